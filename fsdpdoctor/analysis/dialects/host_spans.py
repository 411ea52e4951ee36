"""Collectives read on the host alone: the ``c10d::`` op on the issuing thread gives the kind, the
``gloo:*`` span on a gloo worker thread the execution time (the op's own span when no worker span
pairs with it). The gloo dialect reads every collective this way; the NCCL dialect where a job's
collectives ran through gloo (no communication kernels).

gloo runs reduce-scatter as ``gloo:all_reduce``, so the worker name is never used alone when a c10d
op is there; pairing is FIFO per compatible worker name.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from fsdpdoctor.analysis.collectives import dtype_bytes, first_tensor_numel, kind_from_op
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import CollectiveRecord
from fsdpdoctor.results import Collective
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP
from fsdpdoctor.trace.vocabulary import C10D_PREFIXES, GLOO_ANNOTATION, NCCL_ANNOTATION, NOT_COLLECTIVE_OPS

# gloo's worker span names (the vocabulary's ``gloo:`` annotations) that may execute a c10d op of each kind
_GLOO_FOR_KIND = {
    "all_gather": ("gloo:all_gather",), "reduce_scatter": ("gloo:all_reduce", "gloo:reduce_scatter"),
    "all_reduce": ("gloo:all_reduce", "gloo:sparse_all_reduce"), "broadcast": ("gloo:broadcast",),
    "all_to_all": ("gloo:all_to_all",), "barrier": ("gloo:barrier",), "p2p": ("gloo:send", "gloo:recv"),
    "other": ("gloo:gather", "gloo:scatter", "gloo:reduce"),
}
_NOT_DTYPES = ("TensorList", "Scalar", "ScalarList", "GenericList")


def extract_spans(ctx: RankContext) -> list[CollectiveRecord]:
    t = ctx.t
    ops = t.rows_named(lambda n: n.startswith(C10D_PREFIXES) and not n.startswith(NOT_COLLECTIVE_OPS), cat=CPU_OP)
    gloo = t.rows_with_prefix(GLOO_ANNOTATION, cat=(ANNOTATION, CPU_OP))
    queues: dict[str, deque] = defaultdict(deque)
    for g in gloo:
        queues[t.name(g)].append(int(g))
    used: set[int] = set()
    out: list[CollectiveRecord] = []
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
        nelems = first_tensor_numel(a.get("Input Dims"))
        types = a.get("Input type")
        dtype = None
        if isinstance(types, list):
            dtype = next((x for x in types if isinstance(x, str) and x and x not in _NOT_DTYPES), None)
        db = dtype_bytes(dtype)
        c = Collective(rank=t.rank, index=0, step=None, kind=kind, raw_name=name, phase="other",
                       start_us=start, end_us=max(end, start), issue_us=float(t.ts[o]), nelems=nelems,
                       dtype=dtype, size_bytes=int(nelems * db) if nelems and db else None,
                       group_size=t.world_size)
        out.append(CollectiveRecord(coll=c, issue_track=tr))
    # worker spans with no c10d op (e.g. traces recorded without cpu ops), and the library's own
    # annotations where no c10d op encloses them (``nccl:all_reduce`` of the legacy list export)
    if not ops.size:
        nccl = t.rows_with_prefix(NCCL_ANNOTATION, cat=(ANNOTATION, CPU_OP))
        spans = np.sort(np.concatenate([gloo, nccl])) if len(nccl) else gloo
        spans = spans[np.argsort(t.ts[spans], kind="stable")]
        outer_end: dict[int, float] = {}
        for g in spans:
            g = int(g)
            tr = int(t.track[g])
            if g in used or t.ts[g] < outer_end.get(tr, -np.inf):
                continue
            outer_end[tr] = float(t.ts[g] + t.dur[g])
            c = Collective(rank=t.rank, index=0, step=None, kind=kind_from_op(t.name(g)) or "other",
                           raw_name=t.name(g), phase="other", start_us=float(t.ts[g]),
                           end_us=float(t.ts[g] + t.dur[g]), issue_us=None, group_size=t.world_size)
            out.append(CollectiveRecord(coll=c, issue_track=None, described=False))
    return out
