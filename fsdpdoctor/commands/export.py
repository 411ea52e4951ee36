"""`fsdpdoctor export RUN --perfetto out.json`: every rank on one timeline (docs/clock.md)."""

from __future__ import annotations

from fsdpdoctor.commands.base import say
from fsdpdoctor.commands.common import (
    add_selection_args, options_from, progress_bar,
)
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = ("Merge the ranks of a run into one Chrome/Perfetto JSON trace: each rank a "
                     "process on the reference rank's clock, collectives linked across ranks, "
                     "findings as annotated ranges. Open it at ui.perfetto.dev or chrome://tracing.")
    add_selection_args(p)
    p.add_argument("--perfetto", metavar="OUT.json", required=True, help="file to write")
    p.add_argument("--no-ops", action="store_true",
                   help="leave out the original trace events (steps, collectives and findings only)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.report.perfetto import write

    from fsdpdoctor.trace.io import check_output

    check_output(args.perfetto, [args.path])
    options = options_from(args)
    with progress_bar(not args.no_progress) as cb:
        if args.no_ops:  # steps, collectives and findings: the analysis alone, mapped where the options say
            a, traces = open_analysis(args.path, options, progress=cb), None
        elif options.dask:
            raise InputError(None, "--dask: export copies every rank's events into one file from this process; "
                                   "use --no-ops to analyse on the cluster and export steps, collectives and findings")
        else:  # the events themselves: every rank's tables come back here (--jobs processes read them)
            a, traces = open_analysis(args.path, options, progress=cb, tables=True)
    try:
        n = write(a, args.perfetto, traces)
    except OSError as exc:
        raise InputError(args.perfetto, f"cannot write: {exc.strerror or exc}") from None
    clock = ("clocks aligned on rank " + str(a.clock.reference_rank)) if a.clock else "one rank: no clock alignment"
    say(f"wrote {args.perfetto}: {n} events, {len(a.ranks)} rank(s), {len(a.findings)} finding(s); {clock}")
    return 0
