"""`fsdpdoctor analyze PATH`: the report (console, --json, or --tui)."""

from __future__ import annotations

import sys

from fsdpdoctor.commands.base import add_output, add_window
from fsdpdoctor.commands.common import add_selection_args, run_analysis


def register(sub) -> None:
    p = sub.add_parser("analyze", help="step-time breakdown, communication, prefetch, stragglers and findings",
                       description="Analyse a torch.profiler trace file or a folder of per-rank traces.")
    add_selection_args(p)
    add_output(p, "the analysis", tui=True)
    p.add_argument("--events", action="store_true", help="with --json: include every collective call")
    add_window(p)
    p.add_argument("--verbose", "-v", action="store_true", help="also print per-step tables")
    p.add_argument("--compare-hta", action="store_true",
                   help="print HTA's comm/compute overlap beside ours (needs `pip install fsdpdoctor[hta]`)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.tui:
        from fsdpdoctor.commands.tui import open_tui

        return open_tui(args)
    analysis = run_analysis(args)
    if args.json:
        from fsdpdoctor.pipeline import gc_paused
        from fsdpdoctor.report.json_report import to_json

        with gc_paused():   # the document is a tree of millions of new objects at thousands of ranks
            sys.stdout.write(to_json(analysis, include_events=args.events) + "\n")
        return 0
    from fsdpdoctor.report.console import render

    render(analysis, verbose=args.verbose)
    if args.compare_hta:
        from fsdpdoctor.report.hta_compare import print_comparison

        print_comparison(str(analysis.source), analysis)
    return 0
