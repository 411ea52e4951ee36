"""Periodic stalls: a step that is longer every N steps on one rank (a checkpoint every 4th step,
evaluation every 3rd, logging), found in each rank's step times: the step series the capture keeps for
the whole run (``steps/rank<N>.steps``) where it holds two periods, else the profiled steps.

A period ``p`` and offset ``k`` explain the stalls when every step whose number is ``k`` modulo ``p`` is
longer than the others' median by more than their noise (3 sigma from the median absolute deviation) and
by a tenth of a step at least, while almost none of the other steps is (a multiple of the true period
leaves stalled steps among its "others"; a divisor puts healthy steps among its stalled ones), in three steps at least. The cost
per step is the stalled steps' excess averaged over all steps: what moving that work off the step saves.

Under synchronous data parallelism every rank's steps show the stall (the others wait for it in their
next collective). The rank that does the work is the one whose long steps hold more of its own time
(the step less its exposed communication) in the profiled steps, or, from the series alone, the one
whose long steps start first. Its frame is the innermost user frame whose time in the long steps exceeds
its time in the others by most of the stall (``step_frames``, with Python stacks).
"""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.results import PeriodicStall, RankSummary


def median(values) -> float:
    """``statistics.median``, loaded on the first call (with fractions: ~2 ms of every start otherwise)."""
    from statistics import median as _median

    return _median(values)


MAD_TO_SIGMA = 1.4826
NOISE_SIGMAS = 3.0          # every stalled step (three at least) stands this far above the others' noise
MIN_EXCESS_FRAC = 0.10      # and by this share of a step at least (smaller is the straggler's or noise)
MAX_PERIOD = 16
SKIP_FIRST = 2              # the first steps hold start-up (allocation, autotuning, a first collective)


def _fit(steps: list[int], durs: list[float], skip: int = SKIP_FIRST,
         hits: int = 3) -> tuple[int, int, float, list[int]] | None:
    """(period, offset, mean excess of the stalled steps, stalled step numbers) of the best periodic fit, with
    ``hits`` occurrences at least (three: two outliers a period apart happen by chance; two only where the
    caller corroborates them, ``_two_in_window``)."""
    pairs = [(s, d) for s, d in zip(steps, durs)][skip:]
    n = len(pairs)
    best = None
    for p in range(2, min(MAX_PERIOD, n // hits) + 1):
        for k in range(p):
            a = [d for s, d in pairs if s % p == k]
            b = [d for s, d in pairs if s % p != k]
            if len(a) < hits or len(b) < 3:
                continue
            base = median(b)
            noise = MAD_TO_SIGMA * median(abs(x - base) for x in b)
            level = base + max(NOISE_SIGMAS * noise, MIN_EXCESS_FRAC * base)
            if min(a) <= level:
                continue
            # the others hold (almost) no stall of the same size: else this is a multiple of the period
            half = base + 0.5 * (min(a) - base)
            if sum(x > half for x in b) > max(0, len(b) // 10):
                continue
            excess = sum(a) / len(a) - base
            score = excess * len(a)
            if best is None or score > best[0] * (1 + 1e-9):
                best = (score, p, k, excess, [s for s, _ in pairs if s % p == k], base)
    if best is None:
        return None
    _, p, k, excess, stalled, _ = best
    return p, k, excess, stalled


Series = dict[int, tuple[list[int], list[float], list[float]]]


def read_step_series(run_dir: Path | None) -> Series:
    """rank -> (step numbers, wall-clock starts s, durations us) of every step in the run's step series ({}
    without one). Read once per analysis: the periodic finder and the profiler's cost both use it."""
    # capture.series.SERIES_DIR, looked for before the import: a folder without step series (any trace
    # not written by capture()) loads no capture code (the package's hooks and watchdog, ~20 ms)
    if run_dir is None or not (Path(run_dir) / "steps").is_dir():
        return {}
    from fsdpdoctor.capture.series import read_series, series_files   # pure Python: no torch

    out = {}
    for f in series_files(Path(run_dir)):
        try:
            s = read_series(f)
        except (OSError, ValueError):
            continue
        out[s.rank] = (list(s.steps), [s.origin_unix_s + t for t in s.start_s], [d * 1e6 for d in s.duration_s])
    return out


def _without(series: Series, skip: set[int]) -> Series:
    """The series less the steps in ``skip`` (profiled: the profiler slows them and exports after the last)."""
    out = {}
    for r, (steps, starts, durs) in series.items():
        keep = [i for i, st in enumerate(steps) if st not in skip]
        out[r] = ([steps[i] for i in keep], [starts[i] for i in keep], [durs[i] for i in keep])
    return out


def find(summaries: list[RankSummary], step_frames: dict[int, dict[str, dict[int, float]]],
         whole_series: Series, manifest: dict | None = None) -> PeriodicStall | None:
    """The periodic stall of the run, if any (see the module docstring); ``whole_series``: every step of the
    run's step series (``read_step_series``)."""
    profiled = [s for s in (manifest or {}).get("profiled_steps") or [] if isinstance(s, int)]
    skip = set(profiled) | {s + 1 for s in profiled}
    series = _without(whole_series, skip)
    fits: dict[int, tuple] = {}
    source = "step series"
    for r, (steps, _, durs) in series.items():
        f = _fit(steps, durs)
        if f:
            fits[r] = f
    if not fits:
        source = "profiled steps"
        fits = _profiled_fits(summaries, step_frames)
    if not fits:
        return None
    # the period most ranks agree on (the waiting ranks show the same one, maybe shifted)
    periods = [f[0] for f in fits.values()]
    period = max(set(periods), key=periods.count)
    fits = {r: f for r, f in fits.items() if f[0] == period}
    rank, how = _owner(summaries, fits, series)
    p, k, excess, stalled = fits[rank]
    every = _every_rank(summaries, p, k)
    if every:
        how = every
    n = len(series[rank][0]) - SKIP_FIRST if source == "step series" else \
        len([b for b in next(s for s in summaries if s.rank == rank).steps])
    cost = excess * len(stalled) / max(n, 1)
    frame, frame_extra = _frame(step_frames.get(rank, {}), p, k)
    mean_step = median(d for d in (series[rank][2] if source == "step series" else
                                   [b.duration_us for b in next(s for s in summaries if s.rank == rank).steps]))
    steps_durs = (zip(series[rank][0], series[rank][2]) if source == "step series" else
                  ((b.step, b.duration_us) for b in next(s for s in summaries if s.rank == rank).steps))
    hit = set(stalled)
    # each occurrence's cost spread over the steps, as ``cost`` spreads their mean: the repeated measurements
    # the finding's interval rests on (the step-to-step noise holds the stall itself)
    each = [(d - mean_step) * len(stalled) / max(n, 1) for st, d in steps_durs if st in hit]
    return PeriodicStall(rank=rank, period=p, offset=k, stalled_steps=stalled, excess_us=excess, occurrence_cost_us=each,
                         cost_per_step_us=cost, source=source, owner_evidence=how, frame=frame,
                         frame_extra_us=frame_extra, median_step_us=mean_step,
                         ranks_showing=sorted({s.rank for s in summaries} if every else fits),
                         every_rank=bool(every))


def _profiled_fits(summaries: list[RankSummary], step_frames: dict[int, dict[str, dict[int, float]]]) -> dict:
    """Fits on the profiled steps alone (all of them: the profiler's warm-up already holds the start-up). Three
    occurrences, or two where a user frame runs in those two steps only and holds most of their excess on a
    rank (a checkpoint every 4th step seen twice in an 8-step window): the work itself, seen twice, is the
    corroboration a third occurrence gives otherwise. The ranks that only wait for it fit with that period."""
    def steps_of(s):
        return [b.step for b in s.steps if b.step is not None], [b.duration_us for b in s.steps if b.step is not None]

    fits = {s.rank: f for s in summaries for f in [_fit(*steps_of(s), skip=0)] if f}
    if fits:
        return fits
    two = {s.rank: f for s in summaries for f in [_fit(*steps_of(s), skip=0, hits=2)] if f}
    seen = [r for r, f in two.items() if _only_in_stalled(step_frames.get(r, {}), f)]
    if not seen:
        return {}
    period = two[seen[0]][0]
    return {r: f for r, f in two.items() if f[0] == period}


def _only_in_stalled(frames: dict[str, dict[int, float]], fit: tuple) -> bool:
    """A frame that runs in the stalled steps only (none of the others) and holds half their excess there."""
    p, k, excess, _ = fit
    for per in frames.values():
        a = [v for st, v in per.items() if st % p == k]
        o = [v for st, v in per.items() if st % p != k]
        if a and o and max(o) == 0.0 and min(a) >= 0.5 * excess:
            return True
    return False


def _every_rank(summaries: list[RankSummary], p: int, k: int) -> str | None:
    """Why the periodic work is every rank's (each rank's own time, the step less its exposed communication,
    rises in the stalled steps by a like amount: an evaluation every rank runs, the loader's start at each
    epoch), or None when one rank does it and the others wait. From the profiled steps (where the step
    series of a rank may miss the period in its noise)."""
    if len(summaries) < 2:
        return None
    own = {}
    for s in summaries:
        a = [b.duration_us - b.exposed_comm_us for b in s.steps if b.step is not None and b.step % p == k]
        o = [b.duration_us - b.exposed_comm_us for b in s.steps if b.step is not None and b.step % p != k]
        if not a or not o:
            return None
        own[s.rank] = sum(a) / len(a) - median(o)
    step = median(b.duration_us for s in summaries for b in s.steps)
    lo, hi = min(own.values()), max(own.values())
    if lo < MIN_EXCESS_FRAC * step or lo < 0.5 * hi:
        return None
    return ("every rank's own time (not waiting in a collective) rises in the stalled steps: "
            + ", ".join(f"rank {r} {own[r] / 1e3:.1f} ms" for r in sorted(own)) + " more than in its other steps")


def _owner(summaries: list[RankSummary], fits: dict[int, tuple], series: dict) -> tuple[int, str]:
    if len(fits) == 1:
        r = next(iter(fits))
        return r, f"only rank {r}'s steps show it"
    # the profiled steps: own time (the step less its exposed communication) in stalled vs other steps
    own = {}
    for s in summaries:
        if s.rank not in fits:
            continue
        p, k = fits[s.rank][:2]
        a = [b.duration_us - b.exposed_comm_us for b in s.steps if b.step is not None and b.step % p == k]
        o = [b.duration_us - b.exposed_comm_us for b in s.steps if b.step is not None and b.step % p != k]
        if a and o:
            own[s.rank] = sum(a) / len(a) - median(o)
    if len(own) == len(fits):
        r = max(own, key=own.get)
        return r, (f"in the profiled steps, rank {r}'s stalled steps hold {own[r] / 1e3:.1f} ms more of its own "
                   "time (not waiting in a collective) than its other steps")
    # the series alone: the rank whose stalled steps start first did the work, the others wait after it.
    # Each stalled step of a rank votes for the rank whose stalled step started last before it ended
    # (the one it waited for); the owner waits for nobody
    starts = []
    for r, f in fits.items():
        if r in series:
            steps, st, durs = series[r]
            at = dict(zip(steps, zip(st, durs)))
            starts += [(at[s][0], at[s][0] + at[s][1] / 1e6, r) for s in f[3] if s in at]
    if len({r for _, _, r in starts}) == len(fits):
        starts.sort()
        votes = dict.fromkeys(fits, 0)
        for a, _end, r in starts:
            before = [x for x in starts if x[0] <= a and x[2] != r and x[1] >= a]
            if before:
                votes[max(before)[2]] += 1
        r = max(votes, key=votes.get)
        if votes[r] > 0:
            return r, f"rank {r}'s long steps start first; the others' long steps follow (they wait for it)"
    r = min(fits)
    return r, "every rank's steps show it; which rank does the work is not in the data"


def _frame(frames: dict[str, dict[int, float]], p: int, k: int) -> tuple[str | None, float | None]:
    diffs = []
    for name, per in frames.items():
        a = [v for s, v in per.items() if s % p == k]
        o = [v for s, v in per.items() if s % p != k]
        if a:
            base = median(o) if o else 0.0
            diffs.append((sum(a) / len(a) - base, sum(a) / len(a), name, base))
    if not diffs:
        return None, None
    top = max(d[0] for d in diffs)
    if top <= 0:
        return None, None
    heavy = [d for d in diffs if d[0] >= 0.8 * top]
    # the periodic work's own function runs only in the stalled steps: of those, the outermost
    # (evaluate, not the model forward it calls, which every step runs); else the innermost heavy frame
    only = [d for d in heavy if d[3] == 0.0]
    extra, _, name, _ = max(only, key=lambda d: d[1]) if only else min(heavy, key=lambda d: d[1])
    return name, extra


def step_frame_times(ctx, wins, min_frac: float = 0.05) -> dict[str, dict[int, float]]:
    """Per-rank part of ``find``: for user frames on the main thread whose time in some step exceeds their
    median step time by ``min_frac`` of the median step (the frames that could hold a stall), their
    inclusive time in each step. Empty without stacks."""
    from fsdpdoctor.analysis.context import is_user_frame
    from fsdpdoctor.trace.table import PYFUNC

    t = ctx.t
    wins = [w for w in wins if w.step is not None]
    if not t.has_stacks or len(wins) < 3:
        return {}
    rows = t.rows_named(is_user_frame, cat=PYFUNC)
    rows = rows[t.track[rows] == ctx.main_track] if len(rows) else rows
    if not len(rows):
        return {}
    acc: dict[str, dict[int, float]] = {}
    ts = t.ts[rows]
    for w in wins:
        sel = rows[(ts >= w.start) & (ts < w.end)]
        for r in sel:
            d = acc.setdefault(t.name(int(r)), {})
            d[w.step] = d.get(w.step, 0.0) + float(t.dur[r])
    step_med = float(median([w.end - w.start for w in wins]))   # (np.median imports numpy.ma)
    out = {}
    for name, per in acc.items():
        vals = [per.get(w.step, 0.0) for w in wins]
        if max(vals) - median(vals) >= min_frac * step_med:
            out[name] = {w.step: per.get(w.step, 0.0) for w in wins}
    return out
