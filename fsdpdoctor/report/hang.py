"""Console view of a HangReport: the verdict first (cause, rank, frame, fix), then the ranks,
the process groups where the ranks diverge, desyncs and the profiled-steps trend."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from fsdpdoctor.results.hang import HangReport, RankState
from fsdpdoctor.report.format import SEVERITY_STYLE
from fsdpdoctor.report.prose import prose
from fsdpdoctor.report.terminal import terminal_console

def frame_text(f) -> str:
    if f is None:
        return "-"
    return f"{f.function} {f.file}:{f.line}"


def short_exception(text: str, width: int = 90) -> str:
    """``Type: message`` without the C++ source prefix torch's errors carry ("[/path/pair.cc:537] ")."""
    kind, _, msg = text.partition(": ")
    if msg.startswith("[") and "] " in msg:
        msg = msg.split("] ", 1)[1]
    out = f"{kind}: {msg}" if msg else kind
    return out if len(out) <= width else out[: width - 1] + "…"


def step_text(s: RankState) -> str:
    if s.last_step is None:
        return "-"
    # a faulthandler header is written when the watchdog re-arms: a lower bound
    return f"≥{s.last_step}" if s.dump == "faulthandler" else str(s.last_step)


def rank_doing(s: RankState) -> str:
    if s.dump is None:
        return s.note or "vanished"
    parts = [s.activity]
    if s.library:
        parts.append(f"in {s.library}")
    if s.current:
        parts.append(f"last collective: {s.current['label']} #{s.current['seq']} {s.current['op']}")
    if s.exception:
        parts.append(short_exception(s.exception))
    if s.note:
        parts.append(s.note)
    return "; ".join(parts)


def _indented(con: Console, markup: str | Text) -> None:
    """Printed 2 columns in, its wrapped lines 2 more (report/prose.py)."""
    con.print(Padding(prose(Text.from_markup(markup) if isinstance(markup, str) else markup), (0, 0, 0, 2),
                      expand=False))


def render(rep: HangReport, console: Console | None = None) -> None:
    con = console or terminal_console()
    con.print(f"[bold]Hang forensics[/] {escape(rep.run_dir)}: {len(rep.dumped)} of {rep.world_size} ranks "
              f"dumped" + (f", vanished: {', '.join(map(str, rep.silent))}" if rep.silent else ""))
    if not rep.verdicts:
        con.print("[green]no divergence found[/]: every rank with a dump reached the same collectives "
                  "(a slow step rather than a hang, or the stalled rank wrote no dump)")
    for i, (v, f) in enumerate(zip(rep.verdicts, rep.findings)):
        head = "[bold red]verdict[/]" if i == 0 else "[yellow]also[/]"
        style = SEVERITY_STYLE.get(f.severity, "")
        con.print(f"\n{head} [{style}]{f.severity}[/] [bold]{escape(f.title)}[/] [dim]({f.id})[/] "
                  f"rank(s) {', '.join(map(str, f.ranks))}")
        _indented(con, escape(f.summary))
        if v.frame is not None:
            code = f"  [dim]{escape(v.frame.code)}[/]" if v.frame.code else ""
            _indented(con, f"[bold]frame:[/] {escape(frame_text(v.frame))}{code}")
        for e in f.evidence:
            _indented(con, f"[dim]{escape(e.text)}[/]")
        _indented(con, f"[bold]fix:[/] {escape(f.fix)}")
    con.print()
    con.print(Text("Ranks", style="bold"))
    for line in rank_lines(rep):
        _indented(con, line)
    if rep.divergences:
        con.print(Text("Process groups where the ranks diverge", style="bold"))
        for line in group_lines(rep):
            _indented(con, line)
    for m in rep.mismatches:
        con.print(f"[red]desync[/] group {escape(m.label)} collective #{m.seq}: " +
                  "; ".join(f"rank {r}: {escape(s)}" for r, s in m.by_rank.items()))
    if rep.trend is not None:
        con.print(f"[bold]profiled steps:[/] {escape(rep.trend.summary)}"
                  + (" [red](the lagging rank was already late)[/]" if rep.trend.lagging_was_straggler else ""))
    for n in rep.notes:
        con.print(f"[dim]note: {escape(n)}[/]")


def rank_lines(rep: HangReport) -> list[Text]:
    """One entry per rank: what it dumped and does, then where (a frame's path would not fit a
    table column at 80 columns without splitting it)."""
    out = []
    for s in rep.ranks:
        t = Text(f"rank {s.rank}: ")
        t.append(s.dump or "no dump", style="" if s.dump else "red")
        t.append(f", step {step_text(s)}, {rank_doing(s)}")
        if s.frame is not None:
            t.append(f"; at {frame_text(s.frame)}")
        out.append(t)
    return out


def group_lines(rep: HangReport) -> list[Text]:
    out = []
    for g in rep.divergences:
        def ranks(rs: list[int]) -> str:
            return ", ".join(map(str, rs)) or "-"

        out.append(Text(f"group {g.label}: collective #{g.seq} {g.op} {g.sizes}; waiting inside: "
                        f"{ranks(g.entered)}; never entered: {ranks(g.never_entered)}; no data: {ranks(g.unknown)}; "
                        f"issued at {frame_text(g.issued_at)}"))
    return out


def document(rep: HangReport) -> dict:
    """``hang --json``: the report's fields as they are."""
    return {"fsdpdoctor_hang_report": 1, **dataclasses.asdict(rep)}
