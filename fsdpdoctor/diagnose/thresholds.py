"""The one table of diagnosis thresholds, with where each default comes from.

Override with ``--threshold name=value`` (a trailing % divides by 100) or
``--config FILE`` (JSON or TOML: ``{"thresholds": {"name": value}}`` or a flat
mapping).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fsdpdoctor.errors import InputError


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    unit: str
    meaning: str
    source: str


THRESHOLDS: list[Threshold] = [
    Threshold("exposed_comm_frac", 0.10, "share of step",
              "exposed (not overlapped) communication per step above which it is a finding",
              "rule of thumb: HTA's comm/comp overlap guidance; below 10% of step, other costs dominate"),
    Threshold("exposed_comm_error_frac", 0.25, "share of step", "exposed communication share that makes it an error",
              "our choice: a quarter of every step waiting on the network"),
    Threshold("overlap_low_frac", 0.50, "share of comm", "comm/compute overlap below which 'low overlap' is reported "
              "(GPU traces; with exposed comm above exposed_comm_frac)", "HTA get_comm_comp_overlap; our choice of 50%"),
    Threshold("input_bound_frac", 0.05, "share of step", "data loading not hidden by compute: moderately input-bound",
              "XProf/TensorBoard input-pipeline analyzer: >5% moderately input-bound"),
    Threshold("input_bound_high_frac", 0.20, "share of step", "highly input-bound",
              "XProf/TensorBoard input-pipeline analyzer: >20% highly input-bound"),
    Threshold("straggler_frac", 0.25, "share of step", "median over steps of the longest wait of the other ranks "
              "for the slowest one in a single collective (GPU traces)",
              "fsdp-signatures.md §11f: injected 300 ms delays 0.30-0.59, healthy runs at most 0.215"),
    Threshold("straggler_frac_cpu", 0.45, "share of step", "the same on CPU/gloo traces, where gloo spans on "
              "shared cores jitter", "bundled 2-rank traces: other scenarios at most 0.15 (median over steps) on a "
              "quiet machine and 0.36 while other jobs loaded the cores; injected 300 ms straggler 0.83"),
    Threshold("straggler_consistency", 0.75, "share of steps", "the same rank must be slowest in this share of steps",
              "fsdp-signatures.md §11f: injected rank last in 6/6 steps; healthy runs alternate"),
    Threshold("host_sync_per_step", 1, "calls per step", "user-code host syncs (.item(), synchronize) per step",
              "PyTorch performance tuning guide: avoid unnecessary CPU-GPU synchronization"),
    Threshold("small_message_bytes", 1 << 20, "bytes", "messages below this are latency-bound",
              "nccl-tests curves: bus bandwidth saturates only in the MB range"),
    Threshold("latency_bound_per_step", 20, "calls per step", "small collectives per step (per rank) that make "
              "a latency-bound pattern", "our choice; bucket/coalesce above this"),
    Threshold("low_busbw_gbps", 20.0, "GB/s", "bus bandwidth of large (>= 16 MB) GPU collectives below which it "
              "is reported", "nccl-tests on 25 GB/s (200 Gb/s) IB and much faster NVLink"),
    Threshold("ddp_tiny_buckets_per_backward", 8, "all-reduces per backward", "many small DDP buckets",
              "DDP default bucket_cap_mb=25 gives a few buckets for models under 1B params"),
    Threshold("ddp_tiny_bucket_bytes", 2e6, "bytes", "mean bucket size below which buckets are 'tiny'",
              "DDP's first bucket is 1 MB by design; 25 MB default afterwards"),
    Threshold("ddp_single_bucket_overlap", 0.10, "share of comm", "overlap below which one bucket per backward means "
              "no overlap", "fsdp-signatures.md §5.2: one 1000 MB bucket overlaps 0.01-0.02, default 0.23-0.30"),
    Threshold("forward_exposed_frac", 0.02, "share of step", "exposed forward all-gather share above which "
              "forward prefetch (when off) is suggested", "our choice: below 2% of a step the saving is within "
              "step-to-step noise"),
    Threshold("scaling_efficiency_low", 0.80, "ratio", "scaling efficiency below which it is a finding",
              "common practice: data-parallel scaling above 80-90% is expected"),
    Threshold("hang_busy_runnable_share", 0.50, "share of the window", "`fsdpdoctor hang`: a stalled rank's main "
              "thread runnable (on a CPU or in the run queue) this share of the 0.2 s sampling window is spinning (a "
              "busy loop); below it, it is blocked", "a spinning thread is runnable all the time however loaded the "
              "machine (0.999 measured on 2 cores shared by 7 jobs), a waiting one almost never (0.03 with a 10 ms "
              "sleep loop); half separates them"),
]

BY_NAME = {t.name: t for t in THRESHOLDS}


def defaults() -> dict[str, float]:
    return {t.name: t.default for t in THRESHOLDS}


def resolve(overrides: dict[str, float] | None) -> dict[str, float]:
    values = defaults()
    for k, v in (overrides or {}).items():
        if k not in BY_NAME:
            raise InputError(None, f"unknown threshold {k!r} (known: {', '.join(sorted(BY_NAME))})")
        values[k] = float(v)
    return values


def parse_assignment(item: str) -> tuple[str, float]:
    if "=" not in item:
        raise InputError(None, f"--threshold expects NAME=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    k, v = k.strip(), v.strip()
    try:
        value = float(v[:-1]) / 100 if v.endswith("%") else float(v)
    except ValueError:
        raise InputError(None, f"--threshold {k}: {v!r} is not a number") from None
    if k not in BY_NAME:
        raise InputError(None, f"unknown threshold {k!r} (known: {', '.join(sorted(BY_NAME))})")
    return k, value


def load_overrides(path: str | Path) -> dict[str, float]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(path, f"cannot read config: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise InputError(path, f"cannot parse config ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(path, "config must be a mapping of threshold names to numbers")
    data = data.get("thresholds", data)
    out = {}
    for k, v in data.items():
        if k not in BY_NAME or not isinstance(v, (int, float)):
            raise InputError(path, f"bad threshold entry {k!r}: {v!r}")
        out[k] = float(v)
    return out
