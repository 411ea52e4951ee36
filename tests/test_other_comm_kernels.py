"""Communication through kernels the NCCL/RCCL reading does not name (DeepEP, custom all-reduce,
TensorRT-LLM): made by renaming the NCCL kernels of a real public trace, the host's description of
them removed, so only their names and streams are left to go by."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsdpdoctor.analysis import invariants
from fsdpdoctor.pipeline import open_analysis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_data import SHARED as _SHARED  # noqa: E402
from trace_edit import rename_comm_kernels  # noqa: E402

SHARED = _SHARED if _SHARED.is_dir() else None  # ../shared beside the repository (tests/shared_data.py)
A100 = SHARED / "traces-public" / "ddp_a100_rank0" / "nccl_data.json.gz" if SHARED else None
pytestmark = pytest.mark.skipif(A100 is None or not A100.is_file(), reason="../shared/traces-public absent")

DEEPEP = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*)"
VLLM = "void vllm::cross_device_reduce_2stage<float, 8>(vllm::RankData*, vllm::RankSignals, int)"
TRTLLM = "void tensorrt_llm::kernels::oneShotAllReduceKernel<float, 8>(tensorrt_llm::kernels::AllReduceParams)"


@pytest.fixture(scope="module")
def original():
    return open_analysis(A100, use_summaries=False)


@pytest.mark.parametrize("name, kind", [(DEEPEP, "all_to_all"), (VLLM, "all_reduce"), (TRTLLM, "all_reduce")],
                         ids=["deepep", "vllm-custom-allreduce", "trtllm-allreduce"])
def test_renamed_comm_kernels_are_communication(tmp_path, original, name, kind):
    a = open_analysis(rename_comm_kernels(A100, tmp_path / "rank0.json.gz", lambda _: name), use_summaries=False)
    assert not invariants.check(a)
    # the same kernels, the same intervals: the same communication as NCCL's
    assert a.mean.comm_us == pytest.approx(original.mean.comm_us, rel=1e-6)
    assert a.mean.exposed_comm_us == pytest.approx(original.mean.exposed_comm_us, rel=1e-6)
    assert len(a.collective_events) == len(original.collective_events)
    assert {c.kind for c in a.collective_events} == {kind}
    assert any("outside NCCL/RCCL" in n and name.split("(")[0].split("<")[0].removeprefix("void ") in n
               for n in a.notes)
    assert not any(f.id == "ranks-never-communicate" for f in a.findings)


def test_a_collective_word_on_a_compute_stream_is_not_communication(tmp_path, original):
    """A reduction named like a collective beside GEMMs is compute: said, not counted."""
    import gzip
    import json

    d = json.loads(gzip.open(A100).read())
    gemm = next(e for e in d["traceEvents"] if e.get("cat") == "kernel" and "gemm" in e["name"].lower())
    stream = gemm["args"]["stream"]
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel" and e["args"].get("stream") == stream and "gemm" not in e["name"].lower():
            e["name"] = "void block_allreduce_sum_kernel<float>(float*, int)"
            break
    p = tmp_path / "rank0.json.gz"
    with gzip.open(p, "wt", compresslevel=1) as fh:
        fh.write(json.dumps(d))
    a = open_analysis(p, use_summaries=False)
    assert len(a.collective_events) == len(original.collective_events)
    assert any("compute streams" in n and "block_allreduce_sum_kernel" in n for n in a.notes)


def test_unnamed_kernel_of_a_described_collective_is_that_collective(tmp_path, original):
    """A custom backend's kernel with a name nobody knows, launched inside record_param_comms: the host's
    description makes it the collective it describes (kind and size from record_param_comms)."""
    import gzip
    import json

    p = rename_comm_kernels(A100, tmp_path / "renamed.json.gz", lambda _: "my_backend_kernel_v2", strip_host=False)
    d = json.loads(gzip.open(p).read())
    for e in d["traceEvents"]:  # the kernels' own description goes; the host's stays
        if e.get("name") == "my_backend_kernel_v2":
            e["args"] = {k: v for k, v in e["args"].items() if k in ("correlation", "stream", "device")}
    with gzip.open(tmp_path / "rank0.json.gz", "wt", compresslevel=1) as fh:
        fh.write(json.dumps(d))
    (tmp_path / "renamed.json.gz").unlink()
    a = open_analysis(tmp_path / "rank0.json.gz", use_summaries=False)
    assert not invariants.check(a)
    assert a.mean.comm_us == pytest.approx(original.mean.comm_us, rel=1e-6)
    assert sorted(c.kind for c in a.collective_events) == sorted(c.kind for c in original.collective_events)
    assert any("record_param_comms" in n and "my_backend_kernel_v2" in n for n in a.notes)


@pytest.mark.parametrize("name, strength, kind", [
    # DeepSeek's published H800 MoE training profile and DeepEP's own kernels
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*)", "library", "all_to_all"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)", "library", "all_to_all"),
    ("void deep_ep::internode_ll::combine<7168>(void*, int*, int)", "library", "all_to_all"),
    ("void dpsk::ep::cuda::get_dispatch_layout<256>(long const*, int*)", None, None),  # local, no exchange
    # PyTorch symmetric memory (B200 trace of TraceLens' tests), vLLM, TensorRT-LLM, MSCCL++, NVSHMEM
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "library",
     "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<float, 8>(vllm::RankData*)", "library", "all_reduce"),
    ("void tensorrt_llm::kernels::twoShotAllReduceKernel<float, 8>(AllReduceParams)", "word", "all_reduce"),
    ("void mscclpp::allgather6<false>(void*, mscclpp::DeviceHandle*)", "library", "all_gather"),
    ("nvshmemi_barrier_all_kernel", "library", "other"),
    # names that are not communication: a GEMM epilogue, an elementwise kernel
    ("sm90_xmma_gemm_bf16_allreduce_epilogue_kernel", None, None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", None, None),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", None, "all_gather"),
])
def test_kernel_names_of_other_libraries(name, strength, kind):
    from fsdpdoctor.analysis.collectives import kind_from_kernel, other_library_comm

    assert other_library_comm(name) == strength
    assert kind_from_kernel(name) == kind


def test_lowered_search_answers_as_the_case_insensitive_one():
    """The names are searched lower-cased (ASCII) or as written (other text): the same answers as re.I."""
    from fsdpdoctor.analysis import collectives as c

    names = [DEEPEP, VLLM, TRTLLM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "sm90_XMMA_GEMM_AllGather_epilogue",
             "EP::Internode::Combine", "K_ALL_TO_ALL", "\u017f_all_reduce", "\u0130_MULTIMEM_ALL_REDUCE",
             "\u212a_reduce_scatter_conv", "cutlass_80_tensorop_s1688gemm", "",
             # each alternative once (the searches are skipped for a name with none of their needles)
             "x_ep::intranode::y", "hcom_allreduce_1", "a ccl_comm b", "ccl::allreduce", "One_Shot_All_Reduce",
             "cross_device_reduce_2stage", "mscclpp::x", "multimem_one_shot", "xdispatch", "x dispatch y", "Combine",
             "AllToAll", "allto_all", "all_toall", "ATTENTION", "mma_", "NCCL:all_reduce", "c10d::allreduce_",
             "_C10D_FUNCTIONAL::x", "Record_Param_Comms", "gloo:x", "XCCL:y", "rcclKernel", "foo nccl", "\u212a_nccl"]
    from fsdpdoctor.trace import vocabulary

    for pattern, found in ((c._LIBRARY_COMM, c._library_comm), (c._COLLECTIVE_WORD, c._collective_word),
                           (c._FLOP_HEAVY, c._flop_heavy), (vocabulary._COMM_NAME, vocabulary.is_comm_name)):
        assert [found(n) for n in names] == [pattern.search(n) is not None for n in names], pattern.pattern


def test_device_span_names_read_as_the_case_insensitive_search():
    """trace.kind's copy and wait spans (found_in, with needles): the answers of the re.I patterns."""
    from fsdpdoctor.trace import kind

    names = ["DMA", "MemCopy", "mem_copy", "H2D", "DtoH", "memcpy", "d2h", "HtoD", "Event_Record", "recordEvent",
             "record_event", "Sync", "fence", "signal", "Barrier", "\u017fync", "\u212aernel", "matmul", "", "WAIT"]
    for pattern, found in ((kind._COPY_SPAN, kind._copy_span), (kind._WAIT_SPAN, kind._wait_span)):
        assert [found(n) for n in names] == [pattern.search(n) is not None for n in names], pattern.pattern
