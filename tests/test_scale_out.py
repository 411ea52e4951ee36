"""The map/reduce split: dialects behind one seam, engines (serial, process pool, Dask) that
agree to the byte, and per-rank summaries that stand in for the traces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpdoctor.analysis import dialects
from fsdpdoctor.analysis.dialects.gloo_cpu import GlooCpu
from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.dialects.base import Timelines, comm_by_kind_and_phase
from fsdpdoctor.errors import InputError
from fsdpdoctor.report.json_report import to_json
from fsdpdoctor.results import DialectTraits
from fsdpdoctor.pipeline import open_analysis

from conftest import requires_torch
from shared_data import PUBLIC
from bundled import TRACES  # the committed traces, in a pristine copy

REPO = Path(__file__).resolve().parents[1]
RUNS = ["straggler", "fsdp2_default", "ddp_default", "fsdp1_backward_pre", "host_sync"]


def doc(path, **kw) -> dict:
    a = open_analysis(path, **kw)
    d = json.loads(to_json(a, include_events=True))
    d.pop("source")
    return d


# ------------------------------------------------------------------ dialect seam
class CommIsComputeDialect(GlooCpu):
    """A test double: reads gloo traces, but calls every host op communication-free idle
    (no compute at all) and says so in its traits. If the seam holds, analyze must show
    exactly what this dialect says, end to end."""

    name = "test-double"
    family = "cpu"
    note = "test double in use"

    def __init__(self):
        self.traits = DialectTraits(name=self.name, shared_host_cores=False)
        self.calls = {"matches": 0, "step_windows": 0, "collectives": 0, "timelines": 0}

    def matches(self, trace):
        self.calls["matches"] += 1
        return True

    def step_windows(self, ctx):
        self.calls["step_windows"] += 1
        return super().step_windows(ctx)

    def collectives(self, ctx):
        self.calls["collectives"] += 1
        return super().collectives(ctx)

    def timelines(self, ctx, records):
        self.calls["timelines"] += 1
        colls = [r.coll for r in records]
        by_kind, by_phase = comm_by_kind_and_phase(colls)
        return Timelines(compute=iv.EMPTY, optimizer=iv.EMPTY,
                         comm=iv.as_set([c.start_us for c in colls], [c.end_us for c in colls]),
                         comm_by_kind=by_kind, comm_by_phase=by_phase)


def test_a_registered_dialect_drives_analyze_end_to_end(monkeypatch):
    fake = CommIsComputeDialect()
    monkeypatch.setattr(dialects, "DIALECTS", [fake, *dialects.DIALECTS])  # the "one line" of a new dialect
    a = open_analysis(TRACES / "straggler", workers=1, use_summaries=False)
    assert fake.calls["matches"] == 2 and fake.calls["timelines"] == 2     # once per rank
    assert a.job.traits.name == "test-double" and a.job.dialect == "cpu"
    assert "test double in use" in a.notes
    # no compute from this dialect: all communication is exposed, nothing overlapped
    for r in a.ranks:
        for s in r.steps:
            assert s.compute_us == 0 and s.optimizer_us == 0 and s.overlapped_comm_us == 0
            assert s.exposed_comm_us == pytest.approx(s.comm_us)
    monkeypatch.undo()
    real = open_analysis(TRACES / "straggler", workers=1, use_summaries=False)
    assert real.job.traits.name == "gloo-cpu"
    assert any(s.compute_us > 0 for r in real.ranks for s in r.steps)
    # the collectives themselves come from the same reading: same kinds in the same order
    assert [c.kind for c in a.collective_events] == [c.kind for c in real.collective_events]


def test_detect_picks_the_dialect_by_content():
    from fsdpdoctor.trace.loader import load_file

    assert dialects.detect(load_file(TRACES / "straggler" / "rank0.json.gz")).name == "gloo-cpu"
    if PUBLIC is not None:
        t = load_file(PUBLIC / "ddp_a100_rank0" / "nccl_data.json.gz")
        d = dialects.detect(t)
        assert d.name == "nccl-gpu" and d.traits.device_timeline and d.traits.async_collectives


# ------------------------------------------------------------------ engines agree
@pytest.mark.parametrize("run", RUNS)
def test_process_pool_equals_serial(run):
    assert doc(TRACES / run, workers=2, use_summaries=False) == doc(TRACES / run, workers=1, use_summaries=False)


@pytest.mark.parametrize("run", RUNS)
def test_dask_equals_local(run, dask_address):
    assert doc(TRACES / run, dask=dask_address, use_summaries=False) == doc(TRACES / run, workers=2,
                                                                             use_summaries=False)


@pytest.mark.skipif(PUBLIC is None, reason="public traces not found")
def test_dask_equals_local_on_a_public_gpu_run(dask_address):
    p = PUBLIC / "recsys_2_of_128_ranks"
    assert doc(p, dask=dask_address) == doc(p, workers=1)


# ------------------------------------------------------------------ summaries
def _summarize(path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", "summarize", str(path), *extra],
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("run", RUNS)
def test_summaries_give_the_same_analysis_as_traces(run, tmp_path, monkeypatch):
    folder = tmp_path / run
    shutil.copytree(TRACES / run, folder)
    full = doc(folder, use_summaries=False)
    assert _summarize(folder, "-q").returncode == 0
    assert sorted(p.name for p in folder.glob("*.summary.msgpack")) == ["rank0.summary.msgpack",
                                                                         "rank1.summary.msgpack"]
    # prove the traces are not parsed: any reading of one fails the test
    from fsdpdoctor.trace import loader

    def no_parsing(*a, **k):
        raise AssertionError("a trace was parsed although its summary is current")

    monkeypatch.setattr(loader, "load_file", no_parsing)
    got = doc(folder)
    # the report says where the figures come from, and nothing else differs
    assert got["data_quality"].pop("sources") == [
        "figures of 2 rank(s) read from rank0.summary.msgpack, rank1.summary.msgpack, made from these very "
        "traces (--no-summaries re-reads the traces)"]
    full["data_quality"].pop("sources")
    assert got == full
    # only the summaries (and the manifest), far from the traces
    alone = tmp_path / "alone"
    alone.mkdir()
    for f in list(folder.glob("*.summary.msgpack")) + [folder / "manifest.json"]:
        shutil.copy(f, alone)
    got = doc(alone)
    assert got["data_quality"].pop("sources") == [
        "figures of every rank read from summaries alone, with no trace to check them against: "
        "rank0.summary.msgpack, rank1.summary.msgpack"]
    assert got == full


def test_a_changed_trace_makes_its_summary_stale(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "straggler", folder)
    assert _summarize(folder, "-q").returncode == 0
    # replace rank 1 by the rank 1 of another job: its summary no longer describes the file, so the
    # file is read again and the job checks refuse it (the stale summary would have passed them)
    shutil.copy(TRACES / "dataloader_slow" / "rank1.json.gz", folder / "rank1.json.gz")
    errors = []
    for use in (True, False):
        with pytest.raises(InputError, match="do not belong together") as exc:
            doc(folder, use_summaries=use)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]


def test_summarize_never_writes_into_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    shutil.copytree(TRACES / "straggler", folder)
    folder.chmod(0o555)
    try:
        r = _summarize(folder)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--out" in r.stderr
        assert not list(folder.glob("*.summary.msgpack"))
        out = tmp_path / "out"
        assert _summarize(folder, "--out", str(out), "-q").returncode == 0
        assert len(list(out.glob("*.summary.msgpack"))) == 2
    finally:
        folder.chmod(0o755)


@requires_torch
def test_capture_writes_a_summary_beside_the_trace(tmp_path):
    import torch

    from capture_kit import run_captured, tiny_training, wait_for_summary

    model, opt, train_step = tiny_training(torch)
    out = tmp_path / "run"
    run_captured(out, train_step, model=model, optimizer=opt, wait=0, warmup=1, active=2)
    wait_for_summary(out)
    from_summary, from_trace = doc(out), doc(out, use_summaries=False)
    assert from_summary["data_quality"].pop("sources") == [
        "figures of 1 rank(s) read from rank0.summary.msgpack, made from these very traces "
        "(--no-summaries re-reads the traces)"]
    assert from_trace["data_quality"].pop("sources") == []
    # nothing was dropped or set aside: no "data quality" line, in the report or the TUI's header
    assert from_summary["data_quality"] == from_trace["data_quality"] == {
        "dropped_events": 0, "ranks": [], "manifest": [], "notes": []}
    assert from_summary == from_trace


# the layer and import-circle guards: tests/test_layers.py (every package and root module)


# ------------------------------------------------------------------ loader paths
def test_columnar_and_per_event_readings_agree_on_real_traces():
    import numpy as np

    from fsdpdoctor.trace import columns
    from fsdpdoctor.trace.events import decode_trace
    from fsdpdoctor.trace.io import read_bytes

    files = [TRACES / "fsdp2_default" / "rank0.json.gz"]
    if PUBLIC is not None:
        files += [PUBLIC / "ddp_a100_rank0" / "nccl_data.json.gz",
                  PUBLIC / "mi300_rccl_ddp_act_checkpoint" / "resnet_act_checkpoint.json.gz"]
    for f in files:
        _, events, _ = decode_trace(read_bytes(f), f)
        fast = columns.from_events(list(events))
        slow = columns.per_event(list(events))
        assert fast is not None
        for a, b in zip(fast, slow):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b)
            elif isinstance(a, list) and a and hasattr(a[0], "pid"):
                assert [(t.pid, t.tid) for t in a] == [(t.pid, t.tid) for t in b]
            else:
                assert a == b


def test_an_unreadable_event_is_skipped_and_counted(tmp_path):
    from fsdpdoctor.trace.loader import load_file

    # enough good events that three bad ones stay under the share of dropped events the loader tolerates
    good = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000, "pid": 1, "tid": 1}]
    good += [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10 + 2 * i, "dur": 1, "pid": 1, "tid": 1}
             for i in range(400)]
    bad = [{"ph": "X", "name": ["a list"], "ts": 5, "dur": 1, "pid": 1, "tid": 1},
           {"ph": "X", "name": "x", "ts": "soon", "dur": 1, "pid": 1, "tid": 1},
           {"ph": "X", "name": "y", "ts": 7, "dur": {"a": 1}, "pid": 1, "tid": 1}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": good[:1] + bad + good[1:]}))
    t = load_file(p)
    assert t.names == ["ProfilerStep#1", "aten::mm"] and t.unreadable_events == len(bad)
    assert t.quality.dropped == len(bad)
    assert list(t.ts) == [float(e["ts"]) for e in good]


def test_long_runs_report_progress_per_rank(monkeypatch, capsys):
    from fsdpdoctor import pipeline

    monkeypatch.setattr(pipeline._Reporter, "QUIET_S", -1.0)   # report from the first rank on
    open_analysis(TRACES / "straggler", workers=1, use_summaries=False, diagnose=False)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "ranks analysed" in ln]
    assert lines and lines[-1].startswith("fsdpdoctor: 2/2 ranks analysed (rank1.json.gz")


def test_the_job_checks_do_not_depend_on_the_order_ranks_finished(tmp_path):
    """Workers finish in any order: the ranks' results reach the job checks in that order, and the
    error they raise (the files it names) and the copy of a duplicate they keep must not follow it."""
    import itertools

    from fsdpdoctor.analysis import rankresult
    from fsdpdoctor.pipeline import RankUnit, rank_step
    from fsdpdoctor.results import DataQuality
    from fsdpdoctor.pipeline import _check_one_job

    folder = tmp_path / "run"
    shutil.copytree(TRACES / "straggler", folder)
    shutil.copy(TRACES / "dataloader_slow" / "rank1.json.gz", folder / "rank1.json.gz")  # another job's
    shutil.copy(folder / "rank0.json.gz", folder / "copy_rank0.json.gz")  # an identical copy of rank 0
    results = [rankresult.decode(o.result)
               for f in sorted(folder.glob("*.json.gz")) for o in rank_step(RankUnit((str(f),)))]
    assert sorted(r.rank for r in results) == [0, 0, 1]
    errors, kept = set(), set()
    for perm in itertools.permutations(results):
        with pytest.raises(InputError, match="do not belong together") as exc:
            _check_one_job(folder, list(perm), None, DataQuality())
        errors.add(str(exc.value))
    assert len(errors) == 1
    for perm in itertools.permutations([r for r in results if r.rank == 0]):  # the duplicate alone
        dq = DataQuality()
        got, _ = _check_one_job(folder, list(perm), None, dq)
        kept.add((tuple(r.summary.file for r in got), tuple(dq.notes)))
    assert len(kept) == 1
