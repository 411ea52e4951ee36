"""`fsdpdoctor export RUN --perfetto out.json`: every rank on one timeline (docs/clock.md)."""

from __future__ import annotations

from fsdpdoctor.commands.common import add_selection_args, parse_ranks, parse_steps, parse_thresholds, progress_bar
from fsdpdoctor.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("export", help="write all ranks on one clock-aligned timeline (Perfetto/Chrome JSON)",
                       description="Merge the ranks of a run into one Chrome/Perfetto JSON trace: each rank a "
                                   "process on the reference rank's clock, collectives linked across ranks, "
                                   "findings as annotated ranges. Open it at ui.perfetto.dev or chrome://tracing.")
    add_selection_args(p)
    p.add_argument("--perfetto", metavar="OUT.json", required=True, help="file to write")
    p.add_argument("--no-ops", action="store_true",
                   help="leave out the original trace events (steps, collectives and findings only)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.api import analyze_with_traces
    from fsdpdoctor.report.perfetto import write

    with progress_bar(not args.no_progress) as cb:
        a, traces = analyze_with_traces(args.path, ranks=parse_ranks(args.rank), steps=parse_steps(args.steps),
                                        thresholds=parse_thresholds(args), progress=cb)
    try:
        n = write(a, args.perfetto, None if args.no_ops else traces)
    except OSError as exc:
        raise InputError(args.perfetto, f"cannot write: {exc.strerror or exc}") from None
    clock = ("clocks aligned on rank " + str(a.clock.reference_rank)) if a.clock else "one rank: no clock alignment"
    print(f"wrote {args.perfetto}: {n} events, {len(a.ranks)} rank(s), {len(a.findings)} finding(s); {clock}")
    return 0
