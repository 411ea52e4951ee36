"""Rewrite the timestamps of a copy of a bundled run (the original is only read)."""

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
        with gzip.open(dst / f.name, "wt") as fh:
            json.dump(d, fh)
    return dst
