"""`fsdpdoctor scaling`: efficiency and waterfall on the bundled 1- and 2-process runs of ddp_default."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpdoctor.results.scaling import RESIDUAL
from fsdpdoctor.diagnose.scaling import FINDING_ID, scaling_report
from fsdpdoctor.cli import main
from fsdpdoctor.errors import InputError
from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES  # the committed traces, in a pristine copy
from conftest import error_lines

RUN1, RUN2 = TRACES / "scaling_1proc", TRACES / "scaling_2proc"


# ------------------------------------------------------------------ independent measurement
def profiler_steps(run: Path) -> dict[int, list[float]]:
    """rank -> ProfilerStep#N durations (us), read with plain json/gzip."""
    out = {}
    for f in sorted(run.glob("rank*.json.gz")):
        with gzip.open(f, "rt") as fh:
            data = json.load(fh)
        events = data["traceEvents"] if isinstance(data, dict) else data
        durs = [float(e["dur"]) for e in events
                if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
        out[int(f.name[4:].split(".")[0])] = durs
    return out


def mean_step_us(run: Path) -> float:
    steps = profiler_steps(run)
    return sum(sum(d) / len(d) for d in steps.values()) / len(steps)   # per-rank mean, then over ranks


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.fixture(scope="module")
def a1():
    return open_analysis(RUN1, diagnose=False)


@pytest.fixture(scope="module")
def a2():
    return open_analysis(RUN2, diagnose=False)


@pytest.fixture(scope="module")
def report(a1, a2):
    return scaling_report([a2, a1])          # order given does not matter: base = smallest world size


# ------------------------------------------------------------------ numbers from the real runs
def test_efficiency_from_measured_step_times_and_manifest_work(report):
    m1, m2 = manifest(RUN1), manifest(RUN2)
    t1, t2 = mean_step_us(RUN1), mean_step_us(RUN2)
    thr1 = m1["tokens_per_step"] / (t1 / 1e6)          # manifest figures are global (all ranks)
    thr2 = m2["tokens_per_step"] / (t2 / 1e6)
    n1, n2 = m1["world_size"], m2["world_size"]
    expected = thr2 / (n2 / n1 * thr1)

    assert report.unit == "tokens" and report.mode == "weak" and report.base_world_size == 1
    base, big = report.runs
    assert (base.world_size, big.world_size) == (1, 2)
    assert base.step_us == pytest.approx(t1, rel=1e-6)
    assert big.step_us == pytest.approx(t2, rel=1e-6)
    assert base.throughput == pytest.approx(thr1, rel=1e-6)
    assert big.throughput == pytest.approx(thr2, rel=1e-6)
    assert big.efficiency == pytest.approx(expected, rel=1e-6)
    # weak scaling: same per-rank batch, ideal step time is the base's; E = T_base / T_N
    assert big.work_per_rank == base.work_per_rank == 512
    assert big.ideal_step_us == pytest.approx(t1, rel=1e-6)
    assert big.efficiency == pytest.approx(t1 / t2, rel=1e-6)
    assert report.waterfalls[0].efficiency == big.efficiency


def test_waterfall_parts_add_up_to_step_time_increase(report):
    (w,) = report.waterfalls
    increase = mean_step_us(RUN2) - mean_step_us(RUN1)
    assert w.increase_us == pytest.approx(increase, rel=1e-6)
    named = [p for p in w.parts if p.key != RESIDUAL]
    total = sum(p.delta_us for p in w.parts)
    assert total == pytest.approx(increase, rel=0.01)
    # the named parts alone explain it: the residual is below 1% of the increase
    assert abs(sum(p.delta_us for p in named) - increase) <= 0.01 * abs(increase)
    assert sum(p.efficiency_points for p in w.parts) == pytest.approx(w.lost_efficiency, abs=1e-9)
    assert w.lost_efficiency == pytest.approx(1 - w.efficiency)
    keys = {p.key for p in w.parts}
    assert {"comm:all_reduce", "wait", "data_loading", "compute", "idle", RESIDUAL} <= keys


def test_exposed_all_reduce_appears_with_two_processes(report):
    (w,) = report.waterfalls
    ar = next(p for p in w.parts if p.key == "comm:all_reduce")
    base, big = report.runs
    assert base.parts.exposed_comm_us < 1000        # 1 process: DDP's all-reduce is a local no-op (~us)
    assert ar.delta_us > 0 and ar.run_us > 0
    assert big.parts.exposed_comm_us > 1_000 > base.parts.exposed_comm_us  # gloo over loopback between 2 processes
    # the wait for the other rank is carved out of the exposed comm, not counted twice
    wait = next(p for p in w.parts if p.key == "wait")
    assert ar.run_us + wait.run_us == pytest.approx(big.parts.exposed_comm_us, rel=1e-6)


def test_a_wait_that_is_all_the_exposed_communication_leaves_parts_of_exactly_zero(a2):
    """The larger run's ranks waited for each other through all of their exposed communication (two
    kinds, values for which ``v - wait * v / total`` is -5.7e-14): every kind's part is 0, none below,
    and the parts still add up to the exposed communication."""
    from fsdpdoctor.analysis.scaling import step_parts
    from fsdpdoctor.results.analysis import KindTime

    a = copy.deepcopy(a2)
    for r in a.ranks:
        m = r.mean
        m.comm_by_kind = {"all_reduce": KindTime(count=1, busy_us=470.204, exposed_us=470.204),
                          "broadcast": KindTime(count=1, busy_us=141.737, exposed_us=141.737)}
        m.exposed_comm_us = r.wait_us = 470.204 + 141.737
    p = step_parts(a)
    assert p.comm_by_kind == {"all_reduce": 0.0, "broadcast": 0.0}
    assert p.wait_us == pytest.approx(611.941)
    # half of it waiting: each kind keeps its share of the other half, never below zero
    for r in a.ranks:
        r.wait_us = 611.941 / 2
    half = step_parts(a).comm_by_kind
    assert half["all_reduce"] == pytest.approx(470.204 / 2) and half["broadcast"] == pytest.approx(141.737 / 2)


def test_no_finding_at_default_threshold_and_finding_when_below(a1, a2, report):
    assert report.runs[1].efficiency >= 0.80 and report.findings == []
    rep = scaling_report([a1, a2], thresholds={"scaling_efficiency_low": 10.0})
    (f,) = rep.findings
    w = rep.waterfalls[0]
    assert f.id == FINDING_ID
    assert f.severity in ("warning", "error")
    top = w.biggest
    assert top is not None and top.label in f.summary
    assert f.evidence and "ideal" in f.evidence[0].text


def test_samples_per_rank_flag_is_multiplied_by_world_size(a1, a2, report):
    rep = scaling_report([a1, a2], samples_per_rank=8)
    base, big = rep.runs
    assert rep.unit == "samples" and rep.mode == "weak"
    assert (base.work_per_step, big.work_per_step) == (8, 16)
    assert base.work_source == "flag"
    assert big.efficiency == pytest.approx(report.runs[1].efficiency, rel=1e-9)


def test_strong_scaling_when_global_batch_is_constant(a1, a2):
    b = copy.deepcopy(a2)
    b.job.tokens_per_step = a1.job.tokens_per_step          # same global batch: 256 tokens per rank
    rep = scaling_report([a1, b])
    base, big = rep.runs
    assert rep.mode == "strong"
    assert big.ideal_step_us == pytest.approx(base.step_us * 1 / 2)
    assert big.efficiency == pytest.approx(base.step_us / (2 * big.step_us))
    w = rep.waterfalls[0]
    assert sum(p.delta_us for p in w.parts) == pytest.approx(big.step_us - base.step_us / 2)


def _inflate(a, field: str, add_us: float, kind: str | None = None):
    """A copy of ``a`` with ``add_us`` more of one category in every rank's mean step."""
    b = copy.deepcopy(a)
    for r in b.ranks:
        r.wait_us = 0.0
        setattr(r.mean, field, getattr(r.mean, field) + add_us)
        if kind:
            r.mean.comm_by_kind[kind].exposed_us += add_us
        r.mean.duration_us += add_us
    return b


@pytest.mark.parametrize("field,kind,key,words", [
    ("exposed_comm_us", "all_reduce", "comm:all_reduce", "bucket"),
    ("compute_us", None, "compute", "CPU contention or smaller per-rank work"),
    ("data_loading_us", None, "data_loading", "num_workers"),
])
def test_finding_fix_follows_biggest_part(a1, a2, field, kind, key, words):
    rep = scaling_report([a1, _inflate(a2, field, 500_000.0, kind)])
    (f,) = rep.findings
    assert rep.waterfalls[0].biggest.key == key
    assert f.id == FINDING_ID and words in f.fix
    assert f.impact_us == pytest.approx(rep.waterfalls[0].increase_us)


def test_wait_cause_points_to_straggler(a1, a2):
    b = copy.deepcopy(a2)
    for r in b.ranks:        # a rank waits 400 ms more inside the all-reduce
        r.mean.exposed_comm_us += 400_000
        r.mean.comm_by_kind["all_reduce"].exposed_us += 400_000
        r.mean.duration_us += 400_000
        r.wait_us += 400_000
    rep = scaling_report([a1, b])
    assert rep.waterfalls[0].biggest.key == "wait"
    assert "straggler" in rep.findings[0].fix


def test_pure_function_input_errors(a1, a2):
    with pytest.raises(InputError, match="at least 2 runs"):
        scaling_report([a1])
    with pytest.raises(InputError, match="same world size"):
        scaling_report([a1, a1])
    c = copy.deepcopy(a2)
    c.job.manifest["model"]["parameters"] += 1
    with pytest.raises(InputError, match="different jobs"):
        scaling_report([a1, c])


# ------------------------------------------------------------------ CLI
def test_cli_table_and_json(capsys):
    assert main(["scaling", str(RUN1), str(RUN2)]) == 0
    out = capsys.readouterr().out
    assert "Waterfall 1 -> 2 ranks" in out and "exposed all_reduce" in out and "tokens/s" in out
    assert main(["scaling", str(RUN2), str(RUN1), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["world_size"] for r in d["runs"]] == [1, 2]
    assert d["mode"] == "weak" and d["findings"] == []
    assert d["runs"][1]["efficiency"] == pytest.approx(mean_step_us(RUN1) / mean_step_us(RUN2), rel=1e-6)
    assert {p["key"] for p in d["waterfalls"][0]["parts"]} >= {"comm:all_reduce", "compute", "residual"}


def test_cli_finding_with_threshold_override(capsys):
    assert main(["scaling", str(RUN1), str(RUN2), "--json", "--threshold", "scaling_efficiency_low=10"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in d["findings"]] == [FINDING_ID]


def _copy_run(src: Path, dst: Path, **manifest_changes) -> Path:
    shutil.copytree(src, dst)
    m = manifest(dst)
    for k, v in manifest_changes.items():
        if isinstance(v, dict):
            m[k].update(v)
        else:
            m[k] = v
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("fsdpdoctor: error:"), err
    return err[0]


def test_cli_errors(capsys, tmp_path):
    assert "at least 2 runs" in _error(capsys, ["scaling", str(RUN1)])
    assert "same world size" in _error(capsys, ["scaling", str(RUN1), str(RUN1)])
    assert "different jobs" in _error(capsys, ["scaling", str(RUN1), str(TRACES / "fsdp2_default")])
    other = _copy_run(RUN2, tmp_path / "bigger_model", model={"parameters": 123})
    assert "model parameter count" in _error(capsys, ["scaling", str(RUN1), str(other)])
    bare = _copy_run(RUN2, tmp_path / "no_work", samples_per_step=None, tokens_per_step=None)
    err = _error(capsys, ["scaling", str(RUN1), str(bare)])
    assert "work per step unknown" in err and "--samples-per-step" in err
    assert "positive" in _error(capsys, ["scaling", str(RUN1), str(bare), "--samples-per-step", "-3"])
    # with the per-rank flag it works
    assert main(["scaling", str(RUN1), str(bare), "--samples-per-step", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unit"] == "samples" and [r["work_per_step"] for r in d["runs"]] == [8, 16]


# ------------------------------------------------------------------ real runs
@pytest.mark.slow
@pytest.mark.xdist_group("ddp_reference_run")
def test_reference_runs_end_to_end(tmp_path, ddp_reference_run):
    pytest.importorskip("torch", reason="needs the [capture] extra (torch)")
    cli = [sys.executable, "-m", "fsdpdoctor"]
    # the 2-process run is the session's ddp_default job (tests/test_reference_jobs.py reads it too)
    rc, run2 = ddp_reference_run
    assert rc == 0
    proc = subprocess.run(cli + ["reference", "run", "ddp_default", "--nproc", "1", "--out", str(tmp_path / "tmp1"),
                                 "--wait", "1", "--warmup", "1", "--active", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run(cli + ["scaling", str(tmp_path / "tmp1"), str(run2), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    base, big = d["runs"]
    assert (base["world_size"], big["world_size"]) == (1, 2) and d["mode"] == "weak"
    assert big["efficiency"] == pytest.approx(base["step_us"] / big["step_us"], rel=1e-6)
    assert big["efficiency"] == pytest.approx(
        mean_step_us(tmp_path / "tmp1") / mean_step_us(run2), rel=1e-6)
    (w,) = d["waterfalls"]
    assert sum(p["delta_us"] for p in w["parts"]) == pytest.approx(w["increase_us"], rel=0.01)
    ar = next(p for p in w["parts"] if p["key"] == "comm:all_reduce")
    # never below zero by rounding; 0 where a loaded machine made all of it waiting for the other rank
    assert ar["run_us"] >= 0
