"""How each rank was set up (backend, process groups, wrapper, whether it communicates): the facts
the setup-fault rules read. Also the prefetch verdict at world size 1, where nothing can overlap."""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis import groups as groups_mod
from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis import prefetch as prefetch_mod
from fsdpdoctor.analysis.breakdown import StepWindow
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.results import Collective, PrefetchStatus, RankSetup
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, KERNEL
from fsdpdoctor.trace.vocabulary import GLOO_ANNOTATION

SINGLE_RANK = "n/a (world size 1)"


def rank_setup(ctx: RankContext, windows: list[StepWindow], colls: list[Collective]) -> RankSetup:
    t = ctx.t
    dist = t.distributed_info or {}
    pgs = dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else []
    pgs = [p for p in pgs if isinstance(p, dict)]
    pg_backends = sorted({str(p.get("backend_config")) for p in pgs if p.get("backend_config")})
    default = next((p for p in pgs if p.get("pg_desc") == "default_pg"),
                   next((p for p in pgs if str(p.get("pg_name")) == "0"), None))
    default_backend = str(default["backend_config"]) if default and default.get("backend_config") else None
    in_steps = iv.as_set([w.start for w in windows], [w.end for w in windows])
    bwd = iv.intersect(ctx.backward_set, in_steps) if len(ctx.backward_set) and len(in_steps) else iv.EMPTY
    wrapper = prefetch_mod.framework(ctx)
    if wrapper is None and (len(ctx.rows_prefix("DistributedDataParallel.forward", ANNOTATION))
                            or len(t.rows_named(lambda n: "reducer::" in n, cat=CPU_OP))):
        wrapper = "ddp"
    backend = str(t.backend) if t.backend is not None else None
    return RankSetup(rank=t.rank, world_size=t.world_size, backend=backend, pg_backends=pg_backends,
                     default_pg_backend=default_backend,
                     device_kernels=int(np.count_nonzero(t.cat == KERNEL)),
                     gloo_spans=int(len(t.rows_with_prefix(GLOO_ANNOTATION))),
                     collectives=len(colls),
                     collective_kinds=sorted({c.kind for c in colls}),
                     has_backward=bool(len(bwd)), wrapper=wrapper,
                     smallest_group=min((p["pg_size"] for p in pgs if isinstance(p.get("pg_size"), int)),
                                        default=None),
                     groups=groups_mod.pg_ranks(dist))


def single_rank_prefetch(p: PrefetchStatus | None, world_size: int | None) -> None:
    """At world size 1 FSDP gathers nothing from peers: prefetch can be neither on nor off, only unjudged."""
    if p is None or world_size != 1:
        return
    p.backward_mode = SINGLE_RANK
    p.forward_mode = SINGLE_RANK
    p.gpu_overlap_confirmed = None
    p.method = (p.method + "; " if p.method else "") + "world size 1: no peer to gather from, prefetch cannot be judged"
