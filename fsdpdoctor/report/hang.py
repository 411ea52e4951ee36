"""Console view of a HangReport: the verdict first (cause, rank, frame, fix), then the ranks,
the process groups where the ranks diverge, desyncs and the profiled-steps trend."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fsdpdoctor.analysis.hang import HangReport, RankState

CAUSE_TITLE = {
    "desync": "desync: the ranks disagree on a collective",
    "crashed": "a rank crashed",
    "aborted": "a rank aborted",
    "skipped-collective": "a rank skipped a collective",
    "collective-order": "collectives issued in different orders",
    "no-dump": "a rank wrote nothing (dead or hard-stuck)",
    "data-loader": "a rank is stuck in its data loader",
    "checkpoint": "a rank is stuck in a checkpoint save/load",
    "busy-loop": "a rank is looping outside the collectives",
    "blocked": "a rank is blocked outside the collectives",
    "gil-held": "a rank holds the GIL",
    "user-code": "a rank is in its own code",
}


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
        return "wrote nothing"
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


def render(rep: HangReport, console: Console | None = None) -> None:
    con = console or Console()
    con.print(f"[bold]Hang forensics[/] {escape(rep.run_dir)}: {len(rep.dumped)} of {rep.world_size} ranks "
              f"dumped" + (f", silent: {', '.join(map(str, rep.silent))}" if rep.silent else ""))
    if not rep.verdicts:
        con.print("[green]no divergence found[/]: every rank with a dump reached the same collectives "
                  "(a slow step rather than a hang, or the stalled rank wrote no dump)")
    for i, v in enumerate(rep.verdicts):
        head = "[bold red]verdict[/]" if i == 0 else "[yellow]also[/]"
        con.print(f"\n{head} [bold]{CAUSE_TITLE.get(v.cause, v.cause)}[/] [dim]({v.cause})[/] "
                  f"rank(s) {', '.join(map(str, v.ranks))}")
        con.print(f"  {escape(v.summary)}")
        if v.frame is not None:
            code = f"  [dim]{escape(v.frame.code)}[/]" if v.frame.code else ""
            con.print(f"  [bold]frame:[/] {escape(frame_text(v.frame))}{code}")
        for e in v.evidence:
            con.print(f"  [dim]{escape(e)}[/]")
        con.print(f"  [bold]fix:[/] {escape(v.fix)}")
    con.print()
    con.print(ranks_table(rep))
    if rep.divergences:
        con.print(groups_table(rep))
    for m in rep.mismatches:
        con.print(f"[red]desync[/] group {escape(m.label)} collective #{m.seq}: " +
                  "; ".join(f"rank {r}: {escape(s)}" for r, s in m.by_rank.items()))
    if rep.trend is not None:
        con.print(f"[bold]profiled steps:[/] {escape(rep.trend.summary)}"
                  + (" [red](the lagging rank was already late)[/]" if rep.trend.lagging_was_straggler else ""))
    for n in rep.notes:
        con.print(f"[dim]note: {escape(n)}[/]")


def ranks_table(rep: HangReport) -> Table:
    t = Table(title="Ranks", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("rank", "dump", "step", "doing", "frame"):
        t.add_column(col, overflow="fold")
    for s in rep.ranks:
        t.add_row(str(s.rank), s.dump or "[red]none[/]", step_text(s),
                  escape(rank_doing(s)), escape(frame_text(s.frame)))
    return t


def groups_table(rep: HangReport) -> Table:
    t = Table(title="Process groups where the ranks diverge", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("group", "collective", "sizes", "waiting inside", "never entered", "no data", "issued at"):
        t.add_column(col, overflow="fold")
    for g in rep.divergences:
        t.add_row(escape(g.label), f"#{g.seq} {g.op}", escape(str(g.sizes)), ", ".join(map(str, g.entered)) or "-",
                  ", ".join(map(str, g.never_entered)) or "-", ", ".join(map(str, g.unknown)) or "-",
                  escape(frame_text(g.issued_at)))
    return t
