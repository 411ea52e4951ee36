"""`fsdpdoctor scaling RUN_A RUN_B [...]`: throughput and scaling efficiency of one job at
several world sizes, with a waterfall of where the lost efficiency went (docs/scaling.md)."""

from __future__ import annotations

from fsdpdoctor.commands.base import (add_engine, add_output, add_selection, add_thresholds, print_json,
                                      require_terminal)
from fsdpdoctor.commands.common import options_from, parse_thresholds
from fsdpdoctor.errors import InputError


def _positive(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise InputError(None, f"expected a positive number, got {v!r}") from None
    if not 0 < x < 1e15:   # NaN and inf too: work per step and throughput are products of it
        raise InputError(None, f"expected a positive number below 10^15, got {v!r}")
    return x


def register(p) -> None:
    p.description = ("Compare runs of the same job at different world sizes: global throughput, "
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
    options = options_from(args, thresholds=th, diagnose=False)
    analyses = [open_analysis(r, options) for r in args.runs]
    return scaling_report(analyses, samples_per_rank=spr, tokens_per_rank=tpr, thresholds=th)


def run(args) -> int:
    rep = build_report(args)  # bad input is named first, as without --tui
    if args.tui:
        require_terminal()
        from fsdpdoctor.tui.scaling_app import ScalingApp

        return int(ScalingApp(rep, thresholds=parse_thresholds(args)).run() or 0)
    from fsdpdoctor.report.scaling import document, render

    if args.json:
        print_json(document(rep))
    else:
        render(rep)
    return 0
