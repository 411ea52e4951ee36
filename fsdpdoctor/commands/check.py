"""`fsdpdoctor check PATH`: CI gate. Exit 0 clean, 1 findings at or above the bar, 2 bad input."""

from __future__ import annotations

import json

from fsdpdoctor.commands.common import add_selection_args, engine_kwargs, run_analysis
from fsdpdoctor.errors import InputError

_ORDER = {"info": 0, "warning": 1, "error": 2}


def _percent(v: str) -> float:
    try:
        return float(v[:-1]) / 100 if v.endswith("%") else float(v)
    except ValueError:
        raise InputError(None, f"expected a number or a percentage, got {v!r}") from None


def register(sub) -> None:
    p = sub.add_parser("check", help="CI gate: exit 1 when findings reach the bar",
                       description="Diagnose a trace and fail (exit 1) on findings at or above --fail-on.")
    add_selection_args(p)
    p.add_argument("--fail-on", choices=["info", "warning", "error"], default="warning",
                   help="lowest severity that fails the check (default: warning)")
    p.add_argument("--max-exposed-comm", metavar="PCT", help="also fail if exposed comm exceeds this share of step")
    p.add_argument("--max-data-loading", metavar="PCT", help="also fail if data loading exceeds this share of step")
    p.add_argument("--max-idle", metavar="PCT", help="also fail if idle exceeds this share of step")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print findings and verdict as JSON")
    fmt.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    p.add_argument("--baseline", metavar="RUN_OR_JSON",
                   help="also fail on a significant regression against this run (trace folder/file or saved "
                        "--json); noise and a slower machine do not fail (docs/diff.md)")
    p.add_argument("--list-thresholds", action="store_true", help="print the threshold table and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list_thresholds:
        from fsdpdoctor.diagnose.thresholds import THRESHOLDS

        for t in THRESHOLDS:
            print(f"{t.name:32s} {t.default:<12g} {t.unit:26s} {t.meaning}  [source: {t.source}]")
        return 0
    a = run_analysis(args)
    bar = _ORDER[args.fail_on]
    failing = [f for f in a.findings if _ORDER.get(f.severity, 0) >= bar]
    budgets = []
    m = a.mean
    for flag, field, label in (("max_exposed_comm", "exposed_comm_us", "exposed communication"),
                               ("max_data_loading", "data_loading_us", "data loading"),
                               ("max_idle", "idle_us", "idle")):
        limit = getattr(args, flag)
        if limit is None or not m or not m.duration_us:
            continue
        share = getattr(m, field) / m.duration_us
        if share > _percent(limit):
            budgets.append(f"{label} {100 * share:.1f}% of step > {100 * _percent(limit):.1f}%")
    comparison = None
    if args.baseline:
        from fsdpdoctor.pipeline import open_analysis
        from fsdpdoctor.commands.common import parse_ranks, parse_steps, parse_thresholds
        from fsdpdoctor.diagnose.compare import compare

        th = parse_thresholds(args)
        base = open_analysis(args.baseline, ranks=parse_ranks(args.rank), steps=parse_steps(args.steps), thresholds=th,
                             **engine_kwargs(args))
        if not any(r.steps for r in base.ranks):
            raise InputError(args.baseline, "no analysed step in the baseline (check --steps/--rank)")
        comparison = compare(base, a, thresholds=th)
    regressed = comparison is not None and comparison.regressed
    failed = bool(failing or budgets or regressed)
    from fsdpdoctor.report.data_quality import lines as data_quality_lines

    quality = data_quality_lines(a.data_quality)
    if args.json:
        print(json.dumps({"schema_version": a.schema_version, "passed": not failed, "fail_on": args.fail_on,
                          "failing": [f.id for f in failing], "budgets_exceeded": budgets,
                          "baseline": None if comparison is None else comparison.to_dict(),
                          "data_quality": quality,
                          "findings": [f.__dict__ | {"evidence": [e.__dict__ for e in f.evidence]}
                                       for f in a.findings]}, indent=2, default=str))
    else:
        for f in a.findings:
            mark = "FAIL" if f in failing else "ok  "
            where = f" at {f.source}" if f.source else ""
            cause = f"  [caused by {f.caused_by}]" if f.caused_by else ""
            print(f"{mark} {f.severity:7s} {f.id}: {f.title} ({f.impact_us / 1e3:.1f} ms/step){where}{cause}")
        for b in budgets:
            print(f"FAIL budget  {b}")
        if comparison is not None:
            from fsdpdoctor.report.diff_view import baseline_line

            print(baseline_line(comparison))
        for q in quality:
            print(f"data quality: {q}")
        print(f"fsdpdoctor check: {'FAILED' if failed else 'passed'} "
              f"({len(failing)} finding(s) at or above {args.fail_on}, {len(budgets)} budget(s) exceeded"
              + (f", {'a significant regression' if regressed else 'no regression'} against the baseline"
                 if comparison is not None else "") + ")")
    if args.junit:
        from fsdpdoctor.diagnose.rules import RULE_IDS
        from fsdpdoctor.report.junit import to_junit

        try:
            with open(args.junit, "w") as fh:
                fh.write(to_junit(a, failing, RULE_IDS))
        except OSError as exc:
            raise InputError(args.junit, f"cannot write JUnit file: {exc.strerror or exc}") from None
    return 1 if failed else 0
