"""The hang TUI: ``fsdpdoctor hang RUN --tui``.

Shows a ready :class:`~fsdpdoctor.results.hang.HangReport` (the verb reads the dumps first, so
bad input is a one-line error, exit 2): the verdict (cause, ranks, frame with its source line,
fix), a table of ranks and of the process groups where they diverge, and for the selected rank
what it was doing (its innermost frame, its last collective, its note).

Keys: ↑↓ j k pick a rank, tab next pane, ? help, t light/dark, q quit.
"""

from __future__ import annotations

from rich.markup import escape
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Label, Static

from fsdpdoctor.results.hang import HangReport
from fsdpdoctor.report.hang import frame_text, rank_doing, step_text
from fsdpdoctor.tui.app import DARK, LIGHT
from fsdpdoctor.tui.screens import HelpScreen
from fsdpdoctor.tui.visible import VisibleTextApp

HELP = """\
[b]Keys[/b]
  [b]↑ ↓[/b] [b]j k[/b]   pick a rank (its frame and last collective below)
  [b]tab[/b]       next pane
  [b]t[/b]  light / dark theme    [b]?[/b]  help    [b]q[/b]  quit

[b]Panes[/b]
  Verdict   why the job is stuck: cause, ranks, frame, fix
  Ranks     per rank: dump kind, last completed step, what it does
  Groups    per process group where the ranks diverge: the collective
            (#sequence op sizes), who waits inside, who never entered

[b]?[/b] [b]esc[/b] or [b]q[/b] closes this."""


class HangHelpScreen(HelpScreen):
    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(HELP, id="help-text")


def verdict_markup(rep: HangReport) -> str:
    if not rep.verdicts:
        return "[b]no divergence found[/b]: every rank with a dump reached the same collectives"
    lines = []
    for i, (v, f) in enumerate(zip(rep.verdicts, rep.findings)):
        lines.append(f"[b]{'verdict' if i == 0 else 'also'}: {escape(f.title)}[/b] "
                     f"({f.severity}, {f.id}) rank(s) {', '.join(map(str, f.ranks))}")
        lines.append(escape(f.summary))
        if v.frame is not None:
            code = f"   {escape(v.frame.code)}" if v.frame.code else ""
            lines.append(f"[b]frame:[/b] {escape(frame_text(v.frame))}{code}")
        lines.append(f"[b]fix:[/b] {escape(f.fix)}")
        lines.append("")
    if rep.trend is not None:
        lines.append(f"[b]profiled steps:[/b] {escape(rep.trend.summary)}")
    return "\n".join(lines).rstrip()


class HangApp(VisibleTextApp, App[int]):
    CSS = """
    #hang-head { height: 1; padding: 0 1; background: $surface; }
    .pane { border-left: tall $panel; padding: 0 0 0 1; height: auto; }
    .pane:focus-within { border-left: tall $accent; }
    .pane-title { text-style: bold; }
    #verdict-pane { height: 1fr; }
    #ranks-table, #groups-table { height: auto; max-height: 10; }
    #rank-detail { height: auto; padding: 0 1; }
    """
    CSS_PATH = "app.tcss"
    TITLE = "fsdpdoctor hang"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("t", "toggle_theme", "theme"),
    ]

    def __init__(self, report: HangReport, *, light: bool = False) -> None:
        super().__init__()
        self.report = report
        self._light = light

    def compose(self) -> ComposeResult:
        rep = self.report
        silent = f" · vanished: {', '.join(map(str, rep.silent))}" if rep.silent else ""
        yield Static(f"[b]hang[/b]  {len(rep.dumped)} of {rep.world_size} ranks dumped{silent}", id="hang-head")
        with VerticalScroll(id="verdict-pane", classes="pane"):
            yield Label("Verdict", classes="pane-title")
            yield Static(verdict_markup(rep), id="verdict")
        with Vertical(id="ranks-pane", classes="pane"):
            yield Label("Ranks", classes="pane-title")
            yield DataTable(id="ranks-table", cursor_type="row", zebra_stripes=False)
            yield Static(id="rank-detail")
        if rep.divergences:
            with Vertical(id="groups-pane", classes="pane"):
                yield Label("Process groups where the ranks diverge", classes="pane-title")
                yield DataTable(id="groups-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        if self._light:
            self.theme = LIGHT
        t = self.query_one("#ranks-table", DataTable)
        t.add_columns("rank", "dump", "step", "doing")
        for s in self.report.ranks:
            t.add_row(str(s.rank), s.dump or "none", step_text(s),
                      rank_doing(s), key=str(s.rank))
        if self.report.divergences:
            g = self.query_one("#groups-table", DataTable)
            g.add_columns("group", "collective", "sizes", "waiting", "never entered", "no data")
            for d in self.report.divergences:
                g.add_row(d.label, f"#{d.seq} {d.op}", str(d.sizes), ", ".join(map(str, d.entered)) or "-",
                          ", ".join(map(str, d.never_entered)) or "-", ", ".join(map(str, d.unknown)) or "-")
        lagging = self.report.verdicts[0].ranks[0] if self.report.verdicts and self.report.verdicts[0].ranks else 0
        row = next((i for i, s in enumerate(self.report.ranks) if s.rank == lagging), 0)
        t.focus()
        t.move_cursor(row=row)
        self._show_rank(row)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "ranks-table":
            self._show_rank(event.cursor_row)

    def _show_rank(self, row: int) -> None:
        if not 0 <= row < len(self.report.ranks):
            return
        s = self.report.ranks[row]
        parts = [f"[b]rank {s.rank}[/b]: {escape(rank_doing(s))}"]
        if s.frame is not None:
            code = f"   {escape(s.frame.code)}" if s.frame.code else ""
            parts.append(f"frame: {escape(frame_text(s.frame))}{code}")
        self.query_one("#rank-detail", Static).update("\n".join(parts))

    def action_help(self) -> None:
        if not isinstance(self.screen, HangHelpScreen):
            self.push_screen(HangHelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme != LIGHT else DARK
