"""Run -> Analysis: the metrics of every rank and step, before diagnosis."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from fsdpdoctor.analysis import clock as clock_mod
from fsdpdoctor.analysis import collectives as coll_mod
from fsdpdoctor.analysis import gpu_idle as gpu_idle_mod
from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis import prefetch as prefetch_mod
from fsdpdoctor.analysis import recompute as recompute_mod
from fsdpdoctor.analysis import setup as setup_mod
from fsdpdoctor.analysis import signals as signals_mod
from fsdpdoctor.analysis import stragglers
from fsdpdoctor.analysis.breakdown import (
    breakdown_step, launch_times, mean_breakdown, step_windows, timelines,
)
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.results import (
    Analysis, Collective, CollectiveStat, DialectTraits, JobInfo, RankSummary, Signals, StepBreakdown,
)
from fsdpdoctor.trace.loader import Run
from fsdpdoctor.trace.table import ANNOTATION

SMALL_MESSAGE_BYTES = 1 << 20  # below ~1 MiB NCCL collectives are latency-bound (nccl-tests curves)


def analyze_run(run: Run, steps: set[int] | None = None) -> Analysis:
    notes = list(run.notes)
    ctxs: list[RankContext] = []
    summaries: list[RankSummary] = []
    all_colls: list[Collective] = []
    windows_by_rank = {}
    steps_by_rank: dict[int, list[StepBreakdown]] = {}
    backward_end: dict[int, dict] = {}
    host_syncs, loaders = [], []
    idles, setups, recomputes, offloads = [], [], [], []
    sleep_sources: dict[int, str] = {}
    for trace in run.ranks:
        ctx = RankContext(trace)
        ctxs.append(ctx)
        launch = launch_times(ctx) if ctx.dialect == "gpu" else {}
        windows = step_windows(ctx, launch)
        if not len(ctx.step_rows):
            notes.append(f"rank {trace.rank}: no ProfilerStep annotations; the whole trace is treated as one step")
        if steps is not None:
            windows = [w for w in windows if w.step in steps]
            if not windows:
                notes.append(f"rank {trace.rank}: none of the requested steps is in the trace")
                continue
        colls = coll_mod.extract(ctx)
        # step and phase of each collective, from its host issue time
        in_steps = []
        for c in colls:
            t0 = c.issue_us if c.issue_us is not None else c.start_us
            w = next((w for w in windows if w.start <= t0 < w.end), None)
            if w is None:
                continue  # issued outside the analysed steps
            c.step = w.step
            # a kernel with no launch record was issued before the trace began: phase unknown
            c.phase = ctx.phase_at(t0, w.end) if c.issue_us is not None or ctx.dialect == "cpu" else "other"
            in_steps.append(c)
        colls = in_steps
        _assume_dtype(colls, run.manifest)
        orphans = sum(1 for c in colls if c.issue_us is None and ctx.dialect == "gpu")
        if orphans:
            notes.append(f"rank {trace.rank}: {orphans} communication kernel(s) have no launch record in the trace; "
                         "their kind is inferred from similar kernels on the same stream, their phase is 'other'")
        prefetch_mod.annotate(ctx, colls)
        tl = timelines(ctx, colls, launch)
        if colls:
            hidden = iv.overlap_each([c.start_us for c in colls], [c.end_us for c in colls], tl.compute)
            for c, h in zip(colls, hidden):
                c.exposed_us = max(c.duration_us - float(h), 0.0)
                c.algbw_gbps, c.busbw_gbps = coll_mod.bus_bandwidth(c.kind, c.size_bytes, c.group_size, c.duration_us)
                tr = getattr(c, "_issue_track", None)
                if tr is not None and c.issue_us is not None and trace.has_stacks:
                    c.source = ctx.source_line(tr, c.issue_us)
        by_step = defaultdict(list)
        for c in colls:
            by_step[c.step].append(c)
        bds = [breakdown_step(ctx, w, tl, by_step.get(w.step, [])) for w in windows]
        backward_end[trace.rank] = {}
        for w in windows:
            opt = iv.clip(ctx.optimizer_set, w.start, w.end)
            stop = opt[0, 0] if len(opt) else w.end
            comp = iv.clip(iv.subtract(tl.compute, tl.optimizer), w.start, stop)
            if len(comp):
                backward_end[trace.rank][w.step] = float(comp[-1, 1])
        windows_by_rank[trace.rank] = windows
        steps_by_rank[trace.rank] = bds
        summaries.append(RankSummary(rank=trace.rank, file=str(trace.path), dialect=ctx.dialect, steps=bds,
                                     mean=mean_breakdown(bds, trace.rank), host=trace.host, device=trace.device_name))
        all_colls.extend(colls)
        host_syncs.extend(signals_mod.host_syncs(ctx, windows))
        if len(ctx.sleep_rows):
            r0 = int(ctx.sleep_rows[0])
            src = ctx.source_line(int(trace.track[r0]), float(trace.ts[r0]))
            if src:
                sleep_sources[trace.rank] = src
        dl = signals_mod.dataloader(ctx, windows, bds)
        if dl:
            loaders.append(dl)
        setups.append(setup_mod.rank_setup(ctx, windows, colls))
        idles.append(gpu_idle_mod.gpu_idle(ctx, windows, (run.manifest or {}).get("options")))
        recomputes.append(recompute_mod.recompute(ctx, windows))
        offloads.append(recompute_mod.offload(ctx, windows, run.manifest))

    ctx_by_rank = {c.t.rank: c for c in ctxs}
    fw = next((f for f in (prefetch_mod.framework(c) for c in ctxs) if f), None)
    prefetch = prefetch_mod.status(ctx_by_rank, all_colls, fw)
    setup_mod.single_rank_prefetch(prefetch, run.world_size)
    hosts = {r.host for r in run.ranks if r.host}
    if run.manifest and isinstance(run.manifest.get("hosts"), dict):
        hosts = set(run.manifest["hosts"].values())
    same_clock = len(hosts) <= 1
    clock = clock_mod.estimate(all_colls, [s.rank for s in summaries])
    strag = stragglers.analyze(all_colls, summaries, same_clock, clock)
    if strag:
        stragglers.attribute_cause(strag, summaries)
        stragglers.culprit_frames(strag, {c.t.rank: c for c in ctxs}, windows_by_rank)
        for s in summaries:
            s.wait_us = strag.wait_by_rank.get(s.rank, 0.0)
    job = _job_info(run, ctxs, summaries, fw)
    means = [s.mean for s in summaries if s.mean]
    overall = mean_breakdown(means, -1) if means else None
    sig = Signals(host_syncs=host_syncs, dataloader=loaders, sleep_sources=sleep_sources, setup=setups,
                  gpu_idle=[x for x in idles if x], recompute=[x for x in recomputes if x],
                  offload=[x for x in offloads if x],
                  ddp=signals_mod.ddp(ctxs, all_colls, steps_by_rank, backward_end) if job.wrapping == "ddp" else None)
    if any(c.dialect == "cpu" for c in ctxs) and all_colls:
        notes.append("CPU/gloo trace: communication time is the gloo worker span, which includes waiting for peers; "
                     "CPU 'streams' do not overlap, so synchronous FSDP collectives are fully exposed by design")
    if overall is not None and overall.comm_us > 0 and overall.compute_us + overall.optimizer_us == 0:
        notes.append("the trace holds communication but no compute events (recorded without CPU ops or "
                     "kernels?): exposed and overlapped communication cannot be told apart")
    if len(run.ranks) == 1 and (run.world_size or 1) > 1:
        notes.append(f"only rank {run.ranks[0].rank} of {run.world_size} is in the input: straggler analysis needs "
                     "several ranks")
    return Analysis(source=str(run.source), job=job, ranks=summaries, mean=overall,
                    collectives=collective_stats(all_colls, sum(len(v) for v in steps_by_rank.values())),
                    prefetch=prefetch, straggler=strag, notes=notes, collective_events=all_colls, signals=sig,
                    clock=clock)


def _assume_dtype(colls: list[Collective], manifest: dict | None) -> None:
    """gloo traces record tensor lists without a dtype; gradients and parameters have the model's."""
    dtype = ((manifest or {}).get("model") or {}).get("param_dtype")
    db = coll_mod.dtype_bytes(dtype)
    if not db:
        return
    for c in colls:
        if c.size_bytes is None and c.nelems and c.kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            c.dtype = f"{dtype} (assumed: model dtype)"
            c.size_bytes = int(c.nelems * db)


def collective_stats(colls: list[Collective], n_rank_steps: int) -> list[CollectiveStat]:
    groups: dict[tuple[str, str], list[Collective]] = defaultdict(list)
    for c in colls:
        groups[(c.kind, c.phase)].append(c)
    out = []
    for (kind, phase), cs in groups.items():
        sized = [c for c in cs if c.size_bytes]
        bw = [(c.busbw_gbps, c.duration_us) for c in cs if c.busbw_gbps is not None]
        total = sum(c.duration_us for c in cs)
        out.append(CollectiveStat(
            kind=kind, phase=phase, count=len(cs), per_step=len(cs) / max(n_rank_steps, 1), total_us=total,
            exposed_us=sum(c.exposed_us for c in cs), mean_us=total / len(cs),
            size_bytes=sum(c.size_bytes for c in sized) if sized else None,
            mean_size_bytes=float(np.mean([c.size_bytes for c in sized])) if sized else None,
            # total bytes over total time weights each call by its duration
            busbw_gbps=(sum(b * d for b, d in bw) / sum(d for _, d in bw)) if bw and sum(d for _, d in bw) else None,
            small_messages=sum(1 for c in sized if c.size_bytes < SMALL_MESSAGE_BYTES)))
    out.sort(key=lambda s: -s.exposed_us)
    return out


def _job_info(run: Run, ctxs: list[RankContext], summaries: list[RankSummary], fw: str | None) -> JobInfo:
    m = run.manifest or {}
    wrapping, source, details = "unknown", "trace", {}
    if m.get("wrapping"):
        details = dict(m["wrapping"])
        wrapping, source = details.get("kind", "unknown"), "manifest"
    elif fw:
        wrapping = fw
    elif any(len(c.rows_prefix("DistributedDataParallel.forward", ANNOTATION)) for c in ctxs):
        wrapping = "ddp"
    elif any(len(c.t.rows_named(lambda n: "reducer::" in n)) for c in ctxs):
        wrapping = "ddp"
    elif all(not s.mean or s.mean.collectives == 0 for s in summaries):
        wrapping = "none"
    backend = m.get("backend") or next((r.backend for r in run.ranks if r.backend), None)
    steps = sorted({s.step for r in summaries for s in r.steps if s.step is not None})
    return JobInfo(
        world_size=run.world_size, ranks_analyzed=[s.rank for s in summaries], backend=backend,
        dialect=ctxs[0].dialect if ctxs else "cpu", wrapping=wrapping, wrapping_source=source,
        wrapping_details=details, steps=steps,
        devices=sorted({r.device_name for r in run.ranks if r.device_name}),
        has_stacks=any(r.has_stacks for r in run.ranks), manifest=run.manifest or None,
        samples_per_step=m.get("samples_per_step"), tokens_per_step=m.get("tokens_per_step"),
        traits=_traits(ctxs[0].dialect if ctxs else "cpu"))


def _traits(dialect: str) -> DialectTraits:
    if dialect == "gpu":
        return DialectTraits(name="nccl-gpu", device_timeline=True, async_collectives=True,
                             shared_host_cores=False, has_message_sizes=True)
    return DialectTraits(name="gloo-cpu")
