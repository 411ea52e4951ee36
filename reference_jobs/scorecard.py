"""Precision and recall of every diagnosis rule over the bundled reference scenarios.

    python reference_jobs/scorecard.py [--traces traces] [--markdown]

For each scenario folder with an expected.json (CPU scenarios in traces/<name>/, GPU recordings in
traces/cuda/<name>/): a rule listed in "must" that
fires is a true positive, one that does not is a false negative; a rule listed
in "must_not" that fires is a false positive. Rules firing where expected.json
says nothing either way are counted as "unlisted" (neither right nor wrong).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from fsdpdoctor.diagnose.rules import RULE_IDS
from fsdpdoctor.session import analyze_path


def scenario_files(traces: Path) -> list[Path]:
    """expected.json of every CPU scenario and every GPU (CUDA) recording."""
    return sorted(traces.glob("*/expected.json")) + sorted(traces.glob("cuda/*/expected.json"))


def scorecard(traces: Path) -> tuple[dict, list[str]]:
    stats = {r: defaultdict(int) for r in RULE_IDS}
    failures = []
    for exp_path in scenario_files(traces):
        exp = json.loads(exp_path.read_text())
        fired = {f.id for f in analyze_path(exp_path.parent).findings}
        must, must_not = set(exp["must"]), set(exp["must_not"])
        for r in RULE_IDS:
            s = stats[r]
            if r in must:
                s["tp" if r in fired else "fn"] += 1
            elif r in must_not:
                s["fp" if r in fired else "tn"] += 1
            elif r in fired:
                s["unlisted"] += 1
        if must - fired or must_not & fired:
            failures.append(f"{exp_path.parent.relative_to(traces)}: missing {sorted(must - fired)}, forbidden {sorted(must_not & fired)}")
    return stats, failures


def hang_scorecard(traces: Path) -> tuple[list[str], list[str]]:
    """Markdown rows (scenario, expected and found cause, ranks, frame) of `fsdpdoctor hang` on every
    recorded hang scenario (expected.json with a "hang" verdict), and the mismatches."""
    from fsdpdoctor.analysis.hang import analyze_hang
    from fsdpdoctor.trace.hang import load_hang_dumps

    rows, failures = [], []
    for exp_path in sorted(traces.glob("*/expected.json")):
        exp = json.loads(exp_path.read_text()).get("hang")
        if not exp:
            continue
        name = exp_path.parent.name
        rep = analyze_hang(load_hang_dumps(exp_path.parent))
        v = rep.verdicts[0] if rep.verdicts else None
        got_fn = v.frame.function if v and v.frame else None
        ok = (v is not None and v.cause == exp["cause"] and sorted(v.ranks) == sorted(exp["lagging"])
              and (exp["function"] is None or got_fn == exp["function"]))
        rows.append(f"| `{name}` | {exp['cause']} | {v.cause if v else '-'} | {exp['lagging']} | "
                    f"{sorted(v.ranks) if v else '-'} | {exp['function'] or '-'} | {got_fn or '-'} | "
                    f"{'yes' if ok else '**no**'} |")
        if not ok:
            failures.append(f"{name}: expected {exp['cause']} {exp['lagging']} {exp['function']}, got "
                            f"{v.cause if v else None} {v.ranks if v else None} {got_fn}")
    return rows, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(Path(__file__).resolve().parents[1] / "traces"))
    args = ap.parse_args()
    stats, failures = scorecard(Path(args.traces))
    print("| rule | scenarios that must fire | TP | FN | FP | TN | precision | recall | unlisted fires |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in RULE_IDS:
        s = stats[r]
        p = s["tp"] / (s["tp"] + s["fp"]) if s["tp"] + s["fp"] else None
        rec = s["tp"] / (s["tp"] + s["fn"]) if s["tp"] + s["fn"] else None
        print(f"| `{r}` | {s['tp'] + s['fn']} | {s['tp']} | {s['fn']} | {s['fp']} | {s['tn']} | "
              f"{'-' if p is None else f'{p:.2f}'} | {'-' if rec is None else f'{rec:.2f}'} | {s['unlisted']} |")
    hang_rows, hang_failures = hang_scorecard(Path(args.traces))
    if hang_rows:
        print("\n| hang scenario | expected cause | verdict | lagging | named | frame | found | right |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(hang_rows))
    failures += hang_failures
    for f in failures:
        print(f"\nMISMATCH {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
