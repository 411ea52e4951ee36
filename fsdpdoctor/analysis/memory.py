"""Per-rank model-state memory prediction for DDP / ZeRO / FSDP.

Pure functions over typed dataclasses; no torch. Units: bytes everywhere;
``GB`` means 1e9 bytes (decimal, as in the ZeRO paper), ``GiB`` 2**30.

Accounting (per parameter, before sharding):

* weights        = bytes of the training dtype (fp32 4, bf16/fp16 2)
* gradients      = same dtype as the weights
* master weights = 4 (fp32 copy) only with mixed precision (16-bit training dtype)
* optimizer      = states/param x state bytes (AdamW/Adam 2, SGD+momentum 1,
                   SGD 0, Adafactor ~0.01 as its second moment is factored)

Known answers: fp32 AdamW 4+4+8 = 16 B/param; bf16 weights+grads with fp32
Adam m,v 2+2+8 = 12 B/param (7B -> 84 GB); mixed precision 2+2+4+8 = 16
(the ZeRO paper's "2+2+K, K=12").

Sharding (D = shard group size): ZeRO-1 shards optimizer states and master
weights, ZeRO-2 also gradients, ZeRO-3 also weights. HYBRID_SHARD is ZeRO-3
inside a node (D = GPUs per node) and replicates across nodes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from fsdpdoctor.results.memory import (
    GB, ActivationEstimate, ActivationSpec, BytesPerParam, DevicePeak, GiB, HostMemory, MemoryConfig,
    MemoryEstimate, StrategyRow,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16", "torch.float16": "fp16",
}

# optimizer -> (states per parameter, description)
OPTIMIZERS = {
    "adamw": (2.0, "AdamW: exp_avg (m) and exp_avg_sq (v)"),
    "adam": (2.0, "Adam: exp_avg (m) and exp_avg_sq (v)"),
    "sgd-momentum": (1.0, "SGD with momentum: one momentum buffer"),
    "sgd": (0.0, "plain SGD: no state"),
    "adafactor": (0.01, "Adafactor: factored second moment, O(rows+cols) per matrix, counted as ~0.01 states/param (no momentum)"),
}
_OPTIMIZER_ALIASES = {
    "adamw": "adamw", "adam": "adam", "sgd": "sgd", "sgd-momentum": "sgd-momentum",
    "sgd_momentum": "sgd-momentum", "sgdm": "sgd-momentum", "momentum": "sgd-momentum",
    "adafactor": "adafactor", "fusedadam": "adam", "fusedadamw": "adamw",
}

STRATEGY_LABELS = {
    "ddp": "DDP / NO_SHARD (ZeRO-0)",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2 / SHARD_GRAD_OP",
    "zero3": "ZeRO-3 / FULL_SHARD",
    "hybrid_shard": "HYBRID_SHARD",
    "hybrid_shard_zero2": "_HYBRID_SHARD_ZERO2",
}
_STRATEGY_ALIASES = {
    "ddp": "ddp", "zero0": "ddp", "no_shard": "ddp", "noshard": "ddp", "none": "ddp",
    "zero1": "zero1", "zero-1": "zero1",
    "zero2": "zero2", "zero-2": "zero2", "shard_grad_op": "zero2",
    "zero3": "zero3", "zero-3": "zero3", "full_shard": "zero3", "fsdp": "zero3", "fsdp2": "zero3",
    "hybrid_shard": "hybrid_shard", "hybrid": "hybrid_shard", "hsdp": "hybrid_shard",
    "hybrid_shard_zero2": "hybrid_shard_zero2", "_hybrid_shard_zero2": "hybrid_shard_zero2",
}
# which model-state pieces each strategy shards
_SHARDS = {
    #                      weights gradients optimizer master
    "ddp":                (False, False, False, False),
    "zero1":              (False, False, True, True),
    "zero2":              (False, True, True, True),
    "zero3":              (True, True, True, True),
    "hybrid_shard":       (True, True, True, True),
    "hybrid_shard_zero2": (False, True, True, True),
}

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


# ----------------------------------------------------------------- parsing

def parse_param_count(text) -> int:
    """``7B`` -> 7e9, ``350M``, ``13e9``, ``1.3b``, ``125_000_000``, ``1,000``. Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"parameter count {text!r} is not a number")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).replace("_", "").replace(",", "")
        m = _COUNT_RE.match(s)
        if not m:
            raise ValueError(f"cannot parse parameter count {text!r} (use e.g. 7B, 350M, 13e9, 125000000)")
        value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"parameter count must be positive, got {text!r}")
    return int(round(value))


def normalize_dtype(name) -> str:
    key = str(name).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {name!r} (use fp32, bf16 or fp16)")
    return _DTYPE_ALIASES[key]


def normalize_optimizer(name) -> str:
    key = str(name).strip().lower().replace(" ", "")
    if key not in _OPTIMIZER_ALIASES:
        raise ValueError(f"unknown optimizer {name!r} (use adamw, adam, sgd, sgd-momentum or adafactor)")
    return _OPTIMIZER_ALIASES[key]


def normalize_strategy(name) -> str:
    key = str(name).strip().lower().replace(" ", "")
    if key.startswith("shardingstrategy."):
        key = key[len("shardingstrategy."):]
    if key not in _STRATEGY_ALIASES:
        raise ValueError(
            f"unknown strategy {name!r} (use ddp, zero1, zero2, zero3, no_shard, shard_grad_op, full_shard, hybrid_shard)")
    return _STRATEGY_ALIASES[key]


# ----------------------------------------------------------------- core

def _validate(cfg: MemoryConfig) -> MemoryConfig:
    if cfg.parameters <= 0:
        raise ValueError(f"parameter count must be positive, got {cfg.parameters}")
    dtype = normalize_dtype(cfg.dtype)
    optimizer = normalize_optimizer(cfg.optimizer)
    strategy = normalize_strategy(cfg.strategy)
    if cfg.world_size < 1:
        raise ValueError(f"world size must be >= 1, got {cfg.world_size}")
    if cfg.gpus_per_node is not None and cfg.gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be >= 1, got {cfg.gpus_per_node}")
    if cfg.mixed_precision and dtype == "fp32":
        raise ValueError("mixed precision needs a 16-bit training dtype (bf16 or fp16); "
                         "with fp32 weights there is no separate master copy")
    if cfg.optimizer_state_dtype not in ("fp32", "param"):
        raise ValueError(f"optimizer state dtype must be fp32 or param, got {cfg.optimizer_state_dtype!r}")
    trainable = cfg.parameters if cfg.trainable_parameters is None else cfg.trainable_parameters
    if trainable < 0 or trainable > cfg.parameters:
        raise ValueError(f"trainable parameters ({trainable}) must be between 0 and parameters ({cfg.parameters})")
    if cfg.largest_unit_params is not None and not (0 < cfg.largest_unit_params <= cfg.parameters):
        raise ValueError(f"largest unit ({cfg.largest_unit_params}) must be between 1 and parameters ({cfg.parameters})")
    return replace(cfg, dtype=dtype, optimizer=optimizer, strategy=strategy, trainable_parameters=trainable)


def shard_degree(strategy: str, world_size: int, gpus_per_node: int | None) -> int:
    strategy = normalize_strategy(strategy)
    if strategy == "ddp":
        return 1
    if strategy.startswith("hybrid"):
        return max(1, min(gpus_per_node or world_size, world_size))
    return world_size


def bytes_per_param(cfg: MemoryConfig) -> BytesPerParam:
    """Unsharded bytes per (trainable) parameter for each piece of model state."""
    cfg = _validate(cfg)
    w = DTYPE_BYTES[cfg.dtype]
    states, _ = OPTIMIZERS[cfg.optimizer]
    if cfg.mixed_precision:
        state_bytes = 4  # mixed precision: optimizer runs on the fp32 master copy
    else:
        state_bytes = 4 if cfg.optimizer_state_dtype == "fp32" else w
    return BytesPerParam(weights=w, gradients=w, optimizer_states=states * state_bytes,
                         master_weights=4 if cfg.mixed_precision else 0)


def estimate_activations(spec: ActivationSpec, dtype: str = "bf16", mixed_precision: bool = False) -> ActivationEstimate:
    """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models":
    per layer s*b*h*(34 + 5*a*s/h) bytes for 16-bit activations, no tensor/sequence parallelism,
    no recomputation. With full activation checkpointing only the layer input (2*s*b*h bytes) is
    kept per layer, plus one layer's full activations while it is recomputed in backward."""
    for name in ("layers", "hidden", "seq", "micro_batch"):
        if getattr(spec, name) <= 0:
            raise ValueError(f"activation estimate: {name.replace('_', '-')} must be positive")
    s, b, h, L = spec.seq, spec.micro_batch, spec.hidden, spec.layers
    a = spec.heads if spec.heads else max(1, h // 128)
    if a <= 0:
        raise ValueError("activation estimate: heads must be positive")
    full_layer = s * b * h * (34 + 5 * a * s / h)
    notes = ["estimate, not a measurement: Korthikanti et al. 2022, 16-bit activations, "
             "1-byte dropout masks, no tensor/sequence parallelism"]
    if spec.heads is None:
        notes.append(f"heads not given: assumed hidden/128 = {a}")
    scale = 1.0
    if normalize_dtype(dtype) == "fp32" and not mixed_precision:
        scale = 2.0
        notes.append("fp32 training without autocast: 16-bit figure doubled (approximate)")
    notes.append("attention scores (the 5*a*s/h term) are not stored with flash/memory-efficient attention")
    if spec.checkpointing:
        per_layer = 2 * s * b * h * scale
        total = per_layer * L + full_layer * scale
        formula = (f"checkpointing: 2*s*b*h per layer x {L} layers + one layer recomputed "
                   f"s*b*h*(34+5*a*s/h)  (s={s}, b={b}, h={h}, a={a})")
    else:
        per_layer = full_layer * scale
        total = per_layer * L
        formula = f"s*b*h*(34 + 5*a*s/h) per layer x {L} layers  (s={s}, b={b}, h={h}, a={a})"
    return ActivationEstimate(per_layer_bytes=int(round(per_layer)), total_bytes=int(round(total)),
                              heads=a, formula=formula, notes=notes)


def _accounting_explanation(cfg: MemoryConfig, bpp: BytesPerParam, D: int) -> list[str]:
    """The explanation's first lines: what each byte per parameter holds and what the strategy shards."""
    N, T = cfg.parameters, cfg.trainable_parameters
    states, opt_desc = OPTIMIZERS[cfg.optimizer]
    state_dtype = "fp32" if (cfg.mixed_precision or cfg.optimizer_state_dtype == "fp32") else cfg.dtype
    explanation = [
        f"{N:,} parameters ({T:,} trainable); weights {bpp.weights:g} B ({cfg.dtype}), "
        f"gradients {bpp.gradients:g} B ({cfg.dtype}), optimizer {bpp.optimizer_states:g} B "
        f"({opt_desc}; {states:g} x {state_dtype}), master weights {bpp.master_weights:g} B"
        f" = {bpp.total:g} bytes/param before sharding."]
    if cfg.mixed_precision:
        explanation.append(f"mixed precision: {cfg.dtype} working weights and gradients, fp32 master weights and "
                           f"fp32 optimizer states (ZeRO paper 2+2+K accounting).")
    elif cfg.dtype != "fp32" and state_dtype == "fp32":
        explanation.append(f"{cfg.dtype} weights and gradients with fp32 optimizer states, no fp32 master copy. "
                           f"(torch.optim keeps states in the param dtype: use --optimizer-state-dtype param "
                           f"for pure {cfg.dtype} torch.optim.{'AdamW' if cfg.optimizer == 'adamw' else cfg.optimizer}.)")
    if cfg.strategy == "ddp":
        explanation.append("every rank holds a full replica of weights, gradients and optimizer states.")
    else:
        pieces = [n for n, s in zip(("weights", "gradients", "optimizer states", "master weights"),
                                    _SHARDS[cfg.strategy]) if s and (n != "master weights" or cfg.mixed_precision)]
        scope = (f"within each node of {D} ranks, replicated across {max(1, math.ceil(cfg.world_size / D))} nodes"
                 if cfg.strategy.startswith("hybrid") else f"across {D} ranks")
        explanation.append(f"{STRATEGY_LABELS[cfg.strategy]}: {', '.join(pieces)} sharded {scope}.")
        if cfg.strategy.startswith("hybrid") and cfg.gpus_per_node is None:
            explanation.append("GPUs per node not given: shard group = world size (same as FULL_SHARD).")
    if cfg.strategy == "zero2":
        explanation.append("SHARD_GRAD_OP keeps full parameters from forward through backward, so peak memory "
                           "holds unsharded weights like ZeRO-2 (they are resharded after backward).")
    return explanation


def _peak_transient(cfg: MemoryConfig, bpp: BytesPerParam, D: int, explanation: list[str],
                    not_included: list[str]) -> tuple[int | None, bool]:
    """(bytes, applicable): FSDP's transient unsharded memory for the largest unit, with a line saying
    what it holds; where it applies but the unit is not given, it is named as not included."""
    applicable = cfg.strategy in ("zero2", "zero3", "hybrid_shard", "hybrid_shard_zero2") and D > 1
    if not applicable:
        return None, applicable
    U = cfg.largest_unit_params
    if not U:
        not_included.append("peak transient unsharded parameters/gradients of the largest FSDP unit "
                            "(pass --largest-unit-params)")
        return None, applicable
    if _SHARDS[cfg.strategy][0]:   # sharded weights: the unit is all-gathered, then its gradients produced
        tw = U * bpp.weights * (1 - 1 / D) if not cfg.cpu_offload else U * bpp.weights
        transient = int(round(tw + U * bpp.gradients))
        explanation.append(
            f"peak transient: the largest unit ({U:,} params) is all-gathered to full "
            f"{cfg.dtype} parameters and produces full gradients before reduce-scatter "
            f"(+{transient / GB:.2f} GB; backward prefetch can hold a second unit).")
    else:
        transient = int(round(U * bpp.gradients))
        explanation.append(
            f"peak transient: the largest unit's ({U:,} params) unsharded gradients before "
            f"reduce-scatter (+{transient / GB:.2f} GB).")
    return transient, applicable


def estimate(cfg: MemoryConfig) -> MemoryEstimate:
    """Per-rank device (and host) memory for one configuration."""
    cfg = _validate(cfg)
    bpp = bytes_per_param(cfg)
    D = shard_degree(cfg.strategy, cfg.world_size, cfg.gpus_per_node)
    sh_w, sh_g, sh_o, sh_m = _SHARDS[cfg.strategy]
    N = cfg.parameters
    T = cfg.trainable_parameters

    def part(count: int, per: float, sharded: bool) -> int:
        n = math.ceil(count / D) if (sharded and D > 1) else count  # FSDP pads flat params to a multiple of D
        return int(round(n * per))

    weights = part(N, bpp.weights, sh_w)
    grads = part(T, bpp.gradients, sh_g)
    opt = part(T, bpp.optimizer_states, sh_o)
    master = part(T, bpp.master_weights, sh_m)

    explanation = _accounting_explanation(cfg, bpp, D)
    not_included: list[str] = []
    label = STRATEGY_LABELS[cfg.strategy]

    host = HostMemory()
    if cfg.cpu_offload:
        offload_w = sh_w  # weights needed unsharded for compute stay on device unless the strategy shards them
        host = HostMemory(weights=weights if offload_w else 0, gradients=grads,
                          optimizer_states=opt, master_weights=master)
        weights = 0 if offload_w else weights
        grads = opt = master = 0
        moved = "sharded weights, gradients, optimizer states" if offload_w else "gradients, optimizer states"
        if cfg.mixed_precision:
            moved += ", master weights"
        explanation.append(f"CPU offload: {moved} live in host memory ({host.total / GB:.2f} GB per rank); "
                           f"the optimizer step runs on CPU.")
        if not offload_w:
            explanation.append("weights stay on device: this strategy needs the full parameters for compute.")

    transient, applicable = _peak_transient(cfg, bpp, D, explanation, not_included)
    if cfg.strategy == "ddp" and cfg.world_size > 1:
        not_included.append("DDP gradient buckets (an extra copy of the gradients unless gradient_as_bucket_view=True)")

    act = None
    if cfg.activations is not None:
        act = estimate_activations(cfg.activations, cfg.dtype, cfg.mixed_precision)
    else:
        not_included.append("activations (pass --layers --hidden --seq --micro-batch for an estimate)")
    not_included += ["temporaries and workspace (optimizer step, loss, logits)", "communication buffers (NCCL)",
                     "allocator fragmentation / reserved-but-free cache", "CUDA context (~0.3-1 GB per GPU)"]

    per_rank_bpp = BytesPerParam(weights=weights / N, gradients=grads / N,
                                 optimizer_states=opt / N, master_weights=master / N)
    return MemoryEstimate(config=cfg, strategy_label=label, shard_degree=D, bytes_per_param=bpp,
                          per_rank_bytes_per_param=per_rank_bpp, weights=weights, gradients=grads,
                          optimizer_states=opt, master_weights=master, host=host,
                          peak_transient=transient, transient_applicable=applicable, activations=act,
                          explanation=explanation, not_included=not_included)


def compare_strategies(cfg: MemoryConfig) -> list[StrategyRow]:
    """Every strategy's per-rank memory for the same model, dtype, optimizer and world size."""
    cfg = _validate(cfg)
    variants: list[tuple[str, bool]] = [(s, cfg.cpu_offload) for s in ("ddp", "zero1", "zero2", "zero3")]
    gpn = cfg.gpus_per_node
    if gpn and 1 < gpn < cfg.world_size or cfg.strategy.startswith("hybrid"):
        variants += [("hybrid_shard", cfg.cpu_offload), ("hybrid_shard_zero2", cfg.cpu_offload)]
    other = (cfg.strategy, not cfg.cpu_offload)
    variants.append(other)
    if not cfg.cpu_offload and ("zero3", True) not in variants:
        variants.append(("zero3", True))
    rows = []
    seen = set()
    for strategy, offload in variants:
        if (strategy, offload) in seen:
            continue
        seen.add((strategy, offload))
        e = estimate(replace(cfg, strategy=strategy, cpu_offload=offload))
        rows.append(StrategyRow(strategy=strategy, label=STRATEGY_LABELS[strategy] + (" + CPU offload" if offload else ""),
                                cpu_offload=offload, shard_degree=e.shard_degree, model_state=e.model_state,
                                peak_transient=e.peak_transient, total=e.total, host=e.host.total,
                                current=(strategy == cfg.strategy and offload == cfg.cpu_offload)))
    return rows


def comparison_sentences(cfg: MemoryConfig, rows: list[StrategyRow] | None = None) -> list[str]:
    rows = rows if rows is not None else compare_strategies(cfg)
    cur = next(r for r in rows if r.current)
    out = []
    for r in rows:
        if r.current:
            continue
        verb = "cut" if r.model_state < cur.model_state else ("raise" if r.model_state > cur.model_state else "keep")
        extra = f" (host {fmt_gb(r.host)})" if r.host else ""
        if verb == "keep":
            out.append(f"{r.label} would keep model state at {fmt_gb(cur.model_state)} per rank{extra}")
        else:
            out.append(f"{r.label} would {verb} model state from {fmt_gb(cur.model_state)} to "
                       f"{fmt_gb(r.model_state)} per rank{extra}")
    return out


def _fmt(n: float | None, big: float, big_unit: str, small: float, small_unit: str) -> str:
    if n is None:
        return "-"
    if abs(n) >= 0.1 * big or n == 0:
        return f"{n / big:.2f} {big_unit}"
    return f"{n / small:.2f} {small_unit}"


def fmt_gb(n: float | None) -> str:
    """Decimal units: GB (1e9) from 0.1 GB up, MB (1e6) below."""
    return _fmt(n, GB, "GB", 1e6, "MB")


def fmt_gib(n: float | None) -> str:
    """Binary units: GiB (2^30) from 0.1 GiB up, MiB (2^20) below."""
    return _fmt(n, GiB, "GiB", 2**20, "MiB")


# ----------------------------------------------------------------- run folders

_MANIFEST_OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd", "adafactor": "adafactor",
                        "fusedadam": "adam", "fusedadamw": "adamw"}


@dataclass(frozen=True)
class ManifestConfig:
    config: MemoryConfig
    notes: list[str]
    wrapping_kind: str
    devices: dict[str, str]


def _manifest_model(model: dict, optimizer: str | None, notes: list[str]) -> tuple[int, int | None, str, str]:
    """The model section: parameter counts, dtype and optimizer, each an error naming its key when the
    prediction cannot do without it (``optimizer`` given on the command line skips the manifest's)."""
    n = model.get("parameters")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"model.parameters is {n!r}; pass --params")
    trainable = model.get("trainable_parameters")
    if not isinstance(trainable, int) or isinstance(trainable, bool) or not 0 <= trainable <= n:
        trainable = None
    dtype = model.get("param_dtype")
    if dtype is None:
        raise ValueError("model.param_dtype is null; pass --dtype")
    dtype = normalize_dtype(dtype)
    if optimizer is None:
        raw = model.get("optimizer")
        key = str(raw).strip().lower() if raw is not None else None
        if key not in _MANIFEST_OPTIMIZERS:
            raise ValueError(f"model.optimizer is {raw!r}, not one of AdamW, Adam, SGD, Adafactor; pass --optimizer")
        optimizer = _MANIFEST_OPTIMIZERS[key]
        if optimizer == "sgd":
            notes.append("manifest says SGD: counted without momentum (pass --optimizer sgd-momentum if momentum was set)")
    return n, trainable, dtype, optimizer


def _ranks_per_host(hosts) -> int | None:
    """The most ranks on one host: GPUs per node, HYBRID_SHARD's shard group (None without hosts)."""
    if not isinstance(hosts, dict) or not hosts:
        return None
    per_host: dict[str, int] = {}
    for h in hosts.values():
        per_host[str(h)] = per_host.get(str(h), 0) + 1
    return max(per_host.values())


def _fsdp2_strategy(wrapping: dict, gpn: int | None, notes: list[str]) -> tuple[str, int | None]:
    """FSDP2's strategy from its mesh and reshard_after_forward: a 2-D mesh is HSDP whose last dim is
    the shard group; never resharding after forward is ZeRO-2."""
    mesh = wrapping.get("mesh") or {}
    shape = mesh.get("shape") if isinstance(mesh, dict) else None
    raf = wrapping.get("reshard_after_forward") or {}
    vals = list(raf.values()) if isinstance(raf, dict) else [raf]
    no_reshard = bool(vals) and all(v is False for v in vals)
    if any(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        notes.append("reshard_after_forward=int: parameters are resharded to a smaller group between forward "
                     "and backward; counted as fully sharded at rest")
    if isinstance(shape, list) and len(shape) == 2:
        gpn = int(shape[-1])
        notes.append(f"FSDP2 2-D mesh {shape}: replicate x shard (HSDP), shard group {gpn}")
        return ("hybrid_shard_zero2" if no_reshard else "hybrid_shard"), gpn
    return ("zero2" if no_reshard else "zero3"), gpn


def _wrapping_strategy(kind: str, wrapping: dict, n: int, gpn: int | None,
                       notes: list[str]) -> tuple[str, bool, int | None]:
    """(strategy, CPU offload, shard group per node) from the manifest's wrapping section."""
    if kind in ("none", "ddp"):
        if kind == "ddp" and wrapping.get("gradient_as_bucket_view") is False:
            notes.append("DDP with gradient_as_bucket_view=False keeps gradient buckets besides .grad: "
                         "expect about one more gradient copy than predicted")
        return "ddp", False, gpn
    if kind == "fsdp1":
        strategy = normalize_strategy(wrapping.get("sharding_strategy") or "FULL_SHARD")
        co = wrapping.get("cpu_offload")
        offload = bool(co.get("offload_params")) if isinstance(co, dict) else bool(co)
        units = wrapping.get("units")
        if isinstance(units, int) and units > 0 and strategy != "ddp":
            notes.append(f"{units} FSDP units: average unit {n / units:,.0f} params; the largest unit is not in the "
                         f"manifest (pass --largest-unit-params for the transient peak)")
        return strategy, offload, gpn
    if kind == "fsdp2":
        strategy, gpn = _fsdp2_strategy(wrapping, gpn, notes)
        return strategy, bool(wrapping.get("offload")), gpn
    raise ValueError(f"wrapping.kind is {kind!r}, not one of none, ddp, fsdp1, fsdp2")


def _fsdp_mixed_precision(kind: str, wrapping: dict, dtype: str, notes: list[str]) -> tuple[bool, str]:
    """(mixed precision, training dtype): FSDP's 16-bit param_dtype over fp32 parameters keeps the fp32
    shards as master weights, which is mixed precision in the ZeRO accounting."""
    mp = wrapping.get("mixed_precision") if kind in ("fsdp1", "fsdp2") else None
    if not (isinstance(mp, dict) and mp.get("param_dtype")):
        return False, dtype
    mp_dtype = normalize_dtype(mp["param_dtype"])
    if mp_dtype == "fp32" or dtype != "fp32":
        return False, dtype
    notes.append(f"{'FSDP' if kind == 'fsdp1' else 'FSDP2'} mixed precision: fp32 sharded parameters "
                 f"act as master weights, {mp_dtype} unsharded copies for compute "
                 "(same 16 B/param total)")
    return True, mp_dtype


def config_from_manifest(manifest: dict, *, optimizer: str | None = None) -> ManifestConfig:
    """Map a run-folder manifest (docs/manifest.md) onto a MemoryConfig. Raises ValueError
    naming the manifest key when something needed is missing (caller may override)."""
    notes: list[str] = []
    n, trainable, dtype, optimizer = _manifest_model(manifest.get("model") or {}, optimizer, notes)
    ws = manifest.get("world_size")
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        raise ValueError(f"world_size is {ws!r}")
    wrapping = manifest.get("wrapping") or {}
    kind = str(wrapping.get("kind") or "none").lower()
    strategy, offload, gpn = _wrapping_strategy(kind, wrapping, n, _ranks_per_host(manifest.get("hosts") or {}),
                                                notes)
    mixed, dtype = _fsdp_mixed_precision(kind, wrapping, dtype, notes)
    if kind == "none" and ws > 1:
        notes.append("wrapping.kind is none: every rank holds a full replica")
    notes.append("optimizer states counted in the parameter dtype, as torch.optim allocates them")
    cfg = MemoryConfig(parameters=n, dtype=dtype, optimizer=optimizer, mixed_precision=mixed, strategy=strategy,
                       world_size=ws, gpus_per_node=gpn, cpu_offload=offload, optimizer_state_dtype="param",
                       trainable_parameters=trainable)
    devices = manifest.get("devices") or {}
    return ManifestConfig(config=cfg, notes=notes, wrapping_kind=kind,
                          devices={str(k): str(v) for k, v in devices.items()} if isinstance(devices, dict) else {})


DEVICE_TYPES = {0: "cpu", 1: "cuda"}


def memory_peaks(doc) -> list[DevicePeak]:
    """Peaks from a torch.profiler chrome trace (parsed JSON) recorded with profile_memory=True:
    instant events named ``[memory]`` carrying ``Total Allocated``, ``Bytes``, ``Device Type``,
    ``Device Id``. One row per device; empty when the trace has none."""
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else (doc if isinstance(doc, list) else [])
    acc: dict[tuple, list] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        a = e.get("args")
        if not isinstance(a, dict):
            continue
        total = a.get("Total Allocated")
        if not isinstance(total, (int, float)):
            continue
        dt = a.get("Device Type")
        key = (DEVICE_TYPES.get(dt, f"type{dt}"), int(a.get("Device Id", -1) or 0) if dt != 0 else -1)
        delta = a.get("Bytes") if isinstance(a.get("Bytes"), (int, float)) else 0
        reserved = a.get("Total Reserved") if isinstance(a.get("Total Reserved"), (int, float)) else None
        ts = e.get("ts", 0)
        st = acc.get(key)
        if st is None:
            # [peak, first_ts, start level, last_ts, end level, peak reserved, count]
            acc[key] = [total, ts, total - delta, ts, total, reserved, 1]
            continue
        st[0] = max(st[0], total)
        if ts < st[1]:
            st[1], st[2] = ts, total - delta
        if ts >= st[3]:
            st[3], st[4] = ts, total
        if reserved is not None:
            st[5] = reserved if st[5] is None else max(st[5], reserved)
        st[6] += 1
    return [DevicePeak(device_type=k[0], device_id=k[1], peak_allocated=int(v[0]), start_allocated=int(v[2]),
                       end_allocated=int(v[4]), peak_reserved=None if v[5] is None else int(v[5]), events=v[6])
            for k, v in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1]))]


def pick_device_peak(peaks: list[DevicePeak], device: str | None) -> DevicePeak | None:
    """The peak for the rank's training device (manifest ``devices``: "cpu", "cuda", "cuda:3")."""
    if not peaks:
        return None
    if device:
        d = device.lower()
        kind, _, idx = d.partition(":")
        cands = [p for p in peaks if p.device_type == kind]
        if idx.isdigit():
            exact = [p for p in cands if p.device_id == int(idx)]
            cands = exact or cands
        if cands:
            return max(cands, key=lambda p: p.peak_allocated)
    cuda = [p for p in peaks if p.device_type == "cuda"]
    return max(cuda or peaks, key=lambda p: p.peak_allocated)


MEASURED_CAVEATS = {
    "cuda": ("CUDA 'Total Allocated' is the caching allocator's allocated bytes on the device, including "
             "tensors created before profiling; it adds activations, temporaries and communication buffers to "
             "the model state, and excludes reserved-but-free cache and the CUDA context"),
    "cpu": ("CPU 'Total Allocated' only counts allocations made while a profiler with profile_memory=True was "
            "recording in this process (it starts at 0, or at what earlier profiled windows left); tensors created "
            "before profiling (model weights, optimizer states from earlier steps) are invisible and their frees "
            "ignored, so a CPU peak is comparable to the prediction only if the model was built inside the window"),
}
