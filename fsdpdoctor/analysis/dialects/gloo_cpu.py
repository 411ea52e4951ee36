"""gloo on CPUs: the ``c10d::`` op on the issuing thread gives the kind, the ``gloo:*``
span on a worker thread the execution time (``host_spans``). Host
ops on the main and autograd threads are the compute; a collective's span holds
the wait for its slowest peer, and synchronous collectives block the host.
"""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import (
    CollectiveRecord, StepWindow, Timelines, comm_by_kind_and_phase, host_step_windows,
)
from fsdpdoctor.analysis.dialects.host_spans import extract_spans
from fsdpdoctor.results import DialectTraits
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, RankTrace
from fsdpdoctor.trace.vocabulary import COMM_OPS

class GlooCpu:
    name = "gloo-cpu"
    family = "cpu"
    note = ("CPU/gloo trace: communication time is the gloo worker span, which includes waiting for peers; "
            "a gloo collective blocks the thread that issues it, so collectives are exposed by design here")

    def __init__(self) -> None:
        self.traits = DialectTraits(name=self.name)

    def matches(self, trace: RankTrace) -> bool:
        return True  # the host-only reading applies to any trace: registered last

    def step_windows(self, ctx: RankContext) -> list[StepWindow]:
        return host_step_windows(ctx)

    def collectives(self, ctx: RankContext) -> list[CollectiveRecord]:
        return extract_spans(ctx)

    def timelines(self, ctx: RankContext, records: list[CollectiveRecord]) -> Timelines:
        t = ctx.t
        colls = [r.coll for r in records]
        comm = iv.as_set([c.start_us for c in colls], [c.end_us for c in colls])
        ops = np.nonzero((t.cat == CPU_OP) & np.isin(t.track, ctx.compute_tracks))[0]
        comm_op_ids = t.ids_of(lambda n: n.startswith(COMM_OPS))
        is_comm = np.isin(t.name_id[ops], comm_op_ids)
        compute = iv.subtract(ctx.set_of(ops[~is_comm]), ctx.set_of(ops[is_comm]))
        # An outer op (autograd's evaluate_function) encloses FSDP's hooks, and a hook encloses the
        # blocking wait for its collective: that wait is not compute. Cut out the Work.wait frames
        # (with stacks) and, inside FSDP hook annotations (not the *.forward wrappers, which hold the
        # model), the time the collective runs; the hooks' own copies stay compute
        # (synchronous FSDP on gloo overlaps nothing)
        hook_comm = iv.intersect(fsdp_hook_set(ctx), comm)
        compute = iv.subtract(compute, iv.union(ctx.dataloader_set, ctx.wait_set, hook_comm))
        opt = iv.intersect(compute, ctx.optimizer_set)
        by_kind, by_phase = comm_by_kind_and_phase(colls)
        return Timelines(compute=compute, optimizer=opt, comm=comm, comm_by_kind=by_kind, comm_by_phase=by_phase)


DIALECT = GlooCpu()


def fsdp_hook_set(ctx: RankContext) -> np.ndarray:
    rows = ctx.rows_prefix(("FullyShardedDataParallel.", "FSDP::"), (ANNOTATION,))
    keep = [r for r in rows if not ctx.t.name(r).endswith(".forward")]
    return ctx.set_of(np.asarray(keep, dtype=np.int64)) if keep else iv.EMPTY
