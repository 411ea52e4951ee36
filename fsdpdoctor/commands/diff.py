"""`fsdpdoctor diff BASE NEW`: what changed between two runs, with a noise guard (docs/diff.md)."""

from __future__ import annotations

import json

from fsdpdoctor.commands.common import add_engine_args, engine_kwargs, parse_ranks, parse_steps, parse_thresholds
from fsdpdoctor.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two runs: step time, components and findings, with confidence intervals",
                       description="Compare a base run with a new run of the same job. Each side is a trace file, "
                                   "a run folder or a saved `analyze --json` document.")
    p.add_argument("base", help="trace file, run folder or saved --json of the base run")
    p.add_argument("new", help="trace file, run folder or saved --json of the new run")
    p.add_argument("--rank", action="append", metavar="R[,R...]")
    p.add_argument("--steps", metavar="SPEC")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="e.g. diff_confidence=0.99 (see `fsdpdoctor check --list-thresholds`)")
    p.add_argument("--config", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a significant regression of the job (not on noise, not on a slower machine)")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.diagnose.compare import compare

    th = parse_thresholds(args)
    # the engine options apply to a side that is a trace; a saved --json is read back without one
    kw = dict(ranks=parse_ranks(args.rank), steps=parse_steps(args.steps), thresholds=th, **engine_kwargs(args))
    sides = [open_analysis(p, **kw) for p in (args.base, args.new)]
    for path, a in zip((args.base, args.new), sides):
        if not any(r.steps for r in a.ranks):
            raise InputError(path, "no analysed step to compare (check --steps/--rank)")
    c = compare(*sides, thresholds=th)
    if args.json:
        print(json.dumps(c.to_dict(), indent=2, default=str))
    else:
        from fsdpdoctor.report.diff_view import render

        render(c)
    return 1 if (args.fail_on_regression and c.regressed) else 0
