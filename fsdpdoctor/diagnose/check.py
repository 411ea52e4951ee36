"""The CI gate's decision (``fsdpdoctor check``): which findings reach the bar, which step-share
budgets are exceeded, whether the run regressed against a baseline. Text and JSON are in
report/check.py."""

from __future__ import annotations

from fsdpdoctor.results import SEVERITIES, Analysis, Finding, Severity
from fsdpdoctor.results.check import BUDGETS, Budget, BudgetBreach, CheckResult
from fsdpdoctor.results.comparison import Comparison


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
