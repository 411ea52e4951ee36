"""`fsdpdoctor diff BASE NEW`: what changed between two runs, with a noise guard (docs/diff.md)."""

from __future__ import annotations

from fsdpdoctor.commands.base import add_engine, add_output, add_selection, add_thresholds, print_json
from fsdpdoctor.commands.common import options_from, parse_thresholds
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = ("Compare a base run with a new run of the same job. Each side is a trace file, "
                     "a run folder or a saved `analyze --json` document.")
    p.add_argument("base", help="trace file, run folder or saved --json of the base run")
    p.add_argument("new", help="trace file, run folder or saved --json of the new run")
    add_selection(p, " on both sides")
    # a run folder with capture windows (docs/capture.md): which window each side is, e.g. the same folder
    # twice with --base-window 60 --new-window 178 compares a healthy window with the anomaly's
    p.add_argument("--base-window", type=int, metavar="STEP",
                   help="BASE is a run folder with windows: the window starting at STEP (default: the latest)")
    p.add_argument("--new-window", type=int, metavar="STEP",
                   help="NEW is a run folder with windows: the window starting at STEP (default: the latest)")
    add_thresholds(p, "diff_confidence=0.99")
    add_output(p, "the comparison")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a significant regression of the job (not on noise, not on a slower machine)")
    add_engine(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.diagnose.compare import compare

    th = parse_thresholds(args)
    # the engine options apply to a side that is a trace; a saved --json is read back without one
    options = options_from(args, thresholds=th)
    sides = [open_analysis(p, options, window=w)
             for p, w in ((args.base, args.base_window), (args.new, args.new_window))]
    for path, a in zip((args.base, args.new), sides):
        if not any(r.steps for r in a.ranks):
            raise InputError(path, "no analysed step to compare (check --steps/--rank)")
    c = compare(*sides, thresholds=th)
    from fsdpdoctor.report.diff_view import document, render

    if args.json:
        print_json(document(c))
    else:
        render(c)
    return 1 if (args.fail_on_regression and c.regressed) else 0
