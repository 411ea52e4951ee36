"""GPU idle and its causes, setup faults, recompute and offload: synthetic event tables, the bundled
CUDA recordings (traces/cuda) and the public GPU traces, each checked against an independent
computation from the raw JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.pipeline import open_analysis
from shared_data import PUBLIC, needs_public
from bundled import TRACES as BUNDLED, expectations  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
CUDA = BUNDLED / "cuda"
MY_RULES = {"gpu-idle", "cpu-staged-collectives", "ranks-never-communicate", "wrapper-world-size-1",
            "mixed-backends", "activation-recompute", "offload-exposed"}
PREFETCH = {"fsdp-forward-prefetch-off", "fsdp1-backward-post", "fsdp1-no-backward-prefetch",
            "fsdp2-backward-prefetch-ineffective"}


# ----------------------------------------------------------------- synthetic traces
class Trace:
    """A tiny Kineto trace: host ops on thread 1, kernels on stream 7, launches correlated."""

    def __init__(self, rank=0, world_size=1, backend="nccl", pg=("cuda:nccl",)):
        self.events: list[dict] = []
        self.corr = 0
        self.dist = {"backend": backend, "rank": rank, "world_size": world_size, "pg_count": len(pg),
                     "pg_config": [{"pg_name": str(i), "backend_config": b, "pg_size": world_size,
                                    "ranks": list(range(world_size))} for i, b in enumerate(pg)]}

    def x(self, name, cat, ts, dur, tid=1, pid=1, **args):
        self.events.append({"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
                            "args": args})

    def step(self, n, ts, dur):
        self.x(f"ProfilerStep#{n}", "user_annotation", ts, dur)

    def launch(self, ts, kernel_ts, kernel_dur, name="void gemm_kernel()", cat="kernel", tid=1):
        """cudaLaunchKernel at ts (5 us) and its kernel on stream 7."""
        self.corr += 1
        self.x("cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync", "cuda_runtime", ts, 5, tid=tid,
               correlation=self.corr)
        self.x(name, cat, kernel_ts, kernel_dur, tid=7, pid=0, correlation=self.corr)

    def write(self, folder: Path, name="rank0.json") -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps({"schemaVersion": 1, "distributedInfo": self.dist,
                                               "traceEvents": self.events}))
        return folder


def launch_bound(tr: Trace, steps=(1, 2, 3), step_us=1000.0, delay=2.0, loader_us=0.0):
    """Each step: optional DataLoader wait, then ops of 80 us that each launch one 10 us kernel."""
    for i, n in enumerate(steps):
        s = i * step_us
        tr.step(n, s, step_us - 1)
        if loader_us:
            tr.x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", s, loader_us)
        t = s + loader_us
        while t + 80 <= s + step_us - 1:
            tr.x("aten::mm", "cpu_op", t, 78)
            tr.launch(t + 70, t + 70 + 5 + delay, 10)
            t += 80
    return tr


def brute_union(intervals):
    """Plain merge of intervals: total covered length."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def finding(a, rule_id):
    return next((f for f in a.findings if f.id == rule_id), None)


def test_launch_bound_synthetic(tmp_path):
    a = open_analysis(launch_bound(Trace()).write(tmp_path))
    g = a.signals.gpu_idle[0]
    # first two steps have exact windows [0, 1000) and [1000, 2000): 12 kernels of 10 us each
    for st in g.steps[:2]:
        kernels = (int((999 - 0) // 80)) * 10.0
        assert st.idle_us == pytest.approx(st.duration_us - kernels)
        assert sum(st.by_cause.values()) == pytest.approx(st.idle_us)
        assert st.by_cause["launch"] > 0.9 * st.idle_us
    assert g.queue_delay_median_us == pytest.approx(2.0) and g.queue_empty_frac == 1.0
    f = finding(a, "gpu-idle")
    assert f is not None and "kernel launch overhead" in f.title and "host-bound" in f.title
    assert "torch.compile" in f.fix and f.caused_by is None
    assert f.severity in ("warning", "error")


def test_gpu_busy_queue_is_not_host_bound(tmp_path):
    """Kernels wait 300+ us in the queue and still leave gaps: the GPU is not waiting for the host."""
    tr = Trace()
    for i, n in enumerate((1, 2, 3)):
        s = i * 1000.0
        tr.step(n, s, 999)
        for k in range(10):
            tr.x("aten::mm", "cpu_op", s + 10 * k, 9)
            tr.launch(s + 10 * k, s + 300 + 60 * k, 30)
    a = open_analysis(tr.write(tmp_path))
    g = a.signals.gpu_idle[0]
    assert g.idle_frac > 0.5 and g.queue_empty_frac == 0.0
    assert finding(a, "gpu-idle") is None


def test_data_loading_idle_is_a_consequence_of_input_bound(tmp_path):
    a = open_analysis(launch_bound(Trace(), loader_us=600).write(tmp_path))
    g = a.signals.gpu_idle[0]
    assert g.steps[0].by_cause["data_loading"] == pytest.approx(600.0)
    inp, idle = finding(a, "input-bound"), finding(a, "gpu-idle")
    assert inp is not None and idle is not None
    assert idle.caused_by == "input-bound" and "gpu-idle" in inp.consequences
    assert "num_workers" in idle.fix


def test_host_sync_idle_and_profiler_share(tmp_path):
    tr = launch_bound(Trace())
    # a 200 us stream sync in each step: the GPU idles from its start until the next kernel
    for i in range(3):
        tr.x("cudaStreamSynchronize", "cuda_runtime", i * 1000.0 + 962, 20)
    # with_stack: Python frames recorded on the launching thread
    for i in range(3):
        for k in range(100):
            tr.x("train.py(10): step", "python_function", i * 1000.0 + 5 * k, 2)
    a = open_analysis(tr.write(tmp_path))
    g = a.signals.gpu_idle[0]
    assert g.steps[0].by_cause["host_sync"] > 0
    # the recorded frames that start while no kernel runs cost STACK_EVENT_COST_US each
    from fsdpdoctor.analysis.gpu_idle import STACK_EVENT_COST_US
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in tr.events if e["cat"] == "kernel"]
    idle_starts = sum(1 for k in range(100) if not any(a <= 5 * k < b for a, b in kernels))
    assert 0 < idle_starts < 100
    assert g.steps[0].by_cause["profiler"] == pytest.approx(idle_starts * STACK_EVENT_COST_US)
    assert g.with_stack and g.stack_events_per_step == pytest.approx(100)


def test_cpu_trace_has_no_gpu_idle(tmp_path):
    tr = Trace(backend="gloo", pg=("cpu:gloo",))
    tr.step(1, 0, 1000)
    tr.x("aten::mm", "cpu_op", 10, 500)
    a = open_analysis(tr.write(tmp_path))
    assert a.signals.gpu_idle == [] and finding(a, "gpu-idle") is None


# ----------------------------------------------------------------- setup faults, synthetic
def _training_rank(tr: Trace, with_collective=True, kernels=True):
    for i, n in enumerate((1, 2)):
        s = i * 1000.0
        tr.step(n, s, 999)
        tr.x("aten::mm", "cpu_op", s + 10, 100)
        if kernels:
            tr.launch(s + 20, s + 30, 50)
        tr.x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", s + 200, 300)
        if kernels:
            tr.launch(s + 210, s + 220, 100)
        if with_collective:
            tr.x("c10d::allreduce_", "cpu_op", s + 600, 100)
            if kernels and tr.dist["backend"] == "nccl":
                tr.corr += 1
                tr.x("cudaLaunchKernel", "cuda_runtime", s + 610, 5, correlation=tr.corr)
                tr.x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel",
                     s + 620, 100, tid=8, pid=0, correlation=tr.corr)
            else:
                tr.x("gloo:all_reduce", "cpu_op", s + 605, 90, tid=3)
    return tr


def test_gloo_on_cuda_is_a_setup_fault(tmp_path):
    for r in (0, 1):
        _training_rank(Trace(rank=r, world_size=2, backend="gloo", pg=("cpu:gloo,cuda:gloo",))).write(
            tmp_path, f"rank{r}.json")
    a = open_analysis(tmp_path)
    f = finding(a, "cpu-staged-collectives")
    assert f is not None and f.severity in ("warning", "error")
    effects = {"exposed-comm-high", "low-bus-bandwidth", "latency-bound-collectives", "low-overlap"}
    # root cause first: whatever of its effects fired is claimed by it, none stands as a peer; a
    # prefetch setting survives a change of backend and is never claimed
    assert all(g.caused_by == f.id for g in a.findings if g.id in effects)
    assert all(g.caused_by is None for g in a.findings if g.id.startswith("fsdp"))
    assert set(f.consequences) == {g.id for g in a.findings if g.caused_by == f.id}
    assert "nccl" in f.fix


def test_nccl_and_cpu_gloo_are_not_setup_faults(tmp_path):
    for r in (0, 1):
        _training_rank(Trace(rank=r, world_size=2)).write(tmp_path / "nccl", f"rank{r}.json")
        # CPU job on gloo (no kernels): gloo is the right backend there
        _training_rank(Trace(rank=r, world_size=2, backend="gloo", pg=("cpu:gloo,cuda:gloo",)),
                       kernels=False).write(tmp_path / "cpu", f"rank{r}.json")
    for sub in ("nccl", "cpu"):
        found = {f.id for f in open_analysis(tmp_path / sub).findings}
        assert not found & {"cpu-staged-collectives", "ranks-never-communicate", "mixed-backends"}, (sub, found)


@pytest.mark.parametrize("kernels", [True, False], ids=["gpu", "cpu"])
def test_ranks_that_never_communicate(tmp_path, kernels):
    for r in (0, 1):
        _training_rank(Trace(rank=r, world_size=2, backend="undefined", pg=()), with_collective=False,
                       kernels=kernels).write(tmp_path, f"rank{r}.json")
    f = finding(open_analysis(tmp_path), "ranks-never-communicate")
    assert f is not None and f.severity == "error"
    assert "init_process_group" in f.fix and "accelerate" in f.fix.lower()


def test_world_size_one_never_claims_it_never_communicates(tmp_path):
    _training_rank(Trace(world_size=1), with_collective=False).write(tmp_path)
    assert finding(open_analysis(tmp_path), "ranks-never-communicate") is None


def test_mixed_process_group_backends(tmp_path):
    _training_rank(Trace(rank=0, world_size=2, pg=("cuda:nccl",))).write(tmp_path, "rank0.json")
    _training_rank(Trace(rank=1, world_size=2, pg=("cuda:gloo",))).write(tmp_path, "rank1.json")
    f = finding(open_analysis(tmp_path), "mixed-backends")
    assert f is not None and f.severity == "error"
    assert any("ranks 0" in e.text for e in f.evidence) and any("ranks 1" in e.text for e in f.evidence)


def test_wrapper_at_world_size_one_synthetic(tmp_path):
    tr = _training_rank(Trace(world_size=1))
    tr.x("DistributedDataParallel.forward", "user_annotation", 5, 150)
    a = open_analysis(tr.write(tmp_path / "ws1"))
    f = finding(a, "wrapper-world-size-1")
    assert f is not None and f.severity == "info"
    # no prefetch verdict at world size 1: neither as a peer nor claimed
    assert not {g.id for g in a.findings} & PREFETCH and not set(f.consequences) & PREFETCH
    assert a.prefetch is None or "world size 1" in a.prefetch.backward_mode
    tr2 = _training_rank(Trace(world_size=2))
    tr2.x("DistributedDataParallel.forward", "user_annotation", 5, 150)
    assert finding(open_analysis(tr2.write(tmp_path / "ws2")), "wrapper-world-size-1") is None


# ----------------------------------------------------------------- recompute and offload, synthetic
def test_recompute_non_reentrant_and_reentrant(tmp_path):
    tr = launch_bound(Trace())
    for i in range(3):
        s = i * 1000.0
        tr.x("torch/utils/checkpoint.py(1500): recompute_fn", "python_function", s + 300, 100, tid=2)
        tr.launch(s + 310, s + 320, 100, tid=2)   # recomputed forward: counts
        tr.launch(s + 500, s + 510, 40, tid=2)    # ordinary backward: does not
    a = open_analysis(tr.write(tmp_path / "nonreentrant"))
    r = a.signals.recompute[0]
    assert r.recompute_us == pytest.approx(100.0) and r.regions_per_step == 1
    assert r.recompute_frac == pytest.approx(100.0 / a.mean.duration_us)
    f = finding(a, "activation-recompute")
    assert f is not None and f.severity == "info"

    tr = launch_bound(Trace())
    for i in range(3):
        s = i * 1000.0
        tr.x("CheckpointFunctionBackward", "cpu_op", s + 300, 400, tid=2)
        tr.launch(s + 310, s + 320, 50, tid=2)    # the recomputed forward
        tr.x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", s + 450, 200, tid=2)
        tr.launch(s + 460, s + 470, 80, tid=2)    # backward of the recomputed graph: not recompute
    r = open_analysis(tr.write(tmp_path / "reentrant")).signals.recompute[0]
    assert r.recompute_us == pytest.approx(50.0)


def test_offload_copies_exposed(tmp_path):
    tr = launch_bound(Trace())
    for i in range(3):
        s = i * 1000.0
        tr.launch(s + 100, s + 400, 150, name="Memcpy HtoD (Pinned -> Device)", cat="gpu_memcpy")
        tr.launch(s + 100, s + 600, 50, name="Memcpy DtoH (Device -> Pinned)", cat="gpu_memcpy")
    a = open_analysis(tr.write(tmp_path))
    o = a.signals.offload[0]
    assert o.h2d_us == pytest.approx(150.0) and o.d2h_us == pytest.approx(50.0)
    # the launch-bound kernels run 10 us of every 80: brute-force the part of the copies under none
    kernels = [(ev["ts"], ev["ts"] + ev["dur"]) for ev in tr.events if ev["cat"] == "kernel" and ev["ts"] < 1000]
    copies = [(400.0, 550.0), (600.0, 650.0)]
    covered = sum(brute_union([(max(a0, k0), min(a1, k1)) for k0, k1 in kernels if min(a1, k1) > max(a0, k0)])
                  for a0, a1 in copies)
    assert o.exposed_us == pytest.approx(200.0 - covered)
    f = finding(a, "offload-exposed")
    assert f is not None and "pin" in f.fix


# ----------------------------------------------------------------- the bundled CUDA recordings
EXPECTED = expectations()
CUDA_SCENARIOS = sorted(p.name for p in EXPECTED if p.parent == CUDA)


def test_cuda_set_is_bundled():
    assert {"ddp_default", "fsdp2_default", "fsdp2_no_backward_prefetch", "dataloader_slow",
            "host_sync"} <= set(CUDA_SCENARIOS)


@pytest.mark.parametrize("scenario", CUDA_SCENARIOS)
def test_cuda_expected_findings(scenario):
    exp = EXPECTED[CUDA / scenario]
    a = open_analysis(CUDA / scenario)
    found = {f.id for f in a.findings}
    assert set(exp["must"]) <= found, f"missing {set(exp['must']) - found}"
    assert not set(exp["must_not"]) & found, f"forbidden {set(exp['must_not']) & found}"
    # world size 1: no prefetch verdict is claimed
    if a.prefetch:
        assert a.prefetch.backward_mode == a.prefetch.forward_mode == "n/a (world size 1)"
    assert not PREFETCH & found


def _raw(path: Path) -> dict:
    f = next(iter(sorted(path.glob("*.json.gz"))))
    with gzip.open(f) as fh:
        return json.load(fh)


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")


def _brute_idle_per_step(doc: dict) -> list[tuple[float, float, float]]:
    """(start, end, idle) of every step but the last, from the raw events: step i runs from its
    ProfilerStep start to the next one's; idle = window minus the union of device events."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    # host-side step annotations (the GPU-side copies share the name), old traces say "Operator"
    starts = sorted({e["ts"] for e in ev if str(e["name"]).startswith("ProfilerStep#")
                     and str(e.get("cat")).lower() in ("user_annotation", "cpu_op", "operator")})
    dev = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in ev if str(e.get("cat")).lower() in DEVICE_CATS]
    out = []
    for s, e in zip(starts, starts[1:]):
        busy = brute_union([(max(a, s), min(b, e)) for a, b in dev if min(b, e) > max(a, s)])
        out.append((s, e, e - s - busy))
    return out


@pytest.mark.parametrize("scenario", ["ddp_default", "fsdp2_default", "host_sync", "dataloader_slow"])
def test_cuda_idle_matches_brute_force(scenario):
    a = open_analysis(CUDA / scenario)
    g = a.signals.gpu_idle[0]
    brute = _brute_idle_per_step(_raw(CUDA / scenario))
    assert len(brute) == len(g.steps) - 1
    for (s, e, idle), st in zip(brute, g.steps):
        assert st.duration_us == pytest.approx(e - s)
        assert st.idle_us == pytest.approx(idle, abs=0.01)
        assert sum(st.by_cause.values()) == pytest.approx(st.idle_us)


def test_cuda_findings_name_cause_and_user_frames():
    a = open_analysis(CUDA / "fsdp2_default")
    f = finding(a, "gpu-idle")
    assert "kernel launch overhead" in f.title and "host-bound" in f.title
    assert f.source and f.source.startswith("train.py(")
    a = open_analysis(CUDA / "dataloader_slow")
    idle, inp = finding(a, "gpu-idle"), finding(a, "input-bound")
    assert idle.caused_by == "input-bound" and "gpu-idle" in inp.consequences
    assert "data loading" in idle.title
    a = open_analysis(CUDA / "host_sync")
    hs = [f for f in a.findings if f.id == "host-sync"]
    assert any(f.source and f.source.startswith("train.py(") for f in hs)
    wr = finding(a, "wrapper-world-size-1")
    assert wr.severity == "info" and "DDP" in wr.title


def test_cuda_json_has_gpu_metrics(capsys):
    assert main(["analyze", str(CUDA / "host_sync"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    g = d["signals"]["gpu_idle"][0]
    assert set(g["by_cause"]) == {"launch", "host_sync", "data_loading", "collective_wait", "host_compute", "profiler",
                                  "other"}
    assert 0 < g["idle_frac"] < 1 and g["queue_empty_frac"] is not None
    assert d["signals"]["setup"][0]["backend"] == "nccl"
    assert d["prefetch"] is None or d["prefetch"]["backward_mode"] == "n/a (world size 1)"


def test_console_shows_gpu_idle_line(capsys):
    assert main(["analyze", str(CUDA / "ddp_default")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the panel wraps where it likes
    assert "GPU idle" in out and "after launch" in out


# ----------------------------------------------------------------- public GPU traces
def _public(name):
    return PUBLIC / name


@needs_public
def test_public_idle_matches_brute_force():
    for name in ("ddp_a100_rank0", "resnet50_loader_num_workers_4"):
        g = open_analysis(_public(name)).signals.gpu_idle[0]
        brute = _brute_idle_per_step(_raw(_public(name)))
        assert brute
        for (_, _, idle), st in zip(brute, g.steps):
            assert st.idle_us == pytest.approx(idle, abs=0.01), name


@needs_public
def test_public_healthy_traces_raise_nothing_from_these_rules():
    # resnet50 with 4 workers: GPU idle ~13% of the step, but only ~11% of kernels start within
    # 50 us of their launch (median wait ~10 ms): the GPU has work queued, the host is not the limit.
    # recsys: GPU idle ~54%, yet the median kernel waits ~11 ms in the queue: the idle is the GPU
    # waiting on stream dependencies / events filtered out of this sampled trace, not the host.
    # cpu_gloo_only: a 30-event fragment with no backward and no device.
    # v100 and mi300: the GPU is idle under 4% of the step; mi300's recompute is ~5% (info).
    for name in ("resnet50_loader_num_workers_4", "recsys_2_of_128_ranks", "cpu_gloo_only",
                 "v100_trace_diff_test", "mi300_rccl_ddp_act_checkpoint"):
        a = open_analysis(_public(name))
        bad = [(f.id, f.severity) for f in a.findings if f.id in MY_RULES and f.severity != "info"]
        assert not bad, (name, bad)


@needs_public
def test_public_a100_ddp_is_host_bound():
    """ddp_a100_rank0 (README: 'healthy' real DDP) is flagged, and rightly so: its GPU is idle ~76% of
    every step and ~85% of its kernels start within 50 us of their launch call - the host launches
    batch-norm and small convolutions one by one and the GPU waits for it. Checked from the raw JSON."""
    doc = _raw(_public("ddp_a100_rank0"))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    steps = sorted(e["ts"] for e in ev if str(e["name"]).startswith("ProfilerStep#")
                   and e.get("cat") == "user_annotation")
    delays = [e["ts"] - (launch[c]["ts"] + launch[c]["dur"]) for e in ev
              if str(e.get("cat")).lower() in DEVICE_CATS
              and (c := e.get("args", {}).get("correlation")) in launch and launch[c]["ts"] >= steps[0]]
    empty = sum(d <= 50 for d in delays) / len(delays)
    brute = _brute_idle_per_step(doc)
    idle_frac = sum(i for _, _, i in brute) / sum(e - s for s, e, _ in brute)
    assert empty > 0.5 and idle_frac > 0.5
    a = open_analysis(_public("ddp_a100_rank0"))
    f = finding(a, "gpu-idle")
    assert f is not None and "host-bound" in f.title
    assert a.signals.gpu_idle[0].queue_empty_frac == pytest.approx(empty, abs=0.02)


@needs_public
def test_public_loader_bound_idle_is_input_bound():
    a = open_analysis(_public("resnet50_loader_num_workers_0"))
    idle, inp = finding(a, "gpu-idle"), finding(a, "input-bound")
    assert inp is not None and idle is not None and idle.caused_by == "input-bound"


@needs_public
def test_public_mi300_recompute_share_matches_raw_events():
    """Recompute time = device work launched inside torch.utils.checkpoint's recompute_fn frames,
    computed here from the raw events (frame -> runtime calls on its thread -> correlated kernels)."""
    doc = _raw(_public("mi300_rccl_ddp_act_checkpoint"))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    frames = [e for e in ev if e.get("cat") == "python_function" and e["name"].startswith("torch/utils/checkpoint.py")
              and e["name"].endswith(": recompute_fn")]
    assert frames
    runtime = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    corrs = {r["args"]["correlation"] for r in runtime for f in frames
             if (r["pid"], r["tid"]) == (f["pid"], f["tid"]) and f["ts"] <= r["ts"] <= f["ts"] + f["dur"]}
    dev = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e.get("args", {}).get("correlation") in corrs]
    total = brute_union(dev)
    a = open_analysis(_public("mi300_rccl_ddp_act_checkpoint"))
    r = a.signals.recompute[0]
    n = len(a.job.steps)
    assert r.recompute_us * n == pytest.approx(total, rel=1e-6)
    assert r.recompute_frac == pytest.approx(total / n / a.mean.duration_us, rel=1e-6)
    assert r.regions_per_step == pytest.approx(len(frames) / n)
    f = finding(a, "activation-recompute")
    assert f is not None and f.severity == "info"


def test_wrapped_but_silent_ranks_are_a_warning(tmp_path):
    """DDP is in the trace but no collective ran: maybe no_sync() micro-steps only, so less sure."""
    for r in (0, 1):
        tr = _training_rank(Trace(rank=r, world_size=2), with_collective=False)
        tr.x("DistributedDataParallel.forward", "user_annotation", 5, 150)
        tr.write(tmp_path, f"rank{r}.json")
    f = finding(open_analysis(tmp_path), "ranks-never-communicate")
    assert f is not None and f.severity == "warning" and "no_sync" in f.summary


def test_gpu_idle_in_gloo_collectives_is_caused_by_the_setup(tmp_path):
    """The host blocks 600 us per step in gloo all-reduces of CUDA tensors: the GPU idle is the setup's."""
    for r in (0, 1):
        tr = Trace(rank=r, world_size=2, backend="gloo", pg=("cpu:gloo,cuda:gloo",))
        for i, n in enumerate((1, 2, 3)):
            s = i * 1000.0
            tr.step(n, s, 999)
            tr.x("aten::mm", "cpu_op", s + 10, 100)
            tr.launch(s + 20, s + 27, 200)
            tr.x("c10d::allreduce_", "cpu_op", s + 300, 600)
            tr.x("gloo:all_reduce", "cpu_op", s + 310, 580, tid=3)
        tr.write(tmp_path, f"rank{r}.json")
    a = open_analysis(tmp_path)
    g = a.signals.gpu_idle[0]
    assert max(g.by_cause, key=g.by_cause.get) == "collective_wait"
    setup, idle = finding(a, "cpu-staged-collectives"), finding(a, "gpu-idle")
    assert setup is not None and idle is not None
    assert idle.caused_by == "cpu-staged-collectives" and "gpu-idle" in setup.consequences
    assert setup.impact_us >= 0.5 * a.mean.duration_us


def test_scorecard_covers_the_cuda_set(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "reference_jobs"))
    import scorecard

    names = {p.name for p in scorecard.scenario_folders(BUNDLED) if p.parent.name == "cuda"}
    assert names == set(CUDA_SCENARIOS)
    (tmp_path / "cuda").symlink_to(CUDA)
    stats, failures = scorecard.scorecard(tmp_path)
    assert not failures
    assert stats["gpu-idle"]["tp"] == len(CUDA_SCENARIOS) and stats["gpu-idle"]["fn"] == 0
    assert stats["fsdp2-backward-prefetch-ineffective"]["fp"] == 0


@needs_public
def test_public_host_to_device_copies_match_raw_events():
    """resnet50 (num_workers=0) copies each batch HtoD: the per-step union matches the raw events, and
    the exposed part (~1% of the step) stays below the offload finding's bar."""
    doc = _raw(_public("resnet50_loader_num_workers_0"))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    h2d = [(e["ts"], e["ts"] + e["dur"]) for e in ev
           if str(e.get("cat")).lower() in ("gpu_memcpy", "memcpy") and "HtoD" in e["name"]]
    a = open_analysis(_public("resnet50_loader_num_workers_0"))
    o = a.signals.offload[0]
    # the analysis' step windows; the union inside each is computed here
    windows = [(b.start_us, b.start_us + b.duration_us) for b in a.ranks[0].steps]
    per_step = [brute_union([(max(x, s), min(y, e)) for x, y in h2d if min(y, e) > max(x, s)]) for s, e in windows]
    assert per_step and all(p > 0 for p in per_step)
    assert o.h2d_us == pytest.approx(sum(per_step) / len(per_step))
    assert o.exposed_us <= o.h2d_us + o.d2h_us
    assert finding(a, "offload-exposed") is None


def test_side_gloo_group_and_subgroups_are_not_faults(tmp_path):
    """An NCCL job that keeps a gloo group for CPU objects, and ranks that belong to different
    subgroups (meshes): neither is a setup fault."""
    _training_rank(Trace(rank=0, world_size=2, pg=("cuda:nccl", "cpu:gloo,cuda:gloo", "cuda:nccl"))).write(
        tmp_path, "rank0.json")
    _training_rank(Trace(rank=1, world_size=2, pg=("cuda:nccl", "cpu:gloo,cuda:gloo"))).write(tmp_path, "rank1.json")
    a = open_analysis(tmp_path)
    assert a.signals.setup[0].default_pg_backend == "cuda:nccl"
    assert not {f.id for f in a.findings} & {"cpu-staged-collectives", "mixed-backends"}


def test_only_broadcasts_do_not_synchronise_gradients(tmp_path):
    for r in (0, 1):
        tr = _training_rank(Trace(rank=r, world_size=2), with_collective=False)
        tr.x("c10d::broadcast_", "cpu_op", 700, 50)
        tr.corr += 1
        tr.x("cudaLaunchKernel", "cuda_runtime", 705, 5, correlation=tr.corr)
        tr.x("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", 710, 30,
             tid=8, pid=0, correlation=tr.corr)
        tr.write(tmp_path, f"rank{r}.json")
    a = open_analysis(tmp_path)
    assert sum(s.collectives for s in a.signals.setup) == 2
    f = finding(a, "ranks-never-communicate")
    assert f is not None and f.severity == "error" and "only broadcast" in f.summary


def test_pipeline_parallel_p2p_is_not_called_silent(tmp_path):
    """Only send/recv between the ranks: pipeline parallelism, one replica, nothing to reduce."""
    for r in (0, 1):
        tr = _training_rank(Trace(rank=r, world_size=2), with_collective=False)
        tr.x("c10d::send", "cpu_op", 700, 50)
        tr.corr += 1
        tr.x("cudaLaunchKernel", "cuda_runtime", 705, 5, correlation=tr.corr)
        tr.x("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "kernel", 710, 30,
             tid=8, pid=0, correlation=tr.corr)
        tr.write(tmp_path, f"rank{r}.json")
    a = open_analysis(tmp_path)
    assert a.signals.setup[0].collective_kinds == ["p2p"]
    assert finding(a, "ranks-never-communicate") is None


def test_host_sync_bubble_is_device_idle_counted_once(tmp_path):
    """Three .item() syncs before the next launch share one bubble; a sync that returns while another
    stream still runs leaves no bubble there. Per step: kernel [0, 400) on stream 7; the first sync waits
    for it ([2, 400), blocked 398 us), two more return at once ([410, 420), [430, 440)); next kernel at
    900. One bubble [400, 798) (as long as the first sync blocked, not one per sync); a kernel on stream 8
    still runs [350, 450) when the first sync returns: the device is idle 348 of those 398 us."""
    tr = Trace()
    for i, n in enumerate((1, 2, 3)):
        s = i * 1000.0
        tr.step(n, s, 999)
        tr.launch(s + 1, s, 400)
        for start, dur in ((2, 398), (410, 10), (430, 10)):
            tr.x("aten::_local_scalar_dense", "cpu_op", s + start, dur)
        tr.launch(s + 890, s + 900, 50)
        tr.x("void other_stream_kernel()", "kernel", s + 350, 100, tid=8, pid=0)
    a = open_analysis(tr.write(tmp_path))
    h = a.signals.host_syncs[0]
    assert h.count == 9 and h.bubble_us == pytest.approx(3 * 348.0)


def test_a_sync_that_returns_at_once_costs_no_more_than_it_blocked(tmp_path):
    """A sync called when the device queue is already empty blocks only a moment (the DLRM traces of
    facebookresearch/param and our own host_sync job: 10-20 us), and the device then idles while the host
    goes on (an optimizer's launches, Python). That idle is the host's pace, not the sync's: removing the
    sync would launch the next kernel no earlier than the time it blocked. Per step: kernel [0, 100), a
    20 us .item() at [130, 150), the host busy in one op [150, 900) that launches the next kernel at 900."""
    tr = Trace()
    for i, n in enumerate((1, 2, 3)):
        s = i * 1000.0
        tr.step(n, s, 999)
        tr.launch(s + 1, s, 100)
        tr.x("aten::_local_scalar_dense", "cpu_op", s + 130, 20)
        tr.x("aten::_foreach_add_", "cpu_op", s + 150, 745)
        tr.launch(s + 890, s + 900, 50)
    a = open_analysis(tr.write(tmp_path))
    h = a.signals.host_syncs[0]
    assert h.count == 3 and h.bubble_us == pytest.approx(3 * 20.0)
    g = a.signals.gpu_idle[0]
    # the idle after the sync is the host's own work (here one op that launches nothing until it ends:
    # host compute), at most the sync's own 20 us (and its 20 us of blocking) are the sync's
    for st in g.steps[:2]:
        assert st.by_cause["host_sync"] <= 40.0 + 1e-6
        assert st.by_cause["launch"] + st.by_cause["host_compute"] > 700.0
