"""What ``fsdpdoctor whatif`` answers: the step predicted after one change, its parts, and the change."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WhatIfPart:
    """One part of the mean step (per rank), now and predicted (microseconds)."""

    key: str            # "compute", "comm:all_reduce", "wait", "data_loading", "idle", "residual"
    label: str
    now_us: float
    then_us: float

    @property
    def change_us(self) -> float:
        return self.then_us - self.now_us


@dataclass
class WhatIf:
    """One question about one run. ``withheld`` says why no number is given (then the step, the change and
    the parts after it are None / empty); a step shorter after the change has a negative ``change_us``."""

    source: str
    question: str                            # "--fix input-bound", "--set num_workers=2", "--world-size 64"
    model: str | None                        # which model answered, None where none covers the question
    step_us: float                           # the measured mean step (per rank)
    predicted_step_us: float | None = None
    change_us: float | None = None
    change_interval_us: list[float] | None = None   # the change's interval (its ``interval_level``)
    interval_level: float | None = None
    interval_basis: str | None = None               # what the interval rests on
    parts: list[WhatIfPart] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    withheld: str | None = None              # why no number: no model, or the model cannot tell here
    finding: str | None = None               # the finding whose model answered (its id), where one did
