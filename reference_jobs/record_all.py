"""Regenerate traces/<scenario>/ for every reference scenario, plus
traces/scaling_1proc and traces/scaling_2proc (ddp_default on 1 and 2 ranks), and traces/weak_{1,2,4}rank
(the same job on 1, 2 and 4 ranks).

    python reference_jobs/record_all.py [--out traces] [--only NAME ...] [--nproc 2]

Each folder gets manifest.json and rank<N>.json.gz (what it must and must not show is derived
from the scenario table: expectations.py). CPU/gloo here; CUDA/NCCL where available.
Schedule: wait 1, warmup 1, active 3 (FSDP2: active 2, its with_stack traces are
~4x larger; stragglers: active 4, so the verdict has several steps). Each scenario
runs its own script (train.py, hf_decoder.py, cnn.py, seq_encoder.py or moe.py).

Record on a machine as quiet as you can make it (CPU/gloo step times are shared-core
timings), e.g. ``nice -n -5 python reference_jobs/record_all.py --only hf_ddp``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scenarios import SCALING_RUNS, SCENARIOS  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def active_steps(name: str) -> int:
    sc = SCENARIOS[name]
    if sc.get("active"):
        return sc["active"]   # the scenario needs this window (a period seen twice in it)
    if sc.get("nproc", 2) > 2:
        return 3   # a mesh of 4 ranks: 4 traces; a straggler through it is decided per step over 3 steps
    # FSDP2 and activation checkpointing: their with_stack traces are several times larger
    if sc["wrap"] == "fsdp2" or sc["params"].get("act_ckpt", "none") != "none":
        return 2
    if sc["script"] == "lightning_metrics.py":
        return 6   # Lightning's stacks make large traces; a sync of a sixth of the step against the noise
    if sc["params"].get("metrics") == "step":
        return 8   # a sync's own time against the step-to-step noise of shared cores: more steps decide it
    if sc["params"].get("periodic", "none") != "none":
        return 4   # one period of the checkpoint (4) and of the evaluation (3) in the profiled steps
    if (name == "straggler" or sc["params"].get("straggler", "none") != "none" or sc["params"].get("delay_ms")
            or sc["params"].get("length_skew", 1.0) != 1.0 or sc["params"].get("token_skew", 1.0) != 1.0 or sc["params"].get("expert_skew", 1.0) != 1.0
            or sc["params"].get("collate_sleep_ms")):
        return 4
    return 3


def record(run_name: str, scenario: str, nproc: int, out_root: Path, tries: int = 2) -> float:
    out = out_root / run_name
    if out.exists():
        shutil.rmtree(out)
    scaling = run_name in SCALING_RUNS
    # scaling pair: more steps (CPU step times are noisy) and one thread per rank in both runs
    # (torchrun sets OMP_NUM_THREADS=1 only when it starts more than one process)
    active = 5 if scaling else active_steps(scenario)
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if scaling else None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", "0", str(HERE / SCENARIOS[scenario]["script"]), "--scenario", scenario,
           "--out", str(out), "--wait", "1", "--warmup", "1", "--active", str(active)]
    for attempt in range(tries):
        cmd[cmd.index("--master_port") + 1] = str(free_port())
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            break
        print(f"  {run_name}: attempt {attempt + 1} failed (rc {proc.returncode})\n{proc.stderr[-2000:]}",
              file=sys.stderr)
    else:
        raise SystemExit(f"{run_name}: failed")
    # no expected.json: what a recording must show is derived from the scenario table (expectations.py)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(f"{run_name:28s} {time.time() - t0:5.1f} s  {size:5.2f} MB", flush=True)
    return size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE.parent / "traces"))
    ap.add_argument("--only", nargs="*", default=None, help="scenario / scaling run names")
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    # a scenario that needs a mesh names its process count (hsdp_tokens.py: 4 ranks, a (2, 2) mesh)
    runs = [(n, n, SCENARIOS[n].get("nproc", args.nproc)) for n in SCENARIOS]
    runs += [(n, base, np_) for n, (base, np_) in SCALING_RUNS.items()]
    if args.only:
        unknown = set(args.only) - {r[0] for r in runs}
        if unknown:
            raise SystemExit(f"unknown: {sorted(unknown)}")
        runs = [r for r in runs if r[0] in args.only]
    total = sum(record(name, base, np_, out_root) for name, base, np_ in runs)
    print(f"total {total:.1f} MB in {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
