"""NCCL/RCCL on GPUs: collectives are kernels on device streams, issued by host ops.

The kind comes from ``Collective name`` (on the kernel or the correlated
``record_param_comms``), then the ``c10d::`` op, then the ``nccl:`` annotation,
and only last from the kernel name, which is unreliable (NCCL may run an
all-reduce in a SendRecv-named kernel). Steps are sliced at the next step's
start, so device work that runs on after its host step is counted where it runs.
"""

from __future__ import annotations

import math

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.collectives import (
    dtype_bytes, is_comm_kernel, is_flop_heavy, kind_from_collective_name, kind_from_kernel, kind_from_op,
    kind_from_words, other_library_comm, to_int,
)
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects.base import (
    CollectiveRecord, StepWindow, Timelines, comm_by_kind_and_phase, cycle_index, host_step_windows,
)
from fsdpdoctor.analysis.dialects.host_spans import extract_spans
from fsdpdoctor.analysis.stats import member
from fsdpdoctor.results import Collective, DialectTraits
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, DEVICE_CATEGORIES, KERNEL, RankTrace, distinct
from fsdpdoctor.trace.vocabulary import C10D_PREFIXES, DEVICE_LIBRARY_ANNOTATIONS, NOT_COLLECTIVE_OPS, PARAM_COMMS


# the device timelines this dialect reads (trace/kind.py's ``InputKind.device``)
DEVICE_TIMELINES = ("cuda", "rocm", "xpu", "copies-only")


class NcclGpu:
    name = "nccl-gpu"
    family = "gpu"
    note = None

    def __init__(self) -> None:
        self.traits = DialectTraits(name=self.name, device_timeline=True, async_collectives=True,
                                    shared_host_cores=False, has_message_sizes=True)

    def matches(self, trace: RankTrace) -> bool:
        if trace.kind is not None:  # decided at the front door (trace/kind.py): kernels or copies
            return trace.kind.device in DEVICE_TIMELINES or trace.kind.generic
        return bool(np.any(trace.cat == KERNEL))

    def step_windows(self, ctx: RankContext) -> list[StepWindow]:
        out = host_step_windows(ctx)
        if out[0].step is None:
            return out
        # device work of a step runs on after its host window: slice at the next step's start when
        # that is the next step of the same recording; a step followed by a gap (the last one, the
        # last of a profiler cycle, a step number skipped) extends to its own device work only
        t = ctx.t
        drows = np.nonzero(np.isin(t.cat, DEVICE_CATEGORIES))[0]
        device = (drows, ctx.launch_times(drows))
        cycle = cycle_index(ctx, [w.start for w in out])
        for i, (w, nxt) in enumerate(zip(out, out[1:])):
            if cycle[i] == cycle[i + 1] and nxt.step == w.step + 1:
                w.end = nxt.start
            else:
                _extend_to_device_work(ctx, w, nxt.start, device)
        _extend_to_device_work(ctx, out[-1], math.inf, device)
        return out

    def collectives(self, ctx: RankContext) -> list[CollectiveRecord]:
        out = extract_kernels(ctx)
        # kernels, but the collectives ran elsewhere (gloo with CUDA compute): read the gloo spans
        return out or extract_spans(ctx)

    def timelines(self, ctx: RankContext, records: list[CollectiveRecord]) -> Timelines:
        t = ctx.t
        colls = [r.coll for r in records]
        comm = iv.as_set([c.start_us for c in colls], [c.end_us for c in colls])
        k = np.nonzero(t.cat == KERNEL)[0]
        k = k[~np.isin(t.name_id[k], _comm_kernel_ids(t))]
        coll_starts = {c.start_us for c in colls}
        if coll_starts:  # kernels with collective metadata but odd names
            k = k[~member(t.ts[k], np.fromiter(coll_starts, float))]
        compute = ctx.set_of(k)
        opt = iv.EMPTY
        if len(ctx.optimizer_set) and len(k):
            lt = ctx.launch_times(k)
            ok = ~np.isnan(lt)
            idx = np.searchsorted(ctx.optimizer_set[:, 0], lt[ok], side="right") - 1
            inside = (idx >= 0) & (lt[ok] <= ctx.optimizer_set[np.maximum(idx, 0), 1])
            opt = ctx.set_of(k[ok][inside])
        by_kind, by_phase = comm_by_kind_and_phase(colls)
        return Timelines(compute=compute, optimizer=opt, comm=comm, comm_by_kind=by_kind, comm_by_phase=by_phase)


DIALECT = NcclGpu()


def _extend_to_device_work(ctx: RankContext, w: StepWindow, limit: float, device: tuple) -> None:
    """Extend a step's window to the end of the device work launched inside it (never past ``limit``,
    the next step's start, nor past its own profiler cycle). ``device``: (device rows, launch times)."""
    t = ctx.t
    if t.cycles:
        limit = min(limit, t.cycles[int(cycle_index(ctx, [w.start])[0])][1])
    drows, lt = device
    if not len(drows):
        return
    sel = drows[(lt >= w.start) & (lt <= w.end)]
    if len(sel):
        w.end = max(w.end, min(float((t.ts[sel] + t.dur[sel]).max()), limit))


def _comm_kernel_ids(t) -> np.ndarray:
    """Name ids of communication kernels (only kernels' names are tested: most names are host ops)."""
    return _comm_kernels(t)[0]


def _comm_kernels(t) -> tuple[np.ndarray, list[str], list[str]]:
    """(name ids of communication kernels, names of other libraries' ones among them, names that look
    like communication but run beside FLOP-heavy kernels on a compute stream: not counted)."""
    names = t.names
    kernel_ids = t.ids_in_categories(KERNEL).tolist()
    ids = [i for i in kernel_ids if is_comm_kernel(names[i])]
    library = [i for i in kernel_ids if other_library_comm(names[i]) == "library"]
    words = [i for i in kernel_ids if other_library_comm(names[i]) == "word"]
    refused = []
    if words:
        krows = np.nonzero(t.cat == KERNEL)[0]
        heavy = [i for i in kernel_ids if is_flop_heavy(names[i])]
        heavy_tracks = distinct(t.track[krows[np.isin(t.name_id[krows], heavy)]])  # np.unique imports numpy.ma
        for i in words:
            tracks = distinct(t.track[krows[t.name_id[krows] == i]])
            (refused if np.isin(tracks, heavy_tracks).any() else library).append(i)
    return (np.array(ids + library, dtype=np.int32), [names[i] for i in library], [names[i] for i in refused])


def _launched_in_param_comms(ctx: RankContext, kernels: np.ndarray, param_rows: np.ndarray) -> np.ndarray:
    """The kernels (not FLOP-heavy) whose launch lies inside a ``record_param_comms`` span on the launching
    thread: a collective the trace describes, run by a kernel no dialect names (a custom backend)."""
    t = ctx.t
    if not len(param_rows) or not len(kernels):
        return np.empty(0, dtype=np.int64)
    launch = ctx.launch_rows(kernels)
    ok = launch >= 0
    kernels, launch = kernels[ok], launch[ok]
    inside = np.zeros(len(kernels), dtype=bool)
    for track in distinct(t.track[param_rows]).tolist():  # np.unique imports numpy.ma
        on = t.track[launch] == track
        if on.any():
            spans = ctx.set_of(param_rows[t.track[param_rows] == track])
            inside[on] = iv.contains_open(spans, t.ts[launch[on]])
    picked = kernels[inside]
    return np.array([r for r in picked.tolist() if not is_flop_heavy(t.name(r))], dtype=np.int64)


def _short(name: str) -> str:
    """A kernel's name without its template and argument lists."""
    base = name.replace("(anonymous namespace)::", "").removeprefix("void ").split("(")[0].strip()
    return base.split("<")[0] or base or name[:60]


def extract_kernels(ctx: RankContext) -> list[CollectiveRecord]:
    t = ctx.t
    kernels = np.nonzero(t.cat == KERNEL)[0]
    if len(kernels) == 0:
        return []
    comm_ids, others, refused = _comm_kernels(t)
    is_comm = np.isin(t.name_id[kernels], comm_ids)
    if others:
        shown = sorted({f"{_short(n)} ({kind_from_words(n)})" for n in others})
        ctx.notes.append("communication through kernels outside NCCL/RCCL, recognised by their names (a "
                         f"collective's word alone: and their own streams): {', '.join(shown[:6])}{' ...' if len(shown) > 6 else ''}; counted as "
                         "communication (their message sizes are not in the trace)")
    if refused:
        shown = sorted({_short(n) for n in refused})
        ctx.notes.append(f"kernels named like communication run on compute streams and are counted as compute: "
                         f"{', '.join(shown[:6])}{' ...' if len(shown) > 6 else ''} (not classified)")
    # the rows whose arguments name a collective (a few hundred), not a test per kernel (10^4..10^5)
    # (a mask by row: np.isin of an empty or float array imports numpy.ma, 15-25 ms of a process)
    has_meta = np.zeros(t.n_events, dtype=bool)
    has_meta[[r for r, a in t.args.items() if "Collective name" in a]] = True
    with_meta = has_meta[kernels]
    param_rows = t.rows_named(lambda n: n == PARAM_COMMS, cat=CPU_OP)
    under = _launched_in_param_comms(ctx, kernels[~(is_comm | with_meta)], param_rows)
    if len(under):
        shown = sorted({_short(t.name(r)) for r in under.tolist()})
        ctx.notes.append("kernels launched inside record_param_comms (a collective the trace describes) and not "
                         f"named by NCCL/RCCL: {', '.join(shown[:6])}{' ...' if len(shown) > 6 else ''}; counted "
                         "as that collective")
    rows = distinct(np.concatenate([kernels[is_comm | with_meta], under]))  # np.union1d imports numpy.ma
    if len(rows) == 0:
        return []
    op_rows = t.rows_named(lambda n: n.startswith(C10D_PREFIXES) and not n.startswith(NOT_COLLECTIVE_OPS), cat=CPU_OP)
    nccl_ann = t.rows_with_prefix(DEVICE_LIBRARY_ANNOTATIONS, cat=(ANNOTATION, CPU_OP))
    out = []
    for r, launch in zip(rows.tolist(), ctx.launch_rows(rows).tolist()):  # kernel, its launching runtime call
        kname = t.name(r)
        kargs = t.args.get(r, {})
        launch = launch if launch >= 0 else None
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
        nelems_in, nelems_out = to_int(meta.get("In msg nelems")), to_int(meta.get("Out msg nelems"))
        dtype = meta.get("dtype")
        nbytes = None
        db = dtype_bytes(dtype)
        if db and (nelems_in or nelems_out):
            full = (max(nelems_in or 0, nelems_out or 0) if kind in ("all_gather", "reduce_scatter")
                    else (nelems_in or nelems_out))
            nbytes = int(full * db)
        pg = meta.get("Process Group Name")
        c = Collective(rank=t.rank, index=0, step=None, kind=kind, raw_name=str(raw), phase="other",
                       start_us=float(t.ts[r]), end_us=float(t.ts[r] + t.dur[r]), issue_us=issue_t,
                       nelems=nelems_in, dtype=str(dtype) if dtype else None, size_bytes=nbytes,
                       group_size=to_int(meta.get("Group size")), process_group=str(pg) if pg is not None else None,
                       seq=to_int(meta.get("Seq")))
        out.append(CollectiveRecord(coll=c, issue_track=issue_track, launch_known=launch is not None, kernel=kname,
                                    stream=int(t.track[r]), described=bool(meta) or op_name is not None))
    _infer_orphans(out)
    return out


def _infer_orphans(records: list[CollectiveRecord]) -> None:
    """Kernels launched before the trace began have no launch record, and generic kernel names
    (RCCL's ``ncclDevKernel_Generic``) say nothing. Take the kind of the correlated kernel with the
    same name on the same stream whose duration is closest (log scale); phase stays unknown."""
    known = [r for r in records if r.described]
    for rec in records:
        c = rec.coll
        if rec.described or c.issue_us is not None or kind_from_kernel(rec.kernel) not in (None, "other"):
            continue
        peers = [k for k in known if k.kernel == rec.kernel and k.stream == rec.stream]
        if not peers:
            continue
        d = math.log(max(c.duration_us, 1e-3))
        best = min(peers, key=lambda k: abs(math.log(max(k.coll.duration_us, 1e-3)) - d))
        c.kind = best.coll.kind
        c.raw_name = f"{rec.kernel.split('(')[0]} (kind inferred: no launch record)"
