"""`fsdpdoctor scaling RUN_A RUN_B [...]`: throughput and scaling efficiency of one job at
several world sizes, with a waterfall of where the lost efficiency went (docs/scaling.md)."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.commands.base import (add_engine, add_output, add_selection, add_thresholds, print_json,
                                      require_terminal)
from fsdpdoctor.commands.common import engine_kwargs, parse_ranks, parse_steps, parse_thresholds
from fsdpdoctor.errors import InputError


def _positive(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise InputError(None, f"expected a positive number, got {v!r}") from None
    if x <= 0:
        raise InputError(None, f"expected a positive number, got {v!r}")
    return x


def register(sub) -> None:
    p = sub.add_parser("scaling", help="scaling efficiency across world sizes, with a waterfall of the losses",
                       description="Compare runs of the same job at different world sizes: global throughput, "
                                   "scaling efficiency vs the smallest run, and where the step-time increase went "
                                   "(exposed communication by kind, waiting on slower ranks, data loading, compute "
                                   "inflation, idle). Work per step comes from the manifests (global figures).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or trace files) of the same job")
    work = p.add_mutually_exclusive_group()
    work.add_argument("--samples-per-step", metavar="N", type=str,
                      help="samples per step PER RANK (multiplied by each run's world size); overrides manifests")
    work.add_argument("--tokens-per-step", metavar="N", type=str,
                      help="tokens per step PER RANK (multiplied by each run's world size); overrides manifests")
    add_selection(p, " in every run")
    add_thresholds(p, "scaling_efficiency_low=0.9")
    add_engine(p)
    add_output(p, tui=True)
    p.set_defaults(func=run)


def build_report(args):
    """Load the runs and build the ScalingReport; raises InputError on bad input (before any UI)."""
    from fsdpdoctor.diagnose.scaling import scaling_report
    from fsdpdoctor.pipeline import open_analysis

    if len(args.runs) < 2:
        raise InputError(None, f"scaling needs at least 2 runs, got {len(args.runs)}")
    spr = _positive(args.samples_per_step) if args.samples_per_step is not None else None
    tpr = _positive(args.tokens_per_step) if args.tokens_per_step is not None else None
    th = parse_thresholds(args)
    kw = dict(ranks=parse_ranks(args.rank), steps=parse_steps(args.steps), thresholds=th, diagnose=False,
              **engine_kwargs(args))
    analyses = [open_analysis(r, **kw) for r in args.runs]
    return scaling_report(analyses, samples_per_rank=spr, tokens_per_rank=tpr, thresholds=th)


def run(args) -> int:
    rep = build_report(args)  # bad input is named first, as without --tui
    if args.tui:
        require_terminal()
        from fsdpdoctor.tui.scaling_app import ScalingApp

        return int(ScalingApp(rep, thresholds=parse_thresholds(args)).run() or 0)
    if args.json:
        print_json(rep.to_dict())
    else:
        render(rep)
    return 0


def _bar(points: float, scale: float, width: int = 16) -> str:
    n = round(abs(points) / scale * width) if scale > 0 else 0
    return ("█" * n) if n else ("▏" if points else "")


def render(rep, console=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from fsdpdoctor.report.format import SEVERITY_STYLE

    con = console or Console()
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
