"""Scaling efficiency across runs of the same job at different world sizes.

Pure function: ``scaling_report(analyses, ...)`` takes already analysed runs
(``Analysis`` objects) and returns a :class:`ScalingReport`; no I/O. The
``scaling`` verb (fsdpdoctor/commands/scaling.py) loads the runs and renders it.
See docs/scaling.md for the formulas and how to read the waterfall.

Definitions (all times are per-rank means: mean over a rank's analysed steps,
then mean over the analysed ranks):

- global work per step ``W`` (samples or tokens, summed over ranks), per-rank
  work ``w = W / N``;
- throughput ``W / T`` (per second), ``T`` the mean step time;
- efficiency of run N against the base run b (smallest world size):
  ``E = throughput_N / (N / N_b * throughput_b)``, which equals
  ``T_ideal / T_N`` with ``T_ideal = T_b * w_N / w_b``:
  weak scaling (same per-rank batch): ``T_ideal = T_b``;
  strong scaling (same global batch): ``T_ideal = T_b * N_b / N``;
- waterfall: ``T_N - T_ideal`` split into parts. Each part is the run's time
  in that category minus the base's time scaled the same way
  (``part_N - part_b * w_N / w_b``). Its share of the lost efficiency is
  ``delta / T_N``; all shares add up to ``1 - E``.
"""

from __future__ import annotations

from fsdpdoctor.errors import InputError
from fsdpdoctor.results import COLLECTIVE_KINDS, Analysis, DialectTraits
from fsdpdoctor.results.scaling import (
    COMPUTE, DATA, IDLE, RESIDUAL, WAIT, ScalingReport, ScalingRun, StepParts, Waterfall, WaterfallPart,
)


# per-rank work equal within this relative tolerance counts as "the same batch"
_SAME_WORK_TOL = 0.01

_LABELS = {WAIT: "waiting on slower ranks", DATA: "data loading", COMPUTE: "compute inflation",
           IDLE: "idle", RESIDUAL: "unattributed"}


def part_label(key: str) -> str:
    """Human name of a waterfall part key ("comm:all_reduce" -> "exposed all_reduce")."""
    if key.startswith("comm:"):
        return f"exposed {key[5:]}"
    return _LABELS.get(key, key)


# ---------------------------------------------------------------------------- helpers
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def step_parts(a: Analysis) -> StepParts:
    """Per-rank means of the categories, wait carved out of the exposed communication (also what
    ``whatif`` shows a step's parts with)."""
    rows = []
    for r in a.ranks:
        m = r.mean
        if m is None:
            continue
        kinds = {k: kt.exposed_us for k, kt in m.comm_by_kind.items() if kt.exposed_us > 0}
        # waiting for a slower rank happens inside a collective; only its exposed part costs step time
        wait = min(max(r.wait_us, 0.0), m.exposed_comm_us)
        tot = sum(kinds.values())
        if tot > 0 and wait > 0:
            # each kind keeps the same share of what the wait leaves; a wait that is all of it leaves
            # exactly 0 (v - wait * v / tot left -5e-14 us there: a part below zero by rounding alone)
            left = max(0.0, 1.0 - wait / tot)
            kinds = {k: v * left for k, v in kinds.items()}
        rows.append((m.duration_us, m.compute_us + m.optimizer_us, kinds, wait, m.data_loading_us, m.idle_us,
                     m.exposed_comm_us))
    if not rows:
        raise InputError(a.source, "no analysed steps (no rank has a step breakdown)")
    n = len(rows)
    comm: dict[str, float] = {}
    for row in rows:
        for k, v in row[2].items():
            comm[k] = comm.get(k, 0.0) + v / n
    return StepParts(step_us=_mean([x[0] for x in rows]), compute_us=_mean([x[1] for x in rows]),
                     comm_by_kind=comm, wait_us=_mean([x[3] for x in rows]),
                     data_loading_us=_mean([x[4] for x in rows]), idle_us=_mean([x[5] for x in rows]),
                     exposed_comm_us=_mean([x[6] for x in rows]))


def _step_cv(a: Analysis) -> float:
    d = [s.duration_us for r in a.ranks for s in r.steps]
    if len(d) < 2:
        return 0.0
    mu = _mean(d)
    var = sum((x - mu) ** 2 for x in d) / (len(d) - 1)
    return (var ** 0.5) / mu if mu else 0.0


def _world_size(a: Analysis) -> int:
    ws = a.job.world_size or (a.job.manifest or {}).get("world_size")
    if not ws:
        ws = len(a.ranks)
    if not ws:
        raise InputError(a.source, "world size unknown (no manifest, no distributed info in the trace)")
    return int(ws)


def _pick_unit(analyses: list[Analysis], samples_per_rank: float | None,
               tokens_per_rank: float | None) -> tuple[str, str]:
    if samples_per_rank is not None and tokens_per_rank is not None:
        raise InputError(None, "give --samples-per-step or --tokens-per-step, not both")
    if samples_per_rank is not None:
        return "samples", "flag"
    if tokens_per_rank is not None:
        return "tokens", "flag"
    if all(a.job.tokens_per_step for a in analyses):
        return "tokens", "manifest"
    if all(a.job.samples_per_step for a in analyses):
        return "samples", "manifest"
    missing = [a.source for a in analyses if not (a.job.tokens_per_step or a.job.samples_per_step)]
    where = missing[0] if missing else analyses[0].source
    raise InputError(where, "work per step unknown: the manifest has no samples_per_step/tokens_per_step "
                            "(for every run); pass --samples-per-step N or --tokens-per-step N (per rank)")


def _check_same_hardware(analyses: list[Analysis]) -> None:
    """The losses of a waterfall are those of adding ranks only on the same devices and backend: an
    H100 NCCL run beside a CPU gloo run measures the hardware, not the scaling. Compared where known."""
    for what, of in (("timeline", lambda a: a.job.dialect),
                     ("backend", lambda a: (a.job.backend or "").lower() or None),
                     ("devices", lambda a: ", ".join(sorted(set(a.job.devices))) or None)):
        seen = {a.source: of(a) for a in analyses if of(a) not in (None, "undefined")}
        if len(set(seen.values())) > 1:
            desc = "; ".join(f"{s}: {v}" for s, v in seen.items())
            raise InputError(None, f"runs on different hardware: {what} differs ({desc}); scaling compares "
                                   "one job on one kind of device and backend")


def _check_same_job(analyses: list[Analysis]) -> None:
    _check_same_hardware(analyses)
    kinds = {a.source: a.job.wrapping for a in analyses if a.job.wrapping not in ("unknown", None)}
    if len(set(kinds.values())) > 1:
        desc = ", ".join(f"{s}: {k}" for s, k in kinds.items())
        raise InputError(None, f"runs of different jobs: wrapping differs ({desc})")
    params = {}
    for a in analyses:
        model = (a.job.manifest or {}).get("model") or {}
        if model.get("parameters"):
            params[a.source] = int(model["parameters"])
    if len(set(params.values())) > 1:
        desc = ", ".join(f"{s}: {p}" for s, p in params.items())
        raise InputError(None, f"runs of different jobs: model parameter count differs ({desc})")


# ---------------------------------------------------------------------------- the report
def measure_scaling(analyses: list[Analysis], *, world_sizes: list[int] | None = None,
                    samples_per_rank: float | None = None, tokens_per_rank: float | None = None) -> ScalingReport:
    """Throughput, efficiency and waterfall of runs of one job at different world sizes.

    ``world_sizes`` overrides what the runs say (manifest / trace). Work per step
    comes from the manifests (global ``tokens_per_step``, else ``samples_per_step``)
    unless ``samples_per_rank`` / ``tokens_per_rank`` is given: a per-rank batch,
    multiplied by each run's world size. Raises InputError for inputs that cannot
    be compared. ``findings`` stays empty: ``fsdpdoctor.diagnose.scaling`` judges the report.
    """
    if len(analyses) < 2:
        raise InputError(None, f"scaling needs at least 2 runs, got {len(analyses)}")
    if world_sizes is not None and len(world_sizes) != len(analyses):
        raise InputError(None, "one world size per run is needed")
    sizes = list(world_sizes) if world_sizes is not None else [_world_size(a) for a in analyses]
    if len(set(sizes)) < 2:
        raise InputError(None, f"all runs have the same world size ({sizes[0]}): nothing to scale")
    _check_same_job(analyses)
    unit, work_source = _pick_unit(analyses, samples_per_rank, tokens_per_rank)

    order = sorted(range(len(analyses)), key=lambda i: sizes[i])   # stable: first given wins ties
    runs: list[ScalingRun] = []
    for i in order:
        a, n = analyses[i], sizes[i]
        if work_source == "flag":
            per_rank = float(samples_per_rank if unit == "samples" else tokens_per_rank)
            work = per_rank * n
        else:
            work = float(a.job.tokens_per_step if unit == "tokens" else a.job.samples_per_step)
            per_rank = work / n
        if work <= 0:
            raise InputError(a.source, f"{unit} per step must be positive, got {work:g}")
        p = step_parts(a)
        if p.step_us <= 0:
            raise InputError(a.source, "mean step time is zero")
        runs.append(ScalingRun(source=a.source, world_size=n, ranks_analyzed=len(a.ranks),
                               steps=max((len(r.steps) for r in a.ranks), default=0), unit=unit,
                               work_per_step=work, work_per_rank=per_rank, work_source=work_source,
                               step_us=p.step_us, step_cv=_step_cv(a), throughput=work / (p.step_us / 1e6),
                               efficiency=1.0, ideal_step_us=p.step_us, parts=p))
    base = runs[0]
    for r in runs[1:]:
        ratio = r.work_per_rank / base.work_per_rank
        r.ideal_step_us = base.step_us * ratio
        r.efficiency = r.throughput / (r.world_size / base.world_size * base.throughput)

    def same(x: float, y: float) -> bool:
        return abs(x - y) <= _SAME_WORK_TOL * max(abs(x), abs(y))

    if all(same(r.work_per_rank, base.work_per_rank) for r in runs):
        mode = "weak"
    elif all(same(r.work_per_step, base.work_per_step) for r in runs):
        mode = "strong"
    else:
        mode = "mixed"

    waterfalls = [_waterfall(base, r) for r in runs[1:] if r.world_size != base.world_size]
    job = analyses[order[0]].job
    notes = _notes(runs, waterfalls, mode, job.traits)
    return ScalingReport(mode=mode, unit=unit, base_world_size=base.world_size, runs=runs, waterfalls=waterfalls,
                         notes=notes, dialect=job.dialect, traits=job.traits)


def _waterfall(base: ScalingRun, run: ScalingRun) -> Waterfall:
    ratio = run.work_per_rank / base.work_per_rank
    b, n = base.parts, run.parts
    pairs: list[tuple[str, float, float]] = []
    kinds = [k for k in COLLECTIVE_KINDS if k in b.comm_by_kind or k in n.comm_by_kind]
    kinds += sorted(k for k in set(b.comm_by_kind) | set(n.comm_by_kind) if k not in kinds)
    for k in kinds:
        pairs.append((f"comm:{k}", b.comm_by_kind.get(k, 0.0), n.comm_by_kind.get(k, 0.0)))
    pairs += [(WAIT, b.wait_us, n.wait_us), (DATA, b.data_loading_us, n.data_loading_us),
              (COMPUTE, b.compute_us, n.compute_us), (IDLE, b.idle_us, n.idle_us)]
    increase = run.step_us - run.ideal_step_us
    parts = [WaterfallPart(key=k, label=part_label(k), delta_us=nv - bv * ratio, base_us=bv, run_us=nv,
                           efficiency_points=(nv - bv * ratio) / run.step_us) for k, bv, nv in pairs]
    parts.sort(key=lambda p: -abs(p.delta_us))
    # what the categories do not explain (overlapping exposed kinds, breakdown rounding) is shown, not spread
    resid = increase - sum(p.delta_us for p in parts)
    parts.append(WaterfallPart(key=RESIDUAL, label=part_label(RESIDUAL), delta_us=resid,
                               base_us=b.step_us - _explained(b), run_us=n.step_us - _explained(n),
                               efficiency_points=resid / run.step_us))
    return Waterfall(base_world_size=base.world_size, world_size=run.world_size, base_source=base.source,
                     source=run.source, step_us=run.step_us, ideal_step_us=run.ideal_step_us,
                     increase_us=increase, efficiency=run.efficiency, lost_efficiency=1.0 - run.efficiency,
                     parts=parts)


def _explained(p: StepParts) -> float:
    return sum(p.comm_by_kind.values()) + p.wait_us + p.data_loading_us + p.compute_us + p.idle_us


def _notes(runs: list[ScalingRun], waterfalls: list[Waterfall], mode: str, traits: DialectTraits) -> list[str]:
    notes = []
    if mode == "mixed":
        notes.append("per-rank work is neither constant (weak scaling) nor inversely proportional to the world "
                     "size (strong scaling); the ideal step time scales with per-rank work")
    for r in runs:
        if r.step_cv > 0.25:
            notes.append(f"{r.source}: step times vary by {100 * r.step_cv:.0f}% (CV over {r.steps} step(s) x "
                         f"{r.ranks_analyzed} rank(s)); efficiency is noisy, profile more active steps")
        if r.ranks_analyzed < r.world_size:
            notes.append(f"{r.source}: {r.ranks_analyzed} of {r.world_size} ranks analysed; means are over those")
    for w in waterfalls:
        if w.efficiency > 1.0:
            notes.append(f"{w.world_size} vs {w.base_world_size} ranks: super-linear ({100 * w.efficiency:.0f}%): "
                         "the larger run did more work per second than ideal; the waterfall shows which parts got "
                         "faster (negative bars)" + (" - on CPU usually a noisy or oversubscribed base run"
                                                    if traits.shared_host_cores else ""))
    if traits.shared_host_cores and any(r.world_size > 1 for r in runs):
        notes.append("CPU/gloo: ranks on one host share its cores, so compute inflation is core contention (and "
                     "threads per rank: torchrun sets OMP_NUM_THREADS=1 only for more than one process; set it "
                     "explicitly to compare like for like); gloo collective spans include waiting for the peer")
    return notes
