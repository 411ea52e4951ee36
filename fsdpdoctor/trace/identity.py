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

from __future__ import annotations

import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.table import RankTrace

# Allowance for clocks of different (or unknown) hosts. Two runs of one script start at least a
# process-group init, a model build and the profiler's wait/warm-up steps apart (tens of seconds on the
# reference jobs), which this stays below; it is far above an NTP-synchronised cluster's skew.
CLOCK_SKEW_US = 10e6


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


def _identical(a: RankTrace, b: RankTrace) -> bool:
    return (a.n_events == b.n_events and a.names == b.names and np.array_equal(a.ts, b.ts)
            and np.array_equal(a.dur, b.dur) and np.array_equal(a.name_id, b.name_id))


def _default_pg(t: RankTrace) -> tuple | None:
    for pg in t.distributed_info.get("pg_config") or []:
        if isinstance(pg, dict) and str(pg.get("pg_name")) == "0":
            ranks = pg.get("ranks")
            return (pg.get("pg_size"), tuple(ranks) if isinstance(ranks, list) else None)
    return None


def check_one_job(run) -> None:
    """Refuse (InputError) a folder whose ranks cannot be one job; drop exact duplicates with a note."""
    _duplicates(run)
    ranks = run.ranks
    _manifest_matches(run)
    if len(ranks) < 2:
        return
    worlds = {r.world_size for r in ranks if r.world_size}
    if len(worlds) > 1:
        raise InputError(run.source, f"ranks do not belong together: world sizes {sorted(worlds)}")
    backends = {r.backend for r in ranks if r.backend}
    if len(backends) > 1:
        raise InputError(run.source, f"ranks do not belong together: backends {sorted(backends)}")
    world = next(iter(worlds), None)
    if world:
        bad = [r for r in ranks if r.rank >= world]
        if bad:
            raise InputError(bad[0].path, f"rank {bad[0].rank} is outside world size {world}")
    pgs = {(r.path.name, _default_pg(r)) for r in ranks if _default_pg(r) is not None}
    if len({pg for _, pg in pgs}) > 1:
        (f1, p1), (f2, p2) = sorted(pgs, key=str)[:2]
        raise InputError(run.source, f"ranks do not belong together: {f1} and {f2} have different default "
                                     f"process groups (size/ranks {p1} vs {p2})")
    _windows_overlap(run)


def _duplicates(run) -> None:
    seen: dict[int, RankTrace] = {}
    keep = []
    for r in run.ranks:
        other = seen.get(r.rank)
        if other is None:
            seen[r.rank] = r
            keep.append(r)
            continue
        if r.rank_source == "default":
            raise InputError(r.path, "cannot tell this file's rank (no distributedInfo, no rank in file name)")
        if _identical(r, other):
            run.quality.notes.append(f"{r.path.name} holds the same trace as {other.path.name}: read once")
            continue
        single = not (r.world_size or 0) > 1 and not (other.world_size or 0) > 1
        if single:
            raise InputError(run.source, f"{other.path.name} and {r.path.name} are two different recordings of one "
                                         "process (not profiler cycles of one run): analyse each file on its own")
        raise InputError(r.path, f"rank {r.rank} appears twice with different content (also in {other.path.name}): "
                                 "traces of different jobs?")
    run.ranks = keep


def _manifest_matches(run) -> None:
    """A manifest describing another job (other world size) is ignored, with a note."""
    m = run.manifest
    if not m:
        return
    ws = m.get("world_size")
    worlds = {r.world_size for r in run.ranks if r.world_size}
    if isinstance(ws, int) and worlds and ws not in worlds:
        run.quality.manifest.append(f"manifest.json says world size {ws}, the traces {sorted(worlds)}: "
                                    "the manifest is of another job and is ignored")
        run.manifest = None


def _windows_overlap(run) -> None:
    with_base = {r.base_time_ns is not None for r in run.ranks}
    if len(with_base) > 1:
        return  # relative and absolute clocks: not comparable
    wins = [(r, window_us(r)) for r in run.ranks]
    wins = [(r, w) for r, w in wins if w is not None]
    for i, (a, wa) in enumerate(wins):
        for b, wb in wins[i + 1:]:
            gap = max(wa[0], wb[0]) - min(wa[1], wb[1])
            if gap <= 0:
                continue
            same_host = a.host is not None and a.host == b.host
            allowed = max(wa[1] - wa[0], wb[1] - wb[0]) + (0.0 if same_host else CLOCK_SKEW_US)
            if gap > allowed:
                where = f"on host {a.host}" if same_host else "on the wall clock"
                raise InputError(run.source, f"ranks do not belong together: {a.path.name} and {b.path.name} were "
                                             f"recorded {gap / 1e6:.1f} s apart {where} (ranks of one job "
                                             "profile the same steps at the same time)")
