"""``fsdpdoctor check``: the gate's decision as text (fitted to the console's width, words kept
whole) and as the ``--json`` document."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.text import Text

from fsdpdoctor.results.check import CheckResult
from fsdpdoctor.report.data_quality import lines as data_quality_lines
from fsdpdoctor.report.diff_view import baseline_line, document as comparison_document, fix_lines
from fsdpdoctor.report.terminal import terminal_console


def _line(text: str) -> Text:
    # continuation lines indented under the text, not under the mark; strings from traces are
    # plain text, never markup
    return Text(text, overflow="fold")


def impact_text(f) -> str:
    """The time a fix saves per step; a finding whose time is unknown but whose share is (a hang
    stops the whole step) shows the share; a saving withheld (a starved capture) shows none."""
    if getattr(f, "impact_withheld", None):
        return "saving withheld: re-profile on an idle host"
    if not f.impact_us and f.impact_frac:
        return f"{100 * f.impact_frac:.0f}% of the step"
    return f"{f.impact_us / 1e3:.1f} ms/step"


def render(res: CheckResult, console: Console | None = None) -> None:
    con = console or terminal_console(highlight=False)
    failing = set(map(id, res.failing))
    for f in res.findings:
        mark = "FAIL" if id(f) in failing else "ok  "
        where = f" at {f.source}" if f.source else ""
        cause = f" [caused by {f.caused_by}]" if f.caused_by else ""
        con.print(_line(f"{mark} {f.severity:7s} {f.id}: {f.title} ({impact_text(f)}){where}{cause}"))
    for b in res.budgets:
        con.print(_line(f"FAIL budget  {b.text()}"))
    if res.comparison is not None:
        con.print(_line(baseline_line(res.comparison)))
        for ln in fix_lines(res.comparison):
            con.print(_line(ln))
    for q in data_quality_lines(res.analysis.data_quality):
        con.print(_line(f"data quality: {q}"))
    for n in res.notes:
        con.print(_line(f"note: {n}"))
    against = ""
    if res.comparison is not None:
        # an unattributed slow-down can fail the gate too: say what failed, not always "a regression"
        failed = ("a significant regression" if res.comparison.verdict == "regression"
                  else "a large slow-down it cannot attribute")
        against = f", {failed if res.regressed else 'no regression'} against the baseline"
    con.print(_line(f"fsdpdoctor check: {'passed' if res.passed else 'FAILED'} ({len(res.failing)} finding(s) at "
                    f"or above {res.fail_on}, {len(res.budgets)} budget(s) exceeded{against})"))


def _fields(obj) -> dict:
    """A result's fields by name, in order, its values as they are (slotted dataclasses: no instance dict)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def document(res: CheckResult) -> dict:
    a = res.analysis
    return {"passed": res.passed, "fail_on": res.fail_on, "failing": [f.id for f in res.failing],
            "budgets_exceeded": [b.text() for b in res.budgets],
            "baseline": None if res.comparison is None else comparison_document(res.comparison),
            "data_quality": data_quality_lines(a.data_quality),
            "findings": [_fields(f) | {"evidence": [_fields(e) for e in f.evidence]} for f in res.findings],
            **({"notes": res.notes} if res.notes else {})}


def render_thresholds(thresholds, console: Console | None = None) -> None:
    """The threshold table, one threshold per block: name, default and unit on the first line, what
    it means and where its value comes from wrapped below (a row would not fit 80 columns)."""
    con = console or terminal_console(highlight=False)
    for t in thresholds:
        con.print(Text(f"{t.name} = {t.default:g} {t.unit}".rstrip(), style="bold"))
        con.print(Text(f"  {t.meaning}"))
        con.print(Text(f"  source: {t.source}", style="dim"))
