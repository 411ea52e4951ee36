"""Per-step timeline: one bar per (rank, step), split into categories, scaled to the longest step."""

from __future__ import annotations

import statistics

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label

from fsdpdoctor.report.format import ms
from fsdpdoctor.results import Analysis
from fsdpdoctor.tui.palette import Palette
from fsdpdoctor.tui.tables import VimTable

SLOW = 1.2  # a step this much above the median of the rows shown is marked


class TimelineView(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.analysis: Analysis | None = None
        self.rank: int | None = None
        self._width = 0

    def compose(self) -> ComposeResult:
        yield Label("", id="timeline-legend")
        yield VimTable(id="timeline-table")

    def show(self, a: Analysis, rank: int | None) -> None:
        self.analysis, self.rank = a, rank
        self._draw()

    def on_resize(self) -> None:
        if self.analysis is not None and self.size.width != self._width:
            self._draw()

    def rows(self):
        a = self.analysis
        out = []
        for r in a.ranks if a else []:
            if self.rank is not None and r.rank != self.rank:
                continue
            out.extend(r.steps)
        return out

    def _draw(self) -> None:
        pal = Palette.of(self.app)
        self._width = self.size.width
        table = self.query_one(VimTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        rows = self.rows()
        longest = max((s.duration_us for s in rows), default=0.0)
        median = statistics.median([s.duration_us for s in rows]) if rows else 0.0
        fixed = (5, 5, 10)
        # cell padding is 1 each side; keep 2 for a vertical scrollbar
        width = max(10, (self._width or 80) - sum(fixed) - 2 * (len(fixed) + 1) - 2)
        table.add_column("rank", width=fixed[0], key="rank")
        table.add_column("step", width=fixed[1], key="step")
        table.add_column("time", width=fixed[2], key="time")
        table.add_column(f"0 … {ms(longest)}", width=width, key="bar")
        for s in rows:
            slow = median and s.duration_us > SLOW * median
            t = Text(f"{ms(s.duration_us)}{'!' if slow else ' '}", justify="right",
                     style=pal.severity("warning") if slow else "")
            table.add_row(Text(str(s.rank), justify="right"), Text(str(s.step), justify="right"), t,
                          pal.bar(s, width, longest), key=f"{s.rank}:{s.step}")
        if rows:
            table.move_cursor(row=min(max(cursor, 0), len(rows) - 1), animate=False)
        legend = pal.legend()
        who = f"rank {self.rank}" if self.rank is not None else "all ranks"
        legend.append(f"  {who}", style=pal.muted)
        if any(median and s.duration_us > SLOW * median for s in rows):
            legend.append(f"; ! >{SLOW:.1f}× median", style=pal.severity("warning"))
        self.query_one("#timeline-legend", Label).update(legend)
