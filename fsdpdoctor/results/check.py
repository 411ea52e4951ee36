"""The CI gate's decision (``fsdpdoctor check``): the findings that reach the bar on the one severity
scale, the step-share budgets exceeded, the comparison with a baseline. Decided by ``diagnose/check.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.results.analysis import Analysis, Finding, Severity
from fsdpdoctor.results.comparison import Comparison

Budget = Literal["exposed_comm", "data_loading", "idle"]
# a budget -> (the StepBreakdown field it bounds, its name in words)
BUDGETS: dict[Budget, tuple[str, str]] = {
    "exposed_comm": ("exposed_comm_us", "exposed communication"),
    "data_loading": ("data_loading_us", "data loading"),
    "idle": ("idle_us", "idle"),
}


@dataclass
class BudgetBreach:
    budget: Budget
    share: float                     # of the mean step, 0..1
    limit: float                     # the bound it exceeded, 0..1

    def text(self) -> str:
        return f"{BUDGETS[self.budget][1]} {100 * self.share:.1f}% of step > {100 * self.limit:.1f}%"


@dataclass
class CheckResult:
    analysis: Analysis
    fail_on: Severity
    findings: list[Finding]          # the analysis' findings, then those of the run's hang dumps
    failing: list[Finding]           # findings at or above ``fail_on``
    budgets: list[BudgetBreach] = field(default_factory=list)
    comparison: Comparison | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.comparison is not None and self.comparison.regressed

    @property
    def passed(self) -> bool:
        return not (self.failing or self.budgets or self.regressed)
