"""Structural facts the rules need: host syncs, data-loader stalls, DDP buckets."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.breakdown import StepWindow
from fsdpdoctor.analysis.context import RankContext, is_user_frame
from fsdpdoctor.analysis.gpu_idle import OP_EVENT_COST_US, RUNTIME_EVENT_COST_US, STACK_EVENT_COST_US, starts_inside
from fsdpdoctor.analysis.rankresult import DdpCounts
from fsdpdoctor.results import Collective, DataLoaderInfo, DdpInfo, HostSync, StepBreakdown
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, PYFUNC
from fsdpdoctor.trace.vocabulary import COMM_OPS, LIBRARY_ANNOTATIONS


# ops of the training libraries (a runtime sync directly under one is theirs, not the user's):
# communication (the trace vocabulary's ops and annotations), the wrappers, the optimizer, the loader
_LIBRARY_SCOPES = COMM_OPS + LIBRARY_ANNOTATIONS + (
    "DistributedDataParallel", "FullyShardedDataParallel", "FSDP::", "fsdp::", "Optimizer.", "enumerate(DataLoader)",
    "torch.distributed")


def _step_of(windows: list[StepWindow], t: float) -> int | None:
    w = _window_of(windows, t)
    return w.step if w is not None else None


def _window_of(windows: list[StepWindow], t: float) -> StepWindow | None:
    """The analysed window holding ``t``: a numbered step, or a window without step markers (the whole
    recording, or a profiler cycle), in which host syncs and loader stalls count just the same."""
    for w in windows:
        if w.start <= t < w.end:
            return w
    return None


def host_syncs(ctx: RankContext, windows: list[StepWindow]) -> list[HostSync]:
    t = ctx.t
    groups: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    # syncs inside the data loader or the optimizer (AdamW reads its CPU step counters with
    # .item()) are library internals, not the user's
    skip = iv.union(ctx.dataloader_set, ctx.optimizer_set)
    frames = t.rows_named(lambda n: not n.startswith("<built-in"), cat=PYFUNC) if t.has_stacks else None
    local = ctx.t.rows_named(lambda n: n == "aten::_local_scalar_dense", cat=CPU_OP)
    host_ops = np.nonzero(np.isin(t.cat, (CPU_OP, ANNOTATION)))[0]
    for r in ctx.sync_rows:
        ts = float(t.ts[r])
        if t.name(r) != "aten::_local_scalar_dense":
            if ctx.enclosing(local, int(t.track[r]), ts) is not None:
                continue  # the runtime sync of an .item(): already counted
            # a runtime sync directly under DDP/FSDP/c10d machinery (not under a tensor op) is theirs
            inner = ctx.enclosing(host_ops, int(t.track[r]), ts)
            if inner is not None and t.name(inner).startswith(_LIBRARY_SCOPES):
                continue
        if _window_of(windows, ts) is None:
            continue
        if len(skip) and len(iv.clip(skip, ts, ts + 1e-3)):
            continue
        if frames is not None and len(frames):
            # called from user code, or from inside torch (DDP, FSDP, optimizers)?
            inner = ctx.enclosing(frames, int(t.track[r]), ts)
            if inner is not None and not is_user_frame(t.name(inner)):
                continue
        src = ctx.source_line(int(t.track[r]), ts)
        groups[(t.name(r), src)].append(int(r))
    out = []
    # on GPU the cost of a sync is the idle after it: the device queue is empty and refills only as the
    # host launches again, as far as the sync drained it (RankContext.sync_reach)
    dev = ctx.device_rows
    dev_busy = iv.as_set(t.ts[dev], t.ts[dev] + t.dur[dev]) if len(dev) else iv.EMPTY
    for (name, src), rows in groups.items():
        steps = sorted({s for s in (_step_of(windows, float(t.ts[r])) for r in rows) if s is not None})
        bubble = 0.0
        if len(dev):
            rows_a = np.asarray(rows)
            ends = t.ts[rows_a] + t.dur[rows_a]
            # idle as far as the sync reaches, but not past the end of the sync's own step
            step_end = np.array([next((w.end for w in windows if w.start <= e < w.end), e) for e in ends])
            until = np.minimum(ctx.sync_reach(rows_a), np.maximum(step_end, ends))
            # several syncs before the next launch share one bubble, and a stream still running when a
            # sync returns (it waited on another stream) is no bubble: the union of the gaps, minus
            # device activity, counted once
            keep = until > ends
            gaps = iv.as_set(ends[keep], until[keep]) if keep.any() else iv.EMPTY
            # waiting for a batch inside that span is the loader's (the GPU idle cause order puts it first),
            # and with stacks the profiler's own cost per Python frame recorded there is the profiler's
            idle = iv.subtract(iv.subtract(gaps, dev_busy), ctx.dataloader_set) if len(gaps) else iv.EMPTY
            bubble = max(iv.total(idle) - _profiler_cost(ctx, idle), 0.0) if len(idle) else 0.0
        out.append(HostSync(rank=t.rank, name=name, count=len(rows), total_us=float(t.dur[rows].sum()),
                            steps=steps, source=src, bubble_us=bubble))
    out.sort(key=lambda h: -h.count)
    return out


def _profiler_cost(ctx: RankContext, spans: np.ndarray) -> float:
    """The profiler's own host time inside ``spans``: per Python frame recorded there, and in a GPU trace
    with stacks (as capture records it, where the per-event costs were measured) per torch op and CUDA
    runtime call too (analysis/gpu_idle.py)."""
    cost = starts_inside(ctx.stack_starts, spans) * STACK_EVENT_COST_US
    if ctx.t.has_stacks and len(ctx.device_rows):
        ops, runtime = ctx.host_event_starts
        cost += starts_inside(ops, spans) * OP_EVENT_COST_US + starts_inside(runtime, spans) * RUNTIME_EVENT_COST_US
    return cost


def dataloader(ctx: RankContext, windows: list[StepWindow], steps: list[StepBreakdown]) -> DataLoaderInfo | None:
    t = ctx.t
    rows = ctx.dataloader_rows
    rows = [int(r) for r in rows if _window_of(windows, float(t.ts[r])) is not None]
    if not rows or not steps:
        return None
    it = t.name(rows[0]).split("#", 1)[1].split(".")[0]
    total_step = sum(s.duration_us for s in steps)
    info = DataLoaderInfo(rank=t.rank, iterator=it, calls_per_step=len(rows) / len(steps),
                          mean_call_us=float(np.mean(t.dur[rows])),
                          stall_frac=sum(s.data_loader_us for s in steps) / total_step if total_step else 0.0,
                          exposed_frac=sum(s.data_loading_us for s in steps) / total_step if total_step else 0.0)
    # the slowest user frame under __next__ (a dataset's __getitem__, a collate_fn...)
    if t.has_stacks:
        frames = t.rows_named(is_user_frame, cat=PYFUNC)
        if len(frames):
            frames = frames[t.track[frames] == ctx.main_track]
            dls = ctx.set_of(np.asarray(rows))
            inside = iv.overlap_each(t.ts[frames], t.ts[frames] + t.dur[frames], dls)
            frames = frames[inside >= 0.999 * t.dur[frames]]
            if len(frames):
                per_name: dict[str, float] = defaultdict(float)
                for r in frames:
                    per_name[t.name(r)] += float(t.dur[r])
                # deepest frame that still holds most of the time: prefer the innermost heavy frame
                best = max(per_name.items(), key=lambda kv: kv[1])
                info.slow_frame, info.slow_frame_us = best[0], best[1] / len(steps)
    _worker_starts(ctx, windows, rows, info)
    return info


# DataLoader.__iter__ makes a new iterator (torch/utils/data/dataloader.py): every epoch without
# persistent_workers, which forks the worker processes again (multiprocessing's Popen under it) and shuts
# the last epoch's down; with persistent_workers=True it runs once and later epochs only _reset the iterator
_GET_ITERATOR = re.compile(r"(^|/)torch/utils/data/dataloader\.py\(\d+\): _get_iterator$")
_SHUTDOWN = re.compile(r"(^|/)torch/utils/data/dataloader\.py\(\d+\): _shutdown_workers$")
_FORK = re.compile(r"(^|/)multiprocessing/(popen_\w+|process)\.py\(\d+\): (_launch|start)$")


def _worker_starts(ctx: RankContext, windows: list[StepWindow], nexts: list[int], info: DataLoaderInfo) -> None:
    """The steps in which the loader's worker processes start again (a new iterator that forks workers), and
    what each start holds on this rank: the new iterator (the fork), the last epoch's workers shut down, and
    the first ``__next__``'s wait past the median ``__next__`` of the other steps (the workers' start-up
    and first batch). Python stacks only."""
    t = ctx.t
    if not t.has_stacks or not info.iterator.startswith("_MultiProcessing"):
        return
    frames = t.rows_named(_loader_frame, cat=PYFUNC)
    frames = frames[t.track[frames] == ctx.main_track] if len(frames) else frames
    if not len(frames):
        return
    names = [t.name(int(r)) for r in frames]
    gets = [int(r) for r, n in zip(frames, names) if _GET_ITERATOR.search(n)]
    forks = np.array([float(t.ts[r]) for r, n in zip(frames, names) if _FORK.search(n)])
    starts: dict[int, float] = {}
    for r in gets:
        a, b = float(t.ts[r]), float(t.ts[r] + t.dur[r])
        w = _window_of(windows, a)
        if w is None or w.step is None or not ((forks >= a) & (forks < b)).any():
            continue   # a single-process iterator, or outside the analysed steps
        starts[w.step] = starts.get(w.step, 0.0) + (b - a)
    if not starts:
        return
    for r, n in zip(frames, names):
        w = _window_of(windows, float(t.ts[r])) if _SHUTDOWN.search(n) else None
        if w is not None and w.step in starts:
            starts[w.step] += float(t.dur[r])
    first_next: dict[int, float] = {}
    for r in nexts:
        w = _window_of(windows, float(t.ts[r]))
        if w is not None and w.step is not None:
            first_next.setdefault(w.step, float(t.dur[r]))
    rest = sorted(d for st, d in first_next.items() if st not in starts)
    typical = rest[len(rest) // 2] if rest else 0.0
    for st in starts:
        starts[st] += max(first_next.get(st, typical) - typical, 0.0)
    info.worker_start_steps = sorted(starts)
    info.worker_start_each_us = [starts[st] for st in info.worker_start_steps]
    info.worker_start_us = sum(starts.values()) / len(starts)


def _loader_frame(name: str) -> bool:
    """Python frames of the loader's and multiprocessing's own files (not user frames)."""
    return "dataloader.py(" in name or "multiprocessing/" in name


# DDP's own forward frames that run only with find_unused_parameters=True (torch/nn/parallel/distributed.py,
# DistributedDataParallel._post_forward): the outputs' tensors found and flattened, wrapped in _DDPSink, and
# the output structure rebuilt; the graph search itself is the reducer's search_unused_parameters op
_UNUSED_FORWARD_FRAMES = ("_find_tensors", "_tree_flatten_with_rref", "_tree_unflatten_with_rref")
_DDP_FILE = "torch/nn/parallel/distributed.py("
_DDP_MODULE_FRAME = "nn.Module: DistributedDataParallel"


def _ddp_frames(ctx: RankContext, func: str) -> np.ndarray:
    t = ctx.t
    return t.rows_named(lambda n: _DDP_FILE in n and n.endswith(f": {func}"), cat=PYFUNC)


def _per_window(ctx: RankContext, s: np.ndarray, windows: list[StepWindow] | None) -> dict[int, float]:
    """The time of the interval set ``s`` in each analysed window, less the profiler's own cost of the
    Python frames recorded inside it (``STACK_EVENT_COST_US`` each): what it takes without the profiler.
    (Not the per-op and runtime-call costs of ``_profiler_cost``: fitted on one H200 host, they left
    nothing of DDP's 0.5 ms own host work in a public MI300 trace.)"""
    out: dict[int, float] = {}
    for w in windows or ():
        part = iv.clip(s, w.start, w.end)
        own = iv.total(part) - starts_inside(ctx.stack_starts, part) * STACK_EVENT_COST_US if len(part) else 0.0
        out[w.step if w.step is not None else -1] = max(float(own), 0.0)
    return out


def _ddp_own_host(ctx: RankContext, fwd_rows: np.ndarray, reducer: np.ndarray) -> np.ndarray:
    """DDP's own host work, what the wrapper adds to the model's: DistributedDataParallel.forward less the
    wrapped module's forward (seen only with stacks: the nn.Module frames inside it), the reducer's ops (its
    autograd hooks copying gradients into buckets, the copies back, the unused-parameter search), its
    collectives' host calls and _DDPSink. On a device timeline only the part while no kernel, copy or memset
    runs counts: host work beside a busy device hides behind it."""
    t = ctx.t
    fwd = ctx.set_of(fwd_rows) if len(fwd_rows) else iv.EMPTY
    if len(fwd):
        if t.has_stacks:
            mods = t.rows_named(lambda n: n.startswith("nn.Module: ") and not n.startswith(_DDP_MODULE_FRAME),
                                cat=PYFUNC)
            fwd = iv.subtract(fwd, ctx.set_of(mods)) if len(mods) else fwd
        else:
            fwd = iv.EMPTY  # without frames the module's own forward cannot be told from DDP's
    comm = ctx.rows_prefix("c10d::", CPU_OP)
    sink = t.rows_named(lambda n: n == "_DDPSink" or n.endswith(": _DDPSinkBackward"), cat=CPU_OP)
    own = iv.union(fwd, *(ctx.set_of(r) for r in (reducer, comm, sink) if len(r)))
    if len(own) and len(ctx.device_rows):
        own = iv.subtract(own, ctx.set_of(ctx.device_rows))
    return own


def _unused_host(ctx: RankContext) -> float:
    """What find_unused_parameters=True adds on the host besides the graph search (its own op): in forward,
    with stacks, the outputs found, flattened, wrapped in _DDPSink and rebuilt (each flatten to its rebuild;
    without stacks the _DDPSink op alone), and _DDPSink's backward. Each kind of call at its median (less
    the profiler's cost of the frames inside): a call the loaded host descheduled (one of three took 14.7 ms
    against 0.6 in the bundled ddp_find_unused) is the host's time, not what the flag costs (``_at_median``)."""
    t = ctx.t
    kinds = [ctx.set_of(t.rows_named(lambda n: n.endswith(": _DDPSinkBackward"), cat=CPU_OP))]
    flat = _ddp_frames(ctx, _UNUSED_FORWARD_FRAMES[1]) if t.has_stacks else np.empty(0, dtype=np.int64)
    unflat = _ddp_frames(ctx, _UNUSED_FORWARD_FRAMES[2]) if t.has_stacks else flat
    if len(flat) and len(unflat):
        ends = np.sort(ctx.end[unflat])
        k = np.searchsorted(ends, t.ts[flat])  # each flatten's rebuild: the first that ends after it starts
        ok = k < len(ends)
        kinds.append(iv.as_set(t.ts[flat][ok], ends[k[ok]]))
        kinds.append(ctx.set_of(_ddp_frames(ctx, _UNUSED_FORWARD_FRAMES[0])))
    else:
        kinds.append(ctx.set_of(t.rows_named(lambda n: n == "_DDPSink", cat=CPU_OP)))
    return sum(_at_median(ctx, spans) for spans in kinds)


def _at_median(ctx: RankContext, spans: np.ndarray) -> float:
    """The calls of one kind (``spans``), each priced at the kind's median less the profiler's cost of the
    Python frames recorded inside it: a call the loaded host descheduled (one of three took 14.7 ms
    against 0.6 in the bundled ddp_find_unused) is the host's time, not what the call costs."""
    if not len(spans):
        return 0.0
    starts = ctx.stack_starts
    frames = (np.searchsorted(starts, spans[:, 1], side="left") - np.searchsorted(starts, spans[:, 0], side="left")
              if len(starts) else 0)  # each call's recorded frames, as starts_inside counts them
    net = np.maximum(spans[:, 1] - spans[:, 0] - frames * STACK_EVENT_COST_US, 0.0)
    return len(net) * float(np.median(net))


def ddp_counts(ctx: RankContext, colls: list[Collective], backward_end: dict[int, float],
               windows: list[StepWindow] | None = None) -> DdpCounts:
    """DDP structure on one rank (``colls``: its collectives in the analysed steps)."""
    t = ctx.t
    fwd_rows = ctx.rows_prefix("DistributedDataParallel.forward", ANNOTATION)
    reducer = t.rows_named(lambda n: "reducer::" in n or "reducer." in n, cat=CPU_OP)
    search_rows = ctx.rows_prefix("torch.distributed.ddp.reducer::search_unused_parameters", CPU_OP)
    out = DdpCounts(forward_annotations=int(len(fwd_rows)), reducer_ops=int(len(reducer)),
                    reducer_events=int(len(t.rows_named(lambda n: "reducer::" in n))),
                    search_unused=int(len(search_rows)), search_unused_us=float(t.dur[search_rows].sum()),
                    grads_accumulated=int(len(t.rows_named(lambda n: n.endswith("torch::autograd::AccumulateGrad"),
                                                           cat=CPU_OP))),
                    bucket_copies=int(len(ctx.rows_prefix("torch.distributed.ddp.reducer::copy_bucket_to_grad",
                                                          CPU_OP))))
    for name in ("_DDPSink", "autograd::engine::evaluate_function: _DDPSinkBackward"):
        out.sink_us += _at_median(ctx, ctx.set_of(t.rows_named(lambda n, name=name: n == name, cat=CPU_OP)))
    if len(fwd_rows) or len(reducer):
        out.own_host_by_step = _per_window(ctx, _ddp_own_host(ctx, fwd_rows, reducer), windows)
    if len(search_rows):
        out.unused_host_us = _unused_host(ctx)
    # backward passes = clusters of evaluate_function ops between forwards
    passes = _passes(ctx.backward_set, ctx.set_of(fwd_rows) if len(fwd_rows) else iv.EMPTY)
    out.backward_passes = len(passes)
    rank_ar = [c for c in colls if c.kind == "all_reduce" and c.phase in ("backward", "other") and c.issue_us is not None]
    for s, e in passes:
        if any(s <= c.issue_us <= e for c in rank_ar):
            out.backward_passes_with_allreduce += 1
    for st, end in backward_end.items():
        for c in rank_ar:
            if c.step == st:
                out.allreduce_busy_us += c.duration_us
                out.allreduce_after_backward_us += max(0.0, c.end_us - max(c.start_us, end))
    return out


def ddp(counts: list[DdpCounts], colls: list[Collective], steps_by_rank: dict[int, list[StepBreakdown]]) -> DdpInfo | None:
    """Job-wide DDP facts from the ranks' counts and collectives (no trace tables)."""
    if not any(k.forward_annotations or k.reducer_ops for k in counts):
        return None
    nsteps = sum(len(v) for v in steps_by_rank.values()) or 1
    ar = [c for c in colls if c.kind == "all_reduce" and c.phase in ("backward", "other")]
    busy = sum(k.allreduce_busy_us for k in counts)
    after = sum(k.allreduce_after_backward_us for k in counts)
    overlaps = [s.overlapped_comm_us / s.comm_us for v in steps_by_rank.values() for s in v if s.comm_us > 0]
    return DdpInfo(allreduces_per_step=len(ar) / nsteps,
                   bucket_sizes_bytes=sorted({int(c.size_bytes) for c in ar if c.size_bytes}),
                   forwards_per_step=sum(k.forward_annotations for k in counts) / nsteps,
                   backwards_per_step=sum(k.backward_passes for k in counts) / nsteps,
                   backwards_with_allreduce_per_step=sum(k.backward_passes_with_allreduce for k in counts) / nsteps,
                   search_unused_per_step=sum(k.search_unused for k in counts) / nsteps,
                   search_unused_us_per_step=sum(k.search_unused_us for k in counts) / nsteps,
                   sink_us_per_step=sum(k.sink_us for k in counts) / nsteps,
                   own_host_us_steps=_step_means([k.own_host_by_step for k in counts]),
                   unused_host_us_per_step=sum(k.unused_host_us for k in counts) / nsteps,
                   grads_accumulated_per_step=sum(k.grads_accumulated for k in counts) / nsteps,
                   bucket_copies_per_step=sum(k.bucket_copies for k in counts) / nsteps,
                   bucket_nelems=sorted({int(c.nelems) for c in ar if c.nelems}),
                   after_backward_frac=after / busy if busy else 0.0,
                   overlap_frac=float(np.mean(overlaps)) if overlaps else None)


def _step_means(by_rank: list[dict[int, float]]) -> list[float]:
    """One value per step, the mean over the ranks that have it (steps in order)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for d in by_rank:
        for st, v in d.items():
            by_step[st].append(v)
    return [sum(v) / len(v) for _, v in sorted(by_step.items())]


def _passes(bwd: np.ndarray, fwd: np.ndarray) -> list[tuple[float, float]]:
    """Group backward intervals into passes separated by forwards."""
    if not len(bwd):
        return []
    out = []
    cur = [bwd[0, 0], bwd[0, 1]]
    fstarts = np.sort(fwd[:, 0]).tolist() if len(fwd) else []
    for s, e in bwd[1:].tolist():
        k = bisect_right(fstarts, cur[1])  # the first forward starting after the pass so far: before s?
        if k < len(fstarts) and fstarts[k] < s:
            out.append((cur[0], cur[1]))
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    out.append((cur[0], cur[1]))
    return out
