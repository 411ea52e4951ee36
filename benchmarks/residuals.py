"""The prediction-error table of fsdpdoctor/diagnose/thresholds.py, derived from the calibration record.

    python benchmarks/residuals.py benchmarks/calibration.json         # the table and its coverage
    python benchmarks/residuals.py --seed-from-doc docs/impact.md benchmarks/calibration.json

Each timed pair of the record (``calibration_store.records``) gives a residual e = (M - P) / S: the measured
saving less the predicted one, as a share of the fault capture's step S (the step the prediction was made
from; a share, so that pairs of different step times pool, and a rule that predicts 0 has one too). Per rule,
the root mean square of e over its pairs where it has ``MIN_PAIRS`` or more, else over every pair (pooled):
``error_frac``. Under contention (``wait_share`` w of the fault capture, analysis/contention.py) the error
grows: e^2 = error_frac^2 + (k w)^2, k fitted by least squares over the pairs with w recorded;
``wait_calibrated`` is the largest w at which a pair was timed: past it no prediction is given.

``--seed-from-doc``: the "quiet" run of the record from a docs/impact.md written before the record existed
(its table rows and per-pair sections kept as written, the numbers parsed from them).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_store as store  # noqa: E402

MIN_PAIRS = 3   # a rule's own residual needs this many timed pairs; fewer pool with every rule's


def residual(r: dict) -> float | None:
    s = r.get("captured_step_us")
    if not s or r.get("measured_us") is None:
        return None
    return (r["measured_us"] - (r.get("predicted_us") or 0.0)) / s


def quiet_wait(r: dict) -> float:
    """The contention of a pair timed before it was recorded: 0 (the quiet run's load was 1.5-2.2 on 2 cores,
    the ranks' own); a starved quiet run is not in the record."""
    return r["wait_share"] if r.get("wait_share") is not None else 0.0


def derive(recs: list[dict]) -> dict:
    """{"rules": {rule: (error_frac, pairs)}, "pooled": (error_frac, pairs), "wait_k": k, "wait_calibrated": w}."""
    quiet = [(r["rule"], e) for r in recs if (e := residual(r)) is not None and quiet_wait(r) < 0.10]
    pooled = math.sqrt(sum(e * e for _, e in quiet) / len(quiet)) if quiet else 0.0
    rules = {}
    for rule in sorted({x for x, _ in quiet}):
        es = [e for x, e in quiet if x == rule]
        if len(es) >= MIN_PAIRS:
            rules[rule] = (round(math.sqrt(sum(e * e for e in es) / len(es)), 4), len(es))
    starved = [(r, e, r["wait_share"]) for r in recs if (e := residual(r)) is not None
               and r.get("wait_share") is not None and r["wait_share"] >= 0.10]
    # e^2 - base^2 = k^2 w^2, least squares in k^2 (no intercept), k^2 at least 0
    num = sum((e * e - rule_error(rules, pooled, r["rule"]) ** 2) * w * w for r, e, w in starved)
    den = sum(w ** 4 for _, _, w in starved)
    k = math.sqrt(max(num / den, 0.0)) if den else 0.0
    waits = [r["wait_share"] for r in recs if r.get("wait_share") is not None and residual(r) is not None]
    return {"rules": rules, "pooled": (round(pooled, 4), len(quiet)), "wait_k": round(k, 4),
            "wait_calibrated": math.ceil(max(waits) * 1000) / 1000 if waits else 0.0, "starved_pairs": len(starved)}


def rule_error(rules: dict, pooled: float, rule: str) -> float:
    return rules[rule][0] if rule in rules else pooled


def coverage(recs: list[dict], level: float = 0.90) -> tuple[int, int]:
    """How many measured savings fall inside their ``level`` prediction interval, by the thresholds module's
    table (what ``analyze`` prints), over the record's pairs."""
    from fsdpdoctor.diagnose.prediction import interval_for, withheld

    inside = n = 0
    for r in recs:
        if residual(r) is None or withheld(r.get("wait_share")):   # no number given: nothing to cover
            continue
        noise = r.get("predicted_noise_interval_us") or r.get("predicted_interval_us")
        p = r.get("predicted_us") or 0.0
        hw = (noise[1] - noise[0]) / 2 if noise else 0.0
        lo, hi = interval_for(r["rule"], p, hw, r["captured_step_us"], quiet_wait(r), level)
        n += 1
        inside += lo <= r["measured_us"] <= hi
    return inside, n


_ROW = re.compile(r"^\| (?P<rule>[\w-]+) \| (?P<case>.+?) \| (?P<p>[-\d.]+)(?: \[(?P<plo>[-\d.]+), (?P<phi>[-\d.]+)\])?"
                  r"(?P<nf> \(not found\))? \| (?P<m>[-\d.]+) \[(?P<mlo>[-\d.]+), (?P<mhi>[-\d.]+)\] \| [^|]* \| "
                  r"(?P<verdict>[^|]+?) \| .*\| (?P<load>[\d.]+-[\d.]+) \|$")


def from_doc(text: str) -> dict:
    """The quiet run of a docs/impact.md: its meta from the header, a record per table row with its section."""
    recs, sections, cur = [], {}, None
    for ln in text.splitlines():
        if ln.startswith("### "):
            cur = ln
            sections[cur] = [ln]
        elif cur is not None:
            sections[cur].append(ln)
    for ln in text.splitlines():
        m = _ROW.match(ln)
        if not m:
            continue
        sec_key = next(k for k in sections if k.endswith(f"({m['rule']})") and m["case"] in "\n".join(sections[k]))
        sec = sections.pop(sec_key)
        step = float(re.search(r"fault capture: step ([\d.]+) ms", "\n".join(sec))[1]) * 1e3
        runs = re.search(r"timed runs \(ms\), fault: ([\d., ]+); fix: ([\d., ]+)", "\n".join(sec))
        lo_l, hi_l = (float(x) for x in m["load"].split("-"))
        recs.append({
            "pair": sec_key.split()[1], "rule": m["rule"], "case": m["case"], "predicted_us": float(m["p"]) * 1e3,
            "predicted_interval_us": [float(m["plo"]) * 1e3, float(m["phi"]) * 1e3] if m["plo"] else None,
            "found_on_fault": not m["nf"], "measured_us": float(m["m"]) * 1e3,
            "measured_interval_us": [float(m["mlo"]) * 1e3, float(m["mhi"]) * 1e3],
            "verdict": m["verdict"].split(" (")[0], "captured_step_us": step, "wait_share": None,
            "fault_step_us": [float(x) * 1e3 for x in runs[1].split(", ")],
            "fix_step_us": [float(x) * 1e3 for x in runs[2].split(", ")], "load_runs": [lo_l, hi_l],
            "doc_row": ln, "doc_section": sec})
    return {"pairs": recs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", help="benchmarks/calibration.json")
    ap.add_argument("--seed-from-doc", default=None, metavar="MD", help="make the record's quiet run from this page")
    args = ap.parse_args(argv)
    path = Path(args.record)
    if args.seed_from_doc:
        text = Path(args.seed_from_doc).read_text()
        meta = {"mode": "alternate", "reps": 5, "steps": 7, "skip": 1, "level": 0.9, "tolerance": 0.35,
                "command": re.search(r"Regenerate: `([^`]+)`", text)[1],
                "date": re.search(r"Measured (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", text)[1],
                "machine": re.search(r"UTC on (.+?); load", text)[1],
                "load": re.search(r"load average \(1 min\) (.+?)\.\n", text)[1], "device": "cpu", "stage": "all",
                "notes": [], "interval": "t-drift", "max_rounds": 4, "hogs": 0}
        data = store.load(path)
        data["runs"]["quiet"] = {"meta": meta | {"dates": [meta["date"]]}, "pairs": from_doc(text)["pairs"]}
        path.write_text(json.dumps(data, indent=1))
    recs = store.records(store.load(path))
    print(json.dumps(derive(recs), indent=1))
    try:
        inside, n = coverage(recs)
        print(f"coverage of the 90 % prediction interval: {inside} of {n}")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
