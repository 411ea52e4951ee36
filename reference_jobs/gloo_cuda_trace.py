"""Build a 2-rank "gloo with CUDA tensors" run, rank 1 sleeping in user code, from a real H100 recording.

    python reference_jobs/gloo_cuda_trace.py [--src traces/cuda/ddp_default] [--out traces/cuda_gloo_sleeper]
                                             [--sleep-ms 300]

No GPU is needed: the source is `traces/cuda/ddp_default` (DDP, world size 1, NCCL, recorded on an H100;
see traces/cuda/README.md). Each rank is a copy of its one rank with:

- the process group of a 2-rank job whose default group runs gloo for CUDA tensors (`distributedInfo`:
  backend gloo, world size 2, `cuda:gloo`);
- every `nccl:all_reduce` span turned into the `gloo:all_reduce` span a gloo worker thread records;
- on rank 1, a 300 ms `time.sleep` (`<built-in function sleep>` under a user frame) at the start of every
  step, everything after it shifted by the sleep; on rank 0 the first all-reduce of each step waits that
  long for it (its gloo span, and everything enclosing or after it, stretched or shifted by the same time).

Rank 1 gets its own pid (another process). What a fix of the backend (NCCL) would remove is the staging
through host memory; the others' wait for the sleeper stays.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLEEP = "<built-in function sleep>"
USER_FRAME = "train.py(212): slow_rank_work"
GLOO_TID = 987654


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                   and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _insert_gap(events: list[dict], at: float, gap: float, host_pid) -> None:
    """Open ``gap`` us at time ``at``: later events move, the host's events spanning ``at`` stretch (the
    process waits); device work already running when the host stops ends when it would have."""
    for e in events:
        ts = e.get("ts")
        if ts is None:
            continue
        ts = float(ts)
        if ts >= at:
            e["ts"] = ts + gap
        elif e.get("ph") == "X" and e.get("pid") == host_pid and ts + float(e.get("dur", 0)) > at:
            e["dur"] = float(e["dur"]) + gap


def build_rank(src: dict, rank: int, sleep_us: float) -> dict:
    d = json.loads(json.dumps(src))
    di = d["distributedInfo"]
    di.update(backend="gloo", rank=rank, world_size=2, pg_count=1)
    di.pop("nccl_version", None)
    di["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo",
                        "pg_size": 2, "ranks": [0, 1]}]
    ev = d["traceEvents"]
    main_pid = next(e["pid"] for e in _steps(ev))
    main_tid = next(e["tid"] for e in _steps(ev))
    for e in ev:
        if e.get("name") == "nccl:all_reduce" and e.get("ph") == "X":
            e.update(name="gloo:all_reduce", cat="cpu_op", tid=GLOO_TID)
    # last step first: a gap opened earlier moves the later insertion points with everything else
    for step in reversed(_steps(ev)):
        start, end = float(step["ts"]), float(step["ts"]) + float(step["dur"])
        if rank == 1:
            at = start + 1.0
            _insert_gap(ev, at, sleep_us, main_pid)
            frame = {"ph": "X", "cat": "python_function", "name": USER_FRAME, "pid": main_pid, "tid": main_tid,
                     "ts": at, "dur": sleep_us}
            ev += [frame, {**frame, "name": SLEEP, "ts": at + 0.5, "dur": sleep_us - 1.0}]
        else:
            first = min((e for e in ev if e.get("name") == "gloo:all_reduce" and start <= float(e["ts"]) < end),
                        key=lambda e: e["ts"], default=None)
            if first is not None:
                _insert_gap(ev, float(first["ts"]) + 1.0, sleep_us, main_pid)
    if rank == 1:
        for e in ev:
            if e.get("pid") == main_pid:
                e["pid"] = main_pid + 1
    d["trace_id"] = f"{d.get('trace_id', '')}-rank{rank}"
    return d


def build(src_dir: Path, out: Path, sleep_ms: float = 300.0) -> Path:
    src = json.loads(gzip.open(src_dir / "rank0.json.gz").read())
    out.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        with gzip.open(out / f"rank{r}.json.gz", "wt") as fh:
            json.dump(build_rank(src, r, sleep_ms * 1e3), fh)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "traces" / "cuda" / "ddp_default"))
    ap.add_argument("--out", default=str(ROOT / "traces" / "cuda_gloo_sleeper"))
    ap.add_argument("--sleep-ms", type=float, default=300.0)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    build(Path(args.src), out, args.sleep_ms)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
