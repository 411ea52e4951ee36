"""Ranks -> Analysis in two stages: a per-rank map and a cross-rank reduce.

``analyze_rank`` reads one rank's tables (through its dialect) and returns a compact
``RankResult``; ``reduce`` builds the job's ``Analysis`` from those results alone
(stragglers, prefetch status, DDP structure, job info, collective statistics), so the
map can run anywhere (worker processes, a Dask cluster, the capture itself) and the
main process never holds more than one rank's tables.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from fsdpdoctor.analysis import clock as clock_mod
from fsdpdoctor.analysis import collectives as coll_mod
from fsdpdoctor.analysis import contention as contention_mod
from fsdpdoctor.analysis import gpu_idle as gpu_idle_mod
from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis import groups as groups_mod
from fsdpdoctor.analysis import issuers as issuers_mod
from fsdpdoctor.analysis import partial as partial_mod
from fsdpdoctor.analysis import periodic as periodic_mod
from fsdpdoctor.analysis import prefetch as prefetch_mod
from fsdpdoctor.analysis import profiler_cost as profiler_cost_mod
from fsdpdoctor.analysis import recompute as recompute_mod
from fsdpdoctor.analysis import setup as setup_mod
from fsdpdoctor.analysis import signals as signals_mod
from fsdpdoctor.analysis import stragglers
from fsdpdoctor.analysis.breakdown import CommShares, StepWindow, breakdown_step, mean_breakdown
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects import detect
from fsdpdoctor.analysis.loop_framework import framework_frames, job_framework
from fsdpdoctor.analysis.partial import CrossRankPartial
from fsdpdoctor.analysis.rankresult import RankResult, TraceStamp, Window
from fsdpdoctor.errors import InputError
from fsdpdoctor.results import (
    Analysis, Collective, DialectTraits, JobInfo, RankSummary, Signals,
)
from fsdpdoctor.trace.identity import of as identity_of
from fsdpdoctor.trace.io import shown
from fsdpdoctor.trace.table import RankTrace



# A step repeats the work of its neighbours and lasts about as long; one under 1 % of the median of
# the others holds no work: a marker (a ProfilerStep opened as the profiler stops), not a sample.
MARKER_STEP_FRAC = 0.01


def marker_windows(windows: list[StepWindow]) -> list[StepWindow]:
    """Step windows under MARKER_STEP_FRAC of the median of the rank's other steps."""
    durs = [w.end - w.start for w in windows]
    out = []
    for i, w in enumerate(windows):
        others = sorted(durs[:i] + durs[i + 1:])
        if others and durs[i] < MARKER_STEP_FRAC * others[len(others) // 2]:
            out.append(w)
    return out


def _step_windows(trace: RankTrace, dialect, ctx: RankContext, notes: list[str]) -> list[StepWindow]:
    """The rank's steps as the dialect marks them, less the markers that hold no work (each named in a
    note, as is a trace without step annotations)."""
    windows = dialect.step_windows(ctx)
    if not len(ctx.step_rows):
        notes.append(f"rank {trace.rank}: no ProfilerStep annotations; the whole trace is treated as one step")
    markers = marker_windows(windows)
    if markers:
        windows = [w for w in windows if not any(w is m for m in markers)]
        notes.append(f"rank {trace.rank}: " + ", ".join(f"step {w.step} lasts {w.end - w.start:.0f} us"
                                                        for w in markers[:3])
                     + f"{' ...' if len(markers) > 3 else ''}, under {MARKER_STEP_FRAC:.0%} of the rank's other "
                     "steps: a step marker with no work in it, not counted as a step")
    return windows


def _in_steps(ctx: RankContext, records: list, windows: list[StepWindow]) -> list:
    """The collectives issued inside the analysed steps, each given its step and phase from its host
    issue time (its start where the launch is not recorded)."""
    in_steps = []
    for rec in records:
        c = rec.coll
        t0 = c.issue_us if c.issue_us is not None else c.start_us
        w = next((w for w in windows if w.start <= t0 < w.end), None)
        if w is None:
            continue  # issued outside the analysed steps
        c.step = w.step
        # a kernel with no launch record was issued before the trace began: phase unknown
        c.phase = ctx.phase_at(t0, w.end) if rec.launch_known else "other"
        in_steps.append(rec)
    return in_steps


def _overlap_and_bandwidth(ctx: RankContext, records: list, windows: list[StepWindow], tl,
                           shares: CommShares) -> None:
    """Each collective's time hidden under compute, its share of communication and of exposed time
    within the steps, its bandwidths and (with stacks) the source line that issued it."""
    hidden = iv.overlap_each(shares.starts, shares.ends, tl.compute)
    # shares inside the analysed steps only, so the Collectives table adds up to the steps' figures
    busy, exposed = np.zeros(len(records)), np.zeros(len(records))
    for w in windows:
        b, e = shares.within(w.start, w.end)
        busy, exposed = busy + b, exposed + e
    for rec, h, b, e in zip(records, hidden, busy, exposed):
        c = rec.coll
        c.hidden_us = float(h)
        c.comm_share_us = float(b)
        c.exposed_us = float(e)
        c.algbw_gbps, c.busbw_gbps = coll_mod.bus_bandwidth(c.kind, c.size_bytes, c.group_size, c.duration_us)
        if rec.issue_track is not None and c.issue_us is not None and ctx.t.has_stacks:
            c.source = ctx.source_line(rec.issue_track, c.issue_us)


def _backward_ends(ctx: RankContext, windows: list[StepWindow], tl) -> dict[int | None, float]:
    """Per step, when its backward's compute ends: the last compute before the first optimizer update
    that follows the step's last backward op (None: a window without a step number)."""
    backward_end: dict[int | None, float] = {}
    for w in windows:
        # the first update after the step's last backward op (inside optimizer.step(closure) the
        # closure's backward runs after the step span began), else the first optimizer step
        opt = iv.clip(ctx.optimizer_set, w.start, w.end)
        bwd = iv.clip(ctx.backward_set, w.start, w.end)
        after = opt[opt[:, 0] >= bwd[-1, 1]] if len(bwd) and len(opt) else opt
        stop = after[0, 0] if len(after) else opt[0, 0] if len(opt) else w.end
        comp = iv.clip(iv.subtract(tl.compute, tl.optimizer), w.start, stop)
        if len(comp):
            backward_end[w.step] = float(comp[-1, 1])
    return backward_end


# ----------------------------------------------------------------------------- map
def analyze_rank(trace: RankTrace, steps: set[int] | None = None, files: list[Path] | None = None,
                 param_dtype: str | None = None) -> RankResult:
    """Everything about one rank that cross-rank work needs, from its tables.

    ``param_dtype``: the model's dtype (manifest), assumed for collectives recorded without one."""
    dialect = detect(trace)
    ctx = RankContext(trace, dialect)
    notes = []
    windows = _step_windows(trace, dialect, ctx, notes)
    stamps = [TraceStamp.of(Path(f)) for f in (files or [trace.path]) if Path(f).is_file()]
    res = RankResult(
        rank=trace.rank, rank_source=trace.rank_source, files=stamps, dialect=dialect.name, family=dialect.family,
        traits=dialect.traits, world_size=trace.world_size, backend=trace.backend, host=trace.host,
        device=trace.device_name, has_stacks=trace.has_stacks, steps_filter=sorted(steps) if steps is not None else None,
        windows=[], summary=RankSummary(rank=trace.rank, file=shown(trace.path), dialect=dialect.family, steps=[],
                                        mean=None, host=trace.host, device=trace.device_name,
                                        input_kind=trace.kind),
        collectives=[], dialect_note=dialect.note, notes=notes, param_dtype=param_dtype,
        quality=trace.quality, identity=identity_of(trace))
    if steps is not None:
        every = windows
        windows = [w for w in windows if w.step in steps]
        if not windows:
            notes.append(f"rank {trace.rank}: none of the requested steps is in the trace")
            res.skipped = True
            res.available_steps = sorted({w.step for w in every if w.step is not None})
            return res
    res.frameworks = framework_frames(trace)
    records = coll_mod.extract_records(ctx)
    notes.extend(ctx.notes)
    records = _in_steps(ctx, records, windows)
    colls = [r.coll for r in records]
    _assume_dtype(colls, param_dtype)
    orphans = sum(1 for r in records if not r.launch_known)
    if orphans:
        notes.append(f"rank {trace.rank}: {orphans} communication kernel(s) have no launch record in the trace; "
                     "their kind is inferred from similar kernels on the same stream, their phase is 'other'")
    prefetch_mod.annotate(ctx, records)
    tl = dialect.timelines(ctx, records)
    shares = CommShares(colls, tl.compute)
    if colls:
        _overlap_and_bandwidth(ctx, records, windows, tl, shares)
        issuers_mod.annotate(ctx, records)
        groups_mod.annotate(colls, groups_mod.hsdp_roles(trace.distributed_info, trace.world_size))
    by_step = defaultdict(list)
    for c in colls:
        by_step[c.step].append(c)
    bds = [breakdown_step(ctx, w, tl, by_step.get(w.step, []), shares) for w in windows]
    backward_end = _backward_ends(ctx, windows, tl)
    # the summary's keys are step numbers (msgpack keys are typed)
    res.backward_end = {st: end for st, end in backward_end.items() if st is not None}
    res.windows = [Window(w.step, w.start, w.end) for w in windows]
    res.summary.steps = bds
    res.summary.mean = mean_breakdown(bds, trace.rank)
    res.summary.cycles = list(trace.cycles)
    res.collectives = colls
    res.host_syncs = signals_mod.host_syncs(ctx, windows)
    if len(ctx.sleep_rows):
        r0 = int(ctx.sleep_rows[0])
        res.sleep_source = ctx.source_line(int(trace.track[r0]), float(trace.ts[r0]))
    res.dataloader = signals_mod.dataloader(ctx, windows, bds)
    res.prefetch = prefetch_mod.rank_counts(ctx, records)
    res.ddp = signals_mod.ddp_counts(ctx, colls, backward_end, windows)
    res.setup = setup_mod.rank_setup(ctx, windows, colls)
    # profiler options and the offload configuration come from the manifest, applied in the reduce
    res.gpu_idle = gpu_idle_mod.gpu_idle(ctx, windows, None)
    res.recompute = recompute_mod.recompute(ctx, windows)
    res.offload = recompute_mod.offload(ctx, windows, None)
    res.user_frames = stragglers.user_frame_times(ctx, windows)
    res.step_frames = periodic_mod.step_frame_times(ctx, windows)
    res.work = stragglers.step_work(ctx, windows)
    if trace.cpu_share:
        c = trace.cpu_share
        res.cpu_share = contention_mod.cpu_share(c)
    return res


# -------------------------------------------------------------------------- reduce
def step_spec(steps: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4,7' (the form --steps takes)."""
    out: list[str] = []
    for s in sorted(set(steps)):
        if out and out[-1].rsplit("-", 1)[-1] == str(s - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ",".join(out)


def empty_step_selection(source: str | Path, results: list[RankResult]) -> InputError:
    """--steps matched no step of any rank: one line that says which steps there are."""
    have = sorted({s for r in results for s in r.available_steps})
    wanted = step_spec(results[0].steps_filter or [])
    return InputError(source, f"--steps {wanted} matches no profiled step"
                      + (f" (the trace has steps {step_spec(have)})" if have else " (the trace has no numbered steps)"))


def _partial_of(kept: list[RankResult], partial: CrossRankPartial | None) -> CrossRankPartial:
    """The merged partial result of the kept ranks: the one given (merged elsewhere, from groups of
    ranks) when it holds exactly those ranks, else built here."""
    if partial is None:
        return partial_mod.of_results(kept, compact=False)
    if partial.ranks != [r.rank for r in kept]:
        raise ValueError(f"the partial result holds {len(partial.ranks)} ranks, not the {len(kept)} ranks "
                         "of the results it is reduced with")
    return partial


def reduce(results: list[RankResult], *, source: str | Path, manifest: dict | None = None,
           notes: list[str] | None = None, partial: CrossRankPartial | None = None) -> Analysis:
    """The job's ``Analysis`` from per-rank results only (sorted by rank).

    ``partial``: the cross-rank collective part already reduced and merged from groups of these
    ranks (analysis/partial.py); the same Analysis as without it."""
    results = sorted(results, key=lambda r: r.rank)
    if results and all(r.skipped for r in results):
        raise empty_step_selection(source, results)
    notes = list(notes or [])
    for r in results:
        notes.extend(r.notes)
    notes = list(dict.fromkeys(notes))  # what every rank says alike is said once
    kept = [r for r in results if not r.skipped]
    summaries = [r.summary for r in kept]
    all_colls: list[Collective] = [c for r in kept for c in r.collectives]
    steps_by_rank = {r.rank: r.summary.steps for r in kept}
    fw = next((r.prefetch.framework for r in results if r.prefetch.framework), None)
    first = results[0] if results else None
    traits = first.traits if first else DialectTraits()
    prefetch = prefetch_mod.status([r.prefetch for r in kept], all_colls, fw, traits.device_timeline)
    world_size = _world_size(results, manifest)
    setup_mod.single_rank_prefetch(prefetch, world_size)
    hosts = {r.host for r in results if r.host}
    if manifest and isinstance(manifest.get("hosts"), dict):
        hosts = set(manifest["hosts"].values())
    same_clock = len(hosts) <= 1
    merged = _partial_of(kept, partial)
    clock = clock_mod.estimate_by_rank(merged.by_rank(), [s.rank for s in summaries])
    # process groups smaller than the world (a 2-D mesh): a rank waits for a late one through other groups
    sub_groups = bool(world_size and any(r.setup and r.setup.smallest_group and r.setup.smallest_group < world_size
                                         for r in kept))
    group_ranks = {name: ranks for r in kept if r.setup for name, ranks in r.setup.groups.items()}
    strag = stragglers.analyze(all_colls, summaries, same_clock, clock, sub_groups=sub_groups,
                               group_ranks=group_ranks, groups=merged.groups())
    if strag:
        stragglers.attribute_cause(strag, summaries, {r.rank: r.work for r in kept if r.work}, all_colls)
        stragglers.culprit_frames(strag, {r.rank: r.user_frames for r in kept})
        stragglers.shared_core_speeds(strag, {r.rank: r.cpu_share for r in kept if r.cpu_share},
                                      {r.rank: r.host for r in kept})
        for s in summaries:
            s.wait_us = strag.wait_by_rank.get(s.rank, 0.0)
    job = _job_info(results, kept, manifest, fw, world_size)
    means = [s.mean for s in summaries if s.mean]
    overall = mean_breakdown(means, -1) if means else None
    sig = Signals(host_syncs=[h for r in kept for h in r.host_syncs],
                  dataloader=[r.dataloader for r in kept if r.dataloader],
                  sleep_sources={r.rank: r.sleep_source for r in kept if r.sleep_source},
                  ddp=signals_mod.ddp([r.ddp for r in kept], all_colls, steps_by_rank) if job.wrapping == "ddp" else None,
                  setup=[r.setup for r in kept if r.setup],
                  gpu_idle=[r.gpu_idle for r in kept if r.gpu_idle],
                  recompute=[r.recompute for r in kept if r.recompute],
                  offload=[r.offload for r in kept if r.offload])
    gpu_idle_mod.apply_profiler_options(sig.gpu_idle, (manifest or {}).get("options"))
    recompute_mod.apply_offload_config(sig.offload, manifest)
    if all_colls:
        for note in dict.fromkeys(r.dialect_note for r in kept if r.dialect_note):
            notes.append(note)
    if overall is not None and overall.comm_us > 0 and overall.compute_us + overall.optimizer_us == 0:
        notes.append("the trace holds communication but no compute events (recorded without CPU ops or "
                     "kernels?): exposed and overlapped communication cannot be told apart")
    unread = [k for k in (r.summary.input_kind for r in kept) if k is not None and k.unknown]
    if kept and len(unread) == len(kept):  # what the breakdown rests on is not in the input: no figures
        overall = None
        for s in summaries:
            s.mean = None
        notes.insert(0, f"step breakdown withheld: {unread[0].unknown[0]}")
    if len(results) == 1 and (world_size or 1) > 1:
        notes.append(f"only rank {results[0].rank} of {world_size} is in the input: straggler analysis needs "
                     "several ranks")
    run_dir = Path(source) if Path(source).is_dir() else None
    if run_dir is not None and not (run_dir / "steps").is_dir() and (run_dir.parent / "steps").is_dir():
        run_dir = run_dir.parent   # a window-<step> folder: the series is the run's
    series = periodic_mod.read_step_series(run_dir)
    periodic = periodic_mod.find(summaries, {r.rank: r.step_frames for r in kept}, series, manifest)
    if traits.device_timeline:  # a host-bound device idles for all the profiler adds: gpu-idle sets it aside
        sig.profiler_cost = profiler_cost_mod.measure(series, run_dir, manifest,
                                                      set(periodic.stalled_steps) if periodic else set())
    return Analysis(source=shown(source), job=job, ranks=summaries, mean=overall,
                    collectives=merged.collective_stats(sum(len(v) for v in steps_by_rank.values())),
                    prefetch=prefetch, straggler=strag, notes=notes, collective_events=all_colls, signals=sig,
                    clock=clock, periodic=periodic,
                    contention=contention_mod.contention({r.rank: r.cpu_share for r in kept}, manifest))


def _world_size(results: list[RankResult], manifest: dict | None) -> int | None:
    if manifest and manifest.get("world_size"):
        return int(manifest["world_size"])
    sizes = [r.world_size for r in results if r.world_size]
    return sizes[0] if sizes else None


def param_dtype(manifest: dict | None) -> str | None:
    dtype = ((manifest or {}).get("model") or {}).get("param_dtype")
    return str(dtype) if dtype else None


def _assume_dtype(colls: list[Collective], dtype: str | None) -> None:
    """gloo traces record tensor lists without a dtype; gradients and parameters have the model's."""
    db = coll_mod.dtype_bytes(dtype)
    if not db:
        return
    for c in colls:
        if c.size_bytes is None and c.nelems and c.kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            c.dtype = f"{dtype} (assumed: model dtype)"
            c.size_bytes = int(c.nelems * db)


def _job_info(results: list[RankResult], kept: list[RankResult], manifest: dict | None, fw: str | None,
              world_size: int | None) -> JobInfo:
    m = manifest or {}
    wrapping, source, details = "unknown", "trace", {}
    if m.get("wrapping"):
        details = dict(m["wrapping"])
        wrapping, source = details.get("kind", "unknown"), "manifest"
    elif fw:
        wrapping = fw
    elif any(r.ddp.forward_annotations or r.ddp.reducer_events for r in results):
        wrapping = "ddp"
    elif all(not r.summary.mean or r.summary.mean.collectives == 0 for r in kept):
        wrapping = "none"
    backend = m.get("backend") or next((r.backend for r in results if r.backend), None)
    steps = sorted({s.step for r in kept for s in r.summary.steps if s.step is not None})
    first = results[0] if results else None
    framework, framework_source = job_framework(m, {f for r in results for f in r.frameworks},
                                                any(r.has_stacks for r in results))
    family = first.family if first else "cpu"
    traits = first.traits if first else DialectTraits()
    return JobInfo(
        world_size=world_size, ranks_analyzed=[r.rank for r in kept], backend=backend,
        dialect=family, wrapping=wrapping, wrapping_source=source,
        wrapping_details=details, steps=steps,
        devices=sorted({r.device for r in results if r.device}),
        has_stacks=any(r.has_stacks for r in results), manifest=manifest or None,
        samples_per_step=m.get("samples_per_step"), tokens_per_step=m.get("tokens_per_step"),
        traits=traits, input_kind=first.summary.input_kind if first else None,
        framework=framework, framework_source=framework_source)
