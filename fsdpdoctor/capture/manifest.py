"""Facts about the live model for ``manifest.json`` (docs/manifest.md).

Everything here reads attributes of the wrapped model as it is when the
manifest is written; nothing is taken from the user's configuration. Private
torch attributes are read defensively (``getattr`` with a default) so a torch
version that renamed one yields ``null`` rather than an exception.
"""

from __future__ import annotations

import collections
from typing import Any

# Marker set on an FSDP2 state by the patched setters (see track_fsdp2_prefetch_calls):
# an explicit ``set_modules_to_backward_prefetch([])`` leaves the same empty list as
# "never set", so only a recorded call can tell the two apart.
BWD_MARK = "_fsdpdoctor_bwd_prefetch_set"
FWD_MARK = "_fsdpdoctor_fwd_prefetch_set"


def _enum_name(value) -> Any:
    if value is None:
        return None
    return getattr(value, "name", str(value))


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    return str(dtype).replace("torch.", "")


def _fsdp1_classes():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except Exception:  # pragma: no cover - torch without distributed
        return None
    return FullyShardedDataParallel


def _fsdp2_class():
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        try:
            from torch.distributed._composable.fsdp import FSDPModule  # older torch
        except Exception:
            return None
    return FSDPModule


def _ddp_class():
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:  # pragma: no cover
        return None
    return DistributedDataParallel


def _global_numel(p) -> int:
    # FSDP1 flat parameters are the local shard (padded); the unsharded size is private.
    unsharded = getattr(p, "_unpadded_unsharded_size", None)
    if unsharded is not None:
        try:
            return int(unsharded.numel())
        except Exception:
            pass
    return int(p.numel())  # DTensor (FSDP2): numel() is the global size


def describe_model(model, optimizer=None) -> dict:
    out = {"parameters": None, "trainable_parameters": None, "param_dtype": None,
           "param_bytes": None, "optimizer": type(optimizer).__name__ if optimizer is not None else None}
    if model is None:
        return out
    total = trainable = nbytes = 0
    by_dtype: collections.Counter = collections.Counter()
    for p in model.parameters():
        n = _global_numel(p)
        total += n
        if p.requires_grad:
            trainable += n
        nbytes += n * p.element_size()
        by_dtype[_dtype_name(p.dtype)] += n
    out.update(parameters=total, trainable_parameters=trainable, param_bytes=nbytes,
               param_dtype=by_dtype.most_common(1)[0][0] if by_dtype else None)
    return out


def _mp_dict(param_dtype, reduce_dtype, buffer_dtype=None, *, has_buffer=True) -> dict | None:
    if param_dtype is None and reduce_dtype is None and buffer_dtype is None:
        return None
    d = {"param_dtype": _dtype_name(param_dtype), "reduce_dtype": _dtype_name(reduce_dtype)}
    if has_buffer:
        d["buffer_dtype"] = _dtype_name(buffer_dtype)
    return d


def _describe_ddp(ddp) -> dict:
    cap = getattr(ddp, "bucket_bytes_cap", None)
    return {
        "kind": "ddp",
        "bucket_cap_mb": (cap / (1024 * 1024)) if cap is not None else None,
        "find_unused_parameters": getattr(ddp, "find_unused_parameters", None),
        "gradient_as_bucket_view": getattr(ddp, "gradient_as_bucket_view", None),
        "static_graph": getattr(ddp, "static_graph", None),
    }


def _describe_fsdp1(units: list) -> dict:
    root = units[0]
    mp = getattr(root, "mixed_precision", None)
    offload = getattr(root, "cpu_offload", None)
    return {
        "kind": "fsdp1",
        "sharding_strategy": _enum_name(getattr(root, "sharding_strategy", None)),
        "backward_prefetch": _enum_name(getattr(root, "backward_prefetch", None)),
        "forward_prefetch": getattr(root, "forward_prefetch", None),
        "limit_all_gathers": getattr(root, "limit_all_gathers", None),
        "mixed_precision": None if mp is None else _mp_dict(
            getattr(mp, "param_dtype", None), getattr(mp, "reduce_dtype", None),
            getattr(mp, "buffer_dtype", None)),
        "cpu_offload": None if offload is None else bool(getattr(offload, "offload_params", False)),
        "units": len(units),
    }


def _describe_fsdp2(model, fsdp_modules: list[tuple[str, Any]]) -> dict:
    state_to_fqn = {}
    states = []
    for fqn, mod in fsdp_modules:
        try:
            st = mod._get_fsdp_state()
        except Exception:
            st = None
        states.append((fqn, mod, st))
        if st is not None:
            state_to_fqn[id(st)] = fqn

    def names(lst):
        return [state_to_fqn.get(id(s), "?") for s in lst]

    mesh = None
    raf: dict = {}
    fwd: dict = {}
    bwd: dict = {}
    mp = None
    offload = None
    for fqn, _mod, st in states:
        if st is None:
            continue
        groups = list(getattr(st, "_fsdp_param_groups", None) or [])
        if groups:
            g = groups[0]
            mi = getattr(g, "mesh_info", None)
            if mesh is None and mi is not None:
                m = getattr(mi, "mesh", None)
                if m is not None:
                    mesh = {"shape": list(getattr(m, "shape", ()) or ()),
                            "dim_names": list(m.mesh_dim_names) if getattr(m, "mesh_dim_names", None) else None}
            pfmi = getattr(g, "post_forward_mesh_info", None)
            if pfmi is None:
                raf[fqn] = False
            elif mi is not None and pfmi == mi:
                raf[fqn] = True
            else:
                raf[fqn] = int(getattr(pfmi, "shard_mesh_size", 0)) or True
            if mp is None and getattr(g, "mp_policy", None) is not None:
                p = g.mp_policy
                mp = _mp_dict(getattr(p, "param_dtype", None), getattr(p, "reduce_dtype", None),
                              has_buffer=False)
            if offload is None and getattr(g, "offload_policy", None) is not None:
                offload = type(g.offload_policy).__name__ != "OffloadPolicy"
        f_list = list(getattr(st, "_states_to_forward_prefetch", None) or [])
        b_list = list(getattr(st, "_states_to_backward_prefetch", None) or [])
        if f_list or getattr(st, FWD_MARK, False):
            fwd[fqn] = names(f_list)
        if b_list or getattr(st, BWD_MARK, False):
            bwd[fqn] = names(b_list)
    return {
        "kind": "fsdp2",
        "mesh": mesh,
        "reshard_after_forward": raf,
        "forward_prefetch": fwd,
        "backward_prefetch": bwd,
        "mixed_precision": mp,
        "offload": offload,
        "units": len(fsdp_modules),
    }


def describe_wrapping(model) -> dict:
    """``wrapping`` section of the manifest, read from the live model."""
    if model is None:
        return {"kind": "none"}
    fsdp2 = _fsdp2_class()
    fsdp1 = _fsdp1_classes()
    ddp = _ddp_class()
    named = list(model.named_modules())
    if fsdp2 is not None:
        mods = [(fqn, m) for fqn, m in named if isinstance(m, fsdp2)]
        if mods:
            return _describe_fsdp2(model, mods)
    if fsdp1 is not None:
        units = [m for _fqn, m in named if isinstance(m, fsdp1)]
        if units:
            return _describe_fsdp1(units)
    if ddp is not None:
        for _fqn, m in named:
            if isinstance(m, ddp):
                return _describe_ddp(m)
    return {"kind": "none"}
