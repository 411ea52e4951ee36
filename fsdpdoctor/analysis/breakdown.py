"""Per-step time breakdown of one rank: compute, optimizer, exposed and
overlapped communication (per kind and phase), data loading and idle.

The timelines come from the rank's dialect (GPU: device kernels, compute =
non-communication kernels, memcpy/memset neither, as in HTA; CPU: host ops on
the main and autograd threads and gloo worker spans). Data loading is host time
inside ``enumerate(DataLoader)#...__next__`` not hidden under compute or
communication.
"""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import CollectiveRecord, StepWindow, Timelines
from fsdpdoctor.results import Collective, KindTime, StepBreakdown

__all__ = ["CommShares", "StepWindow", "Timelines", "breakdown_step", "mean_breakdown", "step_windows", "timelines"]


class CommShares:
    """Each collective's share of the rank's communication time and of its exposed part.

    Calls that run at the same time (buckets in flight together, an all-gather beside a
    reduce-scatter, gloo spans waiting together) split that time equally, so per-call,
    per-kind and per-phase figures add up to the step's union, never to more."""

    def __init__(self, colls: list[Collective], compute: np.ndarray):
        self.colls = colls
        self.starts = np.array([c.start_us for c in colls], dtype=np.float64)
        self.ends = np.array([c.end_us for c in colls], dtype=np.float64)
        comm = iv.as_set(self.starts, self.ends)
        self.sizes = np.array([c.size_bytes or 0 for c in colls], dtype=np.int64)
        self.by_kind = _indexes_by([c.kind for c in colls])
        self.by_phase = _indexes_by([c.phase for c in colls])
        self.busy = iv.share_density(self.starts, self.ends)
        self.exposed = iv.share_density(self.starts, self.ends, iv.subtract(comm, compute))

    def within(self, lo: float = -np.inf, hi: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
        """(busy share, exposed share) of every call inside [lo, hi)."""
        return (iv.share_each(self.busy, self.starts, self.ends, lo, hi),
                iv.share_each(self.exposed, self.starts, self.ends, lo, hi))


def _indexes_by(labels: list[str]) -> dict[str, np.ndarray]:
    out: dict[str, list[int]] = {}
    for i, k in enumerate(labels):
        out.setdefault(k, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def step_windows(ctx: RankContext) -> list[StepWindow]:
    """The rank's step windows, as its dialect cuts them."""
    return ctx.dialect_impl.step_windows(ctx)


def timelines(ctx: RankContext, collectives: list) -> Timelines:
    """Compute/optimizer/communication sets from the dialect (records or plain ``Collective`` list)."""
    recs = [c if isinstance(c, CollectiveRecord) else CollectiveRecord(coll=c) for c in collectives]
    return ctx.dialect_impl.timelines(ctx, recs)


def breakdown_step(ctx: RankContext, w: StepWindow, tl: Timelines, colls: list[Collective],
                   shares: CommShares | None = None) -> StepBreakdown:
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
    # run in the next step's window, so slicing by time (not by issuing step) keeps the parts summing up;
    # calls running together share their time (CommShares), so kinds and phases add up to the totals
    if shares is not None and shares.colls:
        busy, exp = shares.within(w.start, w.end)
        inside = (shares.starts >= w.start) & (shares.starts < w.end)
        for kind, idx in shares.by_kind.items():
            if not inside[idx].any() and not busy[idx].any():
                continue
            kb, ke = float(busy[idx].sum()), float(exp[idx].sum())
            b.comm_by_kind[kind] = KindTime(count=int(inside[idx].sum()), busy_us=kb, exposed_us=ke,
                                            overlapped_us=max(kb - ke, 0.0),
                                            size_bytes=int(shares.sizes[idx][inside[idx]].sum()))
        for phase, idx in shares.by_phase.items():
            if busy[idx].any():
                b.exposed_by_phase[phase] = float(exp[idx].sum())
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
        sleeps = ctx.set_of(sel)
        b.sleep_us = float(iv.total(sleeps))
        # the loader's waiting (a sleep under __next__): the part of loading a worker hides on busy cores
        b.loader_sleep_us = float(iv.total(iv.intersect(sleeps, dl_all)))
    return b


def mean_breakdown(steps: list[StepBreakdown], rank: int) -> StepBreakdown | None:
    """Average of several step breakdowns (per-kind and per-phase times averaged too)."""
    if not steps:
        return None
    n = len(steps)
    m = StepBreakdown(rank=rank, step=None, start_us=steps[0].start_us, duration_us=0.0)
    scalar = ["duration_us", "compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us",
              "data_loading_us", "idle_us", "comm_us", "data_loader_us", "host_sync_us", "sleep_us",
              "loader_sleep_us"]
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
