"""``fsdpdoctor whatif``: the step now and predicted, part by part, the change with its interval, and what
the prediction assumes; or, where no model answers, why no number is given."""

from __future__ import annotations

import dataclasses

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdpdoctor.results.whatif import WhatIf
from fsdpdoctor.report.terminal import terminal_console


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.1f}"


def _signed(us: float) -> str:
    return f"{round(us / 1e3, 1) + 0.0:+.1f}"   # + 0.0: no "-0.0"


def _change(w: WhatIf) -> str:
    if w.change_us is None:
        return ""
    text = f"{_signed(w.change_us)} ms"
    if w.change_interval_us:
        lo, hi = w.change_interval_us
        text += f" ({w.interval_level:.0%} interval {_signed(lo)} to {_signed(hi)} ms)"
    else:
        text += " (no interval: nothing to rest one on)" if w.change_us else ""
    return text


def render(w: WhatIf, console: Console | None = None) -> None:
    con = console or terminal_console(highlight=False)
    con.print(Text(f"whatif {w.source}: {w.question}", style="bold"))
    if w.withheld:
        con.print(Text(f"step now {_ms(w.step_us)} ms; no prediction: {w.withheld}"))
        return
    con.print(Text(f"model: {w.model}"))
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1))
    t.add_column("part (mean per rank and step)", no_wrap=True)
    for col in ("now ms", "predicted ms", "change ms"):
        t.add_column(col, justify="right", no_wrap=True)
    for p in w.parts:
        t.add_row(p.label, _ms(p.now_us), _ms(p.then_us), _signed(p.change_us))
    t.add_row(Text("step", style="bold"), _ms(w.step_us), _ms(w.predicted_step_us),
              _signed(w.change_us or 0.0))
    con.print(t)
    con.print(Text(f"change: {_change(w)}"))
    if w.interval_basis:
        con.print(Text(f"interval: {w.interval_basis}"))
    for a in w.assumptions:
        con.print(Text(f"assumes: {a}"))


def document(w: WhatIf) -> dict:
    d = dataclasses.asdict(w)
    for p, row in zip(w.parts, d["parts"]):
        row["change_us"] = p.change_us
    return d
