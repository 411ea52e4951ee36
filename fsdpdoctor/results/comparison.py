"""The comparison of two runs (``fsdpdoctor diff``, ``check --baseline``): per metric the difference
with its confidence interval, per component and per finding what changed, and the verdict. Computed by
``diagnose/compare.py`` with ``diagnose/stats.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.results.analysis import Severity


@dataclass
class Estimate:
    """new - base for one metric, with a ``level`` confidence interval of that difference."""

    metric: str
    base_mean: float
    new_mean: float
    diff: float
    lo: float | None            # None: not enough steps for an interval
    hi: float | None
    n_base: int                 # steps (rank-averaged) on each side
    n_new: int
    sd_base: float | None       # step-to-step standard deviation
    sd_new: float | None
    level: float
    method: str                 # "welch-t", "pooled-t", "identical", "none"
    more_steps: int | None = None   # extra steps per run for this difference to be resolved (inconclusive only)

    @property
    def significant(self) -> bool:
        return self.lo is not None and self.hi is not None and (self.lo > 0 or self.hi < 0)

    @property
    def rel(self) -> float | None:
        return self.diff / self.base_mean if self.base_mean else None

    @property
    def rel_interval(self) -> tuple[float, float] | None:
        if not self.base_mean or self.lo is None or self.hi is None:
            return None
        return self.lo / self.base_mean, self.hi / self.base_mean

    @property
    def half_width(self) -> float | None:
        return None if self.lo is None or self.hi is None else (self.hi - self.lo) / 2


ComparisonVerdict = Literal["no-detectable-change", "regression", "improvement", "environment-slower",
                  "environment-faster", "slower-unattributed", "faster-unattributed"]


FindingStatus = Literal["new", "gone", "worse", "better", "same"]


@dataclass
class ComponentChange:
    name: str                            # "compute", "exposed_comm", "comm[all_reduce]", ...
    time: Estimate                       # µs per step
    share: Estimate                      # share of the step
    in_partition: bool                   # one of the parts that add up to the step
    log_ratio: tuple[float, float] | None = None   # interval of log(new time / base time)
    off_common: bool = False             # share moved beyond noise or time ratio outside the step's (parts only)

    @property
    def ratio(self) -> float | None:
        return self.time.new_mean / self.time.base_mean if self.time.base_mean > 0 else None


@dataclass
class FindingChange:
    id: str
    title: str
    status: FindingStatus                # by the finding's presence, then by its component's share
    significant: bool                    # the component it measures changed beyond noise in that direction
    component: str                       # what the finding measures ("step" when not known)
    base_impact_us: float | None
    new_impact_us: float | None
    base_impact_frac: float | None
    new_impact_frac: float | None
    base_severity: Severity | None
    new_severity: Severity | None
    # the interval of the saving ``analyze BASE`` printed beside base_impact_us (None: it printed none)
    base_impact_interval_us: list[float] | None = None
    base_impact_withheld: str | None = None   # analyze BASE gave no saving, and why (a starved capture)
    time: Estimate | None = None         # the component's time per step
    share: Estimate | None = None        # and its share of the step
    # a new or worse finding that a side effect of the base's fix can bring (diagnose/settings.py
    # SIDE_EFFECT_FINDINGS): which fix, which setting, what it costs, and whether the new run shows it applied
    explained_by: str | None = None

    @property
    def regressed(self) -> bool:
        return self.significant and self.status in ("new", "worse")


FixOutcomeKind = Literal["delivered", "less-than-predicted", "more-than-predicted", "not-delivered", "undecided"]


@dataclass
class FixOutcome:
    """A finding the new run no longer has (or has smaller): the step change its fix was predicted to bring
    beside the step change measured, judged on every such finding together (one step time holds them all)."""

    id: str
    status: FindingStatus                # "gone" or "better"
    # the change of the step ``analyze BASE`` predicted for its fix (negative: faster), read from BASE's finding
    # (its impact, the same number and interval analyze printed); None: within caused_by's
    predicted_us: float | None
    caused_by: str | None                # a consequence: its saving is counted in its root's
    together: list[str]                  # every finding the measured change is shared by (this one included)
    predicted_total_us: float            # their predictions summed (roots only)
    measured_us: float                   # the step's change, new - base
    measured_lo_us: float | None         # and its interval (None: too few steps)
    measured_hi_us: float | None
    level: float
    outcome: FixOutcomeKind
    text: str
    predicted_lo_us: float | None = None   # the interval of predicted_us as analyze BASE printed it
    predicted_hi_us: float | None = None
    remaining_us: float | None = None      # "better": what the finding still costs in NEW


@dataclass
class Comparison:
    base: str
    new: str
    level: float                         # confidence level of every interval
    step: Estimate
    components: list[ComponentChange] = field(default_factory=list)
    findings: list[FindingChange] = field(default_factory=list)
    verdict: ComparisonVerdict = "no-detectable-change"
    job_part_us: float = 0.0             # step-time change carried by parts off the common factor
    job_bound_us: float | None = None    # the most the parts could carry beyond the common factor (None: unknown)
    more_steps: int | None = None        # unattributed: profiled steps per run more that would decide it
    fails_gate: bool = False             # `--fail-on-regression` / `check --baseline` fail on this comparison
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fixes: list[FixOutcome] = field(default_factory=list)   # findings gone or smaller: predicted vs measured

    @property
    def regressed(self) -> bool:
        # a regression, and a large slow-down that these samples cannot attribute to the machine
        return self.fails_gate

    # the figures the first diff showed, kept for readers of the JSON
    @property
    def base_step_us(self) -> float:
        return self.step.base_mean

    @property
    def new_step_us(self) -> float:
        return self.step.new_mean

    @property
    def step_change_frac(self) -> float:
        return self.step.rel or 0.0
