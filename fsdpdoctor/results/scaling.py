"""The scaling report (``fsdpdoctor scaling``): each run, and per larger run a waterfall of where the
step time beyond the ideal went. Measured by ``analysis/scaling.py``, judged by ``diagnose/scaling.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.results.analysis import DialectTraits, Finding

ScalingMode = Literal["weak", "strong", "mixed"]

# waterfall part keys that are not a collective kind ("comm:<kind>" for those)
WAIT, DATA, COMPUTE, IDLE, RESIDUAL = "wait", "data_loading", "compute", "idle", "residual"


@dataclass
class StepParts:
    """Mean per-rank step split used by the waterfall (microseconds).

    ``sum(comm_by_kind) + wait_us + data_loading_us + compute_us + idle_us``
    equals ``step_us`` up to the breakdown's own rounding and to per-kind
    exposed times that overlap each other (several kinds exposed at once).
    """

    step_us: float
    compute_us: float                   # compute + optimizer
    comm_by_kind: dict[str, float]      # exposed communication per kind, net of waiting
    wait_us: float                      # exposed time spent waiting for slower ranks
    data_loading_us: float
    idle_us: float
    exposed_comm_us: float              # union of exposed communication (wait included)


@dataclass
class ScalingRun:
    """One run folder in the comparison."""

    source: str
    world_size: int
    ranks_analyzed: int
    steps: int                          # analysed steps per rank (max over ranks)
    unit: str                           # "samples" or "tokens"
    work_per_step: float                # global (all ranks) per optimizer step
    work_per_rank: float                # work_per_step / world_size
    work_source: str                    # "manifest" or "flag"
    step_us: float                      # mean step time (per rank mean, then mean over ranks)
    step_cv: float                      # coefficient of variation of the step times (all ranks, steps)
    throughput: float                   # global work per second
    efficiency: float                   # vs the base run (1.0 for the base)
    ideal_step_us: float                # base step time scaled by per-rank work
    parts: StepParts


@dataclass
class WaterfallPart:
    key: str                            # "comm:<kind>", "wait", "data_loading", "compute", "idle", "residual"
    label: str
    delta_us: float                     # part_N - part_base * work ratio (per step, per rank)
    base_us: float                      # the base's time in this part (unscaled)
    run_us: float                       # the larger run's time in this part
    efficiency_points: float            # delta_us / run step time: share of the lost efficiency


@dataclass
class Waterfall:
    """Where the step-time increase of ``world_size`` vs the base went; parts sum to ``increase_us``."""

    base_world_size: int
    world_size: int
    base_source: str
    source: str
    step_us: float
    ideal_step_us: float
    increase_us: float                  # step_us - ideal_step_us
    efficiency: float
    lost_efficiency: float              # 1 - efficiency == sum of parts' efficiency_points
    parts: list[WaterfallPart] = field(default_factory=list)   # largest |delta| first, residual last

    @property
    def biggest(self) -> WaterfallPart | None:
        """The largest positive (slowing) part other than the residual."""
        pos = [p for p in self.parts if p.key != RESIDUAL and p.delta_us > 0]
        return max(pos, key=lambda p: p.delta_us) if pos else None


@dataclass
class ScalingReport:
    mode: ScalingMode                   # "mixed": per-rank work neither constant nor 1/N
    unit: str
    base_world_size: int
    runs: list[ScalingRun]              # sorted by world size, base first
    waterfalls: list[Waterfall]         # one per non-base run
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dialect: str = "cpu"                # "cpu" or "gpu" (of the base run), for display
    traits: DialectTraits = field(default_factory=DialectTraits)   # what the base run's dialect can show
