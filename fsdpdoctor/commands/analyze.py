"""`fsdpdoctor analyze PATH`: the report (console, --json, or --tui)."""

from __future__ import annotations

import sys

from fsdpdoctor.commands.base import add_output, add_window
from fsdpdoctor.commands.common import add_selection_args, run_analysis
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = "Analyse a torch.profiler trace file or a folder of per-rank traces."
    add_selection_args(p)
    add_output(p, "the analysis", tui=True)
    p.add_argument("--events", action="store_true", help="with --json: include every collective call")
    p.add_argument("--ranks", choices=["all"],
                   help="with --json: every rank's detail in the document (by default, past a few MB of it, "
                        "only the ranks the findings name)")
    p.add_argument("--ranks-detail", metavar="FILE",
                   help="with --json: also write the whole document (every rank) to FILE")
    add_window(p)
    p.add_argument("--verbose", "-v", action="store_true", help="also print per-step tables")
    p.add_argument("--compare-hta", action="store_true",
                   help="print HTA's comm/compute overlap beside ours (needs `pip install fsdpdoctor[hta]`)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.tui:
        from fsdpdoctor.commands.tui import open_tui

        return open_tui(args)
    if (args.ranks or args.ranks_detail) and not args.json:
        raise InputError(None, "--ranks and --ranks-detail shape the --json document: add --json")
    analysis = run_analysis(args)
    if args.json:
        from fsdpdoctor.report.json_report import document

        try:
            doc = document(analysis, include_events=args.events, all_ranks=args.ranks == "all",
                           detail_file=args.ranks_detail)
        except OSError as exc:
            raise InputError(args.ranks_detail, f"cannot write the detail file ({exc.strerror})") from None
        if hasattr(sys.stdout, "buffer"):   # the bytes as encoded (no decode of a document of many MB)
            sys.stdout.flush()
            sys.stdout.buffer.write(doc + b"\n")
        else:                               # a text stream put in its place (redirect_stdout)
            sys.stdout.write(doc.decode() + "\n")
        return 0
    from fsdpdoctor.report.console import render

    render(analysis, verbose=args.verbose)
    if args.compare_hta:
        from fsdpdoctor.report.hta_compare import print_comparison

        print_comparison(str(analysis.source), analysis)
    return 0
