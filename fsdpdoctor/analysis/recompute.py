"""Activation recompute and host<->device copies of one rank: what checkpointing and CPU offload cost.

Recompute regions: non-reentrant ``torch.utils.checkpoint`` re-runs the forward inside backward under
its ``recompute_fn`` frame (stacks needed); the reentrant form runs it inside the
``CheckpointFunctionBackward`` op, before the nested backward of the recomputed graph (the nested
``autograd::engine::evaluate_function`` ops), which is cut out. On a device timeline the recompute
time is the union of the device work launched from those regions; on a CPU trace, the regions' host
time.

Copies: ``Memcpy HtoD`` / ``DtoH`` device events (ROCm: ``CopyHostToDevice`` / ``CopyDeviceToHost``);
exposed is the part under no kernel.
"""

from __future__ import annotations

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.breakdown import StepWindow
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.results import OffloadInfo, RecomputeInfo
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, KERNEL, MEMCPY, PYFUNC, distinct

_RECOMPUTE_FRAME = ("torch/utils/checkpoint.py", ": recompute_fn")
_REENTRANT_OP = "CheckpointFunctionBackward"
_NESTED_BACKWARD = "autograd::engine::evaluate_function:"
_H2D = ("HtoD", "CopyHostToDevice", "Host -> Device", "HostToDevice")
_D2H = ("DtoH", "CopyDeviceToHost", "Device -> Host", "DeviceToHost")
# FSDP's own scopes (FSDP2's hooks and FSDP1's private methods; not FSDP1's ``.forward``, which holds the
# user's module code): a copy launched inside one moves FSDP's parameters or gradients, i.e. CPU offload
_FSDP_SCOPES = ("FSDP::", "FullyShardedDataParallel._")


def recompute_regions(ctx: RankContext) -> tuple[np.ndarray, np.ndarray, str]:
    """(region rows, nested backward rows to cut out of them, how they were found)."""
    t = ctx.t
    frames = t.rows_named(lambda n: n.startswith(_RECOMPUTE_FRAME[0]) and n.endswith(_RECOMPUTE_FRAME[1]), cat=PYFUNC)
    if len(frames):
        return frames, np.empty(0, dtype=np.int64), "torch.utils.checkpoint recompute_fn frames"
    ops = t.rows_named(lambda n: n == _REENTRANT_OP, cat=CPU_OP)
    if len(ops):
        nested = t.rows_with_prefix(_NESTED_BACKWARD, cat=CPU_OP)
        return ops, nested, "CheckpointFunctionBackward ops minus their nested backward"
    return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), ""


def _region_set_by_track(ctx: RankContext, rows: np.ndarray, nested: np.ndarray) -> dict[int, np.ndarray]:
    t = ctx.t
    out = {}
    for tr in distinct(t.track[rows]):
        r = rows[t.track[rows] == tr]
        s = ctx.set_of(r)
        if len(nested):
            n = nested[(t.track[nested] == tr)]
            # only backward nested strictly inside a region (the region's own evaluate_function encloses it)
            inner = n[iv.overlap_each(t.ts[n], t.ts[n] + t.dur[n], s) >= t.dur[n] - 1e-6]
            inner = inner[~np.isin(t.ts[inner], t.ts[r])]
            s = iv.subtract(s, ctx.set_of(inner)) if len(inner) else s
        out[int(tr)] = s
    return out


def recompute(ctx: RankContext, windows: list[StepWindow]) -> RecomputeInfo | None:
    rows, nested, method = recompute_regions(ctx)
    if not len(rows) or not windows:
        return None
    t = ctx.t
    regions = _region_set_by_track(ctx, rows, nested)
    dev = ctx.device_rows
    if len(dev):
        # device work launched from inside a region of its launching thread
        launch = ctx.launch_rows(dev)
        known = launch >= 0
        launched, la = dev[known], launch[known]
        at, on = t.ts[la], t.track[la]
        picked = np.zeros(len(launched), dtype=bool)
        for tr, s in regions.items():
            mine = on == tr
            if len(s) and mine.any():
                picked[mine] = iv.contains(s, at[mine])
        work = ctx.set_of(launched[picked]) if picked.any() else iv.EMPTY
        busy = ctx.set_of(dev[t.cat[dev] == KERNEL])
    else:
        work = iv.union(*regions.values())
        busy = None
    per_step, frac_of_busy, nregions = [], [], 0
    for w in windows:
        per_step.append(iv.total(iv.clip(work, w.start, w.end)))
        nregions += int(np.sum((t.ts[rows] >= w.start) & (t.ts[rows] < w.end)))
        if busy is not None:
            frac_of_busy.append(iv.total(iv.clip(busy, w.start, w.end)))
    n = len(windows)
    step_us = sum(w.end - w.start for w in windows) / n
    mean = sum(per_step) / n
    busy_mean = sum(frac_of_busy) / n if frac_of_busy else None
    return RecomputeInfo(rank=t.rank, method=method, regions_per_step=nregions / n, recompute_us=mean,
                         recompute_frac=mean / step_us if step_us else 0.0,
                         compute_frac=mean / busy_mean if busy_mean else None)


def offload(ctx: RankContext, windows: list[StepWindow], manifest: dict | None) -> OffloadInfo | None:
    t = ctx.t
    cp = np.nonzero(t.cat == MEMCPY)[0]
    if not len(cp) or not windows:
        return None
    copy_ids = t.ids_in_categories(MEMCPY).tolist()  # the few memcpy names
    h2d_ids = [i for i in copy_ids if any(k in t.names[i] for k in _H2D)]
    d2h_ids = [i for i in copy_ids if any(k in t.names[i] for k in _D2H)]
    h2d = cp[np.isin(t.name_id[cp], h2d_ids)]
    d2h = cp[np.isin(t.name_id[cp], d2h_ids)]
    if not len(h2d) and not len(d2h):
        return None
    kernels = ctx.set_of(np.nonzero(t.cat == KERNEL)[0])
    hs, ds = ctx.set_of(h2d), ctx.set_of(d2h)
    copies = iv.union(hs, ds)
    exposed_set = iv.subtract(copies, kernels)
    n = len(windows)
    tot = {"h2d": 0.0, "d2h": 0.0, "exposed": 0.0, "count": 0}
    for w in windows:
        tot["h2d"] += iv.total(iv.clip(hs, w.start, w.end))
        tot["d2h"] += iv.total(iv.clip(ds, w.start, w.end))
        tot["exposed"] += iv.total(iv.clip(exposed_set, w.start, w.end))
    both = np.concatenate([h2d, d2h])
    in_steps = np.zeros(len(both), dtype=bool)
    for w in windows:
        in_steps |= (t.ts[both] >= w.start) & (t.ts[both] < w.end)
    # exposed copy time by the host phase that issued it
    by_phase: dict[str, float] = {}
    exp_each = (t.dur[both] - iv.overlap_each(t.ts[both], t.ts[both] + t.dur[both], kernels))[in_steps]
    for launch, e in zip(ctx.launch_rows(both[in_steps]).tolist(), exp_each):
        ph = ctx.phase_at(float(t.ts[launch])) if launch >= 0 else "other"
        by_phase[ph] = by_phase.get(ph, 0.0) + float(max(e, 0.0)) / n
    wrap = manifest.get("wrapping") if isinstance(manifest, dict) else None
    wrap = wrap if isinstance(wrap, dict) else {}
    configured = any(bool(wrap.get(k)) for k in ("cpu_offload", "offload", "offload_params", "offload_policy"))
    scopes = ctx.rows_prefix(_FSDP_SCOPES, (ANNOTATION, CPU_OP))
    by_fsdp = 0
    if len(scopes):
        for launch in ctx.launch_rows(both[in_steps]).tolist():
            if launch >= 0 and ctx.enclosing(scopes, int(t.track[launch]), float(t.ts[launch])) is not None:
                by_fsdp += 1
    return OffloadInfo(rank=t.rank, h2d_us=tot["h2d"] / n, d2h_us=tot["d2h"] / n, exposed_us=tot["exposed"] / n,
                       copies_per_step=float(in_steps.sum()) / n, offload_configured=configured, by_phase=by_phase,
                       fsdp_copies_per_step=by_fsdp / n)


def apply_offload_config(infos: list[OffloadInfo], manifest: dict | None) -> None:
    """Whether the wrapper was configured to offload (manifest), on each rank's copy facts."""
    wrap = manifest.get("wrapping") if isinstance(manifest, dict) else None
    wrap = wrap if isinstance(wrap, dict) else {}
    configured = any(bool(wrap.get(k)) for k in ("cpu_offload", "offload", "offload_params", "offload_policy"))
    for o in infos:
        o.offload_configured = configured
