"""The one table of diagnosis thresholds, with where each default comes from.

Override with ``--threshold name=value`` (a trailing % divides by 100) or
``--config FILE`` (JSON or TOML: ``{"thresholds": {"name": value}}`` or a flat
mapping).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.io import read_text
from fsdpdoctor.trace.limits import parse_bounded


@dataclass(frozen=True, slots=True)
class Threshold:
    """One tunable bar of the rules: its default, unit, meaning and where the value comes from."""

    name: str
    default: float
    unit: str
    meaning: str
    source: str


THRESHOLDS: list[Threshold] = [
    # one severity scale for every rule: the time a fix would save, as a share of the step, times the
    # confidence of the diagnosis. A rule may raise a wrong configuration to "warning", never to "error".
    Threshold("severity_warning_frac", 0.05, "share of step (x confidence)",
              "saving at or above which a finding is a warning (below: info)",
              "XProf input-pipeline analyzer's 'moderately' band (5%); below it a fix is within the step-to-step "
              "noise of the healthy runs (docs/noise-study.md: step time CV 2-16% on shared CPU cores)"),
    Threshold("severity_error_frac", 0.25, "share of step (x confidence)",
              "saving at or above which a finding is an error",
              "a quarter of every step: a fix pays back 1.33x throughput; above XProf's 'highly' band (20%)"),
    Threshold("impact_confidence", 0.90, "probability (two-sided interval)",
              "a finding is a warning or an error only when the lower end of this interval of its saving (the "
              "t-interval of the mean of the per-step values it rests on) earns that band; the interval is shown "
              "with the impact",
              "a one-sided 95 % lower bound: a CI gate that fails 1 healthy run in 20 on noise alone at most per "
              "finding; docs/noise-study.md: healthy runs beside a CPU hog raise no warning with it"),
    Threshold("exposed_comm_frac", 0.10, "share of step",
              "exposed (not overlapped) communication per step above which it is a finding, where collectives run "
              "on their own stream (traits.async_collectives)",
              "rule of thumb: HTA's comm/comp overlap guidance; below 10% of step, other costs dominate"),
    Threshold("exposed_comm_frac_sync", 0.50, "share of step",
              "the same where collectives block the host and ranks share cores (CPU/gloo)",
              "docs/noise-study.md: 26 healthy 2-rank gloo runs (DDP, FSDP1, FSDP2) expose 0.03-0.40 of the step "
              "(FSDP: every collective blocks the host by design); injected faults sit inside that range, so "
              "only more than half of the step is reported"),
    Threshold("overlap_low_frac", 0.50, "share of comm", "comm/compute overlap below which 'low overlap' is reported "
              "(GPU traces; with exposed comm above exposed_comm_frac)", "HTA get_comm_comp_overlap; our choice of 50%"),
    Threshold("input_bound_frac", 0.05, "share of step", "data loading not hidden by compute: moderately input-bound",
              "XProf/TensorBoard input-pipeline analyzer: >5% moderately input-bound"),
    Threshold("input_bound_high_frac", 0.20, "share of step", "highly input-bound",
              "XProf/TensorBoard input-pipeline analyzer: >20% highly input-bound"),
    Threshold("straggler_consistency", 0.60, "share of steps", "the same rank must be the last to arrive in this "
              "share of steps", "most steps: with N ranks a healthy rank is last 1/N of steps (0.5 at N=2); the "
              "chance of the observed count is reported and sets the confidence"),
    Threshold("straggler_noise_z", 3.0, "robust standard deviations",
              "the others' wait for the last rank (median over its steps) must exceed this many times the run's own "
              "step-to-step noise (1.4826 x MAD of consecutive step-time differences / sqrt 2)",
              "three standard deviations; docs/noise-study.md: 26 healthy runs 0.0-2.4 (and 3.5 for a real "
              "machine-made straggler at load 9), injected 30-200 ms sleeps and 60-250 ms extra matmul 3.2-269 "
              "(one at 1.2, caught by straggler_chance)"),
    Threshold("straggler_chance", 0.25, "probability",
              "a wait between one and straggler_noise_z noise deviations still makes a straggler when the "
              "same rank is last this unlikely by chance and its own work holds the wait (a frame only it runs, "
              "or its excess sleep, loader, host-sync time or more work: facts.own_work)",
              "two independent lines of evidence; 0.25 admits 3 of 3 steps at 2 ranks (the README's active=3 "
              "schedule), not 4 of 5 (0.38); docs/noise-study.md: none of 26 healthy runs has an own-work frame "
              "(the own-time causes were added after that study: no bundled, CUDA or public run changed)"),
    Threshold("straggler_same_work_shared_ratio", 1.5, "ratio of compute time",
              "where ranks share host cores (traits.shared_host_cores), a rank slower at the same work (not more "
              "work, not its own frames) is at most info unless its compute per step exceeds the other ranks' "
              "median by this ratio: below it, another process taking its core does the same",
              "docs/noise-study.md: 20 healthy 2-rank runs beside two CPU hogs, the slower rank computed the same "
              "work 1.00-1.42x as long as the other (median 1.07)"),
    Threshold("straggler_min_frac", 0.05, "share of step", "the wait must also be material",
              "the warning band of the severity scale (severity_warning_frac)"),
    Threshold("periodic_stall_frac", 0.05, "share of step",
              "a stall every N steps on one rank, averaged over every step, worth a finding",
              "as straggler_min_frac: a wait of 5 % of the step is material"),
    Threshold("metric_sync_frac", 0.05, "share of step",
              "own time per step of the collectives that sync metrics or logged values (analysis/issuers.py: a "
              "metrics library, user code outside forward/backward/optimizer) worth a finding",
              "the warning band of the severity scale (severity_warning_frac): a per-step sync that costs less is "
              "within the step-to-step noise of healthy runs (docs/noise-study.md) and may be a chosen live value"),
    Threshold("host_sync_per_step", 1, "calls per step", "user-code host syncs (.item(), synchronize) per step",
              "PyTorch performance tuning guide: avoid unnecessary CPU-GPU synchronization"),
    Threshold("small_message_bytes", 1 << 20, "bytes", "messages below this are latency-bound",
              "nccl-tests curves: bus bandwidth saturates only in the MB range"),
    Threshold("latency_bound_per_step", 20, "calls per step", "small collectives per step (per rank) that make "
              "a latency-bound pattern", "our choice; bucket/coalesce above this"),
    Threshold("low_busbw_gbps", 20.0, "GB/s", "bus bandwidth of large (>= 16 MB) GPU collectives below which it "
              "is reported", "nccl-tests on 25 GB/s (200 Gb/s) IB and much faster NVLink"),
    Threshold("ddp_tiny_buckets_per_backward", 8, "all-reduces per backward", "many small DDP buckets",
              "DDP default bucket_cap_mb=25 gives a few buckets for models under 1B params"),
    Threshold("ddp_tiny_bucket_bytes", 2e6, "bytes", "mean bucket size below which buckets are 'tiny'",
              "DDP's first bucket is 1 MB by design; 25 MB default afterwards"),
    Threshold("ddp_single_bucket_overlap", 0.10, "share of comm", "overlap below which one bucket per backward means "
              "no overlap", "bundled 2-rank DDP runs: one 1000 MB bucket (ddp_one_bucket) overlaps 0.02, default buckets 0.42-0.72 "
              "(ddp_default, dataloader_fixed, host_sync, ddp_tiny_buckets)"),
    Threshold("forward_exposed_frac", 0.02, "share of step", "exposed forward all-gather share above which "
              "forward prefetch (when off) is suggested", "our choice: below 2% of a step the saving is within "
              "step-to-step noise"),
    Threshold("gpu_idle_frac", 0.10, "share of step", "GPU idle time a host-side fix could give back (launch, "
              "syncs, loading, collective waits, profiler; not the unexplained rest) above which gpu-idle fires",
              "same bar as exposed_comm_frac: below a tenth of the step, other costs dominate"),
    Threshold("launch_queue_empty_frac", 0.50, "share of kernels", "kernels that start within 50 us of their "
              "launch call (empty queue) above which the job is host-bound", "by definition: when most kernels "
              "find nothing queued ahead of them, the GPU runs work as fast as the host produces it"),
    Threshold("recompute_frac", 0.02, "share of step", "activation recompute time per step above which it is "
              "reported (info)", "our choice, as forward_exposed_frac: below 2% the cost is within step noise"),
    Threshold("recompute_warn_frac", 0.25, "share of step", "recompute above which it is a warning",
              "recomputing the whole forward costs one extra forward, about 1/4 of a step whose backward takes "
              "twice the forward (Chen et al. 2016, sublinear memory cost): more means recompute beyond it"),
    Threshold("offload_exposed_frac", 0.05, "share of step", "host<->device copy time under no kernel above which "
              "offload-exposed fires", "XProf input-pipeline bands: 5% of the step is a moderate stall"),
    Threshold("scaling_efficiency_low", 0.80, "ratio", "scaling efficiency below which it is a finding",
              "common practice: data-parallel scaling above 80-90% is expected"),
    Threshold("diff_confidence", 0.95, "probability", "confidence level of the intervals `diff` and "
              "`check --baseline` put on a change (per-step samples, Welch t): a change counts only when its "
              "interval excludes zero", "statistical convention (95%); a gate at 95% fails about 1 in 20 "
              "comparisons of identical runs per metric it tests, so the gate tests few metrics"),
    Threshold("diff_job_share", 0.50, "share of the change", "part of a significant step-time change that parts "
              "of the step off the common factor must carry for it to be the job's; the environment (contention, "
              "clocks) is named only when no part is off it, no finding appeared or grew, and all parts together "
              "could carry less than this much (the far ends of their share intervals)",
              "meaning: the majority of the change; a uniform slow-down has no excess, a one-component "
              "regression puts all of it in that component"),
    Threshold("diff_large_slowdown", 0.25, "share of the step", "a significant slow-down that `diff` cannot "
              "attribute (job or machine?) fails the gate from this size on; smaller ones pass with the steps "
              "that would decide them",
              "the error band (severity_error_frac): a quarter of the step is what an error-level finding costs"),
    Threshold("diff_one_step_noise", 0.96, "share of the step", "with one profiled step per run there is no "
              "interval: a slow-down beyond this is 'slower-unattributed' and fails the gate",
              "docs/noise-study.md: healthy step-time CV up to 0.34; two single steps differ by up to "
              "2 x sqrt(2) x 0.34 = 0.96 of the step at two standard deviations"),
    Threshold("fix_saving_tolerance", 0.35, "share of the prediction", "`diff` / `check --baseline`: a fix "
              "whose measured step change is within this share of the saving its finding predicted delivered it "
              "(also when the prediction lies in the step change's interval)",
              "the calibration tolerance of docs/impact.md (benchmarks/calibrate.py): predicted against measured "
              "savings of fault/fix pairs"),
    Threshold("hang_busy_runnable_share", 0.50, "share of the window", "`fsdpdoctor hang`: a stalled rank's main "
              "thread runnable (on a CPU or in the run queue) this share of the 0.2 s sampling window is spinning (a "
              "busy loop); below it, it is blocked", "a spinning thread is runnable all the time however loaded the "
              "machine (0.999 measured on 2 cores shared by 7 jobs), a waiting one almost never (0.03 with a 10 ms "
              "sleep loop); half separates them"),
]


@dataclass(frozen=True, slots=True)
class PredictionError:
    """How far a rule's predicted savings fell from the measured ones on the calibration's fault/fix pairs:
    the root mean square of (M - P) / step over its pairs, "*" pooled over every pair (for a rule with fewer
    than 3 pairs, or none). What a prediction's interval rests on besides the step noise (diagnose/prediction.py)."""

    rule: str
    error_frac: float       # share of the fault capture's step
    pairs: int
    source: str


# benchmarks/residuals.py benchmarks/calibration.json derives these rows (tests/test_prediction.py checks that
# they are what the record gives); the pairs are docs/impact.md's, the quiet run and the runs beside CPU hogs
PREDICTION_ERRORS: list[PredictionError] = [
    PredictionError("*", 0.0468, 12, "docs/impact.md: the 12 CPU pairs of the quiet run (load 1.5-2.2, 2 cores), "
                    "P against M as a share of the fault capture's step; no rule has 3 pairs of its own yet"),
]
ERROR_BY_RULE = {e.rule: e for e in PREDICTION_ERRORS}

THRESHOLDS += [
    Threshold("prediction_wait_k", 0.1691, "share of step per share of window",
              "how much a prediction's error grows with the contention of the profiled window (the share of it the "
              "ranks' training threads waited for a CPU, w): error^2 = error_frac^2 + (k w)^2",
              "benchmarks/residuals.py: least squares over the 6 calibration pairs timed beside 2 CPU hogs on 2 "
              "cores (calibrate.py --hog 2; wait 0.45-0.80), their residuals against the quiet error"),
    Threshold("prediction_wait_calibrated", 0.801, "share of window",
              "the largest contention at which pairs were calibrated: beyond it a finding gives no saving, only "
              "the reason (re-profile on an idle host)",
              "benchmarks/residuals.py: the largest wait share of a fault capture in benchmarks/calibration.json "
              "(gru_grad_accum_no_sync beside 2 hogs)"),
]

BY_NAME = {t.name: t for t in THRESHOLDS}


def defaults() -> dict[str, float]:
    return {t.name: t.default for t in THRESHOLDS}


def resolve(overrides: dict[str, float] | None) -> dict[str, float]:
    values = defaults()
    for k, v in (overrides or {}).items():
        if k not in BY_NAME:
            raise InputError(None, f"unknown threshold {k!r} (known: {', '.join(sorted(BY_NAME))})")
        values[k] = _within_meaning(BY_NAME[k], v)
    return values


def _within_meaning(t: Threshold, v) -> float:
    """``v`` as ``t``'s value, or an InputError where no value of its unit reads so: a bar is a finite
    number above 0 (a rule divides by it or scales by it: 0 or NaN made every comparison false or raised
    ZeroDivisionError), a share at most 1, a probability below 1 (a 100 % interval is infinite)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(None, f"threshold {t.name}: {v!r} is not a number") from None
    top, top_said = ((1.0, "at most 1") if t.unit.startswith("share") else
                     (math.nextafter(1.0, 0.0), "below 1") if t.unit.startswith("probability") else
                     (math.inf, "finite"))
    if not (math.isfinite(x) and 0 < x <= top):
        raise InputError(None, f"threshold {t.name} = {v!r}: a {t.unit} above 0 and {top_said}")
    return x


def parse_assignment(item: str) -> tuple[str, float]:
    if "=" not in item:
        raise InputError(None, f"--threshold expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    k, v = k.strip(), v.strip()
    try:
        value = float(v[:-1]) / 100 if v.endswith("%") else float(v)
    except ValueError:
        raise InputError(None, f"--threshold {k}: {v!r} is not a number") from None
    if k not in BY_NAME:
        raise InputError(None, f"unknown threshold {k!r} (known: {', '.join(sorted(BY_NAME))})")
    return k, value


def load_overrides(path: str | Path) -> dict[str, float]:
    path = Path(path)
    text = read_text(path)
    try:
        if path.suffix == ".toml":
            import tomllib

            data = parse_bounded(tomllib.loads, text, path, "config", toml=True)
        else:
            data = parse_bounded(json.loads, text, path, "config")
    except ValueError as exc:
        raise InputError(path, f"cannot parse config ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(path, "config must be a mapping of threshold names to numbers")
    data = data.get("thresholds", data)
    out = {}
    for k, v in data.items():
        if k not in BY_NAME or not isinstance(v, (int, float)):
            raise InputError(path, f"bad threshold entry {k!r}: {v!r}")
        out[k] = float(v)
    return out
