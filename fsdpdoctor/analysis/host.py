"""The host the ranks ran on, as far as the capture recorded it: its cores and how many ranks shared it.

Loader workers and world-size predictions both ask how many cores a rank has to itself: a worker process
computes only on a core no rank's compute thread holds, and ranks added to a host that has no core to
spare for them share cores. A figure the capture did not record stays ``None`` (never guessed): the
callers then fall back to the dialect's trait (``shared_host_cores``: CPU/gloo ranks fill the host) or
withhold what depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpdoctor.results import Analysis

# where a manifest records the host's usable cores (the capture's ``host.cores``; older captures have none)
_CORE_KEYS = (("host", "cores"), ("host", "cpus"))


@dataclass
class HostCores:
    cores: int | None           # usable cores of one host (affinity), None where not recorded
    ranks_per_host: int         # ranks of the run on one host
    source: str                 # where ``cores`` was read ("stated", "schedstat", "manifest", "not recorded")

    @property
    def spare(self) -> float | None:
        """Cores no rank's compute thread holds (one thread per rank), None where the cores are unknown."""
        return None if self.cores is None else max(self.cores - self.ranks_per_host, 0)


def _manifest_cores(manifest: dict) -> int | None:
    for path in _CORE_KEYS:
        v = manifest
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def ranks_per_host(a: Analysis) -> int:
    """Ranks per host: the manifest's host of each rank (the busiest host), else the world size on one host
    for a CPU trace (reference runs) and 1 rank per host otherwise."""
    recorded = ((a.job.manifest or {}).get("host") or {}).get("ranks_per_host")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded   # the capture's own count (manifest host, as the fix sizing reads it)
    hosts = (a.job.manifest or {}).get("hosts")
    if isinstance(hosts, dict) and hosts:
        counts: dict = {}
        for h in hosts.values():
            counts[h] = counts.get(h, 0) + 1
        return max(counts.values())
    return max(a.job.world_size or len(a.ranks) or 1, 1) if a.job.traits.shared_host_cores else 1


def host_cores(a: Analysis, stated: int | None = None) -> HostCores:
    """The run's host: its cores (``stated`` wins over the manifest) and ranks per host."""
    per_host = ranks_per_host(a)
    if stated:
        return HostCores(stated, per_host, "stated")
    read = a.contention.cpus if a.contention and a.contention.source == "schedstat" else None
    if read:
        return HostCores(read, per_host, "schedstat")
    cores = _manifest_cores(a.job.manifest or {})
    return HostCores(cores, per_host, "manifest" if cores else "not recorded")


# a run whose training threads waited for a CPU more than this share of the profiled window (Analysis.contention,
# the capture's schedstat) was timed on a host busy with other work. The bundled runs that carry the reading:
# 0.01-0.13 for two ranks on an otherwise quiet 2-core host (gru_lm_*, mlp_*loss_allreduce, vit_fsdp2_bf16_ckpt),
# 0.63-0.88 for the weak_* runs recorded beside eight busy sessions (their steps 2-10x the quiet ones)
STARVED_WAIT = 0.3


def starved(a: Analysis) -> tuple[int, float] | None:
    """The rank whose training thread waited longest for a CPU, with that share of the profiled window, where
    it is over ``STARVED_WAIT``: its step times hold the host's load, not only the job's."""
    c = a.contention
    if not c or c.wait_share is None or c.wait_share <= STARVED_WAIT:
        return None
    rank = max(c.by_rank, key=c.by_rank.get) if c.by_rank else (a.ranks[0].rank if a.ranks else 0)
    return rank, c.wait_share
