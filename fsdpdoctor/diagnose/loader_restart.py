"""The DataLoader's workers started again at every epoch (``persistent_workers=False``): a new iterator each
epoch forks the worker processes again, shuts the last epoch's down, and the first batch waits for them. Every
rank pays it in the same step, once an epoch: read as one rank's periodic stall it gets a fix in the wrong
place. Found from the iterator's own frames (``DataLoaderInfo.worker_start_steps``, with Python stacks), or,
without stacks, from a periodic stall whose steps hold a loader wait on every rank of a worker-process loader.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpdoctor.analysis.stats import median
from fsdpdoctor.diagnose.framework import RuleContext
from fsdpdoctor.results import Evidence, Finding, Setting
from fsdpdoctor.units import ms


@dataclass
class Restarts:
    period: int              # steps between starts (an epoch)
    start_us: float          # mean time one start holds on a rank
    seen: bool               # the new iterator's frames are in the trace (else inferred from the loader's wait)
    each_us: list[float]     # per start (mean over the ranks): its repeated measurements


def worker_restarts(ctx: RuleContext) -> Restarts | None:
    """The loader's workers starting again inside the analysed steps on every rank that loads, at a cost of
    ``input_bound_frac`` of the step: seen twice in the window, or once where the run's periodic stall recurs
    in the same steps (a single start is the first epoch's); None otherwise."""
    loaders = ctx.a.signals.dataloader if ctx.a.signals else []
    if not loaders:
        return None
    found = _seen(ctx, loaders) if all(d.worker_start_steps for d in loaders) else _inferred(ctx, loaders)
    if found is None or ctx.frac(found.start_us / found.period) < ctx.table["input_bound_frac"]:
        return None   # (a helper: thresholds from the table, not ctx.th)
    return found


def _seen(ctx: RuleContext, loaders) -> Restarts | None:
    steps = sorted({s for d in loaders for s in d.worker_start_steps})
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    p = ctx.a.periodic
    if gaps:
        period = min(gaps)
    elif p is not None and steps[0] % p.period == p.offset % p.period:
        period = p.period
    else:
        return None
    each: dict[int, list[float]] = {}
    for d in loaders:
        for st, us in zip(d.worker_start_steps, d.worker_start_each_us):
            each.setdefault(st, []).append(us)
    return Restarts(period, sum(d.worker_start_us for d in loaders) / len(loaders), True,
                    [sum(v) / len(v) for _, v in sorted(each.items())])


def _inferred(ctx: RuleContext, loaders) -> Restarts | None:
    """Without Python stacks the new iterator is not seen: a periodic stall whose profiled stalled steps hold,
    on every rank of a worker-process loader, a loader wait past its other steps' of a quarter of the stall
    at least, is taken as the workers' start (each epoch's first batch waits for them)."""
    p = ctx.a.periodic
    if p is None or ctx.a.job.has_stacks or not all(d.iterator.startswith("_MultiProcessing") for d in loaders):
        return None
    per_step: dict[int, list[float]] = {}
    for r in ctx.a.ranks:
        hit = [b.data_loading_us for b in r.steps if b.step is not None and b.step % p.period == p.offset]
        rest = [b.data_loading_us for b in r.steps if b.step is not None and b.step % p.period != p.offset]
        if not hit or not rest:
            return None
        base = median(rest)
        if min(hit) - base < 0.25 * p.excess_us:
            return None
        for b in r.steps:
            if b.step is not None and b.step % p.period == p.offset:
                per_step.setdefault(b.step, []).append(b.data_loading_us - base)
    each = [sum(v) / len(v) for _, v in sorted(per_step.items())]
    return Restarts(p.period, sum(each) / len(each), False, each)


def restart_finding(ctx: RuleContext, loaders, r: Restarts) -> Finding:
    period, start_us = r.period, r.start_us
    if r.seen:
        ev = [Evidence(f"rank {d.rank}: the DataLoader starts its worker processes again in step(s) "
                       f"{', '.join(map(str, d.worker_start_steps))} ({ms(d.worker_start_us)} each: the new iterator "
                       "forking them, the last epoch's workers shut down, and the first batch's wait)", rank=d.rank)
              for d in loaders[:8]]
    else:
        ev = [Evidence("no Python stacks: the new iterator is not seen; every rank's loader (worker processes) waits "
                       f"{ms(start_us)} more in the periodic steps than in its others, which is what a start of the "
                       "workers at each epoch looks like (record with with_stack=True to see it)")]
    p = ctx.a.periodic
    if p is not None and p.period == period:
        ev.append(Evidence(f"the step times show the same period: every {period} steps (steps "
                           f"{', '.join(map(str, p.stalled_steps[:6]))}), {ms(p.excess_us)} longer than the others",
                           time_us=p.excess_us))
    impact = start_us / period
    ev.append(Evidence("saving: the starts' own time; the first batch of an epoch still has to be made after "
                       "the reset, and what the forked workers' start costs the step's compute besides is not counted",
                       time_us=impact))
    return ctx.finding(
        "input-bound", f"DataLoader workers start again at every epoch: {ms(start_us)} every {period} steps",
        impact,
        f"Every {period} steps (an epoch) the loop makes a new DataLoader iterator: the last epoch's worker "
        f"processes are shut down, new ones forked, and the first batch waits for them to start "
        f"({ms(start_us)} per epoch, {ms(impact)} per step on average). Every rank pays it at the same "
        "step, so it is data loading, not one rank's stall."
        + ("" if r.seen else " (Inferred from the loader's periodic wait: if the period is not your epoch, "
                             "look for what restarts the loader.)"),
        "The workers start once and are reused by every epoch.",
        # the fix as data, written in the job's framework (diagnose/settings.py)
        settings=[Setting("loader.persistent_workers", True, now=False)],
        confidence=0.85 if r.seen else 0.6, evidence=ev, source=loaders[0].slow_frame, floor="warning",
        # each start is one measurement of the cost (as a periodic stall's occurrences): the step-to-step noise
        # is the wrong yardstick, the starts themselves are most of it
        samples=[us / period for us in r.each_us] if len(r.each_us) >= 2 else None)
