"""The calibration benchmark's machinery (benchmarks/calibrate.py) on one small pair end to end: the fault
captured and analysed (P), the fix captured (the finding gone), both variants timed interleaved (M with its
bootstrap interval), docs/impact.md's table written. Timing is not asserted: only that every field comes out
well formed, the expected finding is found on the fault and absent on the fix."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from conftest import requires_torch

ROOT = Path(__file__).resolve().parents[1]


def _calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@requires_torch
def test_one_pair_end_to_end(tmp_path):
    cal = _calibrate()
    doc, out = tmp_path / "impact.md", tmp_path / "r.json"
    rc = cal.main(["--pairs", "ddp_world_size_1", "--reps", "2", "--steps", "4", "--skip", "1", "--active", "2",
                   "--work", str(tmp_path / "runs"), "--doc", str(doc), "--json", str(out)])
    assert rc == 0
    (r,) = json.loads(out.read_text())["pairs"]
    assert "error" not in r, r
    assert r["rule"] == "wrapper-world-size-1" and r["found_on_fault"] and not r["found_on_fix"]
    assert math.isfinite(r["predicted_us"]) and r["predicted_us"] >= 0
    # the saving is DDP's own host work (its forward less the module's, the reducer's hooks and copies), which
    # the capture's stacks show, not only its collectives (at world size 1 they reduce nothing)
    assert r["predicted_us"] > 0 and any("DDP's own host work" in e for e in r["evidence"])
    assert len(r["fault_step_us"]) == len(r["fix_step_us"]) == 2 and all(x > 0 for x in r["fault_step_us"])
    lo, hi = r["measured_interval_us"]
    assert math.isfinite(r["measured_us"]) and lo <= r["measured_us"] <= hi
    assert r["verdict"] in ("holds", "over", "under", "undecided") and r["load_runs"]
    text = doc.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| wrapper-world-size-1 |"))
    assert row.count("|") == 9 and f"{r['measured_us'] / 1e3:.1f} [{lo / 1e3:.1f}, {hi / 1e3:.1f}]" in row
    assert "python benchmarks/calibrate.py" in text and "load average" not in text and " UTC" not in text
    # when and under what load: beside the page, not on it
    assert "load average" in (tmp_path / "impact-runs.md").read_text()


def test_bad_pair_name_is_one_line_exit_2(capsys):
    assert _calibrate().main(["--pairs", "nope"]) == 2
    assert "unknown pair" in capsys.readouterr().err


@pytest.mark.parametrize("p, piv, m, iv, found, want", [
    (100.0, None, 80.0, (60.0, 90.0), True, "holds"),      # within 35 %
    (100.0, None, 50.0, (20.0, 110.0), True, "holds"),     # inside the interval
    (100.0, None, 50.0, (40.0, 60.0), True, "over"),
    (10.0, None, 50.0, (40.0, 60.0), True, "under"),
    (0.0, None, 50.0, (40.0, 60.0), False, "missed"),
    (100.0, (70.0, 130.0), 50.0, (40.0, 75.0), True, "holds"),   # tight P interval overlapping M's
    (100.0, (20.0, 180.0), 50.0, (40.0, 75.0), True, "over"),    # a P interval too wide to mean anything
    (2.0, (1.0, 3.0), -0.3, (-5.0, 4.0), True, "holds"),   # no measurable saving, P inside M's interval
    (6.0, (1.0, 11.0), -0.3, (-5.0, 4.0), True, "over"),   # no measurable saving, P promises more
    (0.0, None, 3.0, (-2.0, 8.0), False, "holds"),         # no measurable saving, nothing promised
])
def test_verdict(p, piv, m, iv, found, want):
    assert _calibrate().verdict(p, piv, m, iv, found, 0.35) == want


def test_a_measurement_too_noisy_to_rule_out_a_warning_decides_nothing():
    cal = _calibrate()
    # M [-5, 4] ms of a 100 ms step rules out a 5 ms (warning-band) saving; [-40, 40] rules out nothing
    assert cal.verdict(0.0, None, -0.3, (-5e3, 4e3), True, 0.35, 100e3) == "holds"
    assert cal.verdict(0.0, None, 0.1e3, (-40e3, 40e3), True, 0.35, 100e3) == "undecided"
    assert cal.verdict(30e3, None, 28e3, (20e3, 35e3), True, 0.35, 100e3) == "holds"  # measurable: as before


def test_rerender_from_json(tmp_path):
    # the document again from an earlier --json, running nothing (no run folders kept: no diff lines added)
    r = {"pair": "host_sync", "rule": "host-sync", "case": "c", "model": "mlp", "world": 2, "found_on_fault": True,
         "found_on_fix": False, "captured_step_us": 1e5, "captured_fix_step_us": 9e4, "predicted_us": 0.0,
         "predicted_interval_us": None, "severity": "info", "evidence": ["e"], "other_findings_fault": [],
         "findings_fix": [], "fault_step_us": [1e5, 1.1e5], "fix_step_us": [1e5, 1e5], "measured_us": 5e3,
         "measured_interval_us": [0.0, 1e4], "ratio": 0.0, "verdict": "holds", "load_runs": [3.0, 4.0]}
    meta = {"mode": "alternate", "reps": 2, "steps": 7, "skip": 1, "level": 0.9, "tolerance": 0.35,
            "command": "python benchmarks/calibrate.py", "date": "d", "machine": "m", "load": "l"}
    src, doc = tmp_path / "r.json", tmp_path / "impact.md"
    src.write_text(json.dumps({"meta": meta, "pairs": [r]}))
    assert _calibrate().main(["--rerender", str(src), "--doc", str(doc)]) == 0
    text = doc.read_text()
    # the verdict by the current rule: M [0, 10] ms holds 0 and reaches above 5 % of the 105 ms step
    assert "| host-sync | c | 0.0 | 5.0 [0.0, 10.0] | 0.00 | undecided |" in text
    assert "0 of 1 predictions hold: 0 within 35 % of M, 0 on M's or both intervals (see the verdict column); " \
           "1 undecided" in text
    assert _calibrate().main(["--rerender", str(tmp_path / "missing.json"), "--doc", str(doc)]) == 2


def test_until_decided_adds_rounds_until_m_decides(tmp_path, monkeypatch):
    """--until-decided: a pair whose M holds 0 and reaches the warning band gets another round of timed runs,
    pooled with the first, until M decides (here the second round's steady saving) or the budget is spent."""
    cal = _calibrate()
    rounds = {"fault": [[24000.0, 17000.0, 22500.0], [22000.0, 22100.0, 21900.0]],
              "fix": [[20000.0, 20000.0, 20000.0], [20000.0, 20000.0, 20000.0]]}
    calls = []

    def fake_timed(pair, work, reps, steps, skip, mode, log=print, record=True, tag=""):
        calls.append(tag)
        k = min(len(calls) - 1, 1)
        return {v: list(rounds[v][k]) for v in ("fault", "fix")}, [1.0] * 6

    monkeypatch.setattr(cal, "run_job", lambda *a, **k: None)
    monkeypatch.setattr(cal, "analyze", lambda run: {"findings": [], "mean": {"duration_us": 2e4}})
    monkeypatch.setattr(cal, "diff_fixes", lambda *a: [])
    monkeypatch.setattr(cal, "timed_runs", fake_timed)
    one = cal.calibrate_pair("ddp_single_bucket", tmp_path, 3, 7, 1, 0.9, 0.35, log=lambda s: None)
    assert one["verdict"] == "undecided" and one["rounds"] == 1 and calls == [""]
    calls.clear()
    r = cal.calibrate_pair("ddp_single_bucket", tmp_path, 3, 7, 1, 0.9, 0.35, log=lambda s: None,
                           until_decided_s=600)
    assert calls[:3] == ["", "_1", "_2"][:len(calls)] and r["rounds"] == len(calls) >= 2
    assert len(r["paired_diff_us"]) == 3 * r["rounds"]
    assert r["verdict"] == "missed" and r["measured_interval_us"][0] > 0  # decided: a saving, none predicted
    text = cal.render([r], {"level": 0.9, "reps": 3, "steps": 7, "skip": 1, "mode": "alternate", "tolerance": 0.35,
                            "command": "c", "date": "d", "machine": "m", "load": "l"})
    assert f"timed in {r['rounds']} rounds of 3 runs a variant" in text
    assert cal.main(["--pairs", "host_sync", "--until-decided", "60", "--stage", "analyse", "--work", "w"]) == 2


# --------------------------------------------------------------------------- the interval under drift
def _drift_stats():
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import drift_stats
    return drift_stats


def _aa_launch(rng, pairs: int, order: str, trend: float) -> list[float]:
    """One synthetic launch of an A/A pair (both variants the same job, true saving 0): a 100 ms step whose
    load drifts slowly (a random walk plus a steady trend per block) under block noise; the pair differences
    (variant A minus variant B) of adjacent blocks, A first in every pair ("fixed") or alternately ("abba")."""
    level, out = 100e3, []
    for i in range(pairs):
        blocks = []
        for _ in range(2):
            level += trend + rng.gauss(0, 1.5e3)
            blocks.append(level + rng.gauss(0, 2e3))
        a, b = blocks if order == "fixed" or i % 2 == 0 else blocks[::-1]
        out.append(a - b)
    return out


def test_the_drift_interval_covers_where_the_bootstrap_did_not():
    """Truth 0, slow drift, 5 ABBA pairs a launch: the old percentile bootstrap excludes 0 far more often than
    its 10 %; the t-interval with the effective sample size stays within it (deterministic seeds)."""
    ds = _drift_stats()
    old = new = 0
    for seed in range(300):
        d = _aa_launch(__import__("random").Random(seed), 5, "abba", 300.0)
        lo, hi = ds.bootstrap_mean(d, 0.9, n=1000, seed=seed)
        old += not lo <= 0 <= hi
        lo, hi = ds.drift_interval(d, 0.9)
        new += not lo <= 0 <= hi
    assert old / 300 >= 0.2 and new / 300 <= 0.13, (old, new)


def test_counterbalanced_order_cancels_a_steady_drift():
    """A steady drift between the two blocks of a pair biases every difference one way when the same variant
    always leads: the interval then excludes the true 0 most of the time; ABBA order cancels it."""
    ds = _drift_stats()
    rng = __import__("random").Random(7)
    miss = {"fixed": 0, "abba": 0}
    for _ in range(100):
        for order in miss:
            lo, hi = ds.drift_interval(_aa_launch(rng, 6, order, 3e3), 0.9)
            miss[order] += not lo <= 0 <= hi
    assert miss["fixed"] > 50 and miss["abba"] <= 12, miss
    assert [ds.abba(i) for i in range(4)] == [("fault", "fix"), ("fix", "fault"), ("fault", "fix"), ("fix", "fault")]


def test_dependence_widens_the_interval():
    ds = _drift_stats()
    smooth = [float(x) for x in (1, 2, 3, 4, 5, 6, 7, 8)]  # strongly autocorrelated: fewer independent values
    shuffled = [float(x) for x in (4, 8, 1, 6, 3, 7, 2, 5)]  # the same values in an order with none
    assert ds.lag1(smooth) > 0.5 >= ds.lag1(shuffled)
    w = lambda iv: iv[1] - iv[0]  # noqa: E731
    assert w(ds.drift_interval(smooth, 0.9)) > 1.5 * w(ds.drift_interval(shuffled, 0.9))
    # launches whose means disagree beyond what their pairs show: the launch becomes the unit
    two = [1.0, 1.2, 0.8, 1.1, 0.9, 9.0, 9.2, 8.8, 9.1, 8.9]
    import statistics
    plain = 2 * ds.t_quantile(0.95, 9) * statistics.stdev(two) / 10 ** 0.5  # ten independent values
    assert ds.lag1(two, [5, 5]) <= 0  # within each launch the pairs look independent
    assert w(ds.drift_interval(two, 0.9, [5, 5])) > 3 * plain


def test_bonferroni_looks_keep_optional_stopping_honest():
    """--until-decided looks after each round and stops once M's interval excludes 0: at the plain level the
    chance of a false decision (truth 0) grows with the looks; at 1 - (1 - level) / K it stays within 10 %."""
    ds = _drift_stats()
    K, n_sims = 4, 200
    false = {0.9: 0, ds.look_level(0.9, K): 0}
    for seed in range(n_sims):
        rng = __import__("random").Random(1000 + seed)
        launches = [_aa_launch(rng, 5, "abba", 0.0) for _ in range(K)]
        for lvl in false:
            for k in range(1, K + 1):
                lo, hi = ds.drift_interval([x for la in launches[:k] for x in la], lvl, [5] * k)
                if not lo <= 0 <= hi:
                    false[lvl] += 1
                    break
    assert ds.look_level(0.9, 4) == pytest.approx(0.975)
    assert false[0.9] / n_sims > 0.15 and false[ds.look_level(0.9, K)] / n_sims <= 0.10, false


def test_aa_pairs_take_same_variant_blocks_nearest_in_time():
    ds = _drift_stats()
    f, x = ["F0", "F1", "F2", "F3", "F4"], ["X0", "X1", "X2", "X3", "X4"]
    # ABBA: F X X F F X X F F X -> the adjacent same-variant blocks
    assert ds.aa_pairs(f, x, True) == [("X0", "X1"), ("F1", "F2"), ("X2", "X3"), ("F3", "F4")]
    assert ds.aa_pairs(f, x, False) == [("F0", "F1"), ("X0", "X1"), ("F2", "F3"), ("X2", "X3")]


def test_processes_mode_runs_pairs_in_abba_order(tmp_path, monkeypatch):
    cal = _calibrate()
    order = []

    def fake_run(pair, variant, extra, timeout=600):
        order.append(variant)
        Path(extra[-1]).parent.mkdir(parents=True, exist_ok=True)
        Path(extra[-1]).write_text(json.dumps({"step_s": [0.1, 0.1], "loadavg": [1.0, 1.0, 1.0]}))

    monkeypatch.setattr(cal, "run_job", fake_run)
    runs, _ = cal.timed_runs("host_sync", tmp_path, 4, 2, 0, "processes", log=lambda s: None)
    assert order == ["fault", "fix", "fix", "fault", "fault", "fix", "fix", "fault"]
    assert len(runs["fault"]) == len(runs["fix"]) == 4


def test_aa_check_and_reinterval_on_an_earlier_json(tmp_path, capsys):
    """--aa counts exclusions of 0 on pseudo-A/A pairs of a recorded file; --rerender --reinterval puts M's
    interval again by the current rule and the document says which rule it used."""
    cal = _calibrate()
    rng = __import__("random").Random(3)
    f = [1e5 + rng.gauss(0, 2e3) for _ in range(10)]
    x = [1e5 + rng.gauss(0, 2e3) for _ in range(10)]
    r = {"pair": "host_sync", "rule": "host-sync", "case": "c", "model": "mlp", "world": 2, "mode": "alternate",
         "found_on_fault": True, "found_on_fix": False, "captured_step_us": 1e5, "captured_fix_step_us": 1e5,
         "predicted_us": 0.0, "predicted_interval_us": None, "severity": "info", "evidence": [],
         "other_findings_fault": [], "findings_fix": [], "fault_step_us": f, "fix_step_us": x, "rounds": 2,
         "measured_us": sum(a - b for a, b in zip(f, x)) / 10, "measured_interval_us": [1.0, 2.0], "ratio": 0.0,
         "verdict": "over", "load_runs": [1.0]}
    meta = {"mode": "alternate", "reps": 5, "steps": 7, "skip": 1, "level": 0.9, "tolerance": 0.35,
            "command": "c", "date": "d", "machine": "m", "load": "l"}
    src, doc = tmp_path / "r.json", tmp_path / "impact.md"
    src.write_text(json.dumps({"meta": meta, "pairs": [r]}))
    assert cal.main(["--aa", str(src)]) == 0
    assert "1 launches, 8 pseudo-A/A pairs" in capsys.readouterr().out
    assert cal.main(["--rerender", str(src), "--doc", str(doc)]) == 0
    assert "bootstrap 90 % interval" in doc.read_text()  # an old file keeps its own interval and says so
    assert cal.main(["--rerender", str(src), "--reinterval", "--doc", str(doc)]) == 0
    (r2,) = json.loads(src.read_text())["pairs"]
    ds = _drift_stats()
    want = ds.drift_interval([a - b for a, b in zip(f, x)], 0.9, [5, 5])
    assert r2["measured_interval_us"] == pytest.approx(list(want)) and r2["interval"] == "t-drift"
    text = doc.read_text()
    assert "Student-t 90 % interval" in text and "A/A check" in text and "without a per-look correction" in text


def test_hogs_spin_beside_the_pairs_and_are_gone_after():
    import os

    store = _calibrate().store
    with store.Hogs(2) as hogs:
        pids = hogs.pids
        assert len(pids) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)
    for p in pids:   # killed and reaped: no process of that id is left (or it is another, not a hog)
        try:
            os.kill(p, 0)
            assert "getppid" not in Path(f"/proc/{p}/cmdline").read_text()
        except ProcessLookupError:
            pass


def test_the_page_is_the_record_rendered_with_both_tables():
    # docs/impact.md is what one command writes from benchmarks/calibration.json: the quiet table and the
    # table beside the hogs, each pair of the record in its table
    cal = _calibrate()
    data = json.loads((ROOT / "benchmarks" / "calibration.json").read_text())
    page = cal.render_all(data)
    assert page == (ROOT / "docs" / "impact.md").read_text()
    assert "## Beside 2 CPU hog(s)" in page and page.count("| rule | case |") == 2
    for run in data["runs"].values():
        for r in run["pairs"]:
            assert f"| {r['rule']} | {r['case']} |" in page
