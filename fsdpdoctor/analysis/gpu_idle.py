"""GPU idle time of one rank, attributed to what the host was doing meanwhile.

Idle is the time in a step when no device activity runs on any stream: the step window minus the
union of every kernel, memcpy and memset (a copy keeps the device busy even if no SM computes; HTA
counts memcpy/memset as neither compute nor idle, we count them as busy so that "idle" means the
device had nothing at all to do). Each idle instant gets one cause, the first that holds:

1. ``data_loading``: the host is inside ``enumerate(DataLoader)#...__next__``;
2. ``collective_wait``: the host is blocked in a collective (a ``c10d::`` op or ``Work.wait``);
3. ``host_sync``: a sync (``cudaStreamSynchronize``, ``.item()``...) drained the queue: from the sync's
   start for as long after its return as it blocked (``RankContext.sync_reach``);
4. ``host_compute``: the host computes on CPU tensors: inside a torch op that launches no device work
   (no runtime call within it) and lasts over ``QUEUE_EMPTY_US``, far longer than dispatching a launch
   takes (an optimizer stepping CPU-offloaded parameters, metrics or preprocessing on CPU in the step);
5. ``other``: the host sleeps (``time.sleep``), or runs no torch op for longer than ``LONG_GAP_US``
   (Python work that launches nothing: logging, I/O, untraced code), or is outside its step;
6. ``launch``: the host is dispatching and launching (inside CPU ops and runtime calls, or in the
   short gaps between them): the GPU waits for the host to queue the next kernel. With ``with_stack``,
   the part of launch, host_compute and host_sync time the profiler itself adds is ``profiler``
   (``STACK_EVENT_COST_US`` per recorded Python frame that starts there).

Stream capture (``cudaStreamBeginCapture`` ... ``cudaStreamEndCapture``, CUDA graphs being recorded)
queues kernels into a graph without running them: idle inside a capture is the capture itself, not
launch overhead, and is reported apart (``capture_idle_us``).

The kernel queue tells a host-bound job from a busy GPU: a kernel that starts right after its launch
call had nothing queued ahead of it.
"""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.breakdown import StepWindow
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.stats import median
from fsdpdoctor.results import IDLE_CAUSES, GpuIdle, GpuIdleStep
from fsdpdoctor.trace.table import CPU_OP, RUNTIME
from fsdpdoctor.trace.vocabulary import COMM_OPS

# A host thread that launches work runs a torch op every few tens of microseconds; a stretch of
# 1 ms with no op at all is Python doing something else (between two ops of even a tiny model,
# the CUDA traces here show median gaps of ~10 us).
LONG_GAP_US = 1000.0
# Kernel launch latency is ~5-10 us on current GPUs (CUDA programming guide, launch overhead); a
# kernel starting within a few launch latencies of its launch call found an empty queue.
QUEUE_EMPTY_US = 50.0
# Host time the profiler adds per recorded Python frame with with_stack=True: measured 200k calls of
# a trivial Python function under torch.profiler (torch 2.13, CPU): 0.10 us/call without, 0.59 with.
STACK_EVENT_COST_US = 0.5
# On a GPU machine the profiler (CPU and CUDA activities, record_shapes, with_stack, as capture records)
# also adds host time per recorded torch op and per traced CUDA runtime call: fitted over bare against
# profiled loops of one call kind each (benchmarks/profiler_cost_cuda.py on an H200's host, torch
# 2.11+cu130: a view op +1.6 us, an empty +2.5 us, an add_ launch +3.7 us, an .item() +11.8 us; 1.6 us an
# op, 1.2 us a runtime call, the frame's 0.9 us besides; the .item() loop's sync adds 2 us more than the fit).
# Set aside where a saving is the host's own time between syncs (signals.host_syncs), in traces with stacks.
OP_EVENT_COST_US = 1.5
RUNTIME_EVENT_COST_US = 1.2
# stream capture records a CUDA graph: kernels launched inside it are queued into the graph, not run
CAPTURE_BEGIN = ("cudaStreamBeginCapture", "hipStreamBeginCapture")
CAPTURE_END = ("cudaStreamEndCapture", "hipStreamEndCapture")
# One-time initialisation runs inside the first runtime call that needs it (context creation in the
# first cudaFree, cuBLAS/cuDNN handles in the first GEMM's calls, a module load in the first launch of a
# kernel): a single call orders of magnitude longer than its rank's typical runtime call. Over
# STARTUP_FACTOR times the median and over STARTUP_MIN_US it is start-up, not launch overhead (syncs,
# which wait for the device, are not counted).
STARTUP_FACTOR = 100.0
STARTUP_MIN_US = 1000.0
_WAITS = ("Synchronize", "Memcpy", "StreamWaitEvent", "EventQuery", "StreamQuery")
_CAUSE_ORDER = ("data_loading", "collective_wait", "host_sync", "host_compute", "other", "launch")  # first that holds
_PROFILED = ("launch", "host_compute", "host_sync")  # host work the profiler's per-frame cost inflates
_MAX_SOURCE_PIECES = 150  # longest idle pieces per cause looked up for a user frame (each lookup scans the frames)


def gpu_idle(ctx: RankContext, windows: list[StepWindow], options: dict | None = None) -> GpuIdle | None:
    """Per-step GPU idle of one rank and its causes; None when the trace has no device timeline."""
    t = ctx.t
    dev = ctx.device_rows
    if not len(dev) or not windows:
        return None
    options = options if isinstance(options, dict) else {}
    busy = ctx.set_of(dev)
    causes = _cause_sets(ctx)
    stack_starts = ctx.stack_starts
    # each idle instant of all the steps gets its cause once; each step then takes its part of them
    in_steps = iv.as_set([w.start for w in windows], [w.end for w in windows])
    rest = iv.subtract(in_steps, busy)
    idle_all, cause_sets = rest, {}
    for cause in _CAUSE_ORDER:
        part = iv.intersect(rest, causes[cause]) if len(causes[cause]) else iv.EMPTY
        rest = iv.subtract(rest, part)
        cause_sets[cause] = part
    steps, pieces_by_cause = [], {c: [] for c in IDLE_CAUSES}
    for w in windows:
        idle = iv.clip(idle_all, w.start, w.end)
        by_cause = {}
        for cause in _CAUSE_ORDER:
            part = iv.clip(cause_sets[cause], w.start, w.end)
            if cause in _PROFILED and len(part) and len(stack_starts):
                # the profiler's own share of host time: a fixed cost per Python frame it recorded
                n = starts_inside(stack_starts, part)
                prof = min(n * STACK_EVENT_COST_US, iv.total(part))
                by_cause["profiler"] = by_cause.get("profiler", 0.0) + prof
                by_cause[cause] = iv.total(part) - prof
            else:
                by_cause[cause] = iv.total(part)
            pieces_by_cause[cause].append(part)
        unexplained = iv.clip(rest, w.start, w.end)
        by_cause["other"] = by_cause.get("other", 0.0) + iv.total(unexplained)
        pieces_by_cause["other"].append(unexplained)
        by_cause = {c: float(by_cause.get(c, 0.0)) for c in IDLE_CAUSES}
        dur = w.end - w.start
        idle_us = iv.total(idle)
        steps.append(GpuIdleStep(step=w.step, duration_us=dur, busy_us=dur - idle_us, idle_us=idle_us,
                                 by_cause=by_cause))
    n = len(steps)
    step_us = sum(s.duration_us for s in steps) / n
    idle_us = sum(s.idle_us for s in steps) / n
    out = GpuIdle(rank=t.rank, steps=steps, idle_us=idle_us, idle_frac=idle_us / step_us if step_us else 0.0,
                  by_cause={c: sum(s.by_cause[c] for s in steps) / n for c in IDLE_CAUSES})
    _queue(ctx, dev, windows, out)
    startup, calls = _startup_set(ctx, in_steps)
    if calls:
        cold = iv.intersect(idle_all, startup)
        out.startup_idle_us = iv.total(cold) / n
        out.startup_calls = calls
        # the steps holding it: the report sets this cold start apart from the steady state
        out.startup_steps = [w.step for w in windows if w.step is not None and iv.total(iv.clip(cold, w.start, w.end))]
    captures = _capture_set(ctx, in_steps)
    if len(captures):
        out.graph_captures = len(captures)
        out.capture_idle_us = iv.total(iv.intersect(idle_all, captures)) / n
    out.stack_events_per_step = starts_inside(stack_starts, in_steps) / n
    if len(cause_sets["host_compute"]) and len(ctx.optimizer_set):
        opt = iv.intersect(cause_sets["host_compute"], ctx.optimizer_set)
        out.optimizer_host_us = max(iv.total(opt) - starts_inside(stack_starts, opt) * STACK_EVENT_COST_US, 0.0) / n
    out.with_stack = bool(options.get("with_stack", t.has_stacks))
    rs = options.get("record_shapes")
    out.record_shapes = bool(rs) if rs is not None else None
    for cause, parts in pieces_by_cause.items():
        # frames only for causes that hold a material part of the idle time
        if parts and out.by_cause.get(cause, 0.0) >= 0.05 * idle_us > 0:
            src = _sources(ctx, iv.union(*parts), n)
            if src:
                out.sources[cause] = src
    return out


def _startup_set(ctx: RankContext, in_steps: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """One-time initialisation inside the analysed steps: runtime calls on the host over STARTUP_FACTOR
    times the rank's median runtime call and over STARTUP_MIN_US; (their time, "name 9.0 s" each)."""
    t = ctx.t
    rows = np.nonzero((t.cat == RUNTIME) & np.isin(t.track, ctx.compute_tracks))[0]
    if len(rows) < 2 or not len(in_steps):
        return iv.EMPTY, []
    limit = max(STARTUP_FACTOR * median(t.dur[rows]), STARTUP_MIN_US)
    long = rows[t.dur[rows] > limit]
    long = np.array([r for r in long.tolist() if not any(w in t.name(r) for w in _WAITS)], dtype=np.int64)
    if not len(long):
        return iv.EMPTY, []
    spans = iv.intersect(ctx.set_of(long), in_steps)
    if not len(spans):
        return iv.EMPTY, []
    named = [f"{t.name(r)} {t.dur[r] / 1e3:.1f} ms" for r in long[np.argsort(-t.dur[long])][:3].tolist()]
    return spans, named


def _capture_set(ctx: RankContext, in_steps: np.ndarray) -> np.ndarray:
    """Stream captures inside the analysed steps: each begin to the first capture end after it (to the
    end of the steps when the recording stops inside the capture)."""
    t = ctx.t
    begin = np.nonzero(np.isin(t.name_id, t.ids_with_prefix(CAPTURE_BEGIN)))[0]
    if not len(begin) or not len(in_steps):
        return iv.EMPTY
    ends = np.sort((t.ts + t.dur)[np.isin(t.name_id, t.ids_with_prefix(CAPTURE_END))])
    starts = t.ts[begin]
    stop = np.full(len(starts), float(in_steps[-1, 1]))  # no end after it: the recording stopped inside
    k = np.searchsorted(ends, starts)
    ended = k < len(ends)
    stop[ended] = ends[k[ended]]
    return iv.intersect(iv.as_set(starts, np.maximum(stop, starts)), in_steps)


def _cause_sets(ctx: RankContext) -> dict[str, np.ndarray]:
    t = ctx.t
    host = np.isin(t.track, ctx.compute_tracks)
    ops = np.nonzero(host & np.isin(t.cat, (CPU_OP, RUNTIME)))[0]
    # old traces record ProfilerStep#N as an op: it spans the step and says nothing about launching
    ops = ops[~np.isin(ops, ctx.step_rows)] if len(ctx.step_rows) else ops
    op_set = ctx.set_of(ops)
    comm_ids = t.ids_with_prefix(COMM_OPS)
    comm = ops[np.isin(t.name_id[ops], comm_ids)]
    collective = iv.union(ctx.set_of(comm) if len(comm) else iv.EMPTY, ctx.wait_set)
    # a sync drains the queue: its cost lasts until the device runs something again, as far as it
    # drained it (RankContext.sync_reach)
    sync = ctx.sync_rows[np.isin(t.track[ctx.sync_rows], ctx.compute_tracks)] if len(ctx.sync_rows) else ctx.sync_rows
    shadow = iv.EMPTY
    if len(sync):
        shadow = iv.as_set(t.ts[sync], ctx.sync_reach(sync))
    # launching: inside ops, or in gaps between them shorter than LONG_GAP_US
    launch = _close_gaps(op_set, LONG_GAP_US)
    sleep = ctx.set_of(ctx.sleep_rows) if len(ctx.sleep_rows) else iv.EMPTY
    # "other" as a cause set: sleeps; whatever launch does not cover is "other" by elimination
    return {"data_loading": ctx.dataloader_set, "collective_wait": collective, "host_sync": shadow,
            "host_compute": _host_compute_set(ctx, ops), "other": sleep, "launch": launch}


def _host_compute_set(ctx: RankContext, ops: np.ndarray) -> np.ndarray:
    """Host ops that compute on CPU tensors: no runtime call (launch, copy, sync) starts inside them, on
    any host thread, and each lasts over QUEUE_EMPTY_US (a few launch latencies: a view, an empty or a
    dispatch that launches nothing takes microseconds)."""
    t = ctx.t
    cpu = ops[(t.cat[ops] == CPU_OP) & (t.dur[ops] > QUEUE_EMPTY_US)]
    if not len(cpu):
        return iv.EMPTY
    rt = np.sort(t.ts[(t.cat == RUNTIME) & np.isin(t.track, ctx.compute_tracks)])
    if len(rt):
        k = np.searchsorted(rt, t.ts[cpu], side="left")
        launches = (k < len(rt)) & (rt[np.minimum(k, len(rt) - 1)] < t.ts[cpu] + t.dur[cpu])
        cpu = cpu[~launches]
    return ctx.set_of(cpu) if len(cpu) else iv.EMPTY


def _close_gaps(s: np.ndarray, gap: float) -> np.ndarray:
    if len(s) < 2:
        return s
    keep = np.concatenate([[True], s[1:, 0] - s[:-1, 1] > gap])
    idx = np.nonzero(keep)[0]
    ends = np.maximum.reduceat(s[:, 1], idx)
    return np.stack([s[idx, 0], ends], axis=1)


def starts_inside(sorted_starts: np.ndarray, s: np.ndarray) -> int:
    """How many of ``sorted_starts`` fall inside the intervals ``s``."""
    if not len(s) or not len(sorted_starts):
        return 0
    lo = np.searchsorted(sorted_starts, s[:, 0], side="left")
    hi = np.searchsorted(sorted_starts, s[:, 1], side="left")
    return int(np.sum(hi - lo))


def _queue(ctx: RankContext, dev: np.ndarray, windows: list[StepWindow], out: GpuIdle) -> None:
    """Launch -> start delay of the device work launched in the analysed steps."""
    t = ctx.t
    launch = ctx.launch_rows(dev)
    k, la = dev[launch >= 0], launch[launch >= 0]
    if not len(k):
        return
    lts = t.ts[la]
    inside = np.zeros(len(k), dtype=bool)
    for w in windows:
        inside |= (lts >= w.start) & (lts < w.end)
    if not inside.any():
        return
    # a kernel that starts before its launch call returns waited for nothing: no queue
    delay = np.maximum(t.ts[k[inside]] - (t.ts[la[inside]] + t.dur[la[inside]]), 0.0)
    out.kernels = int(inside.sum())
    out.queue_delay_median_us = float(median(delay))
    out.queue_empty_frac = float(np.mean(delay <= QUEUE_EMPTY_US))


def _sources(ctx: RankContext, pieces: np.ndarray, nsteps: int) -> list[list]:
    """Innermost user frames on the main thread during the longest idle pieces: [[frame, us per step]]."""
    if not ctx.t.has_stacks or not len(pieces):
        return []
    lengths = pieces[:, 1] - pieces[:, 0]
    order = np.argsort(-lengths)[:_MAX_SOURCE_PIECES]
    acc: dict[str, float] = {}
    for i in order:
        mid = float((pieces[i, 0] + pieces[i, 1]) / 2)
        src = ctx.source_line(ctx.main_track, mid)
        if src:
            acc[src] = acc.get(src, 0.0) + float(lengths[i])
    top = sorted(acc.items(), key=lambda kv: -kv[1])[:5]
    return [[s, us / nsteps] for s, us in top]


def apply_profiler_options(idles: list[GpuIdle], options: dict | None) -> None:
    """The capture's profiler options (manifest) override what the trace suggests."""
    if not isinstance(options, dict):
        return
    for g in idles:
        if "with_stack" in options:
            g.with_stack = bool(options["with_stack"])
        if options.get("record_shapes") is not None:
            g.record_shapes = bool(options["record_shapes"])
