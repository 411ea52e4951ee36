"""Rewrite the timestamps of a copy of a bundled run (the original is only read).

The copies are written as one string at gzip level 1: ``json.dump`` into a gzip stream took 4x the CPU
of ``json.dumps``, and level 9 9x the CPU of level 1 (0.88 s against 0.10 s for a 17 MB trace); the
bytes read back are the same."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path


def rewrite_times(src: Path, dst: Path, scale: float = 1.0, shift_us: float = 0.0,
                  ranks: set[int] | None = None) -> Path:
    """Copy run folder ``src`` to ``dst``; in the rank files chosen (all by default) every event's
    ``ts`` becomes ``ts * scale + shift_us`` and ``dur`` becomes ``dur * scale``; a shifted rank gets
    its own host name (the job identity checks allow clock skew between hosts only)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".json.gz"):
            shutil.copy(f, dst / f.name)
            continue
        rank = int(f.name.removeprefix("rank").split(".")[0])
        if ranks is not None and rank not in ranks:
            shutil.copy(f, dst / f.name)
            continue
        d = json.loads(gzip.open(f).read())
        if shift_us and d.get("host_name"):
            # processes on one host share one clock: a rank whose clock is off ran on another host
            d["host_name"] = f"{d['host_name']}-shifted"
        for e in d["traceEvents"]:
            if "ts" in e:
                e["ts"] = float(e["ts"]) * scale + shift_us
            if "dur" in e:
                e["dur"] = float(e["dur"]) * scale
        with gzip.open(dst / f.name, "wt", compresslevel=1) as fh:
            fh.write(json.dumps(d))
    return dst


def split_cycles(src: Path, dst: Path, first_steps: int, gap_us: float, names: tuple[str, str] | None = None) -> list[Path]:
    """Two profiler cycles of one process from one trace file: the events of its first ``first_steps``
    ProfilerSteps go to one file, the rest to another whose clock is shifted ``gap_us`` later (the time
    the profiler waited between cycles). Device work and flow arrows follow the runtime call that
    launched them (by correlation id), so a kernel that ran after its step stays in its cycle."""
    d = json.loads(gzip.open(src).read() if str(src).endswith(".gz") else Path(src).read_bytes())
    ev = d["traceEvents"]
    steps = sorted((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("cat") in ("user_annotation", "cpu_op", "Operator")), key=lambda e: e["ts"])
    cut = float(steps[first_steps]["ts"])
    host_step_ts = {e["name"]: float(e["ts"]) for e in steps}  # a step's device-side annotation goes with it
    launch_ts = {}
    for e in ev:
        if e.get("cat") in ("Runtime", "cuda_runtime") and "correlation" in (e.get("args") or {}):
            launch_ts[e["args"]["correlation"]] = float(e["ts"])
    parts: tuple[list, list] = ([], [])
    for e in ev:
        if e.get("ph") == "M" or "ts" not in e:
            parts[0].append(e)
            parts[1].append(dict(e))
            continue
        corr = (e.get("args") or {}).get("correlation", e.get("id") if e.get("ph") in ("s", "f") else None)
        t = host_step_ts.get(e.get("name"), launch_ts.get(corr, float(e["ts"])))
        if t < cut:
            parts[0].append(e)
        else:
            e = dict(e)
            e["ts"] = float(e["ts"]) + gap_us
            parts[1].append(e)
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for part, name in zip(parts, names or ("cycle1.pt.trace.json.gz", "cycle2.pt.trace.json.gz")):
        doc = {k: v for k, v in d.items() if k != "traceEvents"}
        doc["traceEvents"] = part
        with gzip.open(dst / name, "wt", compresslevel=1) as fh:
            fh.write(json.dumps(doc))
        out.append(dst / name)
    return out


def rename_comm_kernels(src: Path, dst: Path, new_name, strip_host: bool = True) -> Path:
    """Copy trace file ``src`` to ``dst`` with every NCCL kernel renamed ``new_name(old_name)``; with
    ``strip_host`` the trace's own description of them goes too (the kernels' collective arguments and
    the c10d / record_param_comms / nccl: host ops around their launches, renamed to a neutral op), as
    a library outside NCCL leaves them: only the kernel's name and stream are left to go by."""
    d = json.loads(gzip.open(src).read())
    for e in d["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("cat") in ("kernel", "Kernel") and name.lower().startswith(("nccl", "rccl")):
            e["name"] = new_name(name)
            if strip_host and isinstance(e.get("args"), dict):
                e["args"] = {k: v for k, v in e["args"].items() if k in ("correlation", "stream", "device",
                                                                         "External id", "grid", "block")}
        elif strip_host and (name.startswith(("c10d::", "nccl:", "_c10d_functional::")) or name == "record_param_comms"):
            e["name"] = "user_op"
            e.pop("args", None)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=1) as fh:
        fh.write(json.dumps(d))
    return dst


def stretch_steps(src: Path, dst: Path, extra_us: float | dict[int, float]) -> Path:
    """Copy run folder ``src`` to ``dst`` with ``extra_us`` of nothing at the end of each profiled step of
    every rank (or ``extra_us[step number]``, 0 for a step not named): the step annotation ends that much later
    and every event starting after it moves on by the time added so far, so the job gains idle time per
    step and nothing else (as a job that started waiting on something outside the trace would)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".json.gz"):
            shutil.copy(f, dst / f.name)
            continue
        d = json.loads(gzip.open(f).read())
        ev = d["traceEvents"]
        marks = sorted((e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                        and e.get("cat") in ("user_annotation", "cpu_op", "Operator")), key=lambda e: e["ts"])
        ends, added, total = [], [], 0.0
        for m in marks:
            extra = extra_us.get(int(m["name"].split("#")[1]), 0.0) if isinstance(extra_us, dict) else extra_us
            total += extra
            ends.append(float(m["ts"]) + float(m["dur"]))
            added.append(total)
            m["dur"] = float(m["dur"]) + extra
        for e in ev:
            if "ts" not in e or e in marks:
                continue
            ts = float(e["ts"])
            done = [a for end, a in zip(ends, added) if ts >= end]
            if done:
                e["ts"] = ts + done[-1]
        for m in marks:  # a step starting after an earlier step's end moves on too
            ts = float(m["ts"])
            done = [a for end, a in zip(ends, added) if ts >= end]
            if done:
                m["ts"] = ts + done[-1]
        with gzip.open(dst / f.name, "wt", compresslevel=1) as fh:
            fh.write(json.dumps(d))
    return dst
