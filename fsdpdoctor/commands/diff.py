"""`fsdpdoctor diff BASE NEW`: which findings are new, gone, better or worse; step-time change."""

from __future__ import annotations

import dataclasses
import json

from fsdpdoctor.commands.common import parse_ranks, parse_steps, parse_thresholds


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two runs: findings new/gone/better/worse and step time",
                       description="Compare a base run with a new run of the same job.")
    p.add_argument("base", help="trace file or folder of the base run")
    p.add_argument("new", help="trace file or folder of the new run")
    p.add_argument("--rank", action="append", metavar="R[,R...]")
    p.add_argument("--steps", metavar="SPEC")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--config", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 if a finding is new or worse, or the step got slower by more than 5%%")
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.diagnose.compare import compare
    from fsdpdoctor.session import analyze_path

    kw = dict(ranks=parse_ranks(args.rank), steps=parse_steps(args.steps), thresholds=parse_thresholds(args))
    c = compare(analyze_path(args.base, **kw), analyze_path(args.new, **kw))
    regressed = any(f.status in ("new", "worse") for f in c.findings) or c.step_change_frac > 0.05
    if args.json:
        print(json.dumps(dataclasses.asdict(c) | {"regressed": regressed}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        con = Console()
        sign = "+" if c.step_change_frac >= 0 else ""
        con.print(f"step time {c.base_step_us / 1e3:.1f} ms -> {c.new_step_us / 1e3:.1f} ms "
                  f"({sign}{100 * c.step_change_frac:.1f}%)")
        con.print("  " + ", ".join(f"{k.removesuffix('_us').replace('_', ' ')} {v / 1e3:+.1f} ms"
                                   for k, v in c.breakdown_change_us.items()))
        t = Table(title="Findings", title_justify="left")
        for col in ("status", "finding", "base ms/step", "new ms/step"):
            t.add_column(col)
        style = {"new": "red", "worse": "red", "better": "green", "gone": "green", "same": ""}
        for f in c.findings:
            t.add_row(f"[{style[f.status]}]{f.status}[/]", f"{f.title} [dim]{f.id}[/]",
                      "-" if f.base_impact_us is None else f"{f.base_impact_us / 1e3:.1f}",
                      "-" if f.new_impact_us is None else f"{f.new_impact_us / 1e3:.1f}")
        con.print(t if c.findings else "no findings in either run")
    return 1 if (args.fail_on_regression and regressed) else 0
