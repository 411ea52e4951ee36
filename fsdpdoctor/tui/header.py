"""The job header: job shape, mean step time and its split into categories."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from fsdpdoctor.report.format import straggler_rank
from fsdpdoctor.report.data_quality import lines as data_quality_lines
from fsdpdoctor.report.format import categories, ms, trace_family, wrapping_line
from fsdpdoctor.results import Analysis
from fsdpdoctor.tui.palette import SHORT, Palette


def steps_text(steps: list[int]) -> str:
    if not steps:
        return "-"
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}..{steps[-1]}"
    return f"{steps[0]}..{steps[-1]} ({len(steps)})" if len(steps) > 2 else ", ".join(map(str, steps))


class JobHeader(Widget):
    """Three to five lines at the top of the main screen."""

    DEFAULT_CSS = """
    JobHeader { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.analysis: Analysis | None = None
        self.label = ""
        self.rank: int | None = None

    def show(self, analysis: Analysis, label: str, rank: int | None = None) -> None:
        self.analysis, self.label, self.rank = analysis, label, rank
        self.refresh(layout=True)

    def render(self) -> Text:
        a = self.analysis
        pal = Palette.of(self.app)
        if a is None:
            return Text("fsdpdoctor", style="bold")
        job = a.job
        width = max(20, self.size.width - 2 if self.size.width else 78)
        t = Text()
        t.append(self.label, style=pal.style("text-primary", bold=True))
        n = len(job.ranks_analyzed)
        t.append(f"  {trace_family(job)} {job.backend or '?'} · world {job.world_size or '?'} · "
                 f"{n} rank{'s' if n != 1 else ''} · steps {steps_text(job.steps)}\n")
        t.append(wrapping_line(job))
        strag = straggler_rank(a)
        if strag is not None:
            t.append("   straggler ", style=pal.muted)
            t.append(f"rank {strag}", style=pal.severity("warning"))
        if self.rank is not None:
            t.append("   showing rank ", style=pal.muted)
            t.append(str(self.rank), style=pal.style("text-accent", bold=True))
        t.append("\n")
        m = a.mean
        if m is None or not m.duration_us:
            unread = job.input_kind.unknown if job.input_kind is not None else []
            t.append(f"cannot read: {unread[0]}" if unread else "no complete profiler steps to break down",
                     style=pal.severity("warning") if unread else pal.muted)
            _quality_line(t, a, width, pal)
            return t
        head = f"step {ms(m.duration_us)} "
        t.append(head, style="bold")
        t.append_text(pal.bar(m, max(10, width - len(head))))
        t.append("\n")
        items: list[Text] = []
        for name, v in categories(m):
            item = Text("█ ", style=pal.category(name))
            item.append(f"{SHORT[name]} {ms(v)} {100 * v / m.duration_us:.0f}%")
            items.append(item)
        item = Text("overlapped comm ", style=pal.muted)
        item.append(f"{ms(m.overlapped_comm_us)}")
        items.append(item)
        # pack whole items into lines so no figure is split from its label
        line_len = 0
        for item in items:
            if line_len and line_len + 2 + len(item) > width:
                t.append("\n")
                line_len = 0
            elif line_len:
                t.append("  ")
                line_len += 2
            t.append_text(item)
            line_len += len(item)
        _quality_line(t, a, width, pal)
        return t


def _quality_line(t: Text, a: Analysis, width: int, pal: Palette) -> None:
    """One line when the figures leave something out (dropped events, ignored manifest fields...):
    the first note, cut to the width; all of them behind ``d``."""
    dq = data_quality_lines(a.data_quality)
    if not dq:
        return
    hint = (f" (+{len(dq) - 1} more)" if len(dq) > 1 else "") + "  d: details"
    first = f"data quality: {dq[0]}"
    room = max(10, width - len(hint))
    t.append("\n")
    t.append(first if len(first) <= room else first[:room - 1] + "…", style=pal.severity("warning"))
    t.append(hint, style=pal.muted)
