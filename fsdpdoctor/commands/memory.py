"""`fsdpdoctor memory`: predict per-rank model-state memory (and compare with a measured peak)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fsdpdoctor.commands.base import add_output, print_json
from fsdpdoctor.errors import InputError

if TYPE_CHECKING:
    from fsdpdoctor.results.memory import ActivationSpec, MemoryConfig


def register(p) -> None:
    p.description = ("Predict per-rank memory of weights, gradients, optimizer states and master weights for each "
                     "sharding strategy. Give a model with --params..., or a RUN_FOLDER (manifest.json) to take the "
                     "config from the run and compare with the measured peak when profile_memory was on. "
                     "GB = 1e9 bytes; GiB = 2^30 bytes.")
    p.add_argument("run_folder", nargs="?", metavar="RUN_FOLDER", help="run folder with manifest.json")
    # numbers are parsed by us (not argparse types) so bad values give one-line errors
    p.add_argument("--params", help="parameter count: 7B, 350M, 13e9, 125000000")
    p.add_argument("--trainable-params", help="trainable parameter count (default: all)")
    p.add_argument("--dtype", help="training dtype of weights and gradients: fp32, bf16, fp16 (default fp32)")
    p.add_argument("--optimizer", help="adamw, adam, sgd, sgd-momentum, adafactor (default adamw)")
    p.add_argument("--optimizer-state-dtype", help="fp32 (default for --params) or param (torch.optim: states in "
                                                    "the param dtype; default for a run folder)")
    p.add_argument("--mixed-precision", action="store_true",
                   help="16-bit working weights/grads + fp32 master weights and fp32 optimizer states")
    p.add_argument("--world-size", help="number of ranks (default 1)")
    p.add_argument("--strategy", help="ddp|zero0|no_shard, zero1, zero2|shard_grad_op, zero3|full_shard, "
                                      "hybrid_shard, hybrid_shard_zero2 (default ddp)")
    p.add_argument("--gpus-per-node", help="ranks per node: HYBRID_SHARD shards within a node")
    p.add_argument("--cpu-offload", action="store_true", help="offload params/grads/optimizer states to host")
    p.add_argument("--largest-unit-params", help="parameter count of the biggest FSDP unit (transient peak)")
    p.add_argument("--layers", help="transformer layers (activation estimate)")
    p.add_argument("--hidden", help="hidden size")
    p.add_argument("--seq", help="sequence length")
    p.add_argument("--micro-batch", help="micro-batch size per rank")
    p.add_argument("--heads", help="attention heads (default hidden/128)")
    p.add_argument("--activation-checkpointing", action="store_true", help="full activation recomputation")
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="one device's memory, e.g. 80GB or 80GiB: say whether the per-rank total fits "
                        "(default: the memory the manifest's device name states, where it does)")
    add_output(p, "the prediction")
    p.set_defaults(func=run)


# ----------------------------------------------------------------- input parsing

def _count(flag: str, value) -> int:
    from fsdpdoctor.analysis import memory as mem  # loaded by this verb only: every other verb starts without it
    try:
        return mem.parse_param_count(value)
    except ValueError as exc:
        raise InputError(None, f"{flag}: {exc}") from None


def _size(value: str | None) -> int | None:
    """--gpu-memory: 80GB (1e9 bytes), 80GiB (2^30), 80e9 (bytes)."""
    import re

    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*(GB|GiB|TB|TiB|MB|MiB|B)?\s*", value, re.I)
    units = {"": 1, "b": 1, "mb": 1e6, "mib": 2**20, "gb": 1e9, "gib": 2**30, "tb": 1e12, "tib": 2**40}
    n = int(float(m.group(1)) * units[(m.group(2) or "").lower()]) if m else 0
    if n <= 0:
        raise InputError(None, f"--gpu-memory: cannot read {value!r} (use e.g. 80GB or 80GiB)")
    return n


def _posint(flag: str, value) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise InputError(None, f"{flag}: {value!r} is not an integer") from None
    if n < 1:
        raise InputError(None, f"{flag}: must be >= 1, got {n}")
    return n


def _activations(args) -> ActivationSpec | None:
    from fsdpdoctor.results.memory import ActivationSpec
    shape = {"layers": args.layers, "hidden": args.hidden, "seq": args.seq, "micro_batch": args.micro_batch}
    given = {k: v for k, v in shape.items() if v is not None}
    if not given:
        if args.heads is not None or args.activation_checkpointing:
            raise InputError(None, "activation estimate needs --layers --hidden --seq --micro-batch")
        return None
    missing = [f"--{k.replace('_', '-')}" for k, v in shape.items() if v is None]
    if missing:
        raise InputError(None, f"activation estimate needs {' '.join(missing)} too")
    vals = {k: _posint(f"--{k.replace('_', '-')}", v) for k, v in shape.items()}
    heads = _posint("--heads", args.heads) if args.heads is not None else None
    return ActivationSpec(**vals, heads=heads, checkpointing=args.activation_checkpointing)


def _norm(flag: str, fn, value):
    try:
        return fn(value)
    except ValueError as exc:
        raise InputError(None, f"{flag}: {exc}") from None


def _state_dtype(value) -> str:
    v = str(value).strip().lower()
    if v in ("param", "params", "same"):
        return "param"
    if v in ("fp32", "float32"):
        return "fp32"
    raise InputError(None, f"--optimizer-state-dtype: {value!r} is not fp32 or param")


def _read_manifest(folder: Path) -> tuple[dict, list[str]]:
    """The run folder's manifest, validated by the one reader every verb uses (fields of the wrong
    type are dropped with a note; this verb needs a manifest, so an unusable one is an input error)."""
    from fsdpdoctor.trace.manifest import read_manifest

    if not folder.exists():
        raise InputError(folder, "no such directory")
    if not folder.is_dir():
        raise InputError(folder, "not a directory (expected a run folder with manifest.json)")
    doc, notes = read_manifest(folder)
    if doc is None:
        raise InputError(folder / "manifest.json", notes[0] if notes else "no manifest.json (not a run folder)")
    return doc, notes


# ----------------------------------------------------------------- run

def _base_config(args, optimizer: str | None) -> tuple[MemoryConfig, list[str], Path | None, dict | None,
                                                       dict[str, str]]:
    """The configuration before the command-line overrides: the run folder's manifest, or --params
    with the defaults (fp32, AdamW, DDP, one rank)."""
    from fsdpdoctor.analysis import memory as mem
    from fsdpdoctor.results.memory import MemoryConfig
    if not args.run_folder:
        if args.params is None:
            raise InputError(None, "give --params (e.g. --params 7B) or a RUN_FOLDER")
        cfg = MemoryConfig(parameters=_count("--params", args.params), dtype="fp32", optimizer=optimizer or "adamw")
        return cfg, [], None, None, {}
    folder = Path(args.run_folder)
    manifest, manifest_notes = _read_manifest(folder)
    try:
        mc = mem.config_from_manifest(manifest, optimizer=optimizer)
    except ValueError as exc:
        raise InputError(folder / "manifest.json", str(exc)) from None
    return mc.config, manifest_notes + list(mc.notes), folder, manifest, mc.devices


def _overrides(args, optimizer: str | None) -> dict:
    """The MemoryConfig fields the command line sets (they win over the manifest's), each flag read
    into a one-line error when it is bad."""
    from fsdpdoctor.analysis import memory as mem
    over: dict = {}
    if args.params is not None:
        over["parameters"] = _count("--params", args.params)
    if args.trainable_params is not None:
        over["trainable_parameters"] = _count("--trainable-params", args.trainable_params)
    if args.dtype is not None:
        over["dtype"] = _norm("--dtype", mem.normalize_dtype, args.dtype)
    if optimizer:
        over["optimizer"] = optimizer
    if args.optimizer_state_dtype is not None:
        over["optimizer_state_dtype"] = _state_dtype(args.optimizer_state_dtype)
    if args.mixed_precision:
        over["mixed_precision"] = True
    if args.world_size is not None:
        over["world_size"] = _posint("--world-size", args.world_size)
    if args.strategy is not None:
        over["strategy"] = _norm("--strategy", mem.normalize_strategy, args.strategy)
    if args.gpus_per_node is not None:
        over["gpus_per_node"] = _posint("--gpus-per-node", args.gpus_per_node)
    if args.cpu_offload:
        over["cpu_offload"] = True
    if args.largest_unit_params is not None:
        over["largest_unit_params"] = _count("--largest-unit-params", args.largest_unit_params)
    act = _activations(args)
    if act is not None:
        over["activations"] = act
    return over


def build_config(args) -> tuple[MemoryConfig, list[str], Path | None, dict | None, dict[str, str]]:
    from fsdpdoctor.analysis import memory as mem
    optimizer = _norm("--optimizer", mem.normalize_optimizer, args.optimizer) if args.optimizer else None
    cfg, notes, folder, manifest, devices = _base_config(args, optimizer)
    over = _overrides(args, optimizer)
    if folder is not None and over:
        notes.append("overridden from the command line: " + ", ".join(sorted(k for k in over if k != "activations")))
    from dataclasses import replace   # loaded when the verb runs, not by every start

    cfg = replace(cfg, **over)
    return cfg, notes, folder, manifest, devices


def run(args) -> int:
    from fsdpdoctor.analysis.memory_run import memory_report

    cfg, notes, folder, manifest, devices = build_config(args)
    try:
        rep = memory_report(cfg, notes, folder, manifest, devices, device_bytes=_size(args.gpu_memory))
    except ValueError as exc:
        raise InputError(folder, str(exc)) from None
    from fsdpdoctor.report.memory import document, render

    if args.json:
        print_json(document(rep))
    else:
        render(rep)
    return 0
