"""``fsdpdoctor reference list``: the scenarios as a table that fits the console's width (the
names and wrappings whole, what each injects wrapped at spaces)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from fsdpdoctor.report.terminal import terminal_console


def render(scenarios: dict[str, dict], console: Console | None = None) -> None:
    con = console or terminal_console(highlight=False)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    t.add_column("scenario", no_wrap=True)
    t.add_column("wrap", no_wrap=True)
    t.add_column("injects", overflow="fold")   # a call longer than the column folds, never "…"
    for name, s in scenarios.items():
        t.add_row(Text(name), Text(str(s["wrap"])), Text(str(s["injects"])))  # plain text, never markup
    con.print(t)
