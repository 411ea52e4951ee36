"""`fsdpdoctor memory`: predict per-rank model-state memory (and compare with a measured peak)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from fsdpdoctor.analysis import memory as mem
from fsdpdoctor.errors import InputError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "memory",
        help="predict per-rank model-state memory for DDP/ZeRO/FSDP (and compare with a measured peak)",
        description=(
            "Predict per-rank memory of weights, gradients, optimizer states and master weights for each "
            "sharding strategy. Give a model with --params..., or a RUN_FOLDER (manifest.json) to take the "
            "config from the run and compare with the measured peak when profile_memory was on. "
            "GB = 1e9 bytes; GiB = 2^30 bytes."),
    )
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
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


# ----------------------------------------------------------------- input parsing

def _count(flag: str, value) -> int:
    try:
        return mem.parse_param_count(value)
    except ValueError as exc:
        raise InputError(None, f"{flag}: {exc}") from None


def _posint(flag: str, value) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise InputError(None, f"{flag}: {value!r} is not an integer") from None
    if n < 1:
        raise InputError(None, f"{flag}: must be >= 1, got {n}")
    return n


def _activations(args) -> mem.ActivationSpec | None:
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
    return mem.ActivationSpec(**vals, heads=heads, checkpointing=args.activation_checkpointing)


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


def _read_trace(path: Path) -> dict:
    """The trace's allocator samples, read with the same loader (and errors) as ``analyze``."""
    from fsdpdoctor.trace.loader import load_file

    return {"traceEvents": load_file(path).memory_events}


def _rank_files(folder: Path, manifest: dict, notes: list[str]) -> dict[int, Path]:
    """Each rank's trace: as the manifest lists it (only names inside the run folder: a manifest is
    content, not a command line), else by file name."""
    from fsdpdoctor.trace.io import within

    files = manifest.get("files")
    out: dict[int, Path] = {}
    if isinstance(files, dict) and files:
        for k, v in files.items():
            try:
                rank = int(k)
            except ValueError:
                continue
            inside = within(folder, str(v))
            if inside is None:
                notes.append(f"rank {rank}: manifest names {str(v)!r}, outside the run folder: not read")
            else:
                out[rank] = inside
        return out
    for p in sorted(folder.glob("rank*.json*")):
        stem = p.name[4:].split(".", 1)[0]
        if stem.isdigit():
            out[int(stem)] = p
    return out


def measured(folder: Path, manifest: dict, devices: dict[str, str]) -> tuple[list[dict], list[str]]:
    """Per-rank measured peaks and notes; empty rows when profile_memory was off."""
    notes: list[str] = []
    opts = manifest.get("options") or {}
    if not opts.get("profile_memory"):
        notes.append("no measured peak: the run was captured with options.profile_memory=false")
        return [], notes
    rows = []
    kinds_seen = set()
    for rank, path in sorted(_rank_files(folder, manifest, notes).items()):
        if not path.is_file():
            notes.append(f"rank {rank}: trace {path.name} missing")
            continue
        peaks = mem.memory_peaks(_read_trace(path))
        device = devices.get(str(rank))
        chosen = mem.pick_device_peak(peaks, device)
        if chosen is None:
            notes.append(f"rank {rank}: trace has no [memory] events")
            continue
        kinds_seen.add(chosen.device_type)
        rows.append({"rank": rank, "device": device, **asdict(chosen),
                     "all_devices": [asdict(p) for p in peaks]})
    for k in sorted(kinds_seen):
        if k in mem.MEASURED_CAVEATS:
            notes.append(mem.MEASURED_CAVEATS[k])
    return rows, notes


# ----------------------------------------------------------------- run

def build_config(args) -> tuple[mem.MemoryConfig, list[str], Path | None, dict | None, dict[str, str]]:
    notes: list[str] = []
    folder = manifest = None
    devices: dict[str, str] = {}
    optimizer = _norm("--optimizer", mem.normalize_optimizer, args.optimizer) if args.optimizer else None
    if args.run_folder:
        folder = Path(args.run_folder)
        manifest, manifest_notes = _read_manifest(folder)
        try:
            mc = mem.config_from_manifest(manifest, optimizer=optimizer)
        except ValueError as exc:
            raise InputError(folder / "manifest.json", str(exc)) from None
        cfg, notes, devices = mc.config, manifest_notes + list(mc.notes), mc.devices
    else:
        if args.params is None:
            raise InputError(None, "give --params (e.g. --params 7B) or a RUN_FOLDER")
        cfg = mem.MemoryConfig(parameters=_count("--params", args.params), dtype="fp32",
                               optimizer=optimizer or "adamw")
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
    if folder is not None and over:
        notes.append("overridden from the command line: " + ", ".join(sorted(k for k in over if k != "activations")))
    cfg = replace(cfg, **over)
    return cfg, notes, folder, manifest, devices


def run(args) -> int:
    cfg, notes, folder, manifest, devices = build_config(args)
    try:
        est = mem.estimate(cfg)
        rows = mem.compare_strategies(cfg)
    except ValueError as exc:
        raise InputError(folder, str(exc)) from None
    sentences = mem.comparison_sentences(cfg, rows)
    meas_rows: list[dict] = []
    if folder is not None:
        meas_rows, meas_notes = measured(folder, manifest, devices)
        notes += meas_notes
        for r in meas_rows:
            r["predicted_model_state"] = est.model_state
            r["predicted_total"] = est.total
            r["ratio_to_predicted_total"] = r["peak_allocated"] / est.total if est.total else None
            r["covers_model_state"] = r["peak_allocated"] >= est.model_state

    if args.json:
        doc = {
            "run_folder": str(folder) if folder else None,
            "estimate": est.to_dict(),
            "comparison": [asdict(r) for r in rows],
            "comparison_sentences": sentences,
            "measured": meas_rows,
            "notes": notes,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    _print_rich(est, rows, sentences, meas_rows, notes, folder)
    return 0


def _print_rich(est: mem.MemoryEstimate, rows, sentences, meas_rows, notes, folder) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    cfg = est.config
    gb, gib = mem.fmt_gb, mem.fmt_gib
    head = (f"{cfg.parameters:,} params, {cfg.dtype}{' mixed precision' if cfg.mixed_precision else ''}, "
            f"{cfg.optimizer}, {est.strategy_label}{' + CPU offload' if cfg.cpu_offload else ''}, "
            f"world size {cfg.world_size}, shard group {est.shard_degree}")
    if folder is not None:
        head = f"{folder}: " + head
    t = Table(title=f"Per-rank memory prediction — {head}", caption="GB = 1e9 bytes, GiB = 2^30 bytes (MB = 1e6, MiB = 2^20)")
    for c in ("component", "B/param (unsharded)", "B/param on this rank", "per rank GB", "per rank GiB", "where"):
        t.add_column(c, justify="left" if c in ("component", "where") else "right")
    bpp, prb = est.bytes_per_param, est.per_rank_bytes_per_param
    host = est.host
    for name, key in (("weights", "weights"), ("gradients", "gradients"),
                      ("optimizer states", "optimizer_states"), ("master weights", "master_weights")):
        dev = getattr(est, key)
        h = getattr(host, key)
        where = "device" if not h else ("host" if not dev else "device+host")
        if not dev and not h:
            where = "-"
        shown = dev if dev else h
        t.add_row(name, f"{getattr(bpp, key):g}", f"{getattr(prb, key) + h / cfg.parameters:.3g}",
                  gb(shown), gib(shown), where)
    t.add_row("[bold]model state (device)[/]", f"{bpp.total:g}", f"{prb.total:.3g}",
              f"[bold]{gb(est.model_state)}[/]", gib(est.model_state), "device")
    if host.total:
        t.add_row("model state (host, offloaded)", "", "", gb(host.total), gib(host.total), "host")
    if est.peak_transient is not None:
        t.add_row("peak transient (largest unit)", "", "", gb(est.peak_transient), gib(est.peak_transient), "device")
    elif est.transient_applicable:
        t.add_row("peak transient (largest unit)", "", "", "not included", "", "")
    if est.activations is not None:
        a = est.activations.total_bytes
        t.add_row("activations (ESTIMATE)", "", "", gb(a), gib(a), "device")
    t.add_row("[bold]total (device)[/]", "", "", f"[bold]{gb(est.total)}[/]", gib(est.total), "device")
    console.print(t)

    c = Table(title="How the other strategies would change it (per rank)")
    for col in ("strategy", "shard group", "model state", "transient", "host", "vs current"):
        c.add_column(col, justify="left" if col == "strategy" else "right")
    cur = next(r for r in rows if r.current)
    for r in rows:
        delta = r.model_state - cur.model_state
        vs = "current" if r.current else (("+" if delta > 0 else "") + gb(delta))
        c.add_row(("[bold]" + r.label + "[/]") if r.current else r.label, str(r.shard_degree), gb(r.model_state),
                  gb(r.peak_transient) if r.peak_transient is not None else "-",
                  gb(r.host) if r.host else "-", vs)
    console.print(c)
    for s in sentences:
        console.print(f"  • {s}")

    if meas_rows:
        m = Table(title="Measured allocator peak vs prediction")
        for col in ("rank", "device", "start level", "peak allocated", "peak GiB", "predicted total", "peak/predicted"):
            m.add_column(col, justify="right")
        for r in meas_rows:
            dev = r["device_type"] + (f":{r['device_id']}" if r["device_type"] != "cpu" else "")
            ratio = r["ratio_to_predicted_total"]
            m.add_row(str(r["rank"]), dev, gb(r["start_allocated"]), gb(r["peak_allocated"]), gib(r["peak_allocated"]),
                      gb(r["predicted_total"]), f"{ratio:.2f}x" if ratio is not None else "-")
        console.print(m)

    console.print("[bold]Explanation[/]")
    for line in est.explanation:
        console.print(f"  {line}")
    if est.activations is not None:
        console.print(f"  activations: {est.activations.formula}")
        for n in est.activations.notes:
            console.print(f"    ({n})")
    console.print("[bold]Not included[/]: " + "; ".join(est.not_included))
    for n in notes:
        console.print(f"  note: {n}")
