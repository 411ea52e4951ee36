"""Loading, error, help, notes and rank-picker screens."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

ALL_RANKS = -1


class LoadingScreen(Screen):
    BINDINGS = [Binding("q", "app.quit", "quit")]

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Label(f"fsdpdoctor: loading {self.label}", id="loading-title")
            with Center():
                yield ProgressBar(id="loading-bar", show_eta=False)
            yield Label("reading traces...", id="loading-status")

    def update_progress(self, name: str, done: int, total: int) -> None:
        bar = self.query_one(ProgressBar)
        bar.update(total=total or None, progress=done)
        status = self.query_one("#loading-status", Label)
        if total and done >= total:
            status.update("analysing...")
        else:
            status.update(f"reading {name} ({done}/{total})" if name else f"reading traces ({done}/{total})")


class ErrorScreen(Screen):
    BINDINGS = [Binding("q", "quit_error", "quit"), Binding("escape", "quit_error", "quit", show=False)]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Label("fsdpdoctor cannot open this trace", id="error-title")
            yield Static(Text(self.message), id="error-message")
            yield Label("press q to quit", id="error-hint")

    def action_quit_error(self) -> None:
        self.app.exit(2, return_code=2)


HELP = """\
[b]Keys[/b]
  [b]tab[/b] [b]shift+tab[/b]  next / previous pane   [b]1-4[/b]  jump to a pane
  [b]↑ ↓[/b] [b]j k[/b]        move                   [b]enter[/b]  focus the fix (esc: back)
  [b]/[/b]              filter findings: words, [i]sev:warning[/i], [i]id:loader[/i]
  [b]c[/b]              copy the selected finding's fix to the clipboard
  [b]r[/b]              show one rank (or all) in the Ranks and Timeline panes
  [b]d[/b]              data quality: what the loader dropped or ignored, and notes
  [b]s[/b] [b][ ][/b]          a captured run: its step series; previous / next window
  [b]t[/b]              light / dark theme    [b]?[/b]  help    [b]q[/b]  quit

[b]Panes[/b]
  Findings     most costly first (impact per step), coloured by severity
  Ranks        per rank means; ◀ marks the slowest rank, wait is time
               spent waiting for slower ranks; one rank: its steps
  Collectives  per kind and phase: count, time, exposed, size, bus bw
  Timeline     one bar per step: compute, optimizer, exposed comm, data,
               idle; scaled to the longest step, ! marks slow steps

Times in milliseconds.  [b]?[/b] [b]esc[/b] or [b]q[/b] closes this."""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(HELP, id="help-text")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class NotesScreen(ModalScreen):
    """What the figures leave out (data quality) and the analysis' notes, all of them."""

    BINDINGS = [Binding("escape,q,d", "dismiss", "close")]

    def __init__(self, quality: list[str], notes: list[str]) -> None:
        super().__init__()
        self.quality, self.notes = quality, notes

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("Data quality\n", style="bold")
        for line in self.quality or ["nothing dropped or ignored"]:
            t.append(f"  {line}\n")
        if self.notes:
            t.append("\nNotes\n", style="bold")
            for line in self.notes:
                t.append(f"  {line}\n")
        t.append("\nesc, d or q closes this.", style="dim")
        with VerticalScroll(id="notes-box"):
            yield Static(t, id="notes-text")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class StepsScreen(ModalScreen):
    """Every rank's step time over the whole run, windows marked (as ``fsdpdoctor steps`` draws it)."""

    BINDINGS = [Binding("escape,q,s", "dismiss", "close")]

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def compose(self) -> ComposeResult:
        t = Text("\n".join(self.lines) + "\n")
        t.append("\n[ and ] move between the windows; esc, s or q closes this.", style="dim")
        with VerticalScroll(id="notes-box"):
            yield Static(t, id="notes-text")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class RankPicker(ModalScreen[int | None]):
    """Returns a rank, ALL_RANKS, or None when cancelled."""

    BINDINGS = [Binding("escape,q", "cancel", "cancel"),
                Binding("j", "down", show=False), Binding("k", "up", show=False)]

    def __init__(self, ranks: list[int], current: int | None, straggler: int | None) -> None:
        super().__init__()
        self.ranks, self.current, self.straggler = ranks, current, straggler

    def compose(self) -> ComposeResult:
        options = [Option("all ranks", id="all")]
        for r in self.ranks:
            options.append(Option(f"rank {r}" + ("  (slowest)" if r == self.straggler else ""), id=f"r{r}"))
        with Vertical(id="rank-box"):
            yield Label("show rank (enter picks, esc cancels)")
            yield OptionList(*options, id="rank-list")

    def on_mount(self) -> None:
        lst = self.query_one(OptionList)
        lst.highlighted = 0 if self.current is None else 1 + self.ranks.index(self.current) \
            if self.current in self.ranks else 0
        lst.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        oid = event.option.id or "all"
        self.dismiss(ALL_RANKS if oid == "all" else int(oid[1:]))

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_down(self) -> None:
        self.query_one(OptionList).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(OptionList).action_cursor_up()
