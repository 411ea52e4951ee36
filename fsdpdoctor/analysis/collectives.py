"""Find every collective on a rank and classify it, in both dialects.

GPU (NCCL/RCCL): the executing kernels (``nccl*Kernel*``) on their streams; the
kind comes from ``Collective name`` (on the kernel or the correlated
``record_param_comms``), then the ``c10d::`` op, then the ``nccl:`` annotation,
and only last from the kernel name, which is unreliable (NCCL may run an
all-reduce in a SendRecv-named kernel).

CPU (gloo): the ``c10d::`` op on the issuing thread gives the kind; the
``gloo:*`` span on a worker thread gives the execution time. gloo runs
reduce-scatter as ``gloo:all_reduce``, so the worker name is never used alone
when a c10d op is there; pairing is FIFO per compatible worker name.
"""

from __future__ import annotations

import ast
import math
import re
from collections import defaultdict, deque

import numpy as np

from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.results import Collective
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, KERNEL

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
_KERNEL_RE = re.compile(r"^(?:nccl|rccl)(?:Dev|SymkDev)?Kernel_([A-Za-z]+)", re.I)
_KERNEL_KIND = {"allgather": "all_gather", "reducescatter": "reduce_scatter", "allreduce": "all_reduce",
                "broadcast": "broadcast", "reduce": "other", "sendrecv": "p2p", "send": "p2p", "recv": "p2p",
                "alltoall": "all_to_all"}
_GLOO_FOR_KIND = {
    "all_gather": ("gloo:all_gather",), "reduce_scatter": ("gloo:all_reduce", "gloo:reduce_scatter"),
    "all_reduce": ("gloo:all_reduce", "gloo:sparse_all_reduce"), "broadcast": ("gloo:broadcast",),
    "all_to_all": ("gloo:all_to_all",), "barrier": ("gloo:barrier",), "p2p": ("gloo:send", "gloo:recv"),
    "other": ("gloo:gather", "gloo:scatter", "gloo:reduce"),
}
_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "float64": 8,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1, "bool": 1, "uint8": 1,
                "int8": 1, "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "unsigned char": 1, "signed char": 1, "c10::bfloat16": 2, "c10::half": 2}
_NOT_COLLECTIVE_OPS = ("c10d::wait", "_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")


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
        return None
    return _KERNEL_KIND.get(m.group(1).lower(), "other")


def is_comm_kernel(name: str) -> bool:
    low = name[:6].lower()
    return low.startswith("nccl") or low.startswith("rccl")


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


def _int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return int(v)
    return None


def _first_tensor_numel(dims) -> int | None:
    """Elements of the first tensor found depth-first in a Kineto ``Input Dims`` value."""
    if isinstance(dims, str):
        try:
            dims = ast.literal_eval(dims)
        except (ValueError, SyntaxError):
            return None
    stack = [dims]
    while stack:
        d = stack.pop(0)
        if isinstance(d, list):
            if d and all(isinstance(x, int) for x in d):
                return int(np.prod(d))
            stack = [x for x in d if isinstance(x, list)] + stack
    return None


def extract(ctx: RankContext) -> list[Collective]:
    t = ctx.t
    has_kernels = bool(np.any(t.cat == KERNEL))
    out = _extract_gpu(ctx) if has_kernels else []
    if not out:
        out = _extract_cpu(ctx)
    out.sort(key=lambda c: (c.issue_us if c.issue_us is not None else c.start_us, c.start_us))
    for i, c in enumerate(out):
        c.index = i
    return out


# ---------------------------------------------------------------- GPU
def _extract_gpu(ctx: RankContext) -> list[Collective]:
    t = ctx.t
    kernels = np.nonzero(t.cat == KERNEL)[0]
    if len(kernels) == 0:
        return []
    comm_ids = t.ids_of(is_comm_kernel)
    is_comm = np.isin(t.name_id[kernels], comm_ids)
    with_meta = np.fromiter((r in t.args and "Collective name" in t.args[r] for r in kernels), bool, len(kernels))
    rows = kernels[is_comm | with_meta]
    if len(rows) == 0:
        return []
    # kernel -> launching runtime call (same correlation id)
    launch_of = ctx.launch_row
    param_rows = t.rows_named(lambda n: n == "record_param_comms", cat=CPU_OP)
    op_rows = t.rows_named(lambda n: (n.startswith(("c10d::", "_c10d_functional::", "c10d_functional::"))
                                      and not n.startswith(_NOT_COLLECTIVE_OPS)), cat=CPU_OP)
    nccl_ann = t.rows_named(lambda n: n.startswith("nccl:"), cat=(ANNOTATION, CPU_OP))
    out = []
    for r in rows:
        r = int(r)
        kname = t.name(r)
        kargs = t.args.get(r, {})
        launch = launch_of.get(int(t.corr[r])) if t.corr[r] >= 0 else None
        issue_t = issue_track = None
        meta = kargs if "Collective name" in kargs else {}
        op_name = None
        if launch is not None:
            issue_t, issue_track = float(t.ts[launch]), int(t.track[launch])
            p = ctx.enclosing(param_rows, issue_track, issue_t)
            if p is not None and not meta:
                meta = t.args.get(p, {}) if "Collective name" in t.args.get(p, {}) else {}
            o = ctx.enclosing(op_rows, issue_track, issue_t)
            if o is None:
                o = ctx.enclosing(nccl_ann, issue_track, issue_t)
            if o is not None:
                op_name = t.name(o)
                issue_t = float(t.ts[o])
        kind = (kind_from_collective_name(meta.get("Collective name"))
                or (kind_from_op(op_name) if op_name else None)
                or kind_from_kernel(kname) or "other")
        raw = meta.get("Collective name") or op_name or kname.split("(")[0]
        nelems_in, nelems_out = _int(meta.get("In msg nelems")), _int(meta.get("Out msg nelems"))
        group = _int(meta.get("Group size"))
        dtype = meta.get("dtype")
        nbytes = None
        db = dtype_bytes(dtype)
        if db and (nelems_in or nelems_out):
            full = max(nelems_in or 0, nelems_out or 0) if kind in ("all_gather", "reduce_scatter") else (nelems_in or nelems_out)
            nbytes = int(full * db)
        c = Collective(rank=t.rank, index=0, step=None, kind=kind, raw_name=str(raw), phase="other",
                       start_us=float(t.ts[r]), end_us=float(t.ts[r] + t.dur[r]), issue_us=issue_t,
                       nelems=nelems_in, dtype=str(dtype) if dtype else None, size_bytes=nbytes,
                       group_size=group, process_group=meta.get("Process Group Name"))
        c._issue_track = issue_track  # type: ignore[attr-defined]
        c._kernel = (kname, int(t.track[r]), bool(meta) or op_name is not None)  # type: ignore[attr-defined]
        out.append(c)
    _infer_orphans(out)
    return out


def _infer_orphans(colls: list[Collective]) -> None:
    """Kernels launched before the trace began have no launch record, and generic kernel names
    (RCCL's ``ncclDevKernel_Generic``) say nothing. Take the kind of the correlated kernel with the
    same name on the same stream whose duration is closest (log scale); phase stays unknown."""
    known = [c for c in colls if c._kernel[2]]  # type: ignore[attr-defined]
    for c in colls:
        name, track, has_meta = c._kernel  # type: ignore[attr-defined]
        if has_meta or c.issue_us is not None or kind_from_kernel(name) not in (None, "other"):
            continue
        peers = [k for k in known if k._kernel[0] == name and k._kernel[1] == track]  # type: ignore[attr-defined]
        if not peers:
            continue
        d = math.log(max(c.duration_us, 1e-3))
        best = min(peers, key=lambda k: abs(math.log(max(k.duration_us, 1e-3)) - d))
        c.kind = best.kind
        c.raw_name = f"{name.split('(')[0]} (kind inferred: no launch record)"


# ---------------------------------------------------------------- CPU
def _extract_cpu(ctx: RankContext) -> list[Collective]:
    t = ctx.t
    ops = t.rows_named(lambda n: (n.startswith(("c10d::", "_c10d_functional::", "c10d_functional::"))
                                  and not n.startswith(_NOT_COLLECTIVE_OPS)), cat=CPU_OP)
    gloo = t.rows_named(lambda n: n.startswith("gloo:"), cat=(ANNOTATION, CPU_OP))
    queues: dict[str, deque] = defaultdict(deque)
    for g in gloo:
        queues[t.name(g)].append(int(g))
    used: set[int] = set()
    out: list[Collective] = []
    # drop c10d ops nested in another c10d op on the same thread (e.g. coalesced wrappers)
    last_end: dict[int, float] = {}
    for o in ops:
        o = int(o)
        tr = int(t.track[o])
        if t.ts[o] < last_end.get(tr, -np.inf):
            continue
        last_end[tr] = float(t.ts[o] + t.dur[o])
        name = t.name(o)
        kind = kind_from_op(name) or "other"
        exec_row = None
        for gname in _GLOO_FOR_KIND.get(kind, ()):
            q = queues.get(gname)
            # FIFO per worker name: skip spans that started before this op was issued
            while q and t.ts[q[0]] + t.dur[q[0]] < t.ts[o]:
                q.popleft()
            if q and (exec_row is None or t.ts[q[0]] < t.ts[exec_row]):
                exec_row = q[0]
        if exec_row is not None:
            queues[t.name(exec_row)].popleft()
            used.add(exec_row)
            start, end = float(t.ts[exec_row]), float(t.ts[exec_row] + t.dur[exec_row])
        else:
            start, end = float(t.ts[o]), float(t.ts[o] + t.dur[o])
        a = t.args.get(o, {})
        nelems = _first_tensor_numel(a.get("Input Dims"))
        types = a.get("Input type")
        dtype = None
        if isinstance(types, list):
            dtype = next((x for x in types if isinstance(x, str) and x and x not in ("TensorList", "Scalar", "ScalarList", "GenericList")), None)
        db = dtype_bytes(dtype)
        c = Collective(rank=t.rank, index=0, step=None, kind=kind, raw_name=name, phase="other",
                       start_us=start, end_us=max(end, start), issue_us=float(t.ts[o]), nelems=nelems,
                       dtype=dtype, size_bytes=int(nelems * db) if nelems and db else None,
                       group_size=t.world_size)
        c._issue_track = tr  # type: ignore[attr-defined]
        out.append(c)
    # worker spans with no c10d op (e.g. traces recorded without cpu ops)
    for g in gloo:
        g = int(g)
        if g in used or ops.size:
            continue
        kind = kind_from_op(t.name(g)) or "other"
        c = Collective(rank=t.rank, index=0, step=None, kind=kind, raw_name=t.name(g), phase="other",
                       start_us=float(t.ts[g]), end_us=float(t.ts[g] + t.dur[g]), issue_us=None,
                       group_size=t.world_size)
        c._issue_track = None  # type: ignore[attr-defined]
        out.append(c)
    return out
