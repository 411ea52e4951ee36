"""The scaling TUI: ``fsdpdoctor scaling RUN_A RUN_B [...] --tui``.

Shows a ready :class:`~fsdpdoctor.results.scaling.ScalingReport` (the verb loads the
runs and builds it before the app opens, so bad input is a one-line error, exit 2):

- the runs (world size, work per step, step and ideal step time, throughput,
  efficiency; the base marked),
- for the selected larger run vs the base, the waterfall of where the step-time
  increase went: one bar per part, scaled to the largest part, costs in the
  theme's error colour, gains in its success colour,
- the ``low-scaling-efficiency`` findings and the report's notes.

Keys: tab / shift+tab between panes, ↑↓ j k (or ← →) other comparisons, ? help,
t light/dark, q quit. Colours come from the theme (palette.py), so both themes read.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Label, Static

from fsdpdoctor.results.scaling import RESIDUAL, ScalingReport, Waterfall, WaterfallPart
from fsdpdoctor.tui.app import DARK, LIGHT, display_name
from fsdpdoctor.tui.palette import SEVERITY_BADGE, Palette
from fsdpdoctor.tui.screens import HelpScreen
from fsdpdoctor.tui.tables import VimTable
from fsdpdoctor.tui.visible import VisibleTextApp

PANES = ["runs-table", "waterfall", "details"]
POS_GLYPH, NEG_GLYPH = "█", "▒"   # costs / gains: told apart without colour too
SHORT_ROWS = 30                    # below this height the panes have no blank line between them

HELP = """\
[b]Keys[/b]
  [b]tab[/b] [b]shift+tab[/b]   next / previous pane
  [b]↑ ↓[/b] [b]j k[/b]         other comparison (in Runs: pick a larger run)
  [b]← →[/b]             other comparison (Waterfall pane)
  [b]t[/b]  light / dark theme    [b]?[/b]  help    [b]q[/b]  quit

[b]Panes[/b]
  Runs       world size, global work per step, mean step time, ideal
             step time (base scaled by per-rank work), throughput and
             efficiency vs linear scaling from the base (smallest run)
  Waterfall  where the step-time increase of the selected run went:
             part_run - part_base x work ratio, per step and rank;
             pts: efficiency points lost (negative: gained back);
             █ costs time, ▒ gives it back; bars scaled to the largest
  Findings   low-scaling-efficiency findings with their fix; notes

Times in milliseconds.  [b]?[/b] [b]esc[/b] or [b]q[/b] closes this."""


class ScalingHelpScreen(HelpScreen):
    """The Analysis TUI's help box (same look: app.tcss), with this app's keys."""

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(HELP, id="help-text")


def _f1(us: float) -> str:
    return f"{us / 1e3:.1f}"


def _d1(us: float) -> str:
    return f"{us / 1e3:+.1f}"


def _pts(frac: float) -> str:
    return f"{100 * frac:+.1f}"


def bar_cells(part: WaterfallPart, scale_us: float, width: int) -> int:
    """Cells of a part's bar: ``|delta|`` scaled so the largest part fills ``width``;
    at least one for a non-zero part."""
    if scale_us <= 0 or not part.delta_us:
        return 0
    return max(1, round(abs(part.delta_us) / scale_us * width))


class WaterfallView(Widget, can_focus=True):
    """One comparison's waterfall, drawn to the widget's width."""

    BINDINGS = [
        Binding("up,k,left", "app.comparison(-1)", "prev", show=False),
        Binding("down,j,right", "app.comparison(1)", "next", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.waterfall: Waterfall | None = None
        self.index, self.count = 0, 0
        self.names: dict[str, str] = {}

    def show(self, w: Waterfall | None, index: int, count: int, names: dict[str, str]) -> None:
        self.waterfall, self.index, self.count, self.names = w, index, count, names
        self.refresh(layout=True)

    def layout_widths(self) -> tuple[int, int, bool]:
        """(label width, bar width, show the base/run columns)."""
        width = (self.content_region.width or self.size.width or 78)
        labels = [p.label for p in self.waterfall.parts] if self.waterfall else []
        label_w = min(26, max([len(x) for x in labels] + [len("total")]))
        full = width - label_w - 2 - (9 + 9) - (8 + 7) - 2
        if full >= 12:
            return label_w, full, True
        return label_w, max(4, width - label_w - 2 - (8 + 7) - 2), False

    def part_rows(self) -> list[tuple[WaterfallPart, int]]:
        """Each part with the cells of its bar, in the order drawn."""
        w = self.waterfall
        if w is None:
            return []
        _, bar_w, _ = self.layout_widths()
        scale = max((abs(p.delta_us) for p in w.parts), default=0.0)
        return [(p, bar_cells(p, scale, bar_w)) for p in w.parts]

    def get_content_height(self, container, viewport, width: int) -> int:
        w = self.waterfall
        return 1 if w is None else 4 + len(w.parts)

    def render(self) -> Text:
        pal = Palette.of(self.app)
        w = self.waterfall
        if w is None:
            return Text("no larger run to compare with the base", style=pal.muted)
        label_w, bar_w, wide = self.layout_widths()
        cost, gain = pal.style("error"), pal.style("success")
        t = Text(no_wrap=True, overflow="ellipsis")
        if self.count > 1:
            t.append(f"{self.index + 1} of {self.count} (↑↓)  ", style=pal.style("text-accent", bold=True))
        t.append(f"{self.names.get(w.base_source, w.base_source)} → {self.names.get(w.source, w.source)}",
                 style=pal.muted)
        t.append("\n")
        t.append(f"step {_f1(w.ideal_step_us)} ms ideal → {_f1(w.step_us)} ms measured ({_d1(w.increase_us)} ms) · ")
        t.append(f"efficiency {100 * w.efficiency:.1f}%", style=pal.style(
            "text-error" if w.efficiency < self.app.low_efficiency else "text-success", bold=True))
        t.append("\n")
        head = f"{'part':<{label_w}}  "
        if wide:
            head += f"{'ms at ' + str(w.base_world_size):>9}{'ms at ' + str(w.world_size):>9}"
        head += f"{'Δ ms':>8}{'pts':>7}  "
        t.append(head, style=pal.style("text-muted", bold=True))
        t.append(POS_GLYPH, style=cost)
        t.append(" costs ", style=pal.style("text-muted", bold=True))
        t.append(NEG_GLYPH, style=gain)
        t.append(" gains\n", style=pal.style("text-muted", bold=True))
        for p, cells in self.part_rows():
            residual = p.key == RESIDUAL
            t.append(f"{p.label[:label_w]:<{label_w}}  ", style=pal.muted if residual else "")
            if wide:
                t.append(f"{_f1(p.base_us):>9}{_f1(p.run_us):>9}")
            t.append(f"{_d1(p.delta_us):>8}{_pts(p.efficiency_points):>7}  ")
            if cells:
                pos = p.delta_us > 0
                t.append((POS_GLYPH if pos else NEG_GLYPH) * cells, style=cost if pos else gain)
            t.append("\n")
        total = f"{'total':<{label_w}}  " + (" " * 18 if wide else "")
        t.append(total + f"{_d1(w.increase_us):>8}{_pts(w.lost_efficiency):>7}", style="bold")
        return t


class RunsTable(VimTable):
    pass


class ScalingApp(VisibleTextApp, App[int]):
    CSS_PATH = ["app.tcss", "scaling.tcss"]
    TITLE = "fsdpdoctor scaling"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("tab", "next_pane", "next pane", priority=True),
        Binding("shift+tab", "prev_pane", "prev pane", show=False, priority=True),
        Binding("t", "toggle_theme", "theme"),
    ]

    def __init__(self, report: ScalingReport, *, thresholds: dict[str, float] | None = None,
                 light: bool = False) -> None:
        from fsdpdoctor.diagnose.thresholds import resolve

        super().__init__()
        self.report = report
        self.low_efficiency = resolve(thresholds)["scaling_efficiency_low"]
        self.current = 0                  # index into report.waterfalls
        self._width = 0
        self._light = light
        # never an absolute path on screen (stable snapshots, shorter lines)
        self.names = {r.source: display_name(r.source) for r in report.runs}
        self._row_to_wf: dict[int, int] = {}
        self._wf_to_row: dict[int, int] = {}
        by_source = {w.source: i for i, w in enumerate(report.waterfalls)}
        for row, r in enumerate(report.runs):
            i = by_source.get(r.source)
            if r.world_size != report.base_world_size and i is not None:
                self._row_to_wf[row] = i
                self._wf_to_row.setdefault(i, row)

    # -- layout -----------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="sc-head")
        with Vertical(id="runs-pane", classes="pane"):
            yield Label("Runs", classes="pane-title")
            yield RunsTable(id="runs-table")
        with Vertical(id="waterfall-pane", classes="pane"):
            yield Label("Waterfall", classes="pane-title", id="waterfall-title")
            yield WaterfallView(id="waterfall")
        with VerticalScroll(id="details", classes="pane"):
            yield Label("Findings and notes", classes="pane-title")
            yield Static(id="details-text")
        yield Footer()

    def on_mount(self) -> None:
        if self._light:
            self.theme = LIGHT
        self.theme_changed_signal.subscribe(self, lambda _theme: self._redraw())
        self.screen.set_class(self.size.height < SHORT_ROWS, "-short")
        self._redraw()
        self.query_one(WaterfallView).focus()

    # -- drawing ----------------------------------------------------------
    def _clean(self, text: str) -> str:
        for src, name in self.names.items():
            if src != name:
                text = text.replace(src, name)
        return text

    def _redraw(self) -> None:
        self._draw_head()
        self._draw_runs()
        self._draw_waterfall()
        self._draw_details()

    def _draw_head(self) -> None:
        rep, pal = self.report, Palette.of(self)
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("scaling", style=pal.style("text-primary", bold=True))
        t.append(f"  {rep.mode} · {rep.unit} · {rep.dialect.upper()} · base {rep.base_world_size} "
                 f"rank{'s' if rep.base_world_size != 1 else ''} · {len(rep.runs)} runs · "
                 f"{len(rep.findings)} finding{'s' if len(rep.findings) != 1 else ''}")
        self.query_one("#sc-head", Static).update(t)

    def on_resize(self) -> None:
        # short terminals (80x24): no blank line between the panes
        self.screen.set_class(self.size.height < SHORT_ROWS, "-short")
        if self.is_mounted and self.size.width != self._width:
            self._draw_runs()

    def _draw_runs(self) -> None:
        rep, pal = self.report, Palette.of(self)
        table = self.query_one(RunsTable)
        self._width = self.size.width
        cursor = table.cursor_row
        table.clear(columns=True)
        unit = "tok" if rep.unit == "tokens" else "smp"
        heads = ["N", f"{unit}/step", "/rank", "step ms", "ideal", f"{unit}/s", "eff."]
        rows = []
        for row, r in enumerate(rep.runs):
            if row == 0:
                eff = ("◆ base", pal.style("text-accent", bold=True))
            else:
                low = r.efficiency < self.low_efficiency
                eff = (f"{100 * r.efficiency:.1f}%", pal.style("text-error" if low else "text-success"))
            rows.append([(str(r.world_size), None), (f"{r.work_per_step:g}", None), (f"{r.work_per_rank:g}", None),
                         (_f1(r.step_us), None), (_f1(r.ideal_step_us), None), (f"{r.throughput:,.0f}", None), eff])
        widths = [max([len(h)] + [len(cells[i][0]) for cells in rows]) for i, h in enumerate(heads)]
        for h, w in zip(heads, widths):
            table.add_column(Text(h, justify="right"), width=w, key=h)
        # the run name gets what is left (cell padding is 1 each side; 2 for a scrollbar), its tail kept
        avail = (table.size.width or (self.size.width or 80) - 2) - sum(widths) - 2 * (len(widths) + 1) - 2
        run_w = max(8, avail)
        table.add_column("run", width=run_w, key="run")
        for row, (r, cells) in enumerate(zip(rep.runs, rows)):
            name = self.names[r.source]
            if len(name) > run_w:
                name = "…" + name[len(name) - run_w + 1:]
            table.add_row(*(Text(v, style=st or "", justify="right") for v, st in cells),
                          Text(name, style=pal.muted if row == 0 else ""), key=str(row))
        row = self._wf_to_row.get(self.current, cursor)
        if rep.runs:
            table.move_cursor(row=min(max(row, 0), len(rep.runs) - 1), animate=False)

    def _draw_waterfall(self) -> None:
        wfs = self.report.waterfalls
        w = wfs[self.current] if wfs else None
        self.query_one(WaterfallView).show(w, self.current, len(wfs), self.names)
        title = "Waterfall: where the step-time increase went"
        if w is not None:
            title = f"Waterfall {w.base_world_size} → {w.world_size} ranks: where the step-time increase went"
        self.query_one("#waterfall-title", Label).update(title)

    def _draw_details(self) -> None:
        rep, pal = self.report, Palette.of(self)
        t = Text()
        if not rep.findings:
            t.append(f"no low-scaling-efficiency finding: every larger run is at or above "
                     f"{100 * self.low_efficiency:.0f}% efficiency\n", style=pal.muted)
        for f in rep.findings:
            t.append(SEVERITY_BADGE.get(f.severity, f.severity.upper()), style=pal.severity(f.severity))
            t.append(f" {f.title}", style="bold")
            t.append(f"  {f.id}\n", style=pal.muted)
            t.append(self._clean(f.summary) + "\n")
            t.append("fix: ", style=pal.style("text-success", bold=True))
            t.append(self._clean(f.fix) + "\n\n")
        for n in rep.notes:
            t.append("note: ", style=pal.style("text-accent", bold=True))
            t.append(self._clean(n) + "\n")
        t.rstrip()
        self.query_one("#details-text", Static).update(t)

    # -- comparisons ------------------------------------------------------
    def select(self, index: int) -> None:
        """Show comparison ``index`` (into report.waterfalls)."""
        n = len(self.report.waterfalls)
        if not n:
            return
        index = max(0, min(n - 1, index))
        if index == self.current:
            return
        self.current = index
        self._draw_waterfall()
        table = self.query_one(RunsTable)
        row = self._wf_to_row.get(index)
        if row is not None and table.cursor_row != row:
            table.move_cursor(row=row, animate=False)

    def action_comparison(self, step: int) -> None:
        self.select(self.current + step)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        index = self._row_to_wf.get(event.cursor_row)
        if index is not None:
            self.select(index)

    # -- actions ----------------------------------------------------------
    def _on_main(self) -> bool:
        return self.screen is self.screen_stack[0]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(ScalingHelpScreen())

    def action_next_pane(self, step: int = 1) -> None:
        if not self._on_main():
            self.screen.focus_next() if step > 0 else self.screen.focus_previous()
            return
        focused = self.focused
        ids = [focused.id] + [a.id for a in focused.ancestors] if focused is not None else []
        index = next((PANES.index(i) for i in ids if i in PANES), -1)
        self.query_one(f"#{PANES[(index + step) % len(PANES)]}").focus()

    def action_prev_pane(self) -> None:
        self.action_next_pane(-1)

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme != LIGHT else DARK
