"""`diff` and `check --baseline` close the loop: each finding the new run no longer has, with the saving it
predicted beside the measured change of the step and its interval, and whether the fix delivered it
(diagnose/fix_outcomes.py). Real pairs of bundled traces: a fault and its fix."""

from __future__ import annotations

import json

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.diagnose.fix_outcomes import _judge
from fsdpdoctor.results.comparison import Estimate


def diff_doc(capsys, base, new) -> dict:
    main(["diff", str(base), str(new), "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fault, fix, fid", [("dataloader_slow", "dataloader_fixed", "input-bound"),
                                              ("straggler", "ddp_default", "straggler")])
def test_fix_delivered(capsys, traces_dir, fault, fix, fid):
    d = diff_doc(capsys, traces_dir / fault, traces_dir / fix)
    fx = {f["id"]: f for f in d["fixes"]}[fid]
    assert fx["status"] == "gone" and fx["outcome"] == "delivered"
    # the prediction is the finding's own impact, the measurement the step's change with its interval
    base_impact = next(f["base_impact_us"] for f in d["findings"] if f["id"] == fid)
    assert fx["predicted_us"] == pytest.approx(-base_impact)
    assert fx["measured_us"] == pytest.approx(d["step"]["diff"])
    assert fx["measured_lo_us"] <= fx["predicted_us"] <= fx["measured_hi_us"] or \
        abs(fx["measured_us"] - fx["predicted_us"]) <= 0.35 * abs(fx["predicted_us"])
    assert fx["text"].startswith(f"{fid} gone: analyze BASE predicted -") and "delivered" in fx["text"]


@pytest.mark.parametrize("fault, fix, fid", [("dataloader_slow", "dataloader_fixed", "input-bound"),
                                              ("ddp_one_bucket", "ddp_default", "ddp-single-bucket"),
                                              ("grad_accum_sync_every", "grad_accum_no_sync",
                                               "grad-accum-without-no-sync")])
def test_diff_holds_the_tool_to_what_analyze_printed(capsys, traces_dir, fault, fix, fid):
    # one prediction from analyze to diff: the saving and interval `analyze BASE` printed, read from BASE
    main(["analyze", str(traces_dir / fault), "--json"])
    printed = next(f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == fid)
    main(["analyze", str(traces_dir / fault)])
    console = " ".join(capsys.readouterr().out.split())
    d = diff_doc(capsys, traces_dir / fault, traces_dir / fix)
    fx = {f["id"]: f for f in d["fixes"]}[fid]
    assert fx["predicted_us"] == pytest.approx(-printed["impact_us"])
    lo, hi = printed["impact_interval_us"]
    assert (fx["predicted_lo_us"], fx["predicted_hi_us"]) == (pytest.approx(-hi), pytest.approx(-lo))
    main(["diff", str(traces_dir / fault), str(traces_dir / fix)])
    out = " ".join(capsys.readouterr().out.split())
    said = f"{fid} gone: analyze BASE predicted {-printed['impact_us'] / 1e3:+.1f} ms [{-hi / 1e3:+.1f}, {-lo / 1e3:+.1f}]"
    assert said in out
    # and it is the number the analyze console showed for that finding
    assert f"{printed['impact_us'] / 1e3:.1f}" in console


def test_a_fix_beyond_the_one_proposed_saves_more_than_predicted(capsys, traces_dir):
    # length skew: the finding prices its own fix, an equal token budget, at the balanced step ((N-1)/N of
    # the excess); seq_ddp removes the longer sequences altogether, so the step gains more than that
    d = diff_doc(capsys, traces_dir / "seq_length_skew", traces_dir / "seq_ddp")
    fx = {f["id"]: f for f in d["fixes"]}["straggler"]
    assert fx["status"] == "gone" and fx["outcome"] == "more-than-predicted"
    assert fx["measured_us"] < fx["predicted_us"] < 0


def test_fix_that_did_not_deliver_is_said(capsys, traces_dir):
    # the loader fix of the Qwen2 job: input-bound is gone but the step did not get faster
    d = diff_doc(capsys, traces_dir / "hf_dataloader_slow", traces_dir / "hf_ddp")
    fx = d["fixes"][0]
    assert fx["id"] == "input-bound" and fx["outcome"] == "not-delivered"
    assert fx["measured_lo_us"] <= 0 <= fx["measured_hi_us"] and fx["predicted_us"] < fx["measured_lo_us"]
    assert "did not deliver" in fx["text"]


def test_noise_that_cannot_decide_says_so(capsys, traces_dir):
    # FSDP1 backward prefetch on gloo: the step's interval holds both no saving and the predicted one
    d = diff_doc(capsys, traces_dir / "fsdp1_no_backward_prefetch", traces_dir / "fsdp1_backward_pre")
    fx = {f["id"]: f for f in d["fixes"]}["fsdp1-no-backward-prefetch"]
    assert fx["outcome"] == "undecided" and "cannot tell" in fx["text"]


def test_several_fixes_share_one_step_change(capsys, traces_dir):
    d = diff_doc(capsys, traces_dir / "fsdp1_no_backward_prefetch_sleeper", traces_dir / "fsdp1_no_backward_prefetch")
    gone = {f["id"]: f for f in d["fixes"]}
    assert "straggler" in gone and all(f["together"] == [g["id"] for g in d["fixes"]] for f in d["fixes"])
    roots = [f for f in d["fixes"] if f["predicted_us"] is not None]
    assert sum(f["predicted_us"] for f in roots) == pytest.approx(d["fixes"][0]["predicted_total_us"])


def test_console_and_check_baseline_list_the_fix(capsys, traces_dir):
    d = diff_doc(capsys, traces_dir / "dataloader_slow", traces_dir / "dataloader_fixed")
    predicted = f"{-d['fixes'][0]['predicted_us'] / 1e3:.1f}"   # the finding's own impact, as it is today
    main(["diff", str(traces_dir / "dataloader_slow"), str(traces_dir / "dataloader_fixed")])
    out = capsys.readouterr().out
    assert f"input-bound gone: analyze BASE predicted -{predicted} ms [" in " ".join(out.split())
    rc = main(["check", str(traces_dir / "dataloader_fixed"), "--baseline", str(traces_dir / "dataloader_slow")])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and f"fixed input-bound gone: analyze BASE predicted -{predicted} ms" in out and ": delivered" in out
    main(["check", str(traces_dir / "dataloader_fixed"), "--baseline", str(traces_dir / "dataloader_slow"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"]["fixes"][0]["outcome"] == "delivered"


def _est(diff, lo, hi):
    return Estimate("step", 100.0, 100.0 + diff, diff, lo, hi, 8, 8, 1.0, 1.0, 0.95, "welch-t")


@pytest.mark.parametrize("pred, est, want", [
    (-30, _est(-28, -35, -21), "delivered"),
    (-30, _est(-10, -14, -6), "less-than-predicted"),
    (-10, _est(-40, -45, -35), "more-than-predicted"),
    (-30, _est(2, -5, 9), "not-delivered"),
    (-30, _est(12, 4, 20), "not-delivered"),
    (-8, _est(-3, -12, 6), "undecided"),
    (-30, _est(-29, None, None), "delivered"),
    (-30, _est(-5, None, None), "undecided"),
])
def test_judgement(pred, est, want):
    assert _judge(pred, est, 0.35) == want


def test_judgement_with_the_prediction_interval():
    # intervals that overlap agree only where the prediction's own is as tight as the tolerance
    assert _judge(-100, _est(-57, -86, -28), 0.35, (-120, -80)) == "delivered"
    assert _judge(-100, _est(-57, -86, -28), 0.35, (-180, -20)) == "less-than-predicted"
    assert _judge(-100, _est(-57, -86, -28), 0.35, (-108, -95)) == "less-than-predicted"


def test_a_partial_fix_is_held_to_the_base_prediction():
    # a second, partial fix: the finding shrank from 101.6 to 20.0 ms. The prediction is what analyze BASE
    # printed (101.6 and its interval), not base minus new (81.6), and NEW's remainder is said beside it
    from fsdpdoctor.diagnose.fix_outcomes import fix_outcomes
    from fsdpdoctor.results import Analysis
    from fsdpdoctor.results.comparison import FindingChange

    ch = FindingChange("input-bound", "t", "better", True, "data_loading", 101_600.0, 20_000.0, 0.5, 0.1,
                       "error", "warning", base_impact_interval_us=[95_000.0, 108_000.0])
    base = Analysis.__new__(Analysis)
    base.findings = []
    [fx] = fix_outcomes(base, [ch], _est(-57.5e3, -86.7e3, -28.2e3), 0.35)
    assert fx.predicted_us == -101_600.0 and (fx.predicted_lo_us, fx.predicted_hi_us) == (-108_000.0, -95_000.0)
    assert fx.remaining_us == 20_000.0 and "still 20.0 ms in NEW" in fx.text
    assert "predicted -101.6 ms [-108.0, -95.0]" in fx.text and fx.outcome == "less-than-predicted"


def test_a_withheld_saving_holds_the_step_to_nothing():
    # analyze BASE gave no number (its capture was starved): diff says so and judges nothing against it
    from fsdpdoctor.diagnose.fix_outcomes import fix_outcomes
    from fsdpdoctor.results import Analysis
    from fsdpdoctor.results.comparison import FindingChange

    ch = FindingChange("input-bound", "t", "gone", True, "data_loading", 101_600.0, None, 0.5, None,
                       "error", None, base_impact_withheld="no saving predicted: ...; re-profile on an idle host")
    base = Analysis.__new__(Analysis)
    base.findings = []
    [fx] = fix_outcomes(base, [ch], _est(-57.5e3, -86.7e3, -28.2e3), 0.35)
    assert fx.predicted_us is None and fx.outcome == "undecided"
    assert "analyze BASE gave no number (no saving predicted" in fx.text and "nothing was predicted" in fx.text
