"""Per-step time breakdown of one rank: compute, optimizer, exposed and
overlapped communication (per kind and phase), data loading and idle.

Timeline used: GPU traces -> device kernels (compute = non-communication
kernels; memcpy/memset are neither, as in HTA); CPU traces -> host ops on the
main and autograd threads (compute) and gloo worker spans (communication).
Data loading is host time inside ``enumerate(DataLoader)#...__next__`` not
hidden under compute or communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.collectives import is_comm_kernel
from fsdpdoctor.results import COLLECTIVE_KINDS, PHASES, Collective, KindTime, StepBreakdown
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, DEVICE_CATEGORIES, KERNEL


@dataclass
class StepWindow:
    step: int | None
    start: float
    end: float


@dataclass
class Timelines:
    compute: np.ndarray      # all compute (incl. optimizer)
    optimizer: np.ndarray    # optimizer part of compute
    comm: np.ndarray
    comm_by_kind: dict       # kind -> (interval set, start times, sizes)
    comm_by_phase: dict      # phase -> interval set


def step_windows(ctx: RankContext, launch_ts: dict[int, float] | None = None) -> list[StepWindow]:
    t = ctx.t
    rows = ctx.step_rows
    if len(rows) == 0:
        return [StepWindow(None, float(t.ts.min()), float((t.ts + t.dur).max()))]
    rows = rows[np.argsort(t.ts[rows])]
    gpu = ctx.dialect == "gpu"
    out = []
    for i, r in enumerate(rows):
        start = float(t.ts[r])
        end = float(t.ts[r] + t.dur[r])
        if gpu and i + 1 < len(rows):
            # device work of a step runs on after its host window: slice at the next step's start
            end = float(t.ts[rows[i + 1]])
        out.append(StepWindow(int(ctx.t.name(r).split("#")[1]), start, end))
    if gpu:
        # the last step's device work runs past its host window: extend to it
        last = out[-1]
        dev = np.isin(t.cat, DEVICE_CATEGORIES)
        if launch_ts is not None and dev.any():
            drows = np.nonzero(dev)[0]
            lt = np.array([launch_ts.get(int(c), np.nan) for c in t.corr[drows]])
            sel = drows[(lt >= last.start) & (lt <= last.end)]
            if len(sel):
                last.end = max(last.end, float((t.ts[sel] + t.dur[sel]).max()))
    return out


def launch_times(ctx: RankContext) -> dict[int, float]:
    t = ctx.t
    return {c: float(t.ts[r]) for c, r in ctx.launch_row.items()}


def timelines(ctx: RankContext, collectives: list[Collective], launch_ts: dict[int, float]) -> Timelines:
    t = ctx.t
    comm = iv.as_set([c.start_us for c in collectives], [c.end_us for c in collectives])
    if ctx.dialect == "gpu":
        k = np.nonzero(t.cat == KERNEL)[0]
        comm_ids = t.ids_of(is_comm_kernel)
        k = k[~np.isin(t.name_id[k], comm_ids)]
        coll_starts = {c.start_us for c in collectives}
        if coll_starts:  # kernels with collective metadata but odd names
            k = k[~np.isin(t.ts[k], np.fromiter(coll_starts, float))]
        compute = ctx.set_of(k)
        opt = iv.EMPTY
        if len(ctx.optimizer_set) and len(k):
            lt = np.array([launch_ts.get(int(c), np.nan) for c in t.corr[k]])
            ok = ~np.isnan(lt)
            idx = np.searchsorted(ctx.optimizer_set[:, 0], lt[ok], side="right") - 1
            inside = (idx >= 0) & (lt[ok] <= ctx.optimizer_set[np.maximum(idx, 0), 1])
            opt = ctx.set_of(k[ok][inside])
    else:
        ops = np.nonzero((t.cat == CPU_OP) & np.isin(t.track, ctx.compute_tracks))[0]
        comm_op_ids = t.ids_of(lambda n: n.startswith(("c10d::", "_c10d_functional::", "c10d_functional::",
                                                        "record_param_comms")))
        is_comm = np.isin(t.name_id[ops], comm_op_ids)
        compute = iv.subtract(ctx.set_of(ops[~is_comm]), ctx.set_of(ops[is_comm]))
        # An outer op (autograd's evaluate_function) encloses FSDP's hooks, and a hook encloses the
        # blocking wait for its collective: that wait is not compute. Cut out the Work.wait frames
        # (with stacks) and, inside FSDP hook annotations (not the *.forward wrappers, which hold the
        # model), the time the collective runs; the hooks' own copies stay compute
        # (fsdp-signatures.md §11b: synchronous FSDP on gloo overlaps nothing)
        hook_comm = iv.intersect(fsdp_hook_set(ctx), comm)
        compute = iv.subtract(compute, iv.union(ctx.dataloader_set, ctx.wait_set, hook_comm))
        opt = iv.intersect(compute, ctx.optimizer_set)
    by_kind, by_phase = {}, {}
    for kind in COLLECTIVE_KINDS:
        ks = [c for c in collectives if c.kind == kind]
        if ks:
            by_kind[kind] = (iv.as_set([c.start_us for c in ks], [c.end_us for c in ks]),
                             np.array([c.start_us for c in ks]), np.array([c.size_bytes or 0 for c in ks]))
    for phase in PHASES:
        ps = [c for c in collectives if c.phase == phase]
        if ps:
            by_phase[phase] = iv.as_set([c.start_us for c in ps], [c.end_us for c in ps])
    return Timelines(compute=compute, optimizer=opt, comm=comm, comm_by_kind=by_kind, comm_by_phase=by_phase)


def fsdp_hook_set(ctx: RankContext) -> np.ndarray:
    rows = ctx.rows_prefix(("FullyShardedDataParallel.", "FSDP::"), (ANNOTATION,))
    keep = [r for r in rows if not ctx.t.name(r).endswith(".forward")]
    return ctx.set_of(np.asarray(keep, dtype=np.int64)) if keep else iv.EMPTY


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
