"""How starved the profiled window was: the share of it the ranks' training threads waited for a CPU.

The capture reads each rank's schedstat at both ends of the recorded window (capture/profiling.py, trace
metadata ``fsdpdoctor_cpu``): the training thread's time on a CPU and its time runnable but queued, the same
summed over every thread of the process, the host's 1-minute load and the cores the process may run on. A
thread that waits in the run queue for a share w of the window ran its steps that much later than on an idle
host, and how much later moves from step to step with the other jobs: every prediction made from such steps
carries that (diagnose/noise.py widens its interval by what calibration under CPU hogs measured, or gives no
number past the contention calibrated). Traces without the reading say "host load not recorded".
"""

from __future__ import annotations

from fsdpdoctor.analysis.rankresult import CpuShare
from fsdpdoctor.results.analysis import Contention


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def cpu_share(c: dict) -> CpuShare:
    """The trace's ``fsdpdoctor_cpu`` document (its three times already checked by the loader) as typed."""
    load = c.get("loadavg")
    load = [float(x) for x in load] if isinstance(load, list) and len(load) == 2 and all(
        _num(x) is not None for x in load) else None
    return CpuShare(wall_us=float(c["wall_us"]), on_cpu_us=float(c["on_cpu_us"]), runqueue_us=float(c["runqueue_us"]),
                    cpus=c["cpus"] if isinstance(c.get("cpus"), int) else None, loadavg=load,
                    threads_on_cpu_us=_num(c.get("threads_on_cpu_us")),
                    threads_runqueue_us=_num(c.get("threads_runqueue_us")))


def _wait(s: CpuShare) -> float | None:
    return min(max(s.runqueue_us / s.wall_us, 0.0), 1.0) if s.wall_us > 0 else None


def _process_wait(s: CpuShare) -> float | None:
    on, queued = s.threads_on_cpu_us, s.threads_runqueue_us
    return queued / (on + queued) if on is not None and queued is not None and on + queued > 0 else None


def _from_manifest(manifest: dict | None) -> Contention | None:
    """The manifest rank's own reading (``host_load``), for a run whose traces lack theirs."""
    loads = [x for x in ((manifest or {}).get("host_load") or []) if isinstance(x, dict)
             and _num(x.get("wait_share")) is not None]
    if not loads:
        return None
    worst = max(loads, key=lambda x: x["wait_share"])
    load = worst.get("loadavg") if isinstance(worst.get("loadavg"), list) else None
    c = Contention(wait_share=float(worst["wait_share"]), load=load,
                   cpus=worst.get("cpus") if isinstance(worst.get("cpus"), int) else None, source="schedstat")
    c.text = describe(c, "the manifest rank's training thread")
    return c


def describe(c: Contention, who: str = "the ranks' training threads") -> str:
    load = ""
    if c.load:
        lo, hi = min(c.load), max(c.load)
        load = f"; host load {lo:.1f}" + (f"-{hi:.1f}" if hi - lo >= 0.05 else "")
        load += f" on {c.cpus} core{'s' if c.cpus != 1 else ''}" if c.cpus else ""
    elif c.cpus:
        load = f"; {c.cpus} core{'s' if c.cpus != 1 else ''}"
    worst = ""
    if len(c.by_rank) > 1:
        r = max(c.by_rank, key=c.by_rank.get)
        worst = f" (rank {r} most)"
    return f"{who} waited for a CPU {c.wait_share:.0%} of the profiled window{worst}{load}"


def contention(shares: dict[int, CpuShare | None], manifest: dict | None = None) -> Contention:
    """The run's contention: the largest wait share over the ranks (the step goes at its slowest rank's
    pace), each rank's, the processes' (every thread), the load and cores; "host load not recorded" without."""
    by_rank = {r: w for r, s in shares.items() if s is not None and (w := _wait(s)) is not None}
    if not by_rank:
        return _from_manifest(manifest) or Contention(wait_share=None)
    ss = [s for s in shares.values() if s is not None]
    loads = [x for s in ss if s.loadavg for x in s.loadavg]
    procs = [w for s in ss if (w := _process_wait(s)) is not None]
    cpus = {s.cpus for s in ss if s.cpus}
    c = Contention(wait_share=max(by_rank.values()), by_rank=dict(sorted(by_rank.items())),
                   process_wait_share=max(procs) if procs else None,
                   load=[min(loads), max(loads)] if loads else None, cpus=min(cpus) if cpus else None,
                   source="schedstat")
    c.text = describe(c)
    return c
