"""Per-step time breakdown of one rank: compute, optimizer, exposed and
overlapped communication (per kind and phase), data loading and idle.

The timelines come from the rank's dialect (GPU: device kernels, compute =
non-communication kernels, memcpy/memset neither, as in HTA; CPU: host ops on
the main and autograd threads and gloo worker spans). Data loading is host time
inside ``enumerate(DataLoader)#...__next__`` not hidden under compute or
communication.
"""

from __future__ import annotations

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import CollectiveRecord, StepWindow, Timelines
from fsdpdoctor.results import Collective, KindTime, StepBreakdown

__all__ = ["StepWindow", "Timelines", "breakdown_step", "mean_breakdown", "step_windows", "timelines"]


def step_windows(ctx: RankContext) -> list[StepWindow]:
    """The rank's step windows, as its dialect cuts them."""
    return ctx.dialect_impl.step_windows(ctx)


def timelines(ctx: RankContext, collectives: list) -> Timelines:
    """Compute/optimizer/communication sets from the dialect (records or plain ``Collective`` list)."""
    recs = [c if isinstance(c, CollectiveRecord) else CollectiveRecord(coll=c) for c in collectives]
    return ctx.dialect_impl.timelines(ctx, recs)


def breakdown_step(ctx: RankContext, w: StepWindow, tl: Timelines, colls: list[Collective]) -> StepBreakdown:
    dur = w.end - w.start
    comp = iv.clip(tl.compute, w.start, w.end)
    opt = iv.clip(tl.optimizer, w.start, w.end)
    comm = iv.clip(tl.comm, w.start, w.end)
    comp_total = iv.total(comp)
    opt_total = iv.total(opt)
    comm_total = iv.total(comm)
    overlapped = iv.total(iv.intersect(comm, comp))
    exposed_set = iv.subtract(comm, comp)
    exposed = iv.total(exposed_set)
    dl_all = iv.clip(ctx.dataloader_set, w.start, w.end)
    dl = iv.total(iv.subtract(iv.subtract(dl_all, comp), comm))
    b = StepBreakdown(rank=ctx.t.rank, step=w.step, start_us=w.start, duration_us=dur)
    b.compute_us = comp_total - opt_total
    b.optimizer_us = opt_total
    b.exposed_comm_us = exposed
    b.overlapped_comm_us = overlapped
    b.comm_us = comm_total
    b.data_loading_us = dl
    b.data_loader_us = iv.total(dl_all)
    b.idle_us = max(dur - comp_total - exposed - dl, 0.0)
    b.collectives = len(colls)
    # per kind and phase on the same time slice as the totals: device kernels of one step often
    # run in the next step's window, so slicing by time (not by issuing step) keeps the parts summing up
    for kind, (kset, starts, sizes) in tl.comm_by_kind.items():
        s = iv.clip(kset, w.start, w.end)
        if not len(s):
            continue
        busy = iv.total(s)
        exp = iv.total(iv.subtract(s, comp))
        inside = (starts >= w.start) & (starts < w.end)
        b.comm_by_kind[kind] = KindTime(count=int(inside.sum()), busy_us=busy, exposed_us=exp,
                                        overlapped_us=busy - exp, size_bytes=int(sizes[inside].sum()))
    for phase, pset in tl.comm_by_phase.items():
        s = iv.clip(pset, w.start, w.end)
        if len(s):
            b.exposed_by_phase[phase] = iv.total(iv.subtract(s, comp))
    # host syncs and sleeps in this step
    t = ctx.t
    sync = ctx.sync_rows
    if len(sync):
        sel = sync[(t.ts[sync] >= w.start) & (t.ts[sync] < w.end)]
        b.host_syncs = int(len(sel))
        b.host_sync_us = float(iv.total(ctx.set_of(sel)))
    sl = ctx.sleep_rows
    if len(sl):
        sel = sl[(t.ts[sl] >= w.start) & (t.ts[sl] < w.end)]
        b.sleep_us = float(iv.total(ctx.set_of(sel)))
    return b


def mean_breakdown(steps: list[StepBreakdown], rank: int) -> StepBreakdown | None:
    """Average of several step breakdowns (per-kind and per-phase times averaged too)."""
    if not steps:
        return None
    n = len(steps)
    m = StepBreakdown(rank=rank, step=None, start_us=steps[0].start_us, duration_us=0.0)
    scalar = ["duration_us", "compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us",
              "data_loading_us", "idle_us", "comm_us", "data_loader_us", "host_sync_us", "sleep_us"]
    for f in scalar:
        setattr(m, f, sum(getattr(s, f) for s in steps) / n)
    m.host_syncs = round(sum(s.host_syncs for s in steps) / n)
    m.collectives = round(sum(s.collectives for s in steps) / n)
    for s in steps:
        for k, kt in s.comm_by_kind.items():
            acc = m.comm_by_kind.setdefault(k, KindTime())
            acc.count += kt.count
            acc.busy_us += kt.busy_us / n
            acc.exposed_us += kt.exposed_us / n
            acc.overlapped_us += kt.overlapped_us / n
            acc.size_bytes += kt.size_bytes
        for p, v in s.exposed_by_phase.items():
            m.exposed_by_phase[p] = m.exposed_by_phase.get(p, 0.0) + v / n
    for kt in m.comm_by_kind.values():
        kt.count = round(kt.count / n)   # calls per step
        kt.size_bytes = round(kt.size_bytes / n)
    return m
