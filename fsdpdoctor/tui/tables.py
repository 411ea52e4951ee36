"""Per-rank and per-collective tables."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label

from fsdpdoctor.report.format import straggler_rank
from fsdpdoctor.report.format import num, size
from fsdpdoctor.results import Analysis
from fsdpdoctor.tui.palette import Palette


class VimTable(DataTable):
    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)


def _r(value: str, style=None) -> Text:
    return Text(value, style=style or "", justify="right")


class RanksView(Vertical):
    """All ranks (mean per step), or the steps of one rank when a rank is picked."""

    def compose(self) -> ComposeResult:
        yield Label("", id="ranks-caption")
        yield VimTable(id="ranks-table")

    def show(self, a: Analysis, rank: int | None) -> None:
        pal = Palette.of(self.app)
        table = self.query_one(VimTable)
        table.clear(columns=True)
        caption = self.query_one("#ranks-caption", Label)
        strag = straggler_rank(a)
        if rank is None:
            for col in ("rank", "step ms", "compute", "exposed", "loader", "idle", "wait"):
                table.add_column(col, key=col)
            for r in a.ranks:
                m = r.mean
                if not m:
                    continue
                slow = r.rank == strag
                style = pal.severity("warning") if slow else None
                table.add_row(_r(f"{r.rank}{' ◀ slow' if slow else ''}", style),
                              *(_r(num(v)) for v in (m.duration_us, m.compute_us, m.exposed_comm_us,
                                                     m.data_loader_us, m.idle_us)),
                              _r(num(r.wait_us), pal.severity("warning") if r.wait_us and not slow else None),
                              key=str(r.rank))
            note = "mean per step (ms); wait: waiting for slower ranks"
            if strag is not None:
                note += "; ◀ slowest"
            caption.update(Text(note, style=pal.muted))
            return
        summary = next((r for r in a.ranks if r.rank == rank), None)
        for col in ("step", "time ms", "compute", "optim", "exposed", "overlap", "data", "idle"):
            table.add_column(col, key=col)
        if summary is None:
            caption.update(Text(f"rank {rank} is not in this analysis", style=pal.severity("error")))
            return
        for s in summary.steps:
            table.add_row(_r(str(s.step)), *(_r(num(v)) for v in (
                s.duration_us, s.compute_us, s.optimizer_us, s.exposed_comm_us, s.overlapped_comm_us,
                s.data_loading_us, s.idle_us)), key=f"{s.step}")
        slow = " (slowest rank)" if rank == strag else ""
        caption.update(Text(f"rank {rank}{slow}: per step (ms); r: other ranks",
                            style=pal.muted))


class CollectivesView(Vertical):
    def compose(self) -> ComposeResult:
        yield Label("", id="coll-caption")
        yield VimTable(id="coll-table")

    def show(self, a: Analysis) -> None:
        pal = Palette.of(self.app)
        table = self.query_one(VimTable)
        table.clear(columns=True)
        for col in ("kind", "phase", "count", "ms/step", "exposed", "mean size", "busbw GB/s"):
            table.add_column(col, key=col)
        for i, c in enumerate(sorted(a.collectives, key=lambda c: -c.total_us)):
            exposed_style = pal.severity("warning") if c.total_us and c.exposed_us > 0.5 * c.total_us else None
            table.add_row(c.kind, c.phase, _r(str(c.count)), _r(num(c.busy_per_step_us)),
                          _r(num(c.exposed_per_step_us), exposed_style), _r(size(c.mean_size_bytes)),
                          _r(f"{c.busbw_gbps:.1f}" if c.busbw_gbps is not None else "-"), key=str(i))
        caption = self.query_one("#coll-caption", Label)
        if not a.collectives:
            caption.update(Text("no collectives in the analysed steps", style=pal.muted))
        else:
            caption.update(Text("mean per rank and step (calls running together share their time), most time first",
                                style=pal.muted))
