"""The same model's breakdown under a hand-written loop, Lightning, LBFGS's closure and the HF Trainer.

    python benchmarks/bench_framework_phases.py [--rounds 3] [--active 5] [--loops plain lightning lbfgs]

Runs reference_jobs/frameworks.py (MLP-Mixer, DDP on 2 gloo ranks) once per loop per round, interleaved
so a change of the machine's load hits every loop alike, analyses each run and prints, per loop, the
mean step and each part's share of it (compute, optimizer, exposed communication, data, idle) with its
spread over the rounds, and the phase the gradient all-reduces were filed under. Shares, not
milliseconds: CPU step times on a shared machine move with the load; a phase charged to the wrong part
moves a share by tens of points, noise by a few.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("compute_us", "optimizer_us", "exposed_comm_us", "data_loading_us", "idle_us")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(loop: str, out: Path, active: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port()),
           str(ROOT / "reference_jobs" / "frameworks.py"), "--scenario", f"mixer_{loop}", "--out", str(out),
           "--wait", "1", "--warmup", "1", "--active", str(active)]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    doc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", str(out), "--json"], check=True,
                         capture_output=True, text=True, env=env).stdout
    a = json.loads(doc)
    m = a["mean"]
    shares = {p: m[p] / m["duration_us"] for p in PARTS}
    phases = sorted({(c["kind"], c["phase"]) for c in a["collectives"]})
    return {"step_ms": m["duration_us"] / 1000, "shares": shares, "phases": phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--active", type=int, default=5)
    ap.add_argument("--loops", nargs="*", default=["plain", "lightning", "lbfgs"])
    args = ap.parse_args()
    res: dict[str, list[dict]] = {lp: [] for lp in args.loops}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for lp in args.loops:
                res[lp].append(run(lp, Path(tmp) / f"{lp}{r}", args.active))
                print(f"round {r + 1} {lp}: step {res[lp][-1]['step_ms']:.0f} ms", file=sys.stderr, flush=True)
    head = "loop        step ms  " + "  ".join(f"{p[:-3]:>18s}" for p in PARTS)
    print(head)
    for lp, rs in res.items():
        cells = []
        for p in PARTS:
            v = [x["shares"][p] * 100 for x in rs]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):8.1f}% +-{sd:5.1f}   ")
        print(f"{lp:10s} {statistics.median(x['step_ms'] for x in rs):8.0f}  " + "  ".join(cells))
        print(f"{'':10s} collectives (kind, phase): {rs[0]['phases']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
