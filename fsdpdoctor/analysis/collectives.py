"""Collectives: how names map to kinds, sizes and bus bandwidth, and ``extract`` (every
collective on a rank, found by the rank's dialect: see ``fsdpdoctor.analysis.dialects``)."""

from __future__ import annotations

import ast
import functools
import math
import re

from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.results import Collective
from fsdpdoctor.trace.vocabulary import KERNEL_LIBRARIES, found_in

_COLLECTIVE_NAME_KIND = {
    "_allgather_base": "all_gather", "all_gather": "all_gather", "allgather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "allreduce_sparse": "all_reduce",
    "broadcast": "broadcast", "_broadcast_oop": "broadcast", "broadcast_coalesced": "broadcast",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "alltoall_base": "all_to_all",
    "alltoall": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "p2p", "recv": "p2p", "recv_any_source": "p2p", "isend": "p2p", "irecv": "p2p",
    "batch_isend_irecv": "p2p", "sendrecv": "p2p",
    "gather": "other", "scatter": "other", "reduce": "other",
}
_KERNEL_RE = re.compile(rf"^(?:{'|'.join(KERNEL_LIBRARIES)})(?:Dev|SymkDev)?Kernel_([A-Za-z]+)", re.I)
_KERNEL_KIND = {"allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce",
                "broadcast": "broadcast", "reduce": "other", "sendrecv": "p2p", "send": "p2p", "recv": "p2p",
                "alltoall": "all_to_all"}
_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1, "bool": 1, "uint8": 1,
                "int8": 1, "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "unsigned char": 1, "signed char": 1, "c10::bfloat16": 2, "c10::half": 2,
                # the C++ names the host ops' "Input type" gives the other integer dtypes (int64 is "long int")
                "long int": 8, "long long int": 8, "short int": 2, "unsigned short": 2, "unsigned int": 4,
                "unsigned long": 8, "c10::complex<float>": 8, "c10::complex<double>": 16}


def kind_from_collective_name(name: str | None) -> str | None:
    if not name:
        return None
    n = str(name).strip().lower()
    return _COLLECTIVE_NAME_KIND.get(n) or _COLLECTIVE_NAME_KIND.get(n.lstrip("_"))


def kind_from_op(op: str) -> str | None:
    """``c10d::_allgather_base_`` / ``_c10d_functional::all_reduce`` / ``nccl:all_reduce`` -> kind."""
    base = op.split("::", 1)[1] if "::" in op else op.split(":", 1)[-1]
    base = base.strip().rstrip("_").split(" ")[0]
    return _COLLECTIVE_NAME_KIND.get(base) or _COLLECTIVE_NAME_KIND.get(base.lstrip("_"))


def kind_from_kernel(name: str) -> str | None:
    m = _KERNEL_RE.match(name)
    if not m:
        return kind_from_words(name) if other_library_comm(name) else None
    return _KERNEL_KIND.get(m.group(1).lower(), "other")


def is_comm_kernel(name: str) -> bool:
    return name[:6].lower().startswith(KERNEL_LIBRARIES)


# Communication kernels of libraries other than NCCL/RCCL. Their names are the only description the
# trace has (no record_param_comms, no c10d op), so two strengths:
# - a library's own namespace or name, which only its communication kernels carry (DeepEP's
#   intranode/internode/internode_ll kernels, not its local layout ones; NVSHMEM, MSCCL++, vLLM's
#   custom all-reduce, PyTorch's symmetric-memory multimem / one-shot / two-shot all-reduce kernels,
#   which run on the caller's stream; HCCL's device tasks, hcom_<collective>_<ids> on torch_npu's
#   'Group N Communication' track; oneCCL's SYCL kernels on XPU, whose names carry its namespace and
#   communicator, allreduce_large_read_write_ipc<float, 2, 2>(..., ccl::datatype, ccl::reduction, ...),
#   invoke_barrier(std::shared_ptr<ccl_comm>, ...), on the compute queue): communication by name;
# - a collective's word in a kernel name (TensorRT-LLM's allreduce kernels, home-grown ones): only
#   where the kernel's stream runs nothing FLOP-heavy, the way communication gets its own stream; a
#   reduction helper inside a compute kernel's name is not communication.
_LIBRARY_COMM = re.compile(r"(?:\b|_)ep::(?:intranode|internode|internode_ll)::|mscclpp|nvshmem|cross_device_reduce_|"
                           r"^hcom_|\bccl::|\bccl_comm\b|"
                           r"multimem_(?:all_reduce|all_gather|one_shot|reduce)|(?:one|two)_shot_all_reduce", re.I)
_COLLECTIVE_WORD = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|\bdispatch\b|\bcombine\b",
                              re.I)
_FLOP_HEAVY = re.compile(r"gemm|conv|cutlass|xmma|flash|attn|attention|matmul|cublas|cudnn|wgrad|dgrad|mma_", re.I)
_EXPERT_PARALLEL = re.compile(r"(?:\b|_)ep::(?:intranode|internode)|dispatch|combine", re.I)
_WORD_KINDS = (("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
               ("all_reduce", re.compile(r"all_?reduce|cross_device_reduce", re.I)),
               ("all_gather", re.compile(r"all_?gather", re.I)),
               ("all_to_all", re.compile(r"all_?to_?all", re.I)),
               ("broadcast", re.compile(r"broadcast", re.I)))


# each alternative of a pattern holds one of its needles ("ccl" for ccl::, ccl_comm and mscclpp;
# "reduce" for all_?reduce, reduce_?scatter; "attention" holds no "attn")
_library_comm = found_in(_LIBRARY_COMM, ("ep::", "ccl", "nvshmem", "cross_device_reduce_", "hcom_", "multimem_",
                                          "_shot_all_reduce"))
_collective_word = found_in(_COLLECTIVE_WORD, ("reduce", "gather", "to_all", "toall", "dispatch", "combine"))
_flop_heavy = found_in(_FLOP_HEAVY, ("gemm", "conv", "cutlass", "xmma", "flash", "attn", "attention", "matmul",
                                      "cublas", "cudnn", "wgrad", "dgrad", "mma_"))


@functools.lru_cache(maxsize=1 << 16)  # per distinct kernel name: a regex search of a long C++ name costs ~50 us
def other_library_comm(name: str) -> str | None:
    """'library' (communication by its name), 'word' (communication if its stream says so) or None."""
    if is_comm_kernel(name):
        return None
    if _library_comm(name):
        return "library"
    if _collective_word(name) and not _flop_heavy(name):
        return "word"
    return None


def is_flop_heavy(name: str) -> bool:
    return _flop_heavy(name)


def kind_from_words(name: str) -> str:
    """A collective kind from the words of a non-NCCL kernel name; expert-parallel token exchange
    (dispatch/combine and its notifications) is all_to_all; anything else is 'other'."""
    for kind, pat in _WORD_KINDS:
        if pat.search(name):
            return kind
    return "all_to_all" if _EXPERT_PARALLEL.search(name) else "other"


def dtype_bytes(dtype) -> int | None:
    if not dtype:
        return None
    return _DTYPE_BYTES.get(str(dtype).lower())


def bus_bandwidth(kind: str, size_bytes: int | None, group: int | None, dur_us: float) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s with the nccl-tests formulas; size is the full buffer (see docs)."""
    if not size_bytes or dur_us <= 0:
        return None, None
    algbw = size_bytes / (dur_us * 1e-6) / 1e9
    n = group or 0
    if kind == "all_reduce":
        factor = 2 * (n - 1) / n if n > 1 else None
    elif kind in ("all_gather", "reduce_scatter", "all_to_all"):
        factor = (n - 1) / n if n > 1 else None
    elif kind in ("broadcast", "p2p", "other"):
        factor = 1.0
    else:
        factor = None
    return algbw, (algbw * factor if factor is not None else None)


def to_int(v) -> int | None:
    """A count from a trace argument (elements, group size, sequence number): a whole number from 0 up
    to 2**63 - 1; anything else (negative, fractional, non-finite, text, a bool) is unknown (None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v) if 0 <= v < 2 ** 63 else None


def first_tensor_numel(dims) -> int | None:
    """Elements of the first tensor found depth-first in a Kineto ``Input Dims`` value."""
    if isinstance(dims, str):
        try:
            dims = ast.literal_eval(dims)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    stack = [dims]
    while stack:
        d = stack.pop(0)
        if isinstance(d, list):
            if d and all(isinstance(x, int) and not isinstance(x, bool) for x in d):
                # a shape's dimensions are counts: a negative one, or a product past 2**63, is no shape
                n = math.prod(d) if all(x >= 0 for x in d) else -1
                return n if 0 <= n < 2 ** 63 else None
            stack = [x for x in d if isinstance(x, list)] + stack
    return None


def extract_records(ctx: RankContext) -> list:
    """The dialect's collective records, in issue order, ``index`` set."""
    out = ctx.dialect_impl.collectives(ctx)
    out.sort(key=lambda r: (r.coll.issue_us if r.coll.issue_us is not None else r.coll.start_us, r.coll.start_us))
    for i, r in enumerate(out):
        r.coll.index = i
    return out


def extract(ctx: RankContext) -> list[Collective]:
    return [r.coll for r in extract_records(ctx)]
