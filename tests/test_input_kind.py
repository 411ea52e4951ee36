"""Every input is classified once at the front door (trace/kind.py), read right where it can be, and
what cannot be read is said in the report header and in ``--json`` (``job.input_kind``).

Recorded here: a CPU run without ProfilerStep (tests/data/no_step_cpu) and a legacy autograd-profiler
list export (tests/data/legacy_autograd), both with torch 2.13 (their record.py). Built to the formats'
documented shapes: a copies-only device timeline, launches without a device timeline, an MTIA
recording, another tool's Chrome file, an empty recording and clocks that run backwards.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
from pathlib import Path

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.diagnose.comm_rules import LOW_BUSBW_FIX
from fsdpdoctor.diagnose.gpu_rules import CAUSE_FIX
from fsdpdoctor.diagnose.rules import CUDA_ONLY, name_device
from fsdpdoctor.errors import InputError
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.results import Finding
from fsdpdoctor.trace.loader import load_file

DATA = Path(__file__).resolve().parent / "data"
TRACES = Path(__file__).resolve().parents[1] / "traces"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--no-progress"])
    return rc, out.getvalue(), err.getvalue()


def _x(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _write(path: Path, events: list, **doc) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **doc}))
    return path


def _host_steps(n=3, step=1000.0):
    """``n`` ProfilerStep# spans on the host, each with a few ops."""
    ev = []
    for s in range(n):
        t0 = s * step
        ev.append(_x(f"ProfilerStep#{s}", t0, step - 10, cat="user_annotation"))
        for k in range(8):
            ev.append(_x("aten::mm", t0 + 10 + k * 100, 60))
    return ev


def test_a_cpu_run_without_profiler_step_is_a_host_only_kineto_recording():
    t = load_file(DATA / "no_step_cpu" / "rank0.json.gz")
    assert (t.kind.producer, t.kind.device, t.kind.steps) == ("kineto", "none", "none")
    assert not t.kind.unknown
    a = open_analysis(DATA / "no_step_cpu" / "rank0.json.gz")
    assert a.job.input_kind.steps == "none" and a.mean is not None  # host figures are what it holds


def test_the_legacy_list_export_is_read_with_its_steps_ops_and_collectives():
    path = DATA / "legacy_autograd" / "rank0.json.gz"
    t = load_file(path)
    assert (t.kind.producer, t.kind.steps) == ("legacy-autograd", "profiler-step")
    a = open_analysis(path)
    assert a.job.steps == [0, 1, 2]  # its three ProfilerStep# markers
    # ops are host work; the step marker (a record_function range, Kineto's user annotation) is not: compute
    # is at most the union of the non-annotation events on the marker's thread (it was the whole step)
    assert 0 < a.mean.compute_us <= _legacy_op_union(path)
    # the naive per-parameter all-reduce: one c10d::allreduce_ per parameter (4) per step
    assert sum(s.per_step for s in a.collectives if s.kind == "all_reduce") == pytest.approx(4)



def _legacy_op_union(path: Path) -> float:
    """Per step, the time covered by events other than torch's annotations on the step marker's thread."""
    events = json.loads(gzip.open(path).read())
    annotation = re.compile(r"^(ProfilerStep#|Optimizer\.|gloo:|nccl:)")
    total, steps = 0.0, [e for e in events if e["name"].startswith("ProfilerStep#")]
    for st in steps:
        t0, t1, end = st["ts"], st["ts"] + st["dur"], st["ts"]
        for a, b in sorted((max(e["ts"], t0), min(e["ts"] + e["dur"], t1)) for e in events
                           if e["tid"] == st["tid"] and not annotation.match(e["name"]) and e["ts"] < t1):
            if b > max(a, end):
                total, end = total + b - max(a, end), b
    return total / len(steps)


def test_a_two_rank_legacy_export_finds_its_straggler():
    """A 2-rank gloo job exported in the legacy list format (tests/data/legacy_autograd_2rank, recorded with
    torch 2.13 by its record.py): rank 1 sleeps 20 ms per step before its 4 per-parameter all-reduces. Each
    export's clock starts at its own profiler start; the ranks are aligned on the 32 matched all-reduces,
    and rank 1 is named the straggler at about the sleep it adds, idle outside ops, not compute."""
    path = DATA / "legacy_autograd_2rank"
    a = open_analysis(path)
    assert [r.input_kind.producer for r in a.ranks] == ["legacy-autograd"] * 2
    assert a.job.steps == list(range(8))
    assert sum(s.per_step for s in a.collectives if s.kind == "all_reduce") == pytest.approx(4)
    assert next(c for c in a.clock.ranks if c.rank == 1).n_matched == 32
    s = next(f for f in a.findings if f.id == "straggler")
    assert s.ranks == [1] and 15e3 < s.impact_us < 25e3 and "idle outside ops" in s.fix
    assert a.mean.compute_us < 0.1 * a.mean.duration_us  # a small MLP: the step is waiting and sleeping

def test_legacy_nccl_annotations_are_collectives_and_the_missing_device_is_said(tmp_path):
    events = json.loads(gzip.open(DATA / "legacy_autograd" / "rank0.json.gz").read())
    # the shape a torch build without Kineto writes for NCCL: nccl:all_reduce, no c10d op around it
    events = [dict(e, name="nccl:all_reduce") if e["name"] == "gloo:all_reduce" else e
              for e in events if e["name"] != "c10d::allreduce_"]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(events))
    a = open_analysis(path)
    assert a.job.input_kind.device == "missing"
    assert sum(s.per_step for s in a.collectives if s.kind == "all_reduce") == pytest.approx(4)
    assert a.mean is None  # the device figures are not in the file: withheld, not 100 % idle
    rc, out, _ = _cli("analyze", str(path))
    assert rc in (0, 1) and "device timeline missing" in out.split("Findings")[0]


def test_copies_only_is_a_device_timeline(tmp_path):
    ev = _host_steps()
    for s in range(3):
        for k in range(4):
            t0 = s * 1000.0 + 20 + k * 200
            ev.append(_x("cudaMemcpyAsync", t0, 10, cat="cuda_runtime", correlation=100 + s * 10 + k))
            ev.append(_x("Memcpy DtoH (Device -> Pinned)", t0 + 5, 80, cat="gpu_memcpy", pid=0, tid=7,
                         correlation=100 + s * 10 + k))
    path = _write(tmp_path / "rank0.json", ev)
    t = load_file(path)
    assert t.kind.device == "copies-only" and not t.kind.unknown
    a = open_analysis(path)
    assert a.job.dialect == "gpu" and a.job.traits.device_timeline  # read by the device dialect


def test_launches_without_kernel_events_name_the_missing_timeline(tmp_path):
    ev = _host_steps()
    ev += [_x("cudaLaunchKernel", s * 1000.0 + 30 + k * 100, 5, cat="cuda_runtime", correlation=s * 10 + k)
           for s in range(3) for k in range(8)]
    path = _write(tmp_path / "rank0.json", ev)
    rc, out, _ = _cli("analyze", str(path), "--json")
    job = json.loads(out)["job"]
    assert job["input_kind"]["device"] == "missing"
    assert "24 kernel launch(es), no kernel events" in job["input_kind"]["unknown"][0]
    assert json.loads(out)["mean"] is None
    rc, out, _ = _cli("analyze", str(path))
    header = out.split("Findings")[0].split("No findings")[0]
    assert "ProfilerActivity.CUDA" in header and "idle" not in header


def test_gpu_only_host_ops_without_device_events_name_the_missing_timeline(tmp_path):
    # a GPU forward profiled with the CPU activity only (the public SpikingConvNN trace's shape): the
    # convolution ran through cuDNN, no runtime call or kernel was recorded
    ev = [_x("aten::conv2d", 100.0, 300), _x("aten::convolution", 105.0, 290),
          _x("aten::cudnn_convolution", 110.0, 250), _x("aten::relu", 420.0, 20), _x("aten::addmm", 450.0, 40)]
    path = _write(tmp_path / "trace.json", ev)
    rc, out, _ = _cli("analyze", str(path), "--json")
    kind = json.loads(out)["job"]["input_kind"]
    assert kind["device"] == "missing"
    assert "1 host op(s) that run only on a GPU (aten::cudnn_convolution" in kind["unknown"][0]
    assert json.loads(out)["mean"] is None  # device figures withheld, not a CPU trace's breakdown
    # the same ops on a CPU (mkldnn) are a host-only recording, and so is a CPU GRU's cuDNN check
    cpu = _write(tmp_path / "cpu.json", [dict(e, name=e["name"].replace("cudnn", "mkldnn")) for e in ev]
                 + [_x("aten::cudnn_is_acceptable", 600.0, 1)])
    assert load_file(cpu).kind.device == "none"


def _mtia(tmp_path, device_pid=17, busy=400.0, linked=False) -> Path:
    """An MTIA recording to the plug-in's shape (HTA's mtia traces): per step a 400 us pe_exe, a 100 us
    dma_request and a 300 us event_wait on the device's stream tracks, runFunction calls on the host."""
    ev = _host_steps()
    for s in range(3):
        t0 = s * 1000.0
        ev += [_x("pe_exe", t0 + 50, busy, cat="mtia_ccp_events", pid=device_pid, tid=3910, stream=112,
                  **({"correlation": s} if linked else {})),
               _x("dma_request", t0 + 500, 100, cat="mtia_ccp_events", pid=device_pid, tid=3672, stream=105),
               _x("event_wait", t0 + 600, 300, cat="mtia_ccp_events", pid=device_pid, tid=3774, stream=108),
               _x("runFunction", t0 + 40, 5, cat="mtia_runtime", correlation=s)]
    return _write(tmp_path / "rank0.json", ev, distributedInfo={"backend": "mtia:hccl", "rank": 0, "world_size": 1})


def test_an_mtia_recording_is_read_generically_and_named(tmp_path):
    """Spans on the device's own stream tracks: work is busy time, a DMA a copy, an event wait idle;
    named MTIA, never "CPU trace"."""
    a = open_analysis(_mtia(tmp_path))
    k = a.job.input_kind
    assert k.device == "mtia" and k.generic and not k.unknown
    assert "backend mtia:hccl" in " ".join(k.evidence) and "MTIA read generically" in " ".join(k.evidence)
    assert a.mean is not None and a.mean.compute_us == pytest.approx(400.0, rel=0.01)  # pe_exe, not the wait
    assert a.mean.idle_us > 300.0  # the event wait is no work
    rc, out, _ = _cli("analyze", str(_mtia(tmp_path)))
    assert rc == 0 and out.split("\n")[1].split()[1] == "MTIA"
    assert "MTIA spans (read generically)" in out


def test_accelerator_events_without_a_device_track_are_named_not_analysed(tmp_path):
    """The same categories on the host's own process are not spans on a device queue: not read, said so."""
    a = open_analysis(_mtia(tmp_path, device_pid=1))
    k = a.job.input_kind
    assert k.device == "mtia" and not k.generic
    assert "MTIA device events are not analysed (no spans on a device stream or queue" in k.unknown[0]
    assert a.mean is None
    rc, out, _ = _cli("analyze", str(_mtia(tmp_path, device_pid=1)))
    assert out.split("\n")[1].split()[1] == "MTIA"  # never "CPU trace"


def test_another_tools_chrome_file_is_refused_in_one_line(tmp_path):
    ev = [_x("cudaLaunchKernel", i * 10.0, 3, cat="cuda_api") for i in range(50)]
    path = tmp_path / "ebpf.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(InputError, match="not a torch.profiler recording: a CUDA API trace"):
        load_file(path)
    rc, out, err = _cli("analyze", str(path))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_empty_recording_is_said(tmp_path):
    ev = [_x("ProfilerStep#1", 0.0, 78e6, cat="user_annotation")]
    ev += [_x("cudaDeviceSynchronize", 1e6 * k, 3, cat="cuda_runtime") for k in range(5)]
    path = _write(tmp_path / "rank0.json", ev)
    a = open_analysis(path)
    assert a.job.input_kind.unknown[0].startswith("empty recording: 6 event(s) over 78 s")
    assert a.mean is None


def _linked(tmp_path, lags: list[float]) -> Path:
    ev = _host_steps(1, 10_000.0)
    for i, lag in enumerate(lags):
        t0 = 100.0 + i * 200
        ev.append(_x("cudaLaunchKernel", t0, 5, cat="cuda_runtime", correlation=i))
        ev.append(_x("gemm_kernel", t0 + lag, 50, cat="kernel", pid=0, tid=7, correlation=i))
    return _write(tmp_path / "rank0.json", ev)


def test_a_device_clock_behind_the_hosts_is_shifted_and_named(tmp_path):
    t = load_file(_linked(tmp_path, [-30.0, -25.0, 4.0, -28.0]))
    k = t.kind
    assert (k.links, k.backward_links, k.clock_offset_us) == (4, 3, 30.0)
    assert "shifted by that much" in t.quality.notes[-1]


def test_a_few_backward_links_are_counted_not_shifted(tmp_path):
    t = load_file(_linked(tmp_path, [5.0, 6.0, 5.0, -40.0, 7.0]))
    k = t.kind
    assert (k.links, k.backward_links, k.clock_offset_us) == (5, 1, None)
    assert "not used" in t.quality.notes[-1]


def test_bundled_runs_are_classified_by_what_they_hold():
    cpu = load_file(TRACES / "ddp_default" / "rank0.json.gz").kind
    assert (cpu.producer, cpu.device, cpu.steps) == ("kineto", "none", "profiler-step")
    gpu = load_file(next((TRACES / "cuda" / "ddp_default").glob("rank0*.json.gz"))).kind
    assert gpu.device == "cuda" and not gpu.unknown


def test_one_time_start_up_is_set_aside_not_launch_overhead(tmp_path):
    """The first aten::mm of a window holds a 900 ms cudaFree (context creation): start-up, named, and
    no part of the saving the gpu-idle finding promises."""
    ev, corr = [], 0
    for s in range(3):
        t0 = s * 1_000_000.0
        ev.append(_x(f"ProfilerStep#{s}", t0, 999_000.0, cat="user_annotation"))
        first = s == 0
        ev.append(_x("aten::mm", t0 + 10, 900_100.0 if first else 100.0))
        if first:
            ev.append(_x("cudaFree", t0 + 20, 900_000.0, cat="cuda_runtime"))
        for k in range(40):
            ts = t0 + (900_200.0 if first else 200.0) + k * 20
            ev.append(_x("cudaLaunchKernel", ts, 5, cat="cuda_runtime", correlation=corr))
            ev.append(_x("gemm_kernel", ts + 6, 10, cat="kernel", pid=0, tid=7, correlation=corr))
            corr += 1
    path = _write(tmp_path / "rank0.json", ev)
    a = open_analysis(path)
    g = a.signals.gpu_idle[0]
    assert g.startup_calls == ["cudaFree 900.0 ms"] and g.startup_idle_us == pytest.approx(300_000, rel=0.01)
    f = next(f for f in a.findings if f.id == "gpu-idle")
    assert "start-up" in f.title and "launch overhead" not in f.title
    # what a fix could save excludes the start-up: the idle less the 900 ms / 3 steps
    assert f.impact_us <= g.idle_us - g.startup_idle_us + 1.0


def test_host_syncs_are_findings_in_a_window_without_step_markers():
    a = open_analysis(DATA / "no_step_cpu" / "rank0.json.gz")
    f = next(f for f in a.findings if f.id == "host-sync")
    assert "3 call(s) per step" in f.summary and "no step markers" in f.evidence[0].text


def test_one_options_object_reaches_the_pipeline_from_every_door(tmp_path):
    from fsdpdoctor import api
    from fsdpdoctor.options import Options

    run = TRACES / "ddp_default"
    by_object = api.analyze(run, Options(ranks=[1], steps={2}))
    by_keywords = api.analyze(run, ranks=[1], steps={2})
    assert by_object.to_json() == by_keywords.to_json()
    assert by_object.job.ranks_analyzed == [1] and by_object.job.steps == [2]
    # the notebook door takes the capture window too (it had lost it): asked of a folder without windows,
    # the pipeline answers as the CLI's --window does
    with pytest.raises(InputError, match="window"):
        api.analyze(run, window=3)
    with pytest.raises(TypeError):
        Options().but(window_steps=3)


def _launched(tmp_path, runtime: str, launch: str, kernel: str) -> Path:
    """Three host steps, each launching eight 40 us kernels (category "kernel") through ``runtime``
    calls named ``launch`` that carry the kernel's correlation id."""
    ev = _host_steps()
    for s in range(3):
        for k in range(8):
            ts, c = s * 1000.0 + 15 + k * 100, s * 10 + k
            ev.append(_x(launch, ts, 3, cat=runtime, correlation=c))
            ev.append(_x(kernel, ts + 5, 40, cat="kernel", pid=0, tid=3, correlation=c))
    return _write(tmp_path / "rank0.json", ev)


def test_an_xpu_recording_is_read_as_a_device_timeline_and_named(tmp_path):
    """Intel XPU's Kineto plug-in: kernels under "kernel", their launches (urEnqueueKernelLaunch) under
    "xpu_runtime" with the correlation id the kernel carries."""
    a = open_analysis(_launched(tmp_path, "xpu_runtime", "urEnqueueKernelLaunch", "gemm_kernel"))
    k = a.job.input_kind
    assert k.device == "xpu" and not k.unknown and k.links == 24 and k.backward_links == 0
    assert a.job.traits.device_timeline and a.signals.gpu_idle[0].kernels == 24


# oneCCL's SYCL kernels as an Aurora XPU DDP run's profile names them (argonne-lcf/ALCF_Hands_on_HPC_Workshop,
# data_science/ai_ml_profiling/example_traces/*_self_xpu_time_total-0-of-2.txt, backend xccl), with the
# signature oneCCL declares (allreduce_large_sycl.hpp): on the compute queue, after the gemm kernels
_ONECCL = ("allreduce_large_read_write_ipc<float, 2, 2>(void const*, void*, unsigned long, ccl::datatype, "
           "ccl::reduction, ccl_comm*, ccl_stream*)",
           "invoke_barrier(std::shared_ptr<ccl_comm>, sycl::_V1::queue, std::vector<sycl::_V1::event>)")


def _xpu_ddp(tmp_path) -> Path:
    """Two XPU ranks: per step six gemm kernels (120 us) and an all-reduce (c10d::allreduce_ over
    ProcessGroupXCCL's xccl:all_reduce range) whose oneCCL kernels run 500 (rank 1: 600) us and 10 us."""
    for r in range(2):
        ev, c = [], 0
        for s in range(4):
            t0 = s * 2000.0
            ev.append(_x(f"ProfilerStep#{s}", t0, 1990, cat="user_annotation"))
            for k in range(6):
                c, ts = c + 1, t0 + 20 + k * 150
                ev += [_x("aten::mm", ts, 100), _x("urEnqueueKernelLaunch", ts + 10, 5, cat="xpu_runtime", correlation=c),
                       _x("gemm_kernel", ts + 20, 120, cat="kernel", pid=0, tid=64, correlation=c)]
            ts = t0 + 1000
            ev += [_x("c10d::allreduce_", ts, 300), _x("xccl:all_reduce", ts + 5, 290, cat="user_annotation")]
            for name, at, dur in ((_ONECCL[0], 20, 500 + 100 * r), (_ONECCL[1], 530 + 100 * r, 10)):
                c += 1
                ev += [_x("urEnqueueKernelLaunch", ts + 10, 5, cat="xpu_runtime", correlation=c),
                       _x(name, ts + at, dur, cat="kernel", pid=0, tid=64, correlation=c)]
        _write(tmp_path / f"rank{r}.json", ev, distributedInfo={"backend": "xccl", "rank": r, "world_size": 2})
    return tmp_path


def test_an_xpu_ddp_recordings_oneccl_kernels_are_its_communication(tmp_path):
    """oneCCL's kernels carry its namespace (ccl::, ccl_comm): communication, though they share the gemm
    kernels' queue (read by a collective's word alone they counted as compute: 64 % compute, 1 % exposed
    communication); the header names the XPU, not "GPU"."""
    a = open_analysis(_xpu_ddp(tmp_path))
    assert a.job.input_kind.device == "xpu"
    assert a.mean.compute_us == pytest.approx(720.0, rel=0.02)
    assert a.mean.exposed_comm_us == pytest.approx(560.0, rel=0.05)  # 510 / 610 us on the two ranks
    assert {c.kind for c in a.collectives} == {"all_reduce"}
    rc, out, _ = _cli("analyze", str(tmp_path))
    assert rc == 0 and out.split("\n")[1].split()[1] == "XPU"


@pytest.mark.parametrize("cat,device", [("hpu_op", "hpu"), ("privateuse1_op", "privateuse1")])
def test_an_hpu_or_privateuse1_recording_is_named_never_a_cpu_trace(tmp_path, cat, device):
    """Habana's Kineto activity type HPU_OP (category "hpu_op", Kineto's ActivityType table) or a
    PrivateUse1 backend's category: spans on the device's own process are read generically and named
    that device; the same on the host's process are named, their figures withheld. Never "CPU trace"."""
    ev = _host_steps()
    for s in range(3):
        ev += [_x("matmul_fwd_bf16", s * 1000.0 + 50 + k * 200, 120, cat=cat, pid=9, tid=1) for k in range(4)]
    a = open_analysis(_write(tmp_path / "rank0.json", ev))
    k = a.job.input_kind
    assert (k.device, k.generic) == (device, True) and not k.unknown
    assert a.mean.compute_us == pytest.approx(480.0, rel=0.01)
    for e in ev:
        if e.get("cat") == cat:
            e["pid"] = 1
    a = open_analysis(_write(tmp_path / "host.json", ev))
    assert a.job.input_kind.device == device and a.job.input_kind.unknown and a.mean is None


def _habana(tmp_path) -> Path:
    """A Gaudi recording to the shape the Habana bridge's Kineto plug-in writes (HabanaAI/gaudi-pytorch-bridge,
    backend/profiling/kineto_activity_profiler.cpp and trace_sources/trace_parser.cpp): TPC/MME work as
    "kernel", DMA copies as "gpu_memcpy" and the other engines' events (a NIC) as "hpu_op" on the process
    "/device:HPU:0" with a thread per engine; its host-side calls, also "hpu_op" (Kineto: "HPU host side
    runtime event"), on a "Bridge Logs" process and on a Synapse API thread of a process of its own."""
    meta = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": n}}
            for p, n in ((1, "python3"), (40, "Bridge Logs"), (5, "/device:HPU:0"))]
    meta += [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": n}}
             for p, t, n in ((5, 1, "TPC 0"), (5, 2, "MME 0"), (5, 3, "DMA 0"), (7, 9, "Synapse/Host"))]
    ev = _host_steps()
    for s in range(3):
        t0 = s * 1000.0
        ev += [_x("LaunchSyncTensorsGraph", t0 + 20, 900, cat="hpu_op", pid=40, tid=40),
               _x("synLaunchWithExternalEvents", t0 + 30, 800, cat="hpu_op", pid=7, tid=9),
               _x("matmul_fwd_bf16", t0 + 100, 120, cat="kernel", pid=5, tid=2, device=0),
               _x("add_fwd_f32", t0 + 300, 80, cat="kernel", pid=5, tid=1, device=0),
               _x("memcpy_host_to_device", t0 + 50, 30, cat="gpu_memcpy", pid=5, tid=3),
               _x("nic_send", t0 + 500, 100, cat="hpu_op", pid=5, tid=3)]
    return _write(tmp_path / "rank0.json", meta + ev)


def test_a_gaudi_recording_reads_only_its_device_process_as_the_hpu(tmp_path):
    """Only the spans on "/device:HPU:0" are the HPU's work (per step 200 us of kernels and a 100 us NIC
    span, a 30 us copy); the bridge's and Synapse's host-side hpu_op calls (900 and 800 us a step, on
    processes with no host op) are not device work: read as such they made the HPU 80 % busy."""
    a = open_analysis(_habana(tmp_path))
    k = a.job.input_kind
    assert (k.device, k.generic) == ("hpu", True) and not k.unknown
    assert "6 span(s) off the device's own process (7, Bridge Logs): host-side calls" in " ".join(k.evidence)
    assert a.mean.compute_us == pytest.approx(300.0, rel=0.01)
    assert a.mean.idle_us > 600.0
    rc, out, _ = _cli("analyze", str(_habana(tmp_path)))
    assert rc == 0 and out.split("\n")[1].split()[1] == "HPU" and "HPU spans (read generically)" in out


def test_kernels_launched_through_another_accelerators_runtime_are_not_cuda(tmp_path):
    """Kernels in "kernel" whose launches are a PrivateUse1 backend's runtime calls (Kineto's
    privateuse1_runtime): that backend's timeline, read like any kernel timeline, never "CUDA kernels"."""
    path = _launched(tmp_path, "privateuse1_runtime", "launchKernel", "my_kernel")
    a = open_analysis(path)
    k = a.job.input_kind
    assert (k.device, k.generic) == ("privateuse1", True) and not k.unknown and k.links == 24
    assert a.mean.compute_us == pytest.approx(320.0, rel=0.01)
    rc, out, _ = _cli("analyze", str(path))
    assert "CUDA" not in out and "PRIVATEUSE1 spans (read generically)" in out


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def test_a_shifted_device_clock_on_a_real_h100_trace_is_estimated_and_applied(tmp_path):
    """A produced trace (the bundled H100 DDP run), its device clock set 500 us behind the host's on a
    copy: every launch link runs backwards, the offset is estimated from the links (500 us less the
    shortest real launch-to-start lag) and applied, named in data quality, and the figures are those
    of the unshifted recording."""
    src = next((TRACES / "cuda" / "ddp_default").glob("rank0*.json.gz"))
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") in DEVICE_CATS and e.get("ph") == "X":
            e["ts"] = e["ts"] - 500.0
    shifted = tmp_path / "rank0.json.gz"
    shifted.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    base, moved = load_file(src), load_file(shifted)
    assert base.kind.backward_links == 0 and base.kind.clock_offset_us is None
    k = moved.kind
    assert k.links == base.kind.links > 100
    assert k.backward_links == k.links  # 500 us is more than any launch-to-start lag of this run
    runtime = {c: ts for c, ts, cat in zip(base.corr, base.ts, base.cat) if cat == 6 and c >= 0}
    lags = [ts - runtime[c] for c, ts, cat in zip(base.corr, base.ts, base.cat) if cat in (3, 4, 5) and c in runtime]
    assert k.clock_offset_us == pytest.approx(500.0 - min(lags), abs=1e-3)
    assert any("shifted by that much" in n for n in moved.quality.notes)
    a, b = open_analysis(src), open_analysis(shifted)
    for part in ("duration_us", "compute_us", "exposed_comm_us", "idle_us"):
        assert getattr(b.mean, part) == pytest.approx(getattr(a.mean, part), rel=0.02, abs=50.0), part
    assert b.job.input_kind.clock_offset_us == pytest.approx(k.clock_offset_us)


def test_an_ascend_trace_view_is_named_npu_not_a_cpu_trace():
    """MindStudio Insight's torch_npu trace_view.json fixture: an event on the "Ascend Hardware" process
    (categories as written, no device category): the NPU is named and its figures withheld."""
    path = DATA / "npu_trace_view" / "trace_view.json.gz"
    k = load_file(path).kind
    assert k.device == "npu" and not k.generic and not k.device_known
    assert "NPU device events are not analysed (1 event(s) on 'Ascend Hardware'" in k.unknown[0]
    rc, out, _ = _cli("analyze", str(path), "--json")
    assert rc == 0 and json.loads(out)["job"]["input_kind"]["device"] == "npu"
    rc, out, _ = _cli("analyze", str(path))
    assert out.split("\n")[1].split()[1] == "NPU" and "CPU trace" not in out


def _npu_process(pid: int, name: str, threads: dict[int, str]) -> list[dict]:
    """torch_npu's trace_view.json metadata: a process labelled NPU and its named threads."""
    return ([{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
             {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "NPU"}}]
            + [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": n}}
               for tid, n in threads.items()])


def _npu_matmuls(t0: float, n: int) -> list[dict]:
    """``n`` AI-core matmul tasks on "Ascend Hardware" "Stream 3" (pid 800), 60 us each, 100 us apart."""
    return [{"ph": "X", "name": "aclnnMatmul_MatMulV2_MatMulV2", "pid": 800, "tid": 3, "ts": t0 + 50 + k * 100,
             "dur": 60, "args": {"Task Type": "AI_CORE"}} for k in range(n)]


def test_uncategorised_tasks_on_ascend_hardware_are_read_generically_as_the_npu(tmp_path):
    """torch_npu's trace_view.json (the shape of Ascend mstt's advisor fixture): the device's tasks are
    complete events without a category on the "Ascend Hardware" process's "Stream N" thread. Read by
    shape as the NPU's spans (work, copies by name), not withheld and not called a CPU trace; the
    "Overlap Analysis" summary beside them (also labelled NPU) is not read as device work."""
    ev = _host_steps() + _npu_process(800, "Ascend Hardware", {3: "Stream 3"})
    for s in range(3):
        t0 = s * 1000.0
        ev += _npu_matmuls(t0, 8)
        ev.append({"ph": "X", "name": "MEMCPY_ASYNC", "pid": 800, "tid": 3, "ts": t0 + 880, "dur": 40, "args": {}})
        # torch_npu's derived "Overlap Analysis" process, labelled NPU too: its Free spans are no device work
        ev += [{"ph": "X", "name": n, "pid": 900, "tid": tid, "ts": t0 + 40, "dur": 900, "args": {}}
               for n, tid in (("Computing", 1), ("Free", 2))]
    ev += [{"ph": "M", "name": "process_name", "pid": 900, "tid": 0, "args": {"name": "Overlap Analysis"}},
           {"ph": "M", "name": "process_labels", "pid": 900, "tid": 0, "args": {"labels": "NPU"}}]
    path = _write(tmp_path / "trace_view.json", ev)
    k = load_file(path).kind
    assert (k.device, k.generic) == ("npu", True) and not k.unknown
    assert "24 device spans as work, 3 as copies" in " ".join(k.evidence)
    rc, out, _ = _cli("analyze", str(path), "--json")
    doc = json.loads(out)
    assert doc["mean"] is not None and doc["mean"]["compute_us"] > 0  # read, not withheld
    rc, out, _ = _cli("analyze", str(path))
    assert out.split("\n")[1].split()[1] == "NPU" and "CPU trace" not in out


def test_hccl_collectives_on_their_group_track_are_the_npus_communication(tmp_path):
    """torch_npu writes HCCL's collectives on a process "HCCL" (label NPU), thread "Group N Communication",
    one hcom_<collective>_ span each (their sub-tasks on "Plane N" threads): read as the NPU's
    communication, exposed where no device work runs beside it. Was: left unread, the collective's
    time counted as idle (a real 2-rank trace: 102 ms of all-reduce per step read as 0.3 ms)."""
    ev = (_host_steps() + _npu_process(800, "Ascend Hardware", {3: "Stream 3"})
          + _npu_process(810, "HCCL", {0: "Group 0 Communication", 1: "Plane 0"}))
    for s in range(3):
        t0 = s * 1000.0
        ev += _npu_matmuls(t0, 5)
        ev.append({"ph": "X", "name": f"hcom_allReduce__586_{s}_1", "pid": 810, "tid": 0, "ts": t0 + 560,
                   "dur": 400, "args": {}})
        ev += [{"ph": "X", "name": n, "pid": 810, "tid": 1, "ts": t0 + 560 + k * 200, "dur": 150, "args": {}}
               for k, n in enumerate(("Notify Wait", "Memcpy"))]
    path = _write(tmp_path / "trace_view.json", ev)
    k = load_file(path).kind
    assert (k.device, k.generic) == ("npu", True) and not k.unknown
    a = open_analysis(path)
    assert a.mean.comm_us == pytest.approx(400.0)  # the collective once, not its plane's sub-tasks too
    assert a.mean.exposed_comm_us == pytest.approx(400.0)
    assert a.mean.comm_by_kind["all_reduce"].count == 1


def test_kernels_on_an_npu_stream_are_the_npus_not_cuda(tmp_path):
    """torch_npu's Kineto-shaped export: a process named "NPU" (label "Ascend NPU") and its "NPU stream N"
    threads hold the device's kernels: named NPU and read as a device timeline, not called CUDA."""
    ev = _host_steps()
    ev += [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "NPU"}},
           {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "Ascend NPU"}},
           {"ph": "M", "name": "thread_name", "pid": 47, "tid": 47, "args": {"name": "NPU stream 47"}}]
    ev += [_x("MatMul", s * 1000.0 + 20 + k * 100, 40, cat="kernel", pid=47, tid=47) for s in range(3) for k in range(8)]
    k = load_file(_write(tmp_path / "rank0.json", ev)).kind
    assert (k.device, k.generic) == ("npu", True) and "on 'NPU stream 47'" in " ".join(k.evidence)


def test_findings_on_another_accelerator_name_it_not_the_gpu(tmp_path):
    """The rules' texts say "GPU"; on an MTIA input the findings and the header's idle line say MTIA."""
    a = open_analysis(_mtia(tmp_path, busy=50.0, linked=True))  # the device idles most of the step
    texts = [x for f in a.findings for x in (f.title, f.summary, f.fix, *(e.text for e in f.evidence))]
    assert a.findings and not any("GPU" in x for x in texts)
    assert any("MTIA idle" in x for x in texts)
    rc, out, _ = _cli("analyze", str(_mtia(tmp_path, busy=50.0, linked=True)))
    assert "GPU" not in out and "MTIA idle" in out



CUDA_WORDS = re.compile(r"CUDA|NCCL|nccl|torch\.cuda")


def test_fixes_on_another_accelerator_suggest_only_what_applies_to_it(tmp_path):
    """On MTIA input the launch-bound idle's fix names no CUDA graphs; every CUDA-only piece of advice the
    rules give (gpu-idle's fixes by cause, low-bus-bandwidth's NCCL settings) is replaced or dropped, and
    the CUDA input keeps it word for word."""
    a = open_analysis(_mtia(tmp_path, busy=50.0, linked=True))
    idle = next(f for f in a.findings if f.id == "gpu-idle")
    assert "launch overhead" in idle.title and "torch.compile(model)" in idle.fix
    assert not CUDA_WORDS.search(idle.fix + idle.summary + idle.title)
    texts = [*CAUSE_FIX.values(), LOW_BUSBW_FIX]
    assert all(any(p.search(t) for t in texts) for p, _ in CUDA_ONLY)  # no rewrite outlives its text
    fs = [Finding("x", "t", "info", 1.0, 0.0, 0.0, "s", t) for t in texts]
    name_device(fs, a)
    assert not [f.fix for f in fs if CUDA_WORDS.search(f.fix)]
    assert "torch.mtia.synchronize()" in fs[1].fix and "(mtia:hccl, no Work.wait()" in fs[3].fix
    cuda = open_analysis(next((TRACES / "cuda" / "ddp_default").glob("rank0*.json.gz")))
    fs = [Finding("x", "t", "info", 1.0, 0.0, 0.0, "s", t) for t in texts]
    name_device(fs, cuda)
    assert [f.fix for f in fs] == texts

def test_a_file_without_categories_or_torch_ops_is_another_tools_and_refused(tmp_path):
    """An eBPF CUDA-API monitor's Chrome file (floritange/ebpf_cuda_monitoring's shape): driver API calls
    with no category and no torch op, off the legacy export's pids: refused in one line, not analysed."""
    ev = [{"ph": "X", "name": n, "ts": 10.0 * i, "dur": 3.0, "pid": 3878000, "tid": 3878000, "args": {}}
          for i, n in enumerate(["cuMemAlloc_v2", "cuLaunchKernel", "cuStreamSynchronize"] * 12)]
    path = tmp_path / "chrome_trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    rc, out, err = _cli("analyze", str(path))
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert "not a torch.profiler recording: a CUDA API trace (36 events without categories, no torch op)" in err


CUDA_DDP = TRACES / "cuda" / "ddp_default"


def _without_device_events(dst: Path, keep_runtime: bool) -> Path:
    """A copy of the H100 DDP recording with its device events (kernels, copies, their links) removed, and
    its runtime/driver calls too unless ``keep_runtime``: the document still declares the GPU."""
    import shutil

    drop = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g"}
    if not keep_runtime:
        drop |= {"cuda_runtime", "cuda_driver"}
    dst.mkdir()
    shutil.copy(CUDA_DDP / "manifest.json", dst)
    d = json.loads(gzip.open(CUDA_DDP / "rank0.json.gz").read())
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") not in drop]
    with gzip.open(dst / "rank0.json.gz", "wt", compresslevel=1) as fh:
        fh.write(json.dumps(d))
    return dst


@pytest.mark.skipif(not CUDA_DDP.is_dir(), reason="needs traces/cuda")
def test_gpu_declared_without_device_events(tmp_path):
    """A CUDA job (NCCL, an H100 in deviceProperties) whose trace holds no device event and no runtime call is a
    GPU trace without device events, not a host-only CPU trace: what could not be measured is said and the
    breakdown withheld. With the launches kept it stays the missing timeline; a CPU job's trace declaring the
    host's GPUs (gloo) stays host-only, with the declaration in the evidence."""
    a = open_analysis(_without_device_events(tmp_path / "empty", keep_runtime=False), use_summaries=False)
    kind = a.job.input_kind
    assert kind.device == "empty" and not kind.device_known and kind.device_word == "GPU"
    assert kind.unknown[0].startswith("GPU trace without device events: 1 GPU(s) declared (NVIDIA H100")
    assert "could not be measured" in kind.unknown[0]
    assert a.mean is None and any(n.startswith("step breakdown withheld: GPU trace without device events")
                                  for n in a.notes)
    rc, out, _ = _cli("analyze", str(tmp_path / "empty"))
    assert rc == 0 and "GPU (no device events) trace" in out and "CPU trace" not in out
    missing = open_analysis(_without_device_events(tmp_path / "launches", keep_runtime=True), use_summaries=False)
    assert missing.job.input_kind.device == "missing"
    # the same events with a gloo backend: the host's GPUs listed, not used
    cpu = tmp_path / "cpu"
    _without_device_events(cpu, keep_runtime=False)
    d = json.loads(gzip.open(cpu / "rank0.json.gz").read())
    d["distributedInfo"]["backend"] = "gloo"
    with gzip.open(cpu / "rank0.json.gz", "wt", compresslevel=1) as fh:
        fh.write(json.dumps(d))
    m = json.loads((cpu / "manifest.json").read_text())
    m["backend"] = "gloo"
    (cpu / "manifest.json").write_text(json.dumps(m))
    kind = open_analysis(cpu, use_summaries=False).job.input_kind
    assert kind.device == "none" and any("read as a host-only job" in e for e in kind.evidence)
