"""Fix values sized to the job's host: loader workers per rank from the cores the capture recorded
(manifest ``host``: cores this process may run on, ranks on the host). A rank's main thread holds one of its
cores; a worker process computes on another. Where the manifest records no host, the value is the usual one
and the fix says that it is not sized, and why."""

from __future__ import annotations

from dataclasses import dataclass

from fsdpdoctor.results import Analysis

USUAL_WORKERS = 4       # the value given where the host is not known (and the most given where it is)


@dataclass
class HostShare:
    """What one rank may use of its host."""

    cores: int | None               # cores of the host the job may run on (affinity), None: not recorded
    ranks_per_host: int | None
    memory_bytes: int | None = None

    @property
    def known(self) -> bool:
        return bool(self.cores and self.ranks_per_host)

    @property
    def free_per_rank(self) -> int | None:
        """Cores per rank beside the rank's own main thread (0: none)."""
        if not self.known:
            return None
        return max(self.cores // self.ranks_per_host - 1, 0)

    def words(self) -> str:
        mem = f", {self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else ""
        return f"{self.cores} cores{mem}, {self.ranks_per_host} rank{'s' if self.ranks_per_host != 1 else ''} on it"


def host_share(a: Analysis) -> HostShare:
    host = (a.job.manifest or {}).get("host") or {}
    cores, per_host = host.get("cores"), host.get("ranks_per_host")
    if per_host is None and cores:
        hosts = (a.job.manifest or {}).get("hosts") or {}
        named = [h for h in hosts.values() if h]
        per_host = max((named.count(h) for h in set(named)), default=None)
    return HostShare(int(cores) if cores else None, int(per_host) if per_host else None, host.get("memory_bytes"))


NOT_SIZED = ("Not sized to the host: the manifest records no host cores (a capture before fsdpdoctor recorded "
             "them, or a trace without fsdpdoctor's manifest), so {n} is the usual value, not this host's")


def loader_workers(a: Analysis, waiting: bool, needed: int) -> tuple[int, str]:
    """(workers per rank, what that was sized from). ``waiting``: the loader's time is mostly waiting (a sleep,
    I/O), which workers overlap without a core of their own; computing needs a free core each. ``needed``: the
    workers that deliver a batch within the rest of the step (each takes what the loop took for one)."""
    share = host_share(a)
    needed = max(needed, 1)
    if not share.known:
        return USUAL_WORKERS, NOT_SIZED.format(n=USUAL_WORKERS)
    free = share.free_per_rank
    if waiting:
        n = min(needed, USUAL_WORKERS)
        shared = ("; what they compute still runs on the cores the ranks fill, so expect the ranks' own steps to "
                  "slow" if free == 0 else "")
        return n, (f"Sized to the host and the loader: {share.words()}; the loader mostly waits (sleep or I/O under "
                   f"__next__), which workers overlap without a core of their own, and {n} deliver a batch within "
                   "the rest of the step" if n >= needed else
                   f"Sized to the host and the loader: {share.words()}; the loader mostly waits, which workers overlap "
                   f"without a core of their own; {needed} would keep up, {n} at most are given (memory)") + shared
    if free >= 1:
        n = min(free, needed, USUAL_WORKERS)
        return n, (f"Sized to the host: {share.words()}, so {free} core{'s' if free != 1 else ''} per rank beside "
                   f"its main thread" + ("" if n == min(free, USUAL_WORKERS) else
                                         f"; {n} deliver a batch within the rest of the step"))
    return 0, f"{share.words()}: no core free beside the ranks' main threads, and the loader computes"


def more_cores_words(a: Analysis) -> str:
    """What would let workers help where no core is free: the cores a host would need, and where."""
    share = host_share(a)
    ranks = share.ranks_per_host or (len(a.ranks) if a.job.traits.shared_host_cores else 1) or 1
    need = ranks * 2
    return (f"on a host with at least {need} cores for these {ranks} rank{'s' if ranks != 1 else ''} (one main thread "
            "and one loader worker each), or with fewer ranks on this host, workers would take the loading "
            "off the step; here, make the dataset cheaper (cache decoded samples, move the collate's work "
            "out of the loop)")
