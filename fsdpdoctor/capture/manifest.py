"""Facts about the live model for ``manifest.json`` (docs/manifest.md).

Everything here reads attributes of the wrapped model as it is when the
manifest is written; nothing is taken from the user's configuration. Private
torch attributes are read defensively (``getattr`` with a default) so a torch
version that renamed one yields ``null`` rather than an exception.
"""

from __future__ import annotations

import collections
import functools
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


def _fsdp1_flat_params(model) -> list:
    """The FlatParameter of every FSDP1 unit (each once)."""
    fsdp1 = _fsdp1_classes()
    if fsdp1 is None:
        return []
    flat = {}
    for m in model.modules():
        if isinstance(m, fsdp1):
            fp = getattr(getattr(m, "_handle", None), "flat_param", None)
            if fp is not None:
                flat[id(fp)] = fp
    return list(flat.values())


def _count(params) -> tuple[int, int, int, collections.Counter]:
    """(total, trainable, bytes, numel by dtype) of (numel, requires_grad, element_size, dtype) rows."""
    total = trainable = nbytes = 0
    by_dtype: collections.Counter = collections.Counter()
    for n, requires_grad, size, dtype in params:
        total += n
        trainable += n if requires_grad else 0
        nbytes += n * size
        by_dtype[_dtype_name(dtype)] += n
    return total, trainable, nbytes, by_dtype


def _param_rows(model):
    """One row per original parameter with its full (unsharded) size.

    FSDP1 shards its units into flat parameters; with ``use_orig_params=True``
    ``model.parameters()`` yields the original parameters as views of this rank's
    shard (some empty), so their ``numel()`` is the local share. The flat
    parameter keeps every original shape (``_shapes``) and, with
    ``use_orig_params``, the original parameters (``_params``) for
    ``requires_grad``. Parameters no FSDP1 unit manages (ignored modules, DDP,
    FSDP2's DTensors whose ``numel()`` is global) count as they are.
    """
    managed = set()
    for fp in _fsdp1_flat_params(model):
        managed.add(id(fp))
        shapes = list(getattr(fp, "_shapes", None) or [])
        originals = list(getattr(fp, "_params", None) or [])
        managed.update(id(o) for o in originals)
        if not shapes:
            yield _global_numel(fp), fp.requires_grad, fp.element_size(), fp.dtype
            continue
        for i, shape in enumerate(shapes):
            requires_grad = originals[i].requires_grad if i < len(originals) else fp.requires_grad
            yield int(shape.numel()), requires_grad, fp.element_size(), fp.dtype
    for p in model.parameters():
        if id(p) not in managed:
            yield _global_numel(p), p.requires_grad, p.element_size(), p.dtype


def unwrap_optimizer(optimizer) -> tuple[Any, list[str]]:
    """(innermost optimizer, class names of the wrappers around it, outermost first).

    Accelerate's ``AcceleratedOptimizer`` (``.optimizer``) and Lightning's
    ``LightningOptimizer`` (``._optimizer``) wrap the optimizer that does the work.
    """
    wrappers = []
    opt = optimizer
    for _ in range(8):
        inner = None
        for attr in ("optimizer", "_optimizer"):
            cand = getattr(opt, attr, None)
            if cand is not None and cand is not opt and hasattr(cand, "param_groups"):
                inner = cand
                break
        if inner is None:
            break
        wrappers.append(type(opt).__name__)
        opt = inner
    return opt, wrappers


def describe_checkpointing(model) -> dict | None:
    """Activation checkpointing visible on the module tree, or None.

    ``checkpoint_wrapper`` / ``apply_activation_checkpointing`` leave
    ``CheckpointWrapper`` modules (``OffloadWrapper`` for activation offload);
    transformers' ``gradient_checkpointing_enable()`` sets
    ``gradient_checkpointing = True`` on the layers it recomputes. A
    ``torch.utils.checkpoint`` call inside a ``forward`` leaves no trace on the
    modules and is not seen here (the trace still shows the recompute).
    """
    if model is None:
        return None
    wrappers: collections.Counter = collections.Counter()
    impl = None
    hf_layers = hf_flagged = 0
    for m in model.modules():
        name = type(m).__name__
        if name in ("CheckpointWrapper", "OffloadWrapper"):
            wrappers[name] += 1
            impl = impl or _enum_name(getattr(m, "checkpoint_impl", None))
        elif getattr(m, "gradient_checkpointing", None) is True or getattr(m, "activation_checkpointing", None) is True:
            hf_flagged += 1
            # the layers that recompute (transformers >= 4.52 derive them from GradientCheckpointingLayer);
            # the stack module above them carries the flag too
            hf_layers += any(c.__name__ == "GradientCheckpointingLayer" for c in type(m).__mro__)
    if wrappers.get("CheckpointWrapper"):
        return {"method": "checkpoint_wrapper", "modules": wrappers["CheckpointWrapper"], "impl": impl}
    if hf_flagged:
        return {"method": "gradient_checkpointing", "modules": hf_layers or hf_flagged, "impl": None}
    if wrappers.get("OffloadWrapper"):
        return {"method": "offload_wrapper", "modules": wrappers["OffloadWrapper"], "impl": None}
    return None


def describe_model(model, optimizer=None) -> dict:
    inner, wrappers = unwrap_optimizer(optimizer) if optimizer is not None else (None, [])
    out = {"parameters": None, "trainable_parameters": None, "param_dtype": None,
           "param_bytes": None, "optimizer": type(inner).__name__ if inner is not None else None,
           "optimizer_wrappers": wrappers, "activation_checkpointing": None}
    if model is None:
        return out
    total, trainable, nbytes, by_dtype = _count(_param_rows(model))
    out.update(parameters=total, trainable_parameters=trainable, param_bytes=nbytes,
               param_dtype=by_dtype.most_common(1)[0][0] if by_dtype else None,
               activation_checkpointing=describe_checkpointing(model))
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


def _fsdp2_mesh(mesh_info) -> dict | None:
    m = getattr(mesh_info, "mesh", None) if mesh_info is not None else None
    if m is None:
        return None
    return {"shape": list(getattr(m, "shape", ()) or ()),
            "dim_names": list(m.mesh_dim_names) if getattr(m, "mesh_dim_names", None) else None}


def _fsdp2_reshard(group):
    """reshard_after_forward of one FSDP2 param group: False, True, or the size it reshards to."""
    mi = getattr(group, "mesh_info", None)
    pfmi = getattr(group, "post_forward_mesh_info", None)
    if pfmi is None:
        return False
    if mi is not None and pfmi == mi:
        return True
    return int(getattr(pfmi, "shard_mesh_size", 0)) or True


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
        if not groups and getattr(st, "_fsdp_param_group", None) is not None:
            groups = [st._fsdp_param_group]  # torch before the list of groups (one group per state)
        if groups:
            g = groups[0]
            mesh = mesh if mesh is not None else _fsdp2_mesh(getattr(g, "mesh_info", None))
            raf[fqn] = _fsdp2_reshard(g)
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


def track_fsdp2_prefetch_calls() -> bool:
    """Record explicit FSDP2 ``set_modules_to_{forward,backward}_prefetch`` calls.

    ``set_modules_to_backward_prefetch([])`` leaves the module state exactly as
    if it had never been called (an empty list, which FSDP2 treats as "use the
    default prefetch"), so the manifest can only report such a call if it was
    recorded. Call this before configuring the model; idempotent. Returns False
    when FSDP2 is not available.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        return False
    if getattr(FSDPModule, "_fsdpdoctor_tracked", False):
        return True

    def wrap(name: str, mark: str):
        orig = getattr(FSDPModule, name, None)
        if orig is None:
            return

        @functools.wraps(orig)
        def patched(self, modules, *args, **kwargs):
            result = orig(self, modules, *args, **kwargs)
            try:
                setattr(self._get_fsdp_state(), mark, True)
            except Exception:
                pass
            return result

        setattr(FSDPModule, name, patched)

    wrap("set_modules_to_backward_prefetch", BWD_MARK)
    wrap("set_modules_to_forward_prefetch", FWD_MARK)
