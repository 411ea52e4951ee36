"""A predicted saving's interval is the prediction's own error (diagnose/prediction.py): the step noise it
rests on combined with its rule's calibrated error (diagnose/thresholds.PREDICTION_ERRORS, derived from the
calibration record benchmarks/calibration.json by benchmarks/residuals.py), widened by the contention of the
profiled window (analysis/contention.py), or no number past the contention calibrated."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.diagnose.thresholds import BY_NAME, ERROR_BY_RULE, PREDICTION_ERRORS

ROOT = Path(__file__).resolve().parents[1]


def _bench(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _records():
    store = _bench("calibration_store")
    return store.records(store.load(ROOT / "benchmarks" / "calibration.json"))


def test_the_error_table_is_what_the_calibration_record_gives():
    # the thresholds module's rows are derived, not chosen: a new calibration run changes them through
    # benchmarks/residuals.py, never by hand
    d = _bench("residuals").derive(_records())
    assert ERROR_BY_RULE["*"].error_frac == pytest.approx(d["pooled"][0]) and ERROR_BY_RULE["*"].pairs == d["pooled"][1]
    assert {e.rule: (e.error_frac, e.pairs) for e in PREDICTION_ERRORS if e.rule != "*"} == \
        {k: tuple(v) for k, v in d["rules"].items()}
    assert BY_NAME["prediction_wait_k"].default == pytest.approx(d["wait_k"])
    assert BY_NAME["prediction_wait_calibrated"].default == pytest.approx(d["wait_calibrated"])


def test_about_nine_in_ten_measured_savings_fall_inside_their_90_percent_interval():
    inside, n = _bench("residuals").coverage(_records())
    assert n >= 12
    assert 0.80 <= inside / n <= 1.0, f"{inside} of {n} inside"


def _run(traces_dir, tmp_path, name, queued_share=None, load=None):
    """A copy of a bundled run; with ``queued_share`` its traces carry a capture's schedstat reading where each
    rank's training thread waited that share of the window for a CPU."""
    dst = tmp_path / name
    shutil.copytree(traces_dir / name, dst)
    for p in dst.glob("*.summary.msgpack"):
        p.unlink()
    if queued_share is not None:
        for path in sorted(dst.glob("rank*.json.gz")):
            doc = json.loads(gzip.decompress(path.read_bytes()))
            doc["fsdpdoctor_cpu"] = {"wall_us": 1e6, "on_cpu_us": (1 - queued_share) * 1e6,
                                     "runqueue_us": queued_share * 1e6, "cpus": 2, "loadavg": load or [2.0, 2.0]}
            path.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return dst


def _finding(capsys, run, fid="input-bound"):
    main(["analyze", str(run), "--json"])
    d = json.loads(capsys.readouterr().out)
    return d, next(f for f in d["findings"] if f["id"] == fid)


def test_the_interval_is_wider_than_the_step_noise(capsys, traces_dir):
    # dataloader_slow: the loader's wait is steady step to step (noise +-0.1 ms), the prediction's error is not
    d, f = _finding(capsys, traces_dir / "dataloader_slow")
    nlo, nhi = f["impact_noise_interval_us"]
    lo, hi = f["impact_interval_us"]
    assert lo < nlo <= f["impact_us"] <= nhi < hi
    assert (hi - lo) / 2 >= 1.6 * ERROR_BY_RULE["*"].error_frac * d["mean"]["duration_us"] * 0.99
    assert d["contention"]["text"].startswith("host load not recorded")


def test_a_starved_run_widens_then_withholds(capsys, traces_dir, tmp_path):
    quiet = _finding(capsys, traces_dir / "dataloader_slow")[1]
    w = BY_NAME["prediction_wait_calibrated"].default
    d, busy = _finding(capsys, _run(traces_dir, tmp_path, "dataloader_slow", queued_share=w * 0.9, load=[7.5, 8.2]))
    assert d["contention"]["wait_share"] == pytest.approx(w * 0.9)
    assert "waited for a CPU" in d["contention"]["text"] and "load 7.5-8.2 on 2 cores" in d["contention"]["text"]
    assert busy["impact_us"] == pytest.approx(quiet["impact_us"]) and not busy["impact_withheld"]
    assert busy["impact_interval_us"][1] - busy["impact_interval_us"][0] > \
        quiet["impact_interval_us"][1] - quiet["impact_interval_us"][0]
    # past the contention calibrated: no number, the reason
    starved = _run(traces_dir, tmp_path / "s", "dataloader_slow", queued_share=min(w + 0.1, 0.95))
    d, f = _finding(capsys, starved)
    assert f["impact_interval_us"] is None and "re-profile on an idle host" in f["impact_withheld"]
    main(["analyze", str(starved)])
    out = " ".join(capsys.readouterr().out.split())
    assert "saving withheld" in out and "re-profile on an idle host" in out
    # and diff, holding the fix to what analyze BASE said, says it gave no number
    main(["diff", str(starved), str(traces_dir / "dataloader_fixed"), "--json"])
    fx = json.loads(capsys.readouterr().out)["fixes"][0]
    assert fx["predicted_us"] is None and "analyze BASE gave no number" in fx["text"]
