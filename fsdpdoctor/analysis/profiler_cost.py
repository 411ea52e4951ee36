"""The profiler's own cost per step, measured by the job itself.

A trace holds the profiled steps only, and the profiler slows them: per recorded Python frame, torch op and
CUDA runtime call (a host-bound step on an H200 took 7.7 ms profiled against 2.9 ms bare, and the per-event
costs fitted on simple loops, benchmarks/profiler_cost_cuda.py, explain under half of that). capture() times
every step of the run (``steps/rank<N>.steps``), so the steps it profiled can be set against the steps it
did not: the difference of their medians is what the profiler added, which no fix of the job saves.

Only where every window is the fixed schedule: a window opened on demand or on an anomaly was opened because
its steps differ, and its difference is the job's, not the profiler's. Steps the profiler touches without
recording them (its warm-up before a window, the export after) and the first steps (start-up) are left out
of the unprofiled ones, and so are the steps of a periodic stall from both sides.
"""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.analysis.periodic import SKIP_FIRST, Series, median
from fsdpdoctor.results.signals import ProfilerCost

MIN_BARE_STEPS = 5      # unprofiled steps a median rests on (fewer: one slow step moves it)
MIN_PROFILED_STEPS = 2


def _near_windows(profiled: list[int], warmup: int) -> set[int]:
    """The steps the profiler touches: recorded, exported after (the next step), warmed up before."""
    near = set(profiled) | {s + 1 for s in profiled}
    for s in profiled:
        if s - 1 not in profiled:  # the first step of a window: its warm-up before it
            near |= {s - k for k in range(1, warmup + 1)}
    return near


def measure(series: Series, run_dir: Path | None, manifest: dict | None,
            stalled: set[int] = frozenset()) -> ProfilerCost | None:
    """What the profiler added per profiled step, mean over the ranks with a series (None: not measurable).
    ``series``: the run's step series (periodic.read_step_series of ``run_dir``); ``stalled``: steps of a
    periodic stall (a checkpoint every N steps), left out of both sides."""
    if not series or run_dir is None or not manifest:
        return None
    profiled = sorted(s for s in manifest.get("profiled_steps") or [] if isinstance(s, int))
    if len(profiled) < MIN_PROFILED_STEPS:
        return None
    from fsdpdoctor.trace.windows import list_windows

    if any(w.trigger != "schedule" for w in list_windows(Path(run_dir))):
        return None
    sched = manifest.get("schedule") if isinstance(manifest.get("schedule"), dict) else {}
    warmup = sched.get("warmup") if isinstance(sched.get("warmup"), int) else 0
    near = _near_windows(profiled, max(warmup, 0))
    added, prof_m, bare_m, n_bare = [], [], [], []
    for _rank, (steps, _, durs) in sorted(series.items()):
        pairs = [(s, d) for s, d in list(zip(steps, durs))[SKIP_FIRST:] if s not in stalled]
        bare = [d for s, d in pairs if s not in near]
        prof = [d for s, d in pairs if s in profiled]
        if len(bare) < MIN_BARE_STEPS or len(prof) < MIN_PROFILED_STEPS:
            continue
        p, b = median(prof), median(bare)
        added.append(max(p - b, 0.0))
        prof_m.append(p)
        bare_m.append(b)
        n_bare.append(len(bare))
    if not added:
        return None
    n = len(added)
    return ProfilerCost(added_us=sum(added) / n, profiled_step_us=sum(prof_m) / n, bare_step_us=sum(bare_m) / n,
                        bare_steps=min(n_bare), ranks=n)
