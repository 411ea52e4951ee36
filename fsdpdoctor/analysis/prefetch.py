"""Is FSDP prefetching all-gathers, and does the prefetch take effect?

Decided structurally (fsdp-signatures.md §11c/d): the innermost FSDP hook
annotation enclosing each all-gather's issue says why it was issued. The
prefetch annotations are emitted even when prefetch is off, so an empty one
means nothing; only an all-gather *inside* one counts. With stacks but no
annotations, the Python frames ``_prefetch_handle`` (FSDP1) and
``_prefetch_unshard`` (FSDP2) serve the same purpose.
"""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import CollectiveRecord
from fsdpdoctor.analysis.rankresult import PrefetchCounts
from fsdpdoctor.results import Collective, PrefetchStatus
from fsdpdoctor.trace.table import ANNOTATION, PYFUNC

FSDP1_PREFIX = "FullyShardedDataParallel."
FSDP2_PREFIX = "FSDP::"
_SKIP = ("FSDP::all_gather", "FullyShardedDataParallel.rate_limiter")


def framework(ctx: RankContext) -> str | None:
    t = ctx.t
    if len(ctx.rows_prefix(FSDP2_PREFIX, ANNOTATION)):
        return "fsdp2"
    if len(ctx.rows_prefix(FSDP1_PREFIX, ANNOTATION)):
        return "fsdp1"
    if len(t.rows_named(lambda n: "torch/distributed/fsdp/_fully_shard" in n, cat=PYFUNC)):
        return "fsdp2"
    if len(t.rows_named(lambda n: "torch/distributed/fsdp/_runtime_utils.py" in n, cat=PYFUNC)):
        return "fsdp1"
    return None


def _reason(context: str | None) -> str:
    if not context:
        return "on-demand"
    if "_pre_backward_prefetch" in context:
        return "prefetch-pre"
    if "_post_backward_prefetch" in context:
        return "prefetch-post"
    if "prefetch" in context:  # _pre_forward_prefetch, FSDP::{forward,backward}_prefetch for X, frames
        return "prefetch"
    return "on-demand"


def annotate(ctx: RankContext, records: list[CollectiveRecord]) -> None:
    """Set ``fsdp_context`` and ``prefetch`` on all-gathers (and context on the rest)."""
    t = ctx.t
    hooks = ctx.rows_prefix((FSDP1_PREFIX, FSDP2_PREFIX), ANNOTATION)
    if len(hooks):
        keep = np.fromiter((not t.name(r).startswith(_SKIP) for r in hooks), bool, len(hooks))
        hooks = hooks[keep]
    frames = t.rows_named(lambda n: n.endswith((": _prefetch_handle", ": _prefetch_unshard", ": _pre_backward_hook",
                                                 ": _pre_forward_unshard", ": _pre_backward", ": _pre_forward")),
                          cat=PYFUNC) if not len(hooks) else np.empty(0, dtype=np.int64)
    source = hooks if len(hooks) else frames
    if not len(source):
        return
    # without annotations, FSDP1's prefetch frame is the same for PRE and POST: the hook around it tells
    post_hooks = t.rows_named(lambda n: n.endswith(": _post_backward_hook"), cat=PYFUNC) if not len(hooks) else None
    for rec in records:
        c, tr = rec.coll, rec.issue_track
        if tr is None or c.issue_us is None:
            continue
        r = ctx.enclosing(source, tr, c.issue_us)
        if r is None:
            continue
        c.fsdp_context = t.name(r)
        if c.kind == "all_gather":
            c.prefetch = _reason(c.fsdp_context)
            if post_hooks is not None and c.fsdp_context.endswith(": _prefetch_handle"):
                post = ctx.enclosing(post_hooks, tr, c.issue_us) is not None
                c.prefetch = "prefetch-post" if post else "prefetch-pre" if c.phase == "backward" else "prefetch"


_PREFETCH_ANNOTATIONS = ("FSDP::backward_prefetch for", "FullyShardedDataParallel._pre_backward_prefetch",
                         "FullyShardedDataParallel._post_backward_prefetch")


def rank_counts(ctx: RankContext, records: list[CollectiveRecord]) -> PrefetchCounts:
    """Per-rank facts for ``status``: the framework, and prefetch annotations that gathered nothing."""
    t = ctx.t
    fw = framework(ctx)
    out = PrefetchCounts(framework=fw)
    rows = ctx.rows_prefix(_PREFETCH_ANNOTATIONS, ANNOTATION)
    out.annotations = int(len(rows))
    issue = [(r.issue_track, r.coll.issue_us) for r in records
             if r.coll.kind == "all_gather" and r.coll.issue_us is not None and r.issue_track is not None]
    if issue:
        tracks = np.array([i[0] for i in issue])
        times = np.array([i[1] for i in issue])
    for r in rows:
        start, end, tr = t.ts[r], t.ts[r] + t.dur[r], t.track[r]
        if not issue or not np.any((tracks == tr) & (times >= start) & (times <= end)):
            out.empty_annotations += 1
    explicit = ctx.rows_prefix("FSDP::backward_prefetch for", ANNOTATION)
    if len(explicit):
        outer = ctx.rows_prefix("FSDP::pre_backward", ANNOTATION)
        for r in explicit:
            if ctx.enclosing(outer, int(t.track[r]), float(t.ts[r])) is None:
                out.explicit_backward = True
                break
    return out


def status(counts: list[PrefetchCounts], colls: list[Collective], fw: str | None,
           device_timeline: bool) -> PrefetchStatus | None:
    """Job-wide prefetch verdict from every rank's collectives and counts (no trace tables)."""
    if fw is None:
        return None
    ag = [c for c in colls if c.kind == "all_gather"]
    bwd = [c for c in ag if c.phase == "backward"]
    fwd = [c for c in ag if c.phase == "forward"]
    pre = sum(c.prefetch == "prefetch-pre" for c in bwd)
    post = sum(c.prefetch == "prefetch-post" for c in bwd)
    gen = sum(c.prefetch == "prefetch" for c in bwd)
    prefetched = pre + post + gen
    known = any(c.prefetch is not None for c in ag)
    s = PrefetchStatus(framework=fw, backward_mode="unknown", forward_mode="unknown",
                       backward_all_gathers=len(bwd), backward_prefetched=prefetched,
                       backward_on_demand=sum(c.prefetch == "on-demand" for c in bwd),
                       forward_all_gathers=len(fwd), forward_prefetched=sum(c.prefetch == "prefetch" for c in fwd))
    s.method = "FSDP annotations enclosing each all-gather" if known else "no FSDP annotations or frames"
    if not bwd:
        s.backward_mode = "n/a"  # nothing gathered in backward (reshard_after_forward=False, SHARD_GRAD_OP...)
    elif known:
        if prefetched * 2 < len(bwd):
            s.backward_mode = "none"
        elif fw == "fsdp1":
            s.backward_mode = "post" if post > pre else "pre"
        else:
            s.backward_mode = "pre"
    if not fwd:
        s.forward_mode = "n/a"
    elif known:
        s.forward_mode = "on" if s.forward_prefetched * 4 >= len(fwd) else "off"
    # prefetch annotations that gathered nothing
    for k in counts:
        s.prefetch_annotations += k.annotations
        s.empty_prefetch_annotations += k.empty_annotations
        s.explicit_backward |= k.explicit_backward and fw == "fsdp2"
    # on a device timeline, a prefetch takes effect only if the gathered kernel overlaps compute
    pref = [c for c in bwd if c.prefetch and c.prefetch.startswith("prefetch")]
    if pref and device_timeline:
        hidden = sum(c.hidden_us for c in pref)
        s.gpu_overlap_confirmed = hidden > 0.2 * sum(c.duration_us for c in pref)
    steps = sorted({c.step for c in bwd if c.step is not None})
    for st in steps:
        b = [c for c in bwd if c.step == st]
        s.per_step.append({"step": st, "backward_all_gathers": len(b),
                           "prefetched": sum(bool(c.prefetch and c.prefetch.startswith("prefetch")) for c in b)})
    return s
