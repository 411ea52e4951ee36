"""The fsdpdoctor terminal UI: the same ``Analysis`` the console report prints, browsable.

``FsdpDoctorApp(path=...)`` loads and analyses in a worker thread (with a progress
bar; ``engine=`` takes ``open_analysis``'s ``dask``/``workers``/``use_summaries``);
``FsdpDoctorApp(analysis=...)`` shows a ready result (tests, embedding).
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.worker import get_current_worker
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, TabbedContent, TabPane

from fsdpdoctor.options import Options
from fsdpdoctor.errors import InputError
from fsdpdoctor.report.format import straggler_rank
from fsdpdoctor.results import Analysis
from fsdpdoctor.tui.findings import FindingList, FindingsPane
from fsdpdoctor.tui.header import JobHeader
from fsdpdoctor.report.data_quality import lines as data_quality_lines
from fsdpdoctor.tui.screens import ALL_RANKS, ErrorScreen, HelpScreen, LoadingScreen, NotesScreen, RankPicker
from fsdpdoctor.tui.tables import CollectivesView, RanksView
from fsdpdoctor.tui.timeline import TimelineView
from fsdpdoctor.tui.visible import VisibleTextApp

PANES = ["tab-findings", "tab-ranks", "tab-collectives", "tab-timeline"]
DARK, LIGHT = "textual-dark", "textual-light"


def display_name(source: str | Path | None) -> str:
    """What the UI calls the trace: never an absolute path (stable across machines)."""
    if not source:
        return "trace"
    p = Path(source)
    if not p.is_absolute():
        return p.as_posix().rstrip("/") or "."
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix() or "."
    except ValueError:
        return p.name or str(p)


class _Cancelled(Exception):
    pass


class FsdpDoctorApp(VisibleTextApp, App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "fsdpdoctor"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("slash", "filter", "filter"),
        Binding("r", "pick_rank", "rank"),
        Binding("c", "copy_fix", "copy fix"),
        Binding("tab", "next_pane", "next pane", priority=True),
        Binding("shift+tab", "prev_pane", "prev pane", show=False, priority=True),
        Binding("1", "pane(0)", show=False),
        Binding("2", "pane(1)", show=False),
        Binding("3", "pane(2)", show=False),
        Binding("4", "pane(3)", show=False),
        Binding("t", "toggle_theme", "theme", show=False),
        Binding("d", "data_quality", "data quality", show=False),
        # a run folder with windows (docs/capture.md): the previous / next window
        Binding("left_square_bracket", "window(-1)", "prev window", show=False),
        Binding("right_square_bracket", "window(1)", "next window", show=False),
        Binding("s", "steps", "steps", show=False),
    ]

    def __init__(self, path: str | Path | None = None, *, analysis: Analysis | None = None,
                 ranks: list[int] | None = None, steps: set[int] | None = None,
                 thresholds: dict[str, float] | None = None, light: bool = False,
                 label: str | None = None, engine: dict | None = None, options: Options | None = None) -> None:
        if path is None and analysis is None:
            raise ValueError("FsdpDoctorApp needs a path or an analysis")
        super().__init__()
        self.path = path
        self.analysis: Analysis | None = analysis
        # every selection (ranks, steps, thresholds, where the per-rank map runs): ``options``, or the
        # keywords of the same names
        self.options = (options or Options()).but(**{k: v for k, v in dict(ranks=ranks, steps=steps,
                                                                            thresholds=thresholds).items()
                                                       if v is not None}, **(engine or {}))
        self.label = label or display_name(path if path is not None else analysis.source)
        self.rank: int | None = None
        self.window: int | None = None   # first step of the window shown (None: the latest)
        self.error: str | None = None
        self._light = light

    # -- layout -----------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield JobHeader(id="job")
        with TabbedContent(initial=PANES[0], id="panes"):
            with TabPane("Findings", id=PANES[0]):
                yield FindingsPane(id="findings")
            with TabPane("Ranks", id=PANES[1]):
                yield RanksView(id="ranks")
            with TabPane("Collectives", id=PANES[2]):
                yield CollectivesView(id="collectives")
            with TabPane("Timeline", id=PANES[3]):
                yield TimelineView(id="timeline")
        yield Footer()

    def on_mount(self) -> None:
        if self._light:
            self.theme = LIGHT
        self.theme_changed_signal.subscribe(self, lambda _theme: self._redraw())
        self.query_one("#panes Tabs").can_focus = False
        if self.analysis is not None:
            self._populate()
        else:
            self.push_screen(LoadingScreen(self.label))
            self._load()

    # -- loading ----------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        from fsdpdoctor.pipeline import open_analysis

        worker = get_current_worker()

        def progress(name: str, done: int, total: int) -> None:
            if worker.is_cancelled:  # the user quit while loading: stop at the next file
                raise _Cancelled
            self.call_from_thread(self._progress, name, done, total)

        try:
            analysis = open_analysis(self.path, self.options.but(progress=progress, window=self.window))
            outcome, arg = self._loaded, analysis
        except _Cancelled:
            return
        except InputError as exc:
            outcome, arg = self._failed, str(exc)
        except Exception as exc:  # corrupt input the loader did not anticipate
            outcome, arg = self._failed, f"{self.label}: {type(exc).__name__}: {exc}"
        if not worker.is_cancelled:
            try:
                self.call_from_thread(outcome, arg)
            except RuntimeError:  # the app has already gone
                pass

    def _progress(self, name: str, done: int, total: int) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.update_progress(name, done, total)

    def _loaded(self, analysis: Analysis) -> None:
        self.analysis = analysis
        if isinstance(self.screen, LoadingScreen):
            self.pop_screen()
        self._populate()

    def _failed(self, message: str) -> None:
        self.error = message
        if isinstance(self.screen, LoadingScreen):
            self.switch_screen(ErrorScreen(message))
        else:
            self.push_screen(ErrorScreen(message))

    # -- drawing ----------------------------------------------------------
    def _populate(self) -> None:
        a = self.analysis
        self.sub_title = self.label
        self.query_one(FindingsPane).set_findings(a.findings)
        self._redraw(findings=False)
        self.query_one(FindingList).focus()

    def _redraw(self, findings: bool = True) -> None:
        a = self.analysis
        if a is None:
            return
        self.query_one(JobHeader).show(a, self.label, self.rank)
        if findings:
            pane = self.query_one(FindingsPane)
            pane.redraw(id(pane.current) if pane.current else None)
        self.query_one(RanksView).show(a, self.rank)
        self.query_one(CollectivesView).show(a)
        self.query_one(TimelineView).show(a, self.rank)

    def action_steps(self) -> None:
        """The run's step series with its windows (a run folder captured armed, docs/capture.md)."""
        from fsdpdoctor.report.steps_plot import render
        from fsdpdoctor.trace.step_series import open_steps
        from fsdpdoctor.tui.screens import StepsScreen

        if self.path is None or isinstance(self.screen, StepsScreen):
            return
        try:
            res = open_steps(self.path)
        except InputError as exc:
            self.notify(str(exc), severity="warning")
            return
        # the modal's inside: 90% of the screen less its border, padding and scroll bar (#notes-box in app.tcss)
        width = max(40, min(120, int(0.9 * self.size.width) - 6))
        self.push_screen(StepsScreen(render(res.series, res.windows, width) + [f"note: {n}" for n in res.notes]))

    def action_window(self, delta: int) -> None:
        """Show the previous/next window of a run folder captured with windows."""
        from fsdpdoctor.trace.windows import list_windows

        if self.path is None or self.analysis is None or not Path(self.path).is_dir():
            return
        wins = [w for w in list_windows(Path(self.path)) if w.first is not None]
        shown = Path(str(self.analysis.source)).resolve()
        at = next((i for i, w in enumerate(wins) if w.folder.resolve() == shown), None)
        if at is None or len(wins) < 2:
            self.notify("no other window in this run folder")
            return
        to = min(len(wins) - 1, max(0, at + delta))
        if to == at:
            self.notify("first window" if delta < 0 else "latest window")
            return
        self.window = wins[to].first
        self.label = f"{display_name(self.path)} @ {wins[to].label()}"
        self.push_screen(LoadingScreen(self.label))
        self._load()

    def set_rank(self, rank: int | None) -> None:
        self.rank = rank
        self._redraw(findings=False)

    # -- actions ----------------------------------------------------------
    def _on_main(self) -> bool:
        return self.analysis is not None and self.screen is self.screen_stack[0]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_data_quality(self) -> None:
        if self.analysis is not None and not isinstance(self.screen, NotesScreen):
            a = self.analysis
            self.push_screen(NotesScreen(data_quality_lines(a.data_quality), [*a.notes, *a.data_quality.sources]))

    def action_filter(self) -> None:
        if not self._on_main():
            return
        self.query_one("#panes", TabbedContent).active = PANES[0]
        self.query_one(FindingsPane).open_filter()

    def action_pick_rank(self) -> None:
        if not self._on_main():
            return
        a = self.analysis
        ranks = [r.rank for r in a.ranks]
        strag = straggler_rank(a)

        def picked(choice: int | None) -> None:
            if choice is None:
                return
            self.set_rank(None if choice == ALL_RANKS else choice)
            self.notify(f"showing {'all ranks' if self.rank is None else f'rank {self.rank}'}", timeout=2)

        self.push_screen(RankPicker(ranks, self.rank, strag), picked)

    def action_copy_fix(self) -> None:
        if not self._on_main():
            return
        f = self.query_one(FindingsPane).current
        if f is None:
            self.notify("No finding selected", severity="warning", timeout=3)
            return
        self.copy_to_clipboard(f.fix)
        self.notify(f"Fix for {f.id} copied to the clipboard", title="copied", timeout=3)

    def _focus_pane(self, index: int) -> None:
        tabs = self.query_one("#panes", TabbedContent)
        tabs.active = PANES[index % len(PANES)]
        target = {0: FindingList, 1: "#ranks-table", 2: "#coll-table", 3: "#timeline-table"}[index % len(PANES)]
        widget = self.query_one(target) if isinstance(target, str) else self.query_one(target)
        self.call_after_refresh(widget.focus)

    def action_pane(self, index: int) -> None:
        if self._on_main():
            self._focus_pane(index)

    def action_next_pane(self, step: int = 1) -> None:
        if not self._on_main():
            self.screen.focus_next() if step > 0 else self.screen.focus_previous()
            return
        active = self.query_one("#panes", TabbedContent).active
        index = PANES.index(active) if active in PANES else 0
        self._focus_pane(index + step)

    def action_prev_pane(self) -> None:
        self.action_next_pane(-1)

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme != LIGHT else DARK

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # clicking a tab with the mouse: put the keyboard in that pane too
        if self._on_main() and event.pane.id in PANES:
            index = PANES.index(event.pane.id)
            target = {0: FindingList, 1: "#ranks-table", 2: "#coll-table", 3: "#timeline-table"}[index]
            focused = self.focused
            widget = self.query_one(target)
            if focused is None or not (focused is widget or widget in focused.ancestors_with_self
                                       or event.pane in focused.ancestors):
                self.call_after_refresh(widget.focus)

