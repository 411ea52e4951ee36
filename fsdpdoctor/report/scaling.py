"""``fsdpdoctor scaling``: the runs' throughput and efficiency, then per larger run a waterfall of
where the step-time increase went, then the findings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from fsdpdoctor.results.scaling import ScalingReport
from fsdpdoctor.report.format import SEVERITY_STYLE
from fsdpdoctor.report.terminal import terminal_console


def _bar(points: float, scale: float, width: int = 16) -> str:
    n = round(abs(points) / scale * width) if scale > 0 else 0
    return ("█" * n) if n else ("▏" if points else "")


def render(rep: ScalingReport, console: Console | None = None) -> None:
    con = console or terminal_console()
    unit = rep.unit
    t = Table(title=f"Scaling ({rep.mode} scaling, {unit}/s = global {unit} per step / mean step time)",
              title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("run", overflow="ellipsis", no_wrap=True)
    for col in ("N", "/step", "/rank", "step ms", "ideal", f"{unit}/s", "eff."):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rep.runs:
        eff = f"{100 * r.efficiency:.1f}%"
        if r.world_size != rep.base_world_size:
            eff = f"[{'red' if r.efficiency < 0.8 else 'green'}]{eff}[/]"
        else:
            eff = "base"
        t.add_row(Path(r.source).name or r.source, str(r.world_size), f"{r.work_per_step:g}", f"{r.work_per_rank:g}",
                  f"{r.step_us / 1e3:.1f}", f"{r.ideal_step_us / 1e3:.1f}", f"{r.throughput:,.0f}", eff)
    con.print(t)
    for w in rep.waterfalls:
        con.print(f"\n[bold]Waterfall {w.base_world_size} -> {w.world_size} ranks[/]: step "
                  f"{w.ideal_step_us / 1e3:.1f} ms ideal -> {w.step_us / 1e3:.1f} ms measured "
                  f"({w.increase_us / 1e3:+.1f} ms), efficiency {100 * w.efficiency:.1f}% "
                  f"({100 * -w.lost_efficiency:+.1f} points vs linear)")
        scale = max((abs(p.efficiency_points) for p in w.parts), default=0.0)
        wt = Table(show_header=True, box=None, padding=(0, 1))
        wt.add_column("part", no_wrap=True)
        for col in ("base ms", "run ms", "Δ ms", "points"):
            wt.add_column(col, justify="right", no_wrap=True)
        wt.add_column("", no_wrap=True)
        for p in w.parts:
            color = "red" if p.delta_us > 0 else "green"
            wt.add_row(p.label, f"{p.base_us / 1e3:.1f}", f"{p.run_us / 1e3:.1f}", f"{p.delta_us / 1e3:+.1f}",
                       f"{100 * p.efficiency_points:+.1f}", f"[{color}]{_bar(p.efficiency_points, scale)}[/]")
        wt.add_row("[bold]total[/]", "", "", f"[bold]{w.increase_us / 1e3:+.1f}[/]",
                   f"[bold]{100 * w.lost_efficiency:+.1f}[/]", "")
        con.print(wt)
    if rep.findings:
        con.print()
        for f in rep.findings:
            con.print(f"[{SEVERITY_STYLE.get(f.severity, '')}]{f.severity}[/] {f.title} [dim]{f.id}[/]")
            con.print(f"  {f.summary}")
            con.print(f"  [bold]fix:[/] {f.fix}")
    for n in rep.notes:
        con.print(f"[dim]note: {n}[/]")


def document(rep: ScalingReport) -> dict:
    """``scaling --json``: the report's fields as they are."""
    return dataclasses.asdict(rep)
