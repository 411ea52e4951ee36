"""Job identity: the ranks in one folder must be one job's, recorded in one profiling window.

What each field can tell (measured on the bundled, CUDA and public traces):

- ``distributedInfo.world_size``/``backend``: the same on every rank of a job.
- ``distributedInfo.pg_config``: the default process group (``pg_name`` "0") lists the same ranks on
  every rank of a job; other groups may legitimately differ (subgroups a rank is not part of).
- ``trace_id``: a fresh id per exported file, different on every rank of one job: says nothing about the
  job, so it is not compared.
- ``baseTimeNanoseconds`` + ``ts``: the wall clock of each event (``ts`` in microseconds after the base;
  old traces without a base write epoch microseconds). The base is rounded and can be equal for different
  jobs, so only the resulting windows are compared: ranks of one job run their collectives together,
  so their profiled windows overlap in time. On one host they share one clock; across hosts NTP keeps
  clocks within milliseconds, and ``CLOCK_SKEW_US`` allows for a badly synchronised node.
- the pid of a file's busiest host thread: profiler cycles of one process share it; two recordings made
  by different processes do not.
"""

# Annotations are objects, not text: see results/analysis.py (RankIdentity is in every RankResult).

from hashlib import blake2b
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.table import RankTrace

# Allowance for clocks of different (or unknown) hosts. Two runs of one script start at least a
# process-group init, a model build and the profiler's wait/warm-up steps apart (tens of seconds on the
# reference jobs), which this stays below; it is far above an NTP-synchronised cluster's skew.
CLOCK_SKEW_US = 10e6


class RankIdentity(msgspec.Struct, frozen=True):
    """What tells one rank's recording from another job's: made in the per-rank map, so the
    cross-rank checks below never need the rank's event tables."""

    base_time_ns: int | None = None
    window_us: tuple[float, float] | None = None   # the profiled window on the wall clock
    main_pid: Any = None                           # pid of the busiest host thread
    host: str | None = None
    default_pg: str | None = None                  # (size, ranks) of process group "0", as text
    digest: str = ""                               # of the rows' names and times: identical copies match


def main_pid(t: RankTrace):
    """The pid of the busiest host thread: the process that wrote the trace."""
    host = [tr for tr in t.tracks if not tr.is_device and tr.n_events]
    return max(host, key=lambda tr: tr.n_events).pid if host else None


def same_process(group: list[RankTrace]) -> bool:
    """Files written by one process: same host (when known) and the same pid."""
    hosts = {t.host for t in group}
    if len(hosts) > 1:
        return False
    pids = {main_pid(t) for t in group}
    return len(pids) == 1 and None not in pids


def window_us(t: RankTrace) -> tuple[float, float] | None:
    """The rank's profiled window on the wall clock (microseconds), when the trace says where it lies."""
    if not t.n_events:
        return None
    base = (t.base_time_ns or 0) / 1e3
    return base + float(t.ts.min()), base + float((t.ts + t.dur).max())


def _digest(t: RankTrace) -> str:
    h = blake2b(digest_size=16)
    h.update(str(t.n_events).encode())
    h.update("\0".join(t.names).encode("utf-8", "surrogatepass"))
    for col in (t.ts, t.dur, t.name_id):
        h.update(np.ascontiguousarray(col).tobytes())
    return h.hexdigest()


def _default_pg(t: RankTrace) -> tuple | None:
    for pg in t.distributed_info.get("pg_config") or []:
        if isinstance(pg, dict) and str(pg.get("pg_name")) == "0":
            ranks = pg.get("ranks")
            return (pg.get("pg_size"), tuple(ranks) if isinstance(ranks, list) else None)
    return None


def of(t: RankTrace) -> RankIdentity:
    pg = _default_pg(t)
    pid = main_pid(t)
    return RankIdentity(base_time_ns=t.base_time_ns, window_us=window_us(t),
                        # an identity token, compared only: as text, whatever a trace puts there
                        main_pid=None if pid is None else str(pid), host=t.host,
                        default_pg=None if pg is None else str(pg), digest=_digest(t))


class Member(msgspec.Struct):
    """One rank's recording as the job checks see it (from a ``RankTrace`` or a ``RankResult``)."""

    rank: int
    rank_source: str
    world_size: int | None
    backend: str | None
    file: str
    identity: RankIdentity

    @property
    def name(self) -> str:
        return Path(self.file).name


def check_one_job(source, members: list[Member], manifest: dict | None, dq) -> tuple[list[int], dict | None]:
    """Refuse (InputError) ranks that cannot be one job; exact duplicates are read once, with a note in
    ``dq`` (a ``DataQuality``). Returns (indices of the members to keep, the manifest or None when it
    is of another job).

    Members are checked by rank, then file: which copy of a duplicate is kept and the order of the
    files an error names do not depend on the order in which workers finished."""
    order = sorted(range(len(members)), key=lambda i: (members[i].rank, members[i].file))
    keep = [order[j] for j in _duplicates(source, [members[i] for i in order], dq)]
    ranks = [members[i] for i in keep]
    manifest = _manifest_matches(manifest, ranks, dq)
    if len(ranks) < 2:
        return keep, manifest
    worlds = {r.world_size for r in ranks if r.world_size}
    if len(worlds) > 1:
        raise InputError(source, f"ranks do not belong together: world sizes {sorted(worlds)}")
    backends = {r.backend for r in ranks if r.backend}
    if len(backends) > 1:
        raise InputError(source, f"ranks do not belong together: backends {sorted(backends)}")
    world = next(iter(worlds), None)
    if world:
        bad = [r for r in ranks if r.rank >= world]
        if bad:
            raise InputError(bad[0].file, f"rank {bad[0].rank} is outside world size {world}")
    pgs = {(r.name, r.identity.default_pg) for r in ranks if r.identity.default_pg is not None}
    if len({pg for _, pg in pgs}) > 1:
        (f1, p1), (f2, p2) = sorted(pgs, key=str)[:2]
        raise InputError(source, f"ranks do not belong together: {f1} and {f2} have different default "
                                 f"process groups (size/ranks {p1} vs {p2})")
    # only ranks joined by a process group must profile the same steps together: a job without one
    # (no backend, no default group) runs its ranks free, so their windows may fall anywhere
    if backends or pgs:
        _windows_overlap(source, ranks)
    return keep, manifest


def _duplicates(source, members: list[Member], dq) -> list[int]:
    seen: dict[int, Member] = {}
    keep = []
    for i, r in enumerate(members):
        other = seen.get(r.rank)
        if other is None:
            seen[r.rank] = r
            keep.append(i)
            continue
        if r.rank_source == "default":
            raise InputError(r.file, "cannot tell this file's rank (no distributedInfo, no rank in file name)")
        if r.identity.digest and r.identity.digest == other.identity.digest:
            dq.notes.append(f"{r.name} holds the same trace as {other.name}: read once")
            continue
        single = not (r.world_size or 0) > 1 and not (other.world_size or 0) > 1
        if single:
            raise InputError(source, f"{other.name} and {r.name} are two different recordings of one "
                                     "process (not profiler cycles of one run): analyse each file on its own")
        raise InputError(r.file, f"rank {r.rank} appears twice with different content (also in {other.name}): "
                                 "traces of different jobs?")
    return keep


def _manifest_matches(m: dict | None, ranks: list[Member], dq) -> dict | None:
    """A manifest describing another job (other world size) is ignored, with a note."""
    if not m:
        return m
    ws = m.get("world_size")
    worlds = {r.world_size for r in ranks if r.world_size}
    if isinstance(ws, int) and worlds and ws not in worlds:
        dq.manifest.append(f"manifest.json says world size {ws}, the traces {sorted(worlds)}: "
                           "the manifest is of another job and is ignored")
        return None
    return m


def _windows_overlap(source, ranks: list[Member]) -> None:
    with_base = {r.identity.base_time_ns is not None for r in ranks}
    if len(with_base) > 1:
        return  # relative and absolute clocks: not comparable
    wins = [(r, r.identity.window_us) for r in ranks if r.identity.window_us is not None]
    wins = [wins[i] for i in _may_clash(wins)]
    for i, (a, wa) in enumerate(wins):
        for b, wb in wins[i + 1:]:
            gap = max(wa[0], wb[0]) - min(wa[1], wb[1])
            if gap <= 0:
                continue
            ha, hb = a.identity.host, b.identity.host
            same_host = ha is not None and ha == hb
            allowed = max(wa[1] - wa[0], wb[1] - wb[0]) + (0.0 if same_host else CLOCK_SKEW_US)
            if gap > allowed:
                where = f"on host {ha}" if same_host else "on the wall clock"
                raise InputError(source, f"ranks do not belong together: {a.name} and {b.name} were "
                                         f"recorded {gap / 1e6:.1f} s apart {where} (ranks of one job "
                                         "profile the same steps at the same time)")


def _may_clash(wins: list[tuple[Member, tuple[float, float]]]) -> list[int]:
    """Indices (in order) of the windows that some other window may lie too far from.

    Two windows clash when the later start is more than the longer window (plus ``CLOCK_SKEW_US``
    unless both are on one known host) after the earlier end: then the later one starts more than
    its own length after the earliest end of its host's (or of all) windows, and the earlier one
    ends more than its own length before the latest start. Only windows passing that test are
    compared pair by pair, so ranks that overlap cost one pass, not all pairs, and a clash is reported
    for the same pair as comparing all pairs would."""
    if len(wins) < 3:
        return list(range(len(wins)))
    hosts: dict[str, list[int]] = {}
    for i, (r, _) in enumerate(wins):
        if r.identity.host is not None:
            hosts.setdefault(r.identity.host, []).append(i)
    keep = set()
    groups = [(list(range(len(wins))), CLOCK_SKEW_US)] + [(g, 0.0) for g in hosts.values() if len(g) > 1]
    for idx, slack in groups:
        first_end = min(wins[i][1][1] for i in idx)
        last_start = max(wins[i][1][0] for i in idx)
        for i in idx:
            lo, hi = wins[i][1]
            room = hi - lo + slack - 1.0   # 1 us less: rounding never leaves out a window the pairs would name
            if lo - first_end > room or last_start - hi > room:
                keep.add(i)
    return sorted(keep)
