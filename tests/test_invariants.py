"""The analysis invariants (fsdpdoctor/analysis/invariants.py) on every bundled, CUDA and shared trace,
on profiler cycles split from a real recording, and on generated traces built to break them."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpdoctor.analysis import invariants
from fsdpdoctor.errors import InputError
from fsdpdoctor.results import Analysis, Finding
from fsdpdoctor.pipeline import open_analysis as analyze_path
from bundled import TRACES as BUNDLED, analysed  # the committed traces, in a pristine copy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_data import SHARED as _SHARED  # noqa: E402
from trace_edit import split_cycles  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = _SHARED if _SHARED.is_dir() else None  # ../shared beside the repository (tests/shared_data.py)


def _runs(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    return sorted(d for d in base.iterdir() if d.is_dir()
                  and any(f.name.endswith((".json", ".json.gz")) and f.name != "expected.json" for f in d.iterdir()))


def _assert_family(runs: list[Path]) -> None:
    assert runs, "no runs found"
    bad = {}
    for d in runs:
        found = invariants.check(analysed(d, use_summaries=False))  # rank steps shared (tests/bundled.py)
        if found:
            bad[d.name] = [str(v) for v in found]
    assert not bad, json.dumps(bad, indent=1)


def test_invariants_hold_on_bundled_traces():
    _assert_family([d for d in _runs(BUNDLED) if d.name != "cuda"])


def test_invariants_hold_on_bundled_cuda_traces():
    _assert_family(_runs(BUNDLED / "cuda"))


@pytest.mark.skipif(SHARED is None or not (SHARED / "traces-public").is_dir(), reason="../shared/traces-public absent")
def test_invariants_hold_on_shared_public_traces():
    _assert_family(_runs(SHARED / "traces-public"))


@pytest.mark.skipif(SHARED is None or not (SHARED / "traces-cuda").is_dir(), reason="../shared/traces-cuda absent")
def test_invariants_hold_on_shared_cuda_traces():
    _assert_family(_runs(SHARED / "traces-cuda"))


# ------------------------------------------------------------------ the known violations, fixed
def test_collectives_table_adds_up_on_straggler():
    """Two gloo all-reduces of a step wait together for the sleeping rank: their exposed times were
    summed (298 ms of exposed all-reduce per rank and step against 155.5 ms of exposed communication)."""
    a = analyze_path(BUNDLED / "straggler", use_summaries=False)
    rank_steps = sum(len(r.steps) for r in a.ranks)
    exposed = sum(s.exposed_comm_us for r in a.ranks for s in r.steps) / rank_steps
    comm = sum(s.comm_us for r in a.ranks for s in r.steps) / rank_steps
    ar = [c for c in a.collectives if c.kind == "all_reduce"]
    assert ar and max(c.per_step for c in ar) >= 2  # several calls per step, overlapping
    assert sum(c.exposed_per_step_us for c in a.collectives) == pytest.approx(exposed, rel=1e-6)
    assert sum(c.busy_per_step_us for c in a.collectives) == pytest.approx(comm, rel=1e-6)
    # the per-call shares add up the same way on every rank
    for r in a.ranks:
        calls = [c for c in a.collective_events if c.rank == r.rank]
        assert sum(c.exposed_us for c in calls) == pytest.approx(sum(s.exposed_comm_us for s in r.steps), rel=1e-6)
        assert all(c.exposed_us <= c.duration_us - c.hidden_us + 1e-6 for c in calls)


def test_kinds_and_phases_add_up_where_kinds_overlap():
    """DDP's broadcast of buffers runs beside the gradient all-reduces: each kind's own union summed
    over kinds was 70.9 us more than the step's exposed communication."""
    a = analyze_path(BUNDLED / "cnn_ddp", use_summaries=False)
    calls = sorted(a.collective_events, key=lambda c: (c.rank, c.start_us))
    assert any(x.rank == y.rank and x.kind != y.kind and y.start_us < x.end_us for x, y in zip(calls, calls[1:]))
    for r in a.ranks:
        for s in r.steps:
            assert sum(k.exposed_us for k in s.comm_by_kind.values()) == pytest.approx(s.exposed_comm_us, abs=1)
            assert sum(k.busy_us for k in s.comm_by_kind.values()) == pytest.approx(s.comm_us, abs=1)
            assert sum(s.exposed_by_phase.values()) == pytest.approx(s.exposed_comm_us, abs=1)


def test_enforce_bounds_and_names_a_violated_figure(monkeypatch):
    a = analyze_path(BUNDLED / "host_sync", use_summaries=False)
    step = a.mean.duration_us
    a.findings.append(Finding(id="made-up", title="t", severity="error", confidence=1.0, impact_us=2 * step,
                              impact_frac=2.0, summary="", fix=""))
    found = invariants.check(a)
    assert {v.invariant for v in found} >= {"impact-within-step", "share-in-unit"}
    monkeypatch.setenv(invariants.STRICT_ENV, "1")
    with pytest.raises(invariants.InvariantError):
        invariants.enforce(a)
    monkeypatch.setenv(invariants.STRICT_ENV, "0")
    invariants.enforce(a)
    f = a.findings[-1]
    assert f.impact_us == step and f.impact_frac == 1.0
    assert any("impact-within-step" in n and "made-up" in n for n in a.notes)
    assert not [v for v in invariants.check(a) if v.invariant != "roots-within-step"]


def test_enforce_withholds_a_table_that_does_not_add_up(monkeypatch):
    a = analyze_path(BUNDLED / "straggler", use_summaries=False)
    a.collectives[0].exposed_us *= 2
    monkeypatch.setenv(invariants.STRICT_ENV, "0")
    invariants.enforce(a)
    assert a.collectives == [] and any("collectives-add-up" in n for n in a.notes)


# ------------------------------------------------------------------ profiler cycles of one process
PUBLIC_RESNET = (SHARED / "traces-public" / "resnet50_loader_num_workers_0") if SHARED else None


@pytest.mark.skipif(PUBLIC_RESNET is None or not PUBLIC_RESNET.is_dir(), reason="public ResNet trace absent")
@pytest.mark.parametrize("names", [("worker0.cycle1.pt.trace.json.gz", "worker0.cycle2.pt.trace.json.gz"),
                                   ("gpu1_4242.1610366662254410000.pt.trace.json.gz",
                                    "gpu1_4242.1610367142254410000.pt.trace.json.gz")],
                         ids=["rank-in-name", "trace-handler-names"])
def test_two_profiler_cycles_are_separate_runs_of_steps(tmp_path, names):
    """The public single-GPU ResNet recording split into two cycles of one process, 8 minutes apart:
    was a mean step of tens of seconds (the gap inside a step) and a missed DataLoader stall."""
    src = next(PUBLIC_RESNET.glob("*.json.gz"))
    whole = analyze_path(PUBLIC_RESNET, use_summaries=False)
    split_cycles(src, tmp_path, 3, 480e6, names)
    a = analyze_path(tmp_path, use_summaries=False)
    assert not invariants.check(a)
    (r,) = a.ranks
    assert len(r.cycles) == 2 and r.cycles[1][0] - r.cycles[0][1] > 400e6
    assert [s.step for s in r.steps] == [s.step for s in whole.ranks[0].steps]
    assert max(s.duration_us for s in r.steps) < 2 * max(s.duration_us for s in whole.ranks[0].steps)
    assert a.mean.duration_us == pytest.approx(whole.mean.duration_us, rel=0.05)
    assert a.mean.data_loading_us == pytest.approx(whole.mean.data_loading_us, rel=0.15)
    ids = {f.id: f for f in a.findings}
    assert "input-bound" in ids and ids["input-bound"].severity == "warning"
    assert all(f.severity != "error" for f in a.findings)


def test_our_h100_recording_split_into_two_cycles(tmp_path):
    """Our own H100 recording (traces/cuda/dataloader_slow, steps 2-4) as two cycles 5 minutes apart:
    step 2 alone in the first cycle, steps 3-4 in the second."""
    src = BUNDLED / "cuda" / "dataloader_slow"
    whole = analyze_path(src, use_summaries=False)
    split_cycles(src / "rank0.json.gz", tmp_path, 1, 300e6, ("rank0.json.gz", "rank0.cycle2.json.gz"))
    a = analyze_path(tmp_path, use_summaries=False)
    assert not invariants.check(a)
    (r,) = a.ranks
    assert len(r.cycles) == 2 and [s.step for s in r.steps] == [2, 3, 4]
    for s, w in zip(r.steps, whole.ranks[0].steps):
        assert s.duration_us == pytest.approx(w.duration_us, rel=0.25)
    assert a.mean.data_loading_us == pytest.approx(whole.mean.data_loading_us, rel=0.1)
    assert {f.id for f in a.findings} >= {"input-bound"}


# ------------------------------------------------------------------ generated traces built to break them
STREAM_COMPUTE, STREAMS_COMM = 7, (20, 21)
NCCL = ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")


@st.composite
def gpu_traces(draw):
    """One rank's GPU trace, as one file or as two profiler cycles, with what breaks naive sums:
    collectives overlapping each other, steps nested in steps, a gap between cycles, kernels launched
    outside any step, step numbers that skip."""
    n_steps = draw(st.integers(1, 4))
    two_cycles = n_steps > 1 and draw(st.booleans())
    cut = draw(st.integers(1, n_steps - 1)) if two_cycles else n_steps
    skip = draw(st.booleans())
    nested = draw(st.integers(0, 4)) == 0  # the loader refuses most of these (steps out of order): kept rare
    host, events, corr, t = (1, 1), [], 1, 1e6
    steps = []
    for i in range(n_steps):
        dur = float(draw(st.integers(2000, 20000)))
        if two_cycles and i == cut:
            t += 5e6  # the profiler waited between cycles
        number = 5 + i + (3 if skip and i >= cut else 0)
        steps.append((number, t, dur))
        t += dur + draw(st.sampled_from([0.0, 0.0, 50.0]))
    for number, start, dur in steps:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": host[0],
                       "tid": host[1], "ts": start, "dur": dur})
        if nested:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number + 100}",
                           "pid": host[0], "tid": host[1], "ts": start + dur / 4, "dur": dur / 4})
        for _ in range(draw(st.integers(0, 6))):
            comm = draw(st.booleans())
            launch = start + draw(st.floats(-0.2, 1.1)) * dur  # some launched outside any step
            kstart = launch + draw(st.floats(5.0, 3000.0))
            kdur = draw(st.floats(10.0, 6000.0))
            name = draw(st.sampled_from(NCCL)) if comm else "volta_sgemm_128x64_nn"
            stream = draw(st.sampled_from(STREAMS_COMM)) if comm else STREAM_COMPUTE
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host[0],
                           "tid": host[1], "ts": launch, "dur": 4.0, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": kstart,
                           "dur": kdur, "args": {"correlation": corr, "stream": stream, "device": 0}})
            corr += 1
    return events, (steps[cut][1] if two_cycles else None)


def _write(folder: Path, events: list, split_at: float | None) -> None:
    parts = [events] if split_at is None else [
        [e for e in events if (e["ts"] if e["cat"] != "kernel" else _launch(events, e)) < split_at],
        [e for e in events if (e["ts"] if e["cat"] != "kernel" else _launch(events, e)) >= split_at]]
    for i, part in enumerate(parts):
        doc = {"schemaVersion": 1, "traceEvents": part + [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]}
        with gzip.open(folder / f"rank0.cycle{i + 1}.json.gz", "wt", compresslevel=1) as fh:
            fh.write(json.dumps(doc))


def _launch(events: list, kernel: dict) -> float:
    c = kernel["args"]["correlation"]
    return next(e["ts"] for e in events if e["cat"] == "cuda_runtime" and e["args"]["correlation"] == c)


@settings(max_examples=int(os.environ.get("FSDPDOCTOR_INVARIANT_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(gpu_traces())
def test_generated_traces_keep_the_invariants(tmp_path_factory, trace):
    events, split_at = trace
    folder = tmp_path_factory.mktemp("gen")
    _write(folder, events, split_at)
    try:
        a = analyze_path(folder, use_summaries=False)
    except InputError as exc:  # refused with one line (steps overlapping in more than 1 % of the events...)
        assert "\n" not in str(exc)
        return
    assert isinstance(a, Analysis)
    found = invariants.check(a)
    assert not found, [str(v) for v in found]


@pytest.mark.parametrize("run", ["gru_cycles", "gru_cycles_handler"])
def test_own_recording_with_two_profiler_cycles(run):
    """reference_jobs/gru_cycles.py: repeat=2 with a 2 s pause between the cycles, through the capture
    wrapper (manifest cycle_files) and through torch.profiler's trace handler (no manifest)."""
    a = analyze_path(BUNDLED / run, use_summaries=False)
    assert [r.rank for r in a.ranks] == [0, 1]
    for r in a.ranks:
        assert len(r.cycles) == 2 and r.cycles[1][0] - r.cycles[0][1] > 1.5e6  # the pause
        assert [s.step for s in r.steps] == [2, 3, 4, 7, 8, 9]
        for s in r.steps:  # each step inside one cycle, none near the pause's length
            assert any(c0 <= s.start_us and s.start_us + s.duration_us <= c1 for c0, c1 in r.cycles)
            assert s.duration_us < 1e6
    assert not invariants.check(a)
    assert "input-bound" in {f.id for f in a.findings}


@st.composite
def gloo_traces(draw):
    """One rank's CPU/gloo trace: c10d ops on the main thread whose gloo worker spans (two worker
    threads) overlap each other, compute ops between them, steps back to back or with gaps."""
    events, t = [], 1e6
    for i in range(draw(st.integers(1, 4))):
        dur = float(draw(st.integers(2000, 20000)))
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{3 + i}", "pid": 1, "tid": 1,
                       "ts": t, "dur": dur})
        cursor = t + 10
        for _ in range(draw(st.integers(0, 5))):
            if cursor >= t + dur - 20:
                break
            op = float(draw(st.integers(5, 2000)))
            op = min(op, t + dur - 10 - cursor)
            if draw(st.booleans()):
                events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": cursor,
                               "dur": op})
            else:
                events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1,
                               "ts": cursor, "dur": min(op, 20.0)})
                span = float(draw(st.integers(10, 30000)))  # may run on past the step and over the next call
                events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1,
                               "tid": draw(st.sampled_from([10, 11])), "ts": cursor + 1, "dur": span})
            cursor += op + 1
        t += dur + draw(st.sampled_from([0.0, 0.0, 500.0]))
    return events


@settings(max_examples=int(os.environ.get("FSDPDOCTOR_INVARIANT_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(gloo_traces())
def test_generated_gloo_traces_keep_the_invariants(tmp_path_factory, events):
    folder = tmp_path_factory.mktemp("gloo")
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
           "traceEvents": events}
    with gzip.open(folder / "rank0.json.gz", "wt", compresslevel=1) as fh:
        fh.write(json.dumps(doc))
    try:
        a = analyze_path(folder, use_summaries=False)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    found = invariants.check(a)
    assert not found, [str(v) for v in found]
