"""Findings pane: a filterable list (most costly first) and the selected finding's detail."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from fsdpdoctor.report.format import ms, pct
from fsdpdoctor.results import SEVERITY_RANK, Finding
from fsdpdoctor.tui.palette import SEVERITY_BADGE, Palette


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Root causes most costly first (severity breaks ties), each followed by the findings it explains."""
    key = lambda f: (-(f.impact_us or 0.0), -SEVERITY_RANK.get(f.severity, -1), f.id)  # noqa: E731
    roots = sorted((f for f in findings if not f.caused_by), key=key)
    out: list[Finding] = []
    for root in roots:
        out.append(root)
        out.extend(sorted((f for f in findings if f.caused_by == root.id and f not in out), key=key))
    # a consequence whose root is absent (filtered JSON, old files) stays visible at the end
    out.extend(sorted((f for f in findings if f not in out), key=key))
    return out


def matches(f: Finding, query: str) -> bool:
    """Every word of the query must match: ``sev:warning`` (that severity or a higher one: a severity
    filter is a bar, as ``check --fail-on``), ``id:host`` or plain text anywhere."""
    hay = " ".join(str(x) for x in (f.severity, f.id, f.title, f.summary, f.source or "", f.fix)).lower()
    for word in query.lower().split():
        if word.startswith(("sev:", "severity:")):
            named = [s for s in SEVERITY_RANK if s.startswith(word.split(":", 1)[1])]
            if not named or SEVERITY_RANK.get(f.severity, 0) < min(SEVERITY_RANK[s] for s in named):
                return False
        elif word.startswith("id:"):
            if word[3:] not in f.id.lower():
                return False
        elif word not in hay:
            return False
    return True


class FindingList(OptionList):
    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
        Binding("enter", "open", "open fix", show=False),
    ]

    def action_open(self) -> None:
        """Enter: select the finding and move to its fix (a mouse click only selects)."""
        if self.highlighted is None or self.get_option_at_index(self.highlighted).disabled:
            return
        self.action_select()
        fix = self.screen.query_one(FixText)
        self.call_after_refresh(fix.focus)


class FixText(TextArea):
    """The fix, read-only but selectable (and copied whole with ``c``)."""

    BINDINGS = [Binding("escape", "back", "back to list", show=False)]

    def action_back(self) -> None:
        self.screen.query_one(FindingList).focus()


class FilterInput(Input):
    BINDINGS = [Binding("escape", "clear", "clear filter", show=False)]

    def action_clear(self) -> None:
        self.value = ""
        self.display = False
        self.screen.query_one(FindingList).focus()


class FindingsPane(Horizontal):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.findings: list[Finding] = []
        self.shown: list[Finding] = []
        self.current: Finding | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="findings-left"):
            yield FilterInput(placeholder="filter: text, sev:warning, id:...", id="filter")
            yield FindingList(id="finding-list")
            yield Label("", id="filter-status")
        with VerticalScroll(id="finding-detail"):
            yield Static("", id="detail-head")
            yield Label("fix  (c copies it)", id="fix-label")
            yield FixText("", read_only=True, soft_wrap=True, id="fix", show_line_numbers=False)
            yield Static("", id="detail-evidence")

    def on_mount(self) -> None:
        self.query_one("#filter").display = False

    # -- data -------------------------------------------------------------
    def set_findings(self, findings: list[Finding]) -> None:
        self.findings = sort_findings(findings)
        self.apply_filter(self.query_one(FilterInput).value)

    @property
    def filter_text(self) -> str:
        return self.query_one(FilterInput).value

    def apply_filter(self, query: str) -> None:
        keep_id = id(self.current) if self.current else None
        self.shown = [f for f in self.findings if matches(f, query)] if query.strip() else list(self.findings)
        self.redraw(keep_id)

    def redraw(self, keep_id: int | None = None) -> None:
        if not self.is_mounted:
            return
        pal = Palette.of(self.app)
        lst = self.query_one(FindingList)
        lst.clear_options()
        status = self.query_one("#filter-status", Label)
        if not self.findings:
            lst.add_option(Option(Text("No findings above the thresholds.", style=pal.style("text-success")),
                                  disabled=True))
            status.update("")
            self.show_detail(None)
            return
        for i, f in enumerate(self.shown):
            prompt = Text(no_wrap=False)
            if f.caused_by:
                prompt.append("  ↳ ", style=pal.muted)
            prompt.append(SEVERITY_BADGE.get(f.severity, f.severity[:4].upper()), style=pal.severity(f.severity))
            saving = "saving withheld" if f.impact_withheld else f"{ms(f.impact_us)}/step  {pct(f.impact_frac)}"
            prompt.append(f"  {saving}\n", style=pal.muted)
            prompt.append(f.title)
            lst.add_option(Option(prompt, id=f"f{i}"))
        if not self.shown:
            lst.add_option(Option(Text("nothing matches the filter", style=pal.muted), disabled=True))
        q = self.filter_text.strip()
        status.update(f"{len(self.shown)} of {len(self.findings)} match “{q}”" if q else
                      f"{len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}, most costly first"
                      + ("; ↳ effects under their cause" if any(f.caused_by for f in self.findings) else ""))
        index = 0
        if keep_id is not None:
            for i, f in enumerate(self.shown):
                if id(f) == keep_id:
                    index = i
        if self.shown:
            lst.highlighted = index
            self.show_detail(self.shown[index])
        else:
            self.show_detail(None)

    # -- detail -----------------------------------------------------------
    def show_detail(self, f: Finding | None) -> None:
        self.current = f
        pal = Palette.of(self.app)
        head = self.query_one("#detail-head", Static)
        fix = self.query_one("#fix", FixText)
        ev = self.query_one("#detail-evidence", Static)
        label = self.query_one("#fix-label", Label)
        if f is None:
            head.update(Text("Select a finding to see its evidence and fix." if self.findings else
                             "No findings: nothing in this trace crossed the diagnosis thresholds.",
                             style=pal.muted))
            fix.load_text("")
            fix.display = label.display = False
            ev.update("")
            return
        fix.display = label.display = True
        t = Text()
        t.append(f"{f.title}\n", style="bold")
        t.append(f.severity.upper(), style=pal.severity(f.severity))
        t.append(f"  {f.id}\n", style=pal.muted)
        t.append("impact ", style=pal.muted)
        t.append(f.impact_withheld if f.impact_withheld else f"{ms(f.impact_us)}/step ({pct(f.impact_frac)})",
                 style="bold")
        t.append("  confidence ", style=pal.muted)
        t.append(f"{f.confidence:.0%}\n")
        if f.ranks:
            t.append("ranks ", style=pal.muted)
            t.append(", ".join(map(str, f.ranks[:16])) + (" ..." if len(f.ranks) > 16 else "") + "\n")
        if f.source:
            t.append("source ", style=pal.muted)
            t.append(f"{f.source}\n", style=pal.style("text-accent"))
        if f.caused_by:
            t.append("caused by ", style=pal.muted)
            t.append(f"{f.caused_by} (severity capped: fix the cause first)\n")
        if f.consequences:
            t.append("explains ", style=pal.muted)
            t.append(", ".join(f.consequences) + "\n")
        t.append(f"\n{f.summary}")
        head.update(t)
        fix.load_text(f.fix)
        e = Text()
        if f.evidence:
            e.append("evidence\n", style=pal.style("text-primary", bold=True))
            for item in f.evidence:
                where = []
                if item.rank is not None:
                    where.append(f"rank {item.rank}")
                if item.step is not None:
                    where.append(f"step {item.step}")
                if item.time_us is not None:
                    where.append(ms(item.time_us))
                e.append("• ")
                if where:
                    e.append(f"[{', '.join(where)}] ", style=pal.muted)
                e.append(item.text)
                if item.source:
                    e.append(f"\n  {item.source}", style=pal.style("text-accent"))
                e.append("\n")
        ev.update(e)

    # -- events -----------------------------------------------------------
    def _finding_for(self, option_id: str | None) -> Finding | None:
        if not option_id or not option_id.startswith("f"):
            return None
        i = int(option_id[1:])
        return self.shown[i] if i < len(self.shown) else None

    @on(OptionList.OptionHighlighted, "#finding-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        f = self._finding_for(event.option.id)
        if f is not None:
            self.show_detail(f)

    @on(OptionList.OptionSelected, "#finding-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        f = self._finding_for(event.option.id)
        if f is not None:
            self.show_detail(f)
            self.query_one("#finding-detail").scroll_home(animate=False)

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.apply_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.query_one(FilterInput).display = False
        self.query_one(FindingList).focus()

    def open_filter(self) -> None:
        inp = self.query_one(FilterInput)
        inp.display = True
        inp.focus()
