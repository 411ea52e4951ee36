"""Console rendering of a ``Comparison`` (``fsdpdoctor diff``, ``check --baseline``).

Every string from the traces goes through ``Text`` (never markup), so finding titles or
paths with brackets cannot break the output.
"""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdpdoctor.results.comparison import Comparison, Estimate
from fsdpdoctor.report.terminal import terminal_console

VERDICT_TEXT = {
    "no-detectable-change": ("no detectable change", "green"),
    "regression": ("REGRESSION of the job", "bold red"),
    "improvement": ("improvement", "green"),
    "environment-slower": ("environment changed (slower machine), not a regression of the job", "yellow"),
    "environment-faster": ("environment changed (faster machine), not an improvement of the job", "yellow"),
    "slower-unattributed": ("SLOWER, cause not attributable (job or machine?)", "bold red"),
    "faster-unattributed": ("faster, cause not attributable (job or machine?)", "yellow"),
}
_FIX_STYLE = {"delivered": "green", "more-than-predicted": "green", "less-than-predicted": "yellow",
              "not-delivered": "red", "undecided": "dim"}
_STATUS_STYLE = {"new": "red", "worse": "red", "better": "green", "gone": "green", "same": "dim"}


def change_text(e: Estimate, scale: float = 1e3, unit: str = "ms") -> str:
    """'+1.2 ms (+3.4%, 95% CI -0.5..+2.9 ms)' or 'within noise' forms."""
    rel = f", {100 * e.rel:+.1f}%" if e.rel is not None else ""
    if e.lo is None:
        return f"{e.diff / scale:+.1f} {unit}{rel} (too few steps for an interval)"
    ci = f"{100 * e.level:.0f}% CI {e.lo / scale:+.1f}..{e.hi / scale:+.1f} {unit}"
    return f"{e.diff / scale:+.1f} {unit}{rel} ({ci})"


# the mark of a change beyond noise, joined to its figure: a cell that wraps at its spaces never leaves
# the mark alone on a row
_MARK = {True: "*", False: ""}


def share_text(e: Estimate | None) -> str:
    if e is None:
        return "-"
    return f"{100 * e.base_mean:.1f}% -> {100 * e.new_mean:.1f}%"


def render(c: Comparison, console: Console | None = None) -> None:
    con = console or terminal_console()
    s = c.step
    label, style = VERDICT_TEXT[c.verdict]
    head = Text()
    head.append(f"step time {s.base_mean / 1e3:.1f} ms -> {s.new_mean / 1e3:.1f} ms: ")
    head.append(change_text(s))
    head.append(f"  [{s.n_base} vs {s.n_new} steps, ranks averaged per step]", style="dim")
    con.print(head)
    verdict = Text("verdict: ")
    verdict.append(label, style=style)
    con.print(verdict)
    for r in c.reasons:
        con.print(Text(f"  - {r}"))
    if s.method != "identical" and s.half_width is not None and not s.significant:
        con.print(Text(f"  smallest step-time change these samples can resolve: about "
                       f"±{s.half_width / 1e3:.1f} ms ({100 * s.half_width / s.base_mean:.1f}%)"
                       if s.base_mean else "", style="dim"))
    t = Table(title=f"Components, ms per step ({100 * c.level:.0f}% CI; * = beyond noise)", title_justify="left")
    for col in ("component", "base", "new", "change [CI]", "%", "share of step"):
        # a component's name never wraps ("comm[all reduce]" split over two rows reads as two rows)
        t.add_column(col, justify="left" if col == "component" else "right", no_wrap=col == "component")
    for comp in c.components:
        e = comp.time
        ci = "" if e.lo is None else f" [{e.lo / 1e3:+.1f},{e.hi / 1e3:+.1f}]"
        t.add_row(Text(comp.name.replace("_", " ")), f"{e.base_mean / 1e3:.1f}", f"{e.new_mean / 1e3:.1f}",
                  Text(f"{e.diff / 1e3:+.1f}{ci}" + _MARK[e.significant]),
                  "-" if e.rel is None else f"{100 * e.rel:+.0f}%",
                  Text(share_text(comp.share) + _MARK[comp.share.significant]))
    con.print(t)
    if not c.findings:
        con.print("no findings in either run")
    else:
        ft = Table(title="Findings, judged on the share of the step they are about", title_justify="left")
        for col in ("status", "finding", "about", "base", "new", "share of step"):
            # a finding's id is a name: whole (the status and the component wrap at their spaces instead)
            ft.add_column(col, justify="right" if col in ("base", "new") else "left", no_wrap=col == "finding")
        for f in c.findings:
            status = Text(f.status, style=_STATUS_STYLE[f.status])
            if f.status != "same" and not f.significant:
                guard = f.share if f.share is not None else f.time
                more = guard.more_steps if guard is not None else None
                status.append(" (noise" + (f"; ~{more} more steps" if more else "") + ")", style="dim")
            ft.add_row(status, Text(f.id), Text(f.component.replace("_", " ")),
                       "-" if f.base_impact_us is None else f"{f.base_impact_us / 1e3:.1f}",
                       "-" if f.new_impact_us is None else f"{f.new_impact_us / 1e3:.1f}",
                       Text(share_text(f.share) + _MARK[f.share is not None and f.share.significant]))
        con.print(ft)
        for ln in side_effect_lines(c):
            con.print(Text(ln, style="yellow"))
    if c.fixes:
        con.print(Text("Fixes: predicted saving against the measured change of the step", style="bold"))
        for fx in c.fixes:
            con.print(Text(f"  {fx.text}", style=_FIX_STYLE[fx.outcome]))
    for n in c.notes:
        con.print(Text(f"note: {n}", style="dim"))


def baseline_line(c: Comparison) -> str:
    """One plain line for ``check --baseline``: FAIL/ok, the verdict, the step-time change and why."""
    label, _ = VERDICT_TEXT[c.verdict]
    mark = "FAIL" if c.regressed else "ok  "
    why = f": {c.reasons[0]}" if c.reasons else ""
    # an unattributed slow-down fails or passes by its size: say which, after why it is unattributed
    gate = next((r for r in c.reasons[1:] if r.startswith(("fails the gate", "passes the gate"))), None)
    return f"{mark} baseline {label}; step time {change_text(c.step)}{why}" + (f"; {gate}" if gate else "")


def fix_lines(c: Comparison) -> list[str]:
    """One plain line per finding gone or smaller: its predicted saving beside the step's measured change;
    then one per finding new or worse that a side effect of the base's fix can bring."""
    return [f"fixed {fx.text}" for fx in c.fixes] + side_effect_lines(c)


def side_effect_lines(c: Comparison) -> list[str]:
    """A finding new or worse in the new run, with the base's fix whose side effect can bring it."""
    return [f"{f.status} {f.id}: {f.explained_by}" for f in c.findings if f.explained_by]


def document(c: Comparison) -> dict:
    """``diff --json`` (and ``check --baseline``'s "baseline"): the comparison's fields, each estimate
    with its significance and relative interval, the verdict's derived figures."""
    d = dataclasses.asdict(c)
    d |= {"regressed": c.regressed, "base_step_us": c.base_step_us, "new_step_us": c.new_step_us,
          "step_change_frac": c.step_change_frac}
    _add_estimate_props(d["step"], c.step)
    for dc, comp in zip(d["components"], c.components):
        _add_estimate_props(dc["time"], comp.time)
        _add_estimate_props(dc["share"], comp.share)
        dc["ratio"] = comp.ratio
    for df, f in zip(d["findings"], c.findings):
        for k in ("time", "share"):
            if getattr(f, k) is not None:
                _add_estimate_props(df[k], getattr(f, k))
        df["regressed"] = f.regressed
    return d


def _add_estimate_props(d: dict, e: Estimate) -> None:
    ri = e.rel_interval
    d |= {"significant": e.significant, "rel": e.rel, "rel_lo": ri[0] if ri else None,
          "rel_hi": ri[1] if ri else None}
