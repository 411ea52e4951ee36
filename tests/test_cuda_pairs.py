"""The CUDA fault/fix pairs recorded on an H200 (traces/cuda/pairs, reference_jobs/pair_table.CUDA_PAIRS):
each pair's finding fires on the fault and not on the fix, and the calibration's analyse stage turns the
bundled captures and timed runs into P against M (benchmarks/calibrate.py --device cuda --stage analyse).

The timed runs are recorded data (the GPU's bare step times, bundled beside the captures), so the verdicts
are deterministic: where this file asserts that a prediction holds, it holds against what the GPU measured."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bundled import TRACES
from fsdpdoctor.pipeline import open_analysis

ROOT = Path(__file__).resolve().parents[1]
PAIRS_DIR = TRACES / "cuda" / "pairs"
sys.path.insert(0, str(ROOT / "reference_jobs"))
from pair_table import CUDA_PAIRS  # noqa: E402


def _calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ids(run: Path) -> dict[str, object]:
    return {f.id: f for f in open_analysis(run, use_summaries=False).findings}


@pytest.mark.parametrize("pair", sorted(CUDA_PAIRS))
def test_the_finding_fires_on_the_fault_and_not_on_the_fix(pair):
    expect = CUDA_PAIRS[pair]["expect"]
    fault, fix = _ids(PAIRS_DIR / pair / "fault"), _ids(PAIRS_DIR / pair / "fix")
    assert expect in fault
    if CUDA_PAIRS[pair].get("residual"):
        # the fix leaves a small instance of the same thing (one readback a step; a pinned copy, 11x faster)
        assert fix[expect].impact_us <= 0.15 * fault[expect].impact_us
    else:
        assert expect not in fix


def test_offload_counts_the_optimizer_on_the_host_once():
    """FSDP2 CPUOffloadPolicy: the copies under no kernel are a few % of the step; the optimizer stepping the
    offloaded parameters on the host is most of the saving. offload-exposed carries it, and gpu-idle (the
    launch-bound rest) does not count it again."""
    a = open_analysis(PAIRS_DIR / "cuda_offload" / "fault", use_summaries=False)
    found = {f.id: f for f in a.findings}
    off, idle = found["offload-exposed"], found["gpu-idle"]
    (g,) = a.signals.gpu_idle
    (o,) = a.signals.offload
    assert g.optimizer_host_us > 10 * o.exposed_us
    assert off.impact_us == pytest.approx(o.exposed_us + g.optimizer_host_us)
    assert any("optimizer steps CPU tensors" in e.text for e in off.evidence)
    # together no more than the idle and the exposed copies they rest on
    assert off.impact_us + idle.impact_us <= g.idle_us + o.exposed_us
    assert "host compute" not in idle.title


def test_host_compute_is_not_found_where_the_optimizer_runs_on_the_device():
    """The same model without offload: the optimizer's ops launch kernels, so next to none of its time is host
    compute (a few DTensor dispatches outlast 50 us under the profiler)."""
    a = open_analysis(PAIRS_DIR / "cuda_offload" / "fix", use_summaries=False)
    (g,) = a.signals.gpu_idle
    assert g.optimizer_host_us < 0.01 * a.mean.duration_us
    assert g.by_cause["host_compute"] < 0.05 * g.idle_us


def test_analyse_stage_on_the_bundled_gpu_recordings(tmp_path):
    cal = _calibrate()
    out, doc = tmp_path / "r.json", tmp_path / "impact-cuda.md"
    rc = cal.main(["--device", "cuda", "--stage", "analyse", "--work", str(PAIRS_DIR), "--reps", "5",
                   "--steps", "20", "--active", "4", "--pairs",
                   "cuda_offload,cuda_loader_workers,cuda_host_sync,cuda_recompute,cuda_readback,cuda_pageable_copy,"
                   "cuda_launch_bound",
                   "--doc", str(doc), "--json", str(out), "--machine", "H200"])
    assert rc == 0
    by = {r["pair"]: r for r in json.loads(out.read_text())["pairs"]}
    for name in ("cuda_offload", "cuda_loader_workers", "cuda_host_sync", "cuda_recompute", "cuda_readback",
                 "cuda_pageable_copy", "cuda_launch_bound"):
        r = by[name]
        assert "error" not in r, r
        # a residual pair's fix keeps a small instance of the finding (one readback, one pinned copy a step)
        assert r["found_on_fault"] and (CUDA_PAIRS[name].get("residual") or not r["found_on_fix"])
        assert len(r["fault_step_us"]) == len(r["fix_step_us"]) == 5
        assert r["verdict"] == "holds", (name, r["predicted_us"], r["measured_us"], r["measured_interval_us"])
    text = doc.read_text()
    assert "H200" in text and "--stage analyse" in text


def test_ddp_at_world_size_one_prices_the_wrappers_own_host_work(tmp_path):
    """The H200 pair's fault: DDP's own host work (its forward less the module's, the reducer's hooks and bucket
    copies, its collectives' host calls, while the device idles) is what dropping the wrapper removes, far more
    than its exposed collective. The bare runs measured 0.9 ms [0.7, 1.1]; the trace holds 1.8 ms of it per step
    (CUPTI's cost per traced runtime call is not set aside), capped at the step's compute, 1.2 ms: within 35 %
    of M (the exposed all-reduce alone, the model before, promised 0.1)."""
    a = open_analysis(PAIRS_DIR / "cuda_ddp_world_size_1" / "fault", use_summaries=False)
    f = {x.id: x for x in a.findings}["wrapper-world-size-1"]
    own = a.signals.ddp.own_host_us_steps
    assert len(own) == 4 and all(v > a.mean.exposed_comm_us for v in own)
    assert any("DDP's own host work" in e.text and "device idles" in e.text for e in f.evidence)
    assert f.impact_us > 2 * a.mean.exposed_comm_us and f.severity == "info"
    out = tmp_path / "r.json"
    assert _calibrate().main(["--device", "cuda", "--stage", "analyse", "--work", str(PAIRS_DIR), "--reps", "5",
                              "--steps", "20", "--active", "4", "--pairs", "cuda_ddp_world_size_1", "--doc", "-",
                              "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["pairs"]
    assert r["verdict"] == "holds", (r["predicted_us"], r["measured_us"], r["measured_interval_us"])


def test_record_stage_needs_a_work_folder():
    assert _calibrate().main(["--device", "cuda", "--stage", "record"]) == 2
    assert _calibrate().main(["--device", "cuda", "--pairs", "straggler_sleep"]) == 2  # a CPU pair


# ----------------------------------------------------------------- inputs to name, recorded on the same H200
def test_a_cuda_job_profiled_without_the_cuda_activity_is_named_and_not_read():
    """reference_jobs/cuda_profile_kinds.py --which no_cuda_activity: kernel launches in the host timeline,
    no device timeline. The header says so, the breakdown is withheld, nothing is claimed."""
    a = open_analysis(TRACES / "cuda" / "no_cuda_activity", use_summaries=False)
    kind = a.job.input_kind
    assert kind.device == "missing" and kind.steps == "profiler-step"
    assert any("ProfilerActivity.CUDA" in u and "kernel launch" in u for u in kind.unknown)
    assert a.mean is None and not a.findings


def test_start_up_inside_the_window_is_set_aside():
    """--which startup_in_window: the profiler started before the process touched the GPU, so the first step
    holds context creation and library initialisation inside single runtime calls orders of magnitude longer
    than the rest: named, and left out of the saving."""
    a = open_analysis(TRACES / "cuda" / "startup_in_window", use_summaries=False)
    (g,) = a.signals.gpu_idle
    assert g.startup_idle_us > 0 and g.startup_calls
    f = {x.id: x for x in a.findings}["gpu-idle"]
    assert any("one-time start-up" in e.text for e in f.evidence)
    fixable = sum(v for c, v in g.by_cause.items() if c != "other")
    assert f.impact_us <= fixable - g.startup_idle_us + 1e-6
    assert f.severity != "error"  # four steps, one of them start-up: not enough to fail a gate


def test_cold_start_is_named_apart_from_the_steady_state_in_the_header():
    """startup_in_window's first step holds the process's GPU start-up (context, function attributes): the
    header names it as the cold start of that step with its one-off calls, and gives the steady state's idle
    and causes from the other steps, instead of calling the start-up "launch" idle."""
    from fsdpdoctor.report.console import gpu_lines

    a = open_analysis(TRACES / "cuda" / "startup_in_window", use_summaries=False)
    (g,) = a.signals.gpu_idle
    assert g.startup_steps == [0]
    line = gpu_lines(a).plain
    assert "cold start: step #0 idle" in line and "one-off start-up: cudaDeviceGetStreamPriorityRange" in line
    steady = [st for st in g.steps if st.step != 0]
    assert f"steady state ({len(steady)} steps): idle " in line
    # the steady state's launch idle is the other steps', far below the mean over the window the header used
    launch = sum(st.by_cause["launch"] for st in steady) / len(steady)
    assert launch < 0.1 * g.by_cause["launch"]
    assert "launch" not in line.split("steady state", 1)[0]   # the cold start is not called launch idle
    # a run without start-up in its window keeps the one list of causes
    plain = gpu_lines(open_analysis(TRACES / "cuda" / "ddp_default", use_summaries=False)).plain
    assert "cold start" not in plain and "launch" in plain


def test_a_copies_only_device_timeline_is_read_as_a_device_timeline():
    """--which copies_only (recorded on an H200): a loop that stages a batch on the GPU and reads 64 rows back
    one .cpu() at a time, with no arithmetic on the device: 264 copies and no kernel. It is a device
    timeline (the copies are busy time, their syncs are found), and what idles the device is said in the
    words of what it runs: copies, and a fix that batches them, not fused kernels."""
    a = open_analysis(TRACES / "cuda" / "copies_only", use_summaries=False)
    kind = a.job.input_kind
    assert kind.device == "copies-only" and kind.device_known and kind.steps == "profiler-step"
    assert a.mean is not None and a.mean.duration_us > 0
    f = {x.id: x for x in a.findings}
    idle, sync = f["gpu-idle"], f["host-sync"]
    text = " ".join([idle.title, idle.summary, idle.fix] + [e.text for e in idle.evidence])
    assert "kernel" not in text.lower() and "copies" in idle.fix
    assert "copies" in sync.summary and "kernels" not in sync.summary
    (g,) = a.signals.gpu_idle
    busy = a.mean.duration_us - g.idle_us
    assert busy > 0  # the copies are device work: the device is not 100 % idle
    # the idle's saving never exceeds the idle
    assert idle.impact_us <= g.idle_us + 1e-6


def test_many_small_readbacks_are_priced_once():
    """cuda_readback's fault (64 .item() a step, recorded on an H200): the idle after the syncs is host-sync's
    saving and gpu-idle says it leaves it out, so the roots' shared budget does not cut host-sync to a
    fraction (it did: 0.2 ms against the 0.6 ms the bare runs measured); and the bubble is less than the idle
    after the syncs with only the per-frame cost set aside (the profiler's cost per op and runtime call)."""
    a = open_analysis(PAIRS_DIR / "cuda_readback" / "fault", use_summaries=False)
    f = {x.id: x for x in a.findings}
    hs, gi = f["host-sync"], f["gpu-idle"]
    assert any("counted there, not here" in e.text for e in gi.evidence)
    assert not any("impact limited" in e.text for e in hs.evidence)
    (g,) = a.signals.gpu_idle
    fixable = sum(v for c, v in g.by_cause.items() if c != "other")
    assert gi.impact_us + hs.impact_us <= fixable + 1e-6  # the same idle is not promised twice
    (h,) = [h for h in a.signals.host_syncs if h.count >= 64 * 4]
    assert hs.impact_us == pytest.approx(h.bubble_us / 4, rel=1e-6)


def test_the_profilers_own_cost_is_measured_by_the_run_and_not_promised(tmp_path):
    """cuda_launch_bound's fault (a small MLP stepped eagerly, recorded on an H200 with 8 unprofiled steps after
    the window): the profiled steps took about twice the unprofiled ones, all of it idle on a host-bound GPU.
    gpu-idle's saving is the idle less that (it promised the whole profiled idle before: 11 ms against the 3.9
    the bare runs measured); with the step series gone, only the per-frame estimate is set aside, said so."""
    run = PAIRS_DIR / "cuda_launch_bound" / "fault"
    a = open_analysis(run, use_summaries=False)
    pc = a.signals.profiler_cost
    assert pc is not None and pc.bare_steps >= 5 and pc.profiled_step_us > 1.5 * pc.bare_step_us
    assert pc.added_us == pytest.approx(pc.profiled_step_us - pc.bare_step_us)
    f = {x.id: x for x in a.findings}["gpu-idle"]
    (g,) = a.signals.gpu_idle
    assert f.impact_us <= g.idle_us - pc.added_us + 1e-6
    assert any("profiler's own cost" in e.text and "unprofiled steps" in e.text for e in f.evidence)
    # the same trace without its step series: nothing measured, the per-frame cost alone set aside, said so
    bare = tmp_path / "fault"
    bare.mkdir()
    for name in ("manifest.json", "rank0.json.gz"):
        (bare / name).write_bytes((run / name).read_bytes())
    b = open_analysis(bare, use_summaries=False)
    assert b.signals.profiler_cost is None
    fb = {x.id: x for x in b.findings}["gpu-idle"]
    assert fb.impact_us > f.impact_us
    assert any("not measured here" in e.text for e in fb.evidence)


def test_the_profilers_cost_is_not_measured_where_a_window_was_opened_for_its_steps(tmp_path):
    """A window opened on an anomaly or on demand holds steps chosen because they differ: their difference
    from the unprofiled ones is the job's, not the profiler's, so nothing is measured; a periodic stall's
    steps are left out of both sides."""
    import shutil

    from fsdpdoctor.analysis import profiler_cost
    from fsdpdoctor.analysis.periodic import read_step_series

    run = tmp_path / "run"
    shutil.copytree(TRACES / "periodic_checkpoint", run)
    manifest = json.loads((run / "manifest.json").read_text())
    series = read_step_series(run)
    whole = profiler_cost.measure(series, run, manifest)
    assert whole is not None and whole.bare_steps >= profiler_cost.MIN_BARE_STEPS
    fewer = profiler_cost.measure(series, run, manifest, stalled={8, 12, 16})
    assert fewer is not None and fewer.bare_steps < whole.bare_steps
    win = run / "window-40"
    win.mkdir()
    (win / "manifest.json").write_text(json.dumps({"window": {"trigger": "anomaly", "first_step": 40}}))
    assert profiler_cost.measure(series, run, manifest) is None
    assert profiler_cost.measure(read_step_series(tmp_path), tmp_path, manifest) is None  # no step series
