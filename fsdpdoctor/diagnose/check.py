"""The CI gate's decision (``fsdpdoctor check``): which findings reach the bar, which step-share
budgets are exceeded, whether the run regressed against a baseline. Text and JSON are in
report/check.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.diagnose.compare import Comparison
from fsdpdoctor.results import SEVERITIES, Analysis, Finding

Severity = Literal["info", "warning", "error"]
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


def at_or_above(findings: list[Finding], bar: Severity) -> list[Finding]:
    """The findings whose severity reaches ``bar`` on the one severity scale (results.SEVERITIES)."""
    level = SEVERITIES.index(bar)
    # a severity outside the scale counts as the lowest (as info)
    return [f for f in findings if (SEVERITIES.index(f.severity) if f.severity in SEVERITIES else 0) >= level]


def budget_breaches(a: Analysis, limits: dict[Budget, float]) -> list[BudgetBreach]:
    """Each budget (a share of the mean step) the run exceeds; none without an analysed step."""
    m = a.mean
    if not m or not m.duration_us:
        return []
    out = []
    for budget, limit in limits.items():
        share = getattr(m, BUDGETS[budget][0]) / m.duration_us
        if share > limit:
            out.append(BudgetBreach(budget, share, limit))
    return out


def check(a: Analysis, fail_on: Severity = "warning", budgets: dict[Budget, float] | None = None,
          comparison: Comparison | None = None, hang: list[Finding] | None = None,
          notes: list[str] | None = None) -> CheckResult:
    """The gate on ``a``; ``hang``: the findings of the run's hang dumps (diagnose/hang.py), gated
    like any other finding."""
    findings = [*a.findings, *(hang or [])]
    return CheckResult(a, fail_on, findings, at_or_above(findings, fail_on), budget_breaches(a, budgets or {}),
                       comparison, list(notes or []))
