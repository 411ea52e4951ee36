"""The rich console report: summary first, then findings, ranks, collectives."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fsdpdoctor.report.data_quality import lines as data_quality_lines
from fsdpdoctor.report.prose import prose
from fsdpdoctor.report.format import (
    CATEGORY_STYLE, SEVERITY_STYLE, categories, ms, num, pct, size, straggler_rank, trace_family, wrapping_line,
)
from fsdpdoctor.results import Analysis
from fsdpdoctor.report.terminal import terminal_console


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
    kind = job.input_kind
    lines.append(f"{trace_family(job)} trace, backend {job.backend or '?'}, world size {job.world_size or '?'}, "
                 f"ranks analysed: {ranks}\n")
    if kind is not None:
        lines.append(f"input: {kind.line()}\n")
        for what in kind.unknown:
            lines.append(f"cannot read: {what}\n", style="bold yellow")
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
    lines.append_text(gpu_lines(a))
    if a.prefetch:
        p = a.prefetch
        lines.append(f"\nprefetch ({p.framework}): backward {p.backward_mode} "
                     f"({p.backward_prefetched}/{p.backward_all_gathers} backward all-gathers prefetched), "
                     f"forward {p.forward_mode}")
    line = straggler_line(a)
    if line:
        lines.append("\n" + line)
    if a.contention is not None and a.findings:   # what every saving below rests on
        lines.append(f"\nhost: {a.contention.text}", style="dim" if a.contention.source != "schedstat" else "")
    return Panel(prose(lines), title=f"fsdpdoctor: {a.source}", title_align="left")


def gpu_lines(a: Analysis) -> Text:
    """GPU idle by cause, recompute and copies (device-timeline traces), averaged over ranks."""
    out = Text()
    sig = a.signals
    idles = sig.gpu_idle if sig else []
    if idles:
        n = len(idles)
        idle = sum(g.idle_us for g in idles) / n
        step = idle / max(sum(g.idle_frac for g in idles) / n, 1e-9)
        causes = {c: sum(g.by_cause.get(c, 0.0) for g in idles) / n for c in idles[0].by_cause}
        word = a.job.input_kind.device_word if a.job is not None and a.job.input_kind is not None else "GPU"
        out.append(f"\n{word} idle {ms(idle)} ({pct(idle / step if step else None)})" + _idle_parts(idles, causes, step))
        q = [g.queue_delay_median_us for g in idles if g.queue_delay_median_us is not None]
        if q:
            out.append(f"; kernels start {sorted(q)[len(q) // 2]:.0f} us after launch (median)")
    for r in (sig.recompute if sig else [])[:1]:
        out.append(f"\nactivation recompute {ms(r.recompute_us)} per step ({pct(r.recompute_frac)})")
    offs = sig.offload if sig else []
    step_us = a.mean.duration_us if a.mean else 0.0
    if offs and sum(o.h2d_us + o.d2h_us for o in offs) / len(offs) >= 0.01 * step_us:
        n = len(offs)
        out.append(f"\nhost<->device copies: HtoD {ms(sum(o.h2d_us for o in offs) / n)}, DtoH "
                   f"{ms(sum(o.d2h_us for o in offs) / n)}, exposed {ms(sum(o.exposed_us for o in offs) / n)}")
    return out


def _by_cause(causes: dict[str, float], step_us: float) -> str:
    return ", ".join(f"{c.replace('_', ' ')} {ms(v)}" for c, v in sorted(causes.items(), key=lambda kv: -kv[1])
                     if v >= 0.005 * step_us) or "-"


def _idle_parts(idles, causes: dict[str, float], step_us: float) -> str:
    """": launch 2.0 ms, ..." or, where steps hold one-time start-up (context creation, library handles, module
    loads: ``startup_calls``), the cold start named apart from the steady state: "; cold start: step #0 idle
    595 ms (one-off start-up: cudaFree 3100.0 ms, ...); steady state (3 steps): idle 3.1 ms per step: launch..."."""
    cold = sorted({s for g in idles for s in g.startup_steps})
    steady = [st for g in idles for st in g.steps if st.step not in cold]
    if not cold or not steady:
        return ": " + _by_cause(causes, step_us)
    calls = next((g.startup_calls for g in idles if g.startup_calls), [])
    first = [st for g in idles for st in g.steps if st.step in cold]
    mean = {c: sum(st.by_cause.get(c, 0.0) for st in steady) / len(steady) for c in causes}
    idle = sum(st.idle_us for st in steady) / len(steady)
    dur = sum(st.duration_us for st in steady) / len(steady)
    return (f"; cold start: step{'s' if len(cold) > 1 else ''} {', '.join(f'#{s}' for s in cold)} idle "
            f"{ms(sum(st.idle_us for st in first) / len(first))} (one-off start-up: {', '.join(calls[:2])}); "
            f"steady state ({len({st.step for st in steady})} steps): idle {ms(idle)} per step "
            f"({pct(idle / dur if dur else None)}): {_by_cause(mean, dur)}")


def straggler_line(a: Analysis) -> str | None:
    """One line on rank balance that says what the straggler finding says (header and TUI use it too)."""
    s = a.straggler
    if not s or s.straggler is None:
        return None
    f = next((f for f in a.findings if f.id == "straggler"), None)
    if f is not None:
        return (f"straggler: rank {f.ranks[0] if f.ranks else s.straggler} (last in {s.steps_last} of "
                f"{s.steps_total} steps; it costs {ms(f.impact_us)} = {pct(f.impact_frac)} of the step)")
    noise = f"; step-to-step noise {ms(s.noise_us)}" if s.noise_us else ""
    return (f"no straggler: rank {s.straggler} was last in {s.steps_last} of {s.steps_total} steps, the others "
            f"waiting {ms(s.wait_us)} per step for it (median{noise})")


def _steps(steps: list[int]) -> str:
    if not steps:
        return "-"
    # numbered as the trace numbers them: "steps: 10" would read as ten steps, "#10" is step number 10
    if len(steps) > 3:
        return f"#{steps[0]}..#{steps[-1]} ({len(steps)})"
    return ", ".join(f"#{s}" for s in steps) + f" ({len(steps)})"


def findings_table(a: Analysis, evidence_lines: int = 2) -> Group | Text:
    """Findings as short blocks, most costly first: title, impact, what, where, fix."""
    if not a.findings:
        return Text("No findings above the thresholds.", style="green")
    blocks: list = [Text("Findings (most costly first; effects under their cause)", style="bold")]
    for f in a.findings:
        indent = 4 if f.caused_by else 0
        head = Text(" " * indent)
        if f.caused_by:
            head.append("caused by the above: ", style="dim")
        head.append(f"{f.severity.upper()} ", style=SEVERITY_STYLE.get(f.severity, ""))
        head.append(f.title, style="bold")
        iv = (f" [{f.impact_interval_us[0] / 1e3:.1f}, {f.impact_interval_us[1] / 1e3:.1f}]"
              if f.impact_interval_us and f.impact_us > 0 else "")
        saving = "saving withheld" if f.impact_withheld else f"{ms(f.impact_us)}{iv}/step ({pct(f.impact_frac)})"
        head.append(f"  {saving}  [{f.id}]", style="dim")
        body = Text()
        body.append(f.summary)
        if f.impact_withheld:
            body.append(f"\n{f.impact_withheld}", style="yellow")
        for e in f.evidence[:evidence_lines]:
            body.append(f"\n- {e.text}", style="dim")
        if f.source:
            body.append("\nat ", style="dim")
            body.append(f.source, style="cyan")
        body.append("\nfix: ", style="green")
        body.append(f.fix)
        if f.consequences:
            body.append(f"\nexplains: {', '.join(f.consequences)} (below)", style="dim")
        blocks += [prose(head), Padding(prose(body), (0, 0, 0, 2 + indent))]
    return Group(*blocks)


def ranks_table(a: Analysis) -> Table:
    t = Table(title=prose("Per rank (mean per step, ms)"), title_justify="left", box=box.SIMPLE_HEAD)
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
    t = Table(title=prose("Collectives (mean per rank and step, ms; calls running together share their time, so the "
                          "rows add up to the step's communication; size = mean message, GB/s = bus bandwidth)"),
              title_justify="left", box=box.SIMPLE_HEAD)
    widths = {"kind": 14, "phase": 9}
    for col in ("kind", "phase", "calls/step", "ms", "exp ms", "size", "GB/s"):
        left = col in widths
        t.add_column(col, justify="left" if left else "right", no_wrap=True, min_width=widths.get(col))
    for c in a.collectives:
        t.add_row(c.kind, c.phase, f"{c.per_step:.1f}", num(c.busy_per_step_us), num(c.exposed_per_step_us),
                  size(c.mean_size_bytes), f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "-")
    return t


def render(a: Analysis, console: Console | None = None, verbose: bool = False) -> None:
    console = console or terminal_console()
    parts = [summary(a), findings_table(a, evidence_lines=99 if verbose else 2), ranks_table(a)]
    ct = collectives_table(a)
    if ct is not None:
        parts.append(ct)
    if verbose:
        for r in a.ranks:
            st = Table(title=prose(f"rank {r.rank} per step (ms)"), title_justify="left")
            for col in ("step", "time", "compute", "optimizer", "exposed", "overlapped", "data", "idle"):
                st.add_column(col, justify="right")
            for s in r.steps:
                st.add_row(str(s.step), *(num(v) for v in (s.duration_us, s.compute_us, s.optimizer_us,
                                                           s.exposed_comm_us, s.overlapped_comm_us,
                                                           s.data_loading_us, s.idle_us)))
            parts.append(st)
    dq = data_quality_lines(a.data_quality)
    if dq:
        parts.append(prose("\n".join(f"data quality: {n}" for n in dq), style="yellow"))
    notes = [*a.notes, *(a.data_quality.sources if a.data_quality else [])]
    if notes:
        parts.append(prose("\n".join(f"note: {n}" for n in notes), style="dim"))
    console.print(Group(*parts))
