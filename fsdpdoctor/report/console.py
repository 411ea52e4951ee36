"""The rich console report: summary first, then findings, ranks, collectives."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fsdpdoctor.report.data_quality import lines as data_quality_lines
from fsdpdoctor.report.format import (
    CATEGORY_STYLE, SEVERITY_STYLE, categories, ms, num, pct, size, wrapping_line,
)
from fsdpdoctor.results import Analysis


def breakdown_bar(b, width: int = 50) -> Text:
    text = Text()
    total = b.duration_us or 1.0
    for name, v in categories(b):
        n = round(width * v / total)
        if n:
            text.append("█" * n, style=CATEGORY_STYLE[name])
    return text


def summary(a: Analysis) -> Panel:
    job = a.job
    lines = Text()
    ranks = ", ".join(map(str, job.ranks_analyzed[:8])) + ("..." if len(job.ranks_analyzed) > 8 else "")
    lines.append(f"{job.dialect.upper()} trace, backend {job.backend or '?'}, world size {job.world_size or '?'}, "
                 f"ranks analysed: {ranks}\n")
    lines.append(f"wrapping: {wrapping_line(job)}   steps: {_steps(job.steps)}\n")
    m = a.mean
    if m:
        lines.append(f"step time {ms(m.duration_us)}  ")
        lines.append_text(breakdown_bar(m))
        lines.append("\n")
        for name, v in categories(m):
            lines.append(f"{name} ", style=CATEGORY_STYLE[name])
            lines.append(f"{ms(v)} ({pct(v / m.duration_us if m.duration_us else None)})  ")
        lines.append("\n")
        lines.append(f"communication {ms(m.comm_us)}: exposed {ms(m.exposed_comm_us)}, overlapped "
                     f"{ms(m.overlapped_comm_us)} (overlap {pct(m.overlap_frac)})")
    if a.prefetch:
        p = a.prefetch
        lines.append(f"\nprefetch ({p.framework}): backward {p.backward_mode} "
                     f"({p.backward_prefetched}/{p.backward_all_gathers} backward all-gathers prefetched), "
                     f"forward {p.forward_mode}")
    if a.straggler and a.straggler.straggler is not None:
        s = a.straggler
        if straggler_rank(a) is not None:
            lines.append(f"\nstraggler: rank {s.straggler} (slowest in {pct(s.last_fraction)} of steps; the others "
                         f"wait {pct(s.spread_frac)} of the step for it)")
        else:
            lines.append(f"\nranks balanced: at most {pct(s.spread_frac)} of a step waiting for another rank "
                         "(median over steps)")
    return Panel(lines, title=f"fsdpdoctor: {a.source}", title_align="left")


def _steps(steps: list[int]) -> str:
    if not steps:
        return "-"
    return f"{steps[0]}..{steps[-1]} ({len(steps)})" if len(steps) > 3 else ", ".join(map(str, steps))


def findings_table(a: Analysis, evidence_lines: int = 2) -> Group | Text:
    """Findings as short blocks, most costly first: title, impact, what, where, fix."""
    if not a.findings:
        return Text("No findings above the thresholds.", style="green")
    blocks: list = [Text("Findings (most costly first)", style="bold")]
    for f in a.findings:
        head = Text()
        head.append(f"{f.severity.upper()} ", style=SEVERITY_STYLE.get(f.severity, ""))
        head.append(f.title, style="bold")
        head.append(f"  {ms(f.impact_us)}/step ({pct(f.impact_frac)})  [{f.id}]", style="dim")
        body = Text()
        body.append(f.summary)
        for e in f.evidence[:evidence_lines]:
            body.append(f"\n- {e.text}", style="dim")
        if f.source:
            body.append("\nat ", style="dim")
            body.append(f.source, style="cyan")
        body.append("\nfix: ", style="green")
        body.append(f.fix)
        blocks += [head, Padding(body, (0, 0, 0, 2))]
    return Group(*blocks)


def straggler_rank(a: Analysis) -> int | None:
    """The straggler, when the diagnosis says there is one."""
    f = next((f for f in a.findings if f.id == "straggler"), None)
    return f.ranks[0] if f and f.ranks else None


def ranks_table(a: Analysis) -> Table:
    t = Table(title="Per rank (mean per step, ms)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("rank", "step", "compute", "optim", "exposed", "overlap", "data", "idle", "wait"):
        t.add_column(col, justify="right")
    strag = straggler_rank(a)
    for r in a.ranks:
        m = r.mean
        if not m:
            continue
        label = f"{r.rank}*" if r.rank == strag else str(r.rank)
        t.add_row(label, *(num(v) for v in (m.duration_us, m.compute_us, m.optimizer_us, m.exposed_comm_us,
                                             m.overlapped_comm_us, m.data_loading_us, m.idle_us, r.wait_us)))
    if strag is not None:
        t.caption = "* slowest rank (the others wait for it)"
    return t


def collectives_table(a: Analysis) -> Table | None:
    if not a.collectives:
        return None
    t = Table(title="Collectives (all analysed ranks and steps; size = mean message, GB/s = bus bandwidth)",
              title_justify="left", box=box.SIMPLE_HEAD)
    widths = {"kind": 14, "phase": 9}
    for col in ("kind", "phase", "calls/step", "ms", "exp ms", "size", "GB/s"):
        left = col in widths
        t.add_column(col, justify="left" if left else "right", no_wrap=True, min_width=widths.get(col))
    for c in a.collectives:
        t.add_row(c.kind, c.phase, f"{c.per_step:.1f}", num(c.total_us), num(c.exposed_us),
                  size(c.mean_size_bytes), f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "-")
    return t


def render(a: Analysis, console: Console | None = None, verbose: bool = False) -> None:
    console = console or Console()
    parts = [summary(a), findings_table(a, evidence_lines=99 if verbose else 2), ranks_table(a)]
    ct = collectives_table(a)
    if ct is not None:
        parts.append(ct)
    if verbose:
        for r in a.ranks:
            st = Table(title=f"rank {r.rank} per step (ms)", title_justify="left")
            for col in ("step", "time", "compute", "optimizer", "exposed", "overlapped", "data", "idle"):
                st.add_column(col, justify="right")
            for s in r.steps:
                st.add_row(str(s.step), *(num(v) for v in (s.duration_us, s.compute_us, s.optimizer_us,
                                                           s.exposed_comm_us, s.overlapped_comm_us,
                                                           s.data_loading_us, s.idle_us)))
            parts.append(st)
    dq = data_quality_lines(a.data_quality)
    if dq:
        parts.append(Text("\n".join(f"data quality: {n}" for n in dq), style="yellow"))
    if a.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in a.notes), style="dim"))
    console.print(Group(*parts))
