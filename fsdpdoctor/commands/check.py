"""`fsdpdoctor check PATH`: CI gate. Exit 0 clean, 1 findings at or above the bar, 2 bad input."""

from __future__ import annotations

from fsdpdoctor.commands.base import add_analysis_flags, add_output, print_json
from fsdpdoctor.commands.common import options_from, parse_thresholds, run_analysis
from fsdpdoctor.errors import InputError
from fsdpdoctor.severity import SEVERITIES


def _percent(v: str) -> float:
    try:
        return float(v[:-1]) / 100 if v.endswith("%") else float(v)
    except ValueError:
        raise InputError(None, f"expected a number or a percentage, got {v!r}") from None


def register(p) -> None:
    p.description = "Diagnose a trace and fail (exit 1) on findings at or above --fail-on."
    add_analysis_flags(p, path_optional=True)
    p.add_argument("--fail-on", choices=SEVERITIES, default="warning",
                   help="lowest severity that fails the check (default: warning)")
    p.add_argument("--max-exposed-comm", metavar="PCT", help="also fail if exposed comm exceeds this share of step")
    p.add_argument("--max-data-loading", metavar="PCT", help="also fail if data loading exceeds this share of step")
    p.add_argument("--max-idle", metavar="PCT", help="also fail if idle exceeds this share of step")
    fmt = add_output(p, "the findings and the verdict")
    fmt.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    p.add_argument("--baseline", metavar="RUN_OR_JSON",
                   help="also fail on a significant regression against this run (trace folder/file or saved "
                        "--json); noise and a slower machine do not fail (docs/diff.md)")
    p.add_argument("--list-thresholds", action="store_true", help="print the threshold table and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list_thresholds:
        from fsdpdoctor.diagnose.thresholds import THRESHOLDS
        from fsdpdoctor.report.check import render_thresholds

        render_thresholds(THRESHOLDS)
        return 0
    if args.path is None:
        raise InputError(None, "check: give a PATH (a trace file or a run folder), or --list-thresholds")
    from fsdpdoctor.diagnose.check import check

    limits = {budget: _percent(limit) for budget, limit in (("exposed_comm", args.max_exposed_comm),
                                                           ("data_loading", args.max_data_loading),
                                                           ("idle", args.max_idle)) if limit is not None}
    if args.junit:
        from fsdpdoctor.trace.io import check_output

        check_output(args.junit, [args.path])
    a = run_analysis(args)
    hang, notes = _hang(args)
    res = check(a, args.fail_on, limits, _baseline(args, a) if args.baseline else None, hang, notes)
    if args.json:
        from fsdpdoctor.report.check import document

        print_json(document(res))
    else:
        from fsdpdoctor.report.check import render

        render(res)
    if args.junit:
        from fsdpdoctor.diagnose.hang import HANG_IDS
        from fsdpdoctor.diagnose.rules import RULE_IDS
        from fsdpdoctor.report.junit import to_junit

        from fsdpdoctor.trace.io import write_atomic

        try:
            write_atomic(args.junit, to_junit(a, res.failing, RULE_IDS + (HANG_IDS if hang else [])))
        except OSError as exc:
            raise InputError(args.junit, f"cannot write JUnit file: {exc.strerror or exc}") from None
    return 0 if res.passed else 1


def _hang(args) -> tuple[list, list[str]]:
    """The findings of the run's hang dumps, gated like the others; dumps that cannot be read are
    named in a note (the traces were checked)."""
    from fsdpdoctor.trace.hang import has_hang_dumps

    if not has_hang_dumps(args.path):
        return [], []
    from fsdpdoctor.hang_pipeline import open_hang

    try:
        return open_hang(args.path, trend=False, thresholds=parse_thresholds(args)).findings, []
    except InputError as exc:
        return [], [f"the hang dumps could not be read ({exc})"]


def _baseline(args, a):
    from fsdpdoctor.diagnose.compare import compare
    from fsdpdoctor.pipeline import open_analysis

    th = parse_thresholds(args)
    base = open_analysis(args.baseline, options_from(args, thresholds=th, window=None))
    if not any(r.steps for r in base.ranks):
        raise InputError(args.baseline, "no analysed step in the baseline (check --steps/--rank)")
    return compare(base, a, thresholds=th)
