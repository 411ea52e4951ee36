"""Who issued each collective: the library or module whose work asked for it, read from what encloses
its issue on the issuing thread (Python frames with stacks, the autograd node and the wrappers'
annotations without). A collective's fix depends on its issuer: no DDP bucket size merges SyncBatchNorm's
statistics exchanges or a metrics library's syncs.

Labels (``Collective.issuer``), most specific first:

- ``gradient buckets``: DDP's reducer, from the gradient hooks of the autograd engine (AccumulateGrad);
- ``fsdp``: FSDP's own all-gathers and reduce-scatters (an FSDP hook encloses them);
- ``DDP buffer broadcast``: DDP's forward syncing BatchNorm buffers from rank 0;
- ``norm statistics (<Module>)``: a normalisation layer that exchanges batch statistics (SyncBatchNorm and
  its kind), in its forward or its autograd node's backward;
- ``clip_grad_norm_``, ``optimizer-state sharding``, ``metrics (<library>)``, ``framework (<library>)``;
- ``module <Name>``: another module's forward; ``backward of <Node>``: another autograd node;
- ``user code <file(line)>``: the user's own call;
- None: nothing in the trace says (no stacks and no enclosing op).
"""

from __future__ import annotations

import re

import numpy as np

from fsdpdoctor.analysis.context import RankContext, is_user_frame
from fsdpdoctor.analysis.dialects.base import CollectiveRecord
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, PYFUNC

_EVALUATE = "autograd::engine::evaluate_function: "
_MODULE = "nn.Module: "
_MODULE_NUM = re.compile(r"_\d+$")
# Python frames of the libraries that issue collectives of their own, by what their fix is
_FRAMES = (
    ("DDP buffer broadcast", ("torch/nn/parallel/distributed.py(", ), ("_sync_buffers", "_sync_module_buffers",
                                                                      "_distributed_broadcast_coalesced",
                                                                      "_default_broadcast_coalesced")),
    ("clip_grad_norm_", ("torch/nn/utils/clip_grad.py(", "fully_sharded_data_parallel.py("), ("clip_grad_norm_",)),
    ("optimizer-state sharding", ("zero_redundancy_optimizer.py(",), ("",)),
)
_METRICS = ("torchmetrics", "evaluate")
_FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric", "transformers", "accelerate")
_NORM = re.compile(r"(?i)norm")
_FSDP = re.compile(r"FSDP|FullyShardedDataParallel|fsdp/")


def _frame_file(name: str) -> str:
    return name.split("(", 1)[0]


def annotate(ctx: RankContext, records: list[CollectiveRecord]) -> None:
    """Set ``issuer`` on every collective whose issue the trace can place."""
    t = ctx.t
    nodes = ctx.rows_prefix(_EVALUATE, CPU_OP)
    ddp_fwd = ctx.rows_prefix("DistributedDataParallel.forward", (ANNOTATION, CPU_OP))
    frames = t.rows_named(lambda n: True, cat=PYFUNC) if t.has_stacks else np.empty(0, dtype=np.int64)
    modules = ctx.frames_named(_MODULE) if len(frames) else frames
    known = {label: t.rows_named(lambda n, f=files, fn=funcs: any(x in n for x in f) and n.endswith(fn), cat=PYFUNC)
             for label, files, funcs in _FRAMES} if len(frames) else {}
    libs = t.rows_named(lambda n: _frame_file(n).split("/", 1)[0] in _METRICS + _FRAMEWORKS, cat=PYFUNC) \
        if len(frames) else frames
    for rec in records:
        c, tr = rec.coll, rec.issue_track
        if tr is None or c.issue_us is None:
            continue
        if c.fsdp_context and _FSDP.search(c.fsdp_context):
            c.issuer = "fsdp"
            continue
        c.issuer = _issuer(ctx, c, tr, nodes, ddp_fwd, modules, known, libs)


def _issuer(ctx, c, tr, nodes, ddp_fwd, modules, known, libs) -> str | None:
    t, at = ctx.t, c.issue_us
    for label, rows in known.items():
        if len(rows) and ctx.enclosing(rows, tr, at) is not None:
            return label
    mod = ctx.enclosing(modules, tr, at) if len(modules) else None
    mod_name = _MODULE_NUM.sub("", t.name(mod)[len(_MODULE):]) if mod is not None else None
    if mod_name and _NORM.search(mod_name):
        return f"norm statistics ({mod_name})"
    node = ctx.enclosing(nodes, tr, at) if len(nodes) else None
    if node is not None:
        name = t.name(node)[len(_EVALUATE):]
        if name.endswith("AccumulateGrad"):
            return "gradient buckets"
        short = name.rsplit("::", 1)[-1]
        return f"norm statistics ({short})" if _NORM.search(short) else f"backward of {short}"
    if len(libs):
        lib = ctx.enclosing(libs, tr, at)
        if lib is not None:
            top = _frame_file(t.name(lib)).split("/", 1)[0]
            if top in _METRICS:
                # a metric's entry point (forward, compute, sync) groups its syncs, not the helper that gathers
                lib = _outermost(ctx, libs, tr, at, top)
            func = t.name(lib).split("): ", 1)[-1]
            if top == "torchmetrics" and func == "wrapped_func":
                func = "compute"   # torchmetrics' Metric._wrap_compute: the compute() the user called
            return f"metrics ({top}: {func})" if top in _METRICS else f"framework ({top}: {func})"
    if mod_name and mod_name != "DistributedDataParallel":
        return f"module {mod_name}"
    src = c.source or (ctx.source_line(tr, at) if t.has_stacks else None)
    if src and is_user_frame(src):
        return f"user code {src}"
    if c.kind == "broadcast" and len(ddp_fwd) and ctx.enclosing(ddp_fwd, tr, at) is not None:
        return "DDP buffer broadcast"   # without stacks: DDP's forward broadcasts nothing else
    return None


def _outermost(ctx: RankContext, rows: np.ndarray, track: int, at: float, top: str) -> int:
    """The earliest-starting frame of library ``top`` among ``rows`` on ``track`` that holds ``at``."""
    t = ctx.t
    sel = rows[(t.track[rows] == track) & (t.ts[rows] <= at) & (ctx.end[rows] >= at)]
    sel = [r for r in sel if _frame_file(t.name(r)).split("/", 1)[0] == top]
    return int(min(sel, key=lambda r: t.ts[r]))
