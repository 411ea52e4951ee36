"""``fsdpdoctor memory``'s result: the prediction for one configuration, the other strategies
beside it and, for a run folder captured with ``profile_memory``, each rank's measured
allocator peak against the prediction."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fsdpdoctor.analysis import memory as mem
from fsdpdoctor.results.memory import MemoryConfig, MemoryReport
from fsdpdoctor.trace.io import within


def _read_trace(path: Path) -> dict:
    """The trace's allocator samples, read with the same loader (and errors) as ``analyze``."""
    from fsdpdoctor.trace.loader import allocator_samples, load_file

    return {"traceEvents": allocator_samples(load_file(path))}


def rank_files(folder: Path, manifest: dict, notes: list[str] | None = None) -> dict[int, Path]:
    """Each rank's trace: as the manifest lists it (only names inside the run folder: a manifest is
    content, not a command line; the others are named in ``notes``), else by file name."""
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
                if notes is not None:
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
    for rank, path in sorted(rank_files(folder, manifest, notes).items()):
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


def device_memory(devices: dict[str, str]) -> tuple[int | None, str | None]:
    """One device's memory as the manifest's device names state it ("cuda:0 (NVIDIA H100 80GB HBM3)":
    80 GB, read as 1e9 bytes, the lower reading); None where no name states it or the names differ."""
    import re

    found = [re.search(r"\b(\d+(?:\.\d+)?)\s?GB\b", name) for name in devices.values()]
    sizes = {m.group(1) for m in found if m}
    if not found or not all(found) or len(sizes) != 1:  # no name, a name without a size, or sizes that differ
        return None, None
    return int(float(sizes.pop()) * 1e9), f"the manifest's device, {next(iter(devices.values()))}"


def memory_report(cfg: MemoryConfig, notes: list[str] | None = None, folder: Path | None = None,
                  manifest: dict | None = None, devices: dict[str, str] | None = None,
                  device_bytes: int | None = None) -> MemoryReport:
    """The prediction for ``cfg``; with a run folder, each rank's measured peak beside it; whether the
    per-rank total fits one device (``device_bytes``, else the memory the manifest's device names state).
    Raises ValueError on a configuration the model cannot hold."""
    est = mem.estimate(cfg)
    rows = mem.compare_strategies(cfg)
    rep = MemoryReport(est, rows, mem.comparison_sentences(cfg, rows), notes=list(notes or []), run_folder=folder)
    if device_bytes:
        rep.device_bytes, rep.device_source = device_bytes, "--gpu-memory"
    else:
        rep.device_bytes, rep.device_source = device_memory(devices or {})
    if folder is not None and manifest is not None:
        rep.measured, meas_notes = measured(folder, manifest, devices or {})
        rep.notes += meas_notes
        for r in rep.measured:
            r["predicted_model_state"] = est.model_state
            r["predicted_total"] = est.total
            r["ratio_to_predicted_total"] = r["peak_allocated"] / est.total if est.total else None
            r["covers_model_state"] = r["peak_allocated"] >= est.model_state
    return rep
