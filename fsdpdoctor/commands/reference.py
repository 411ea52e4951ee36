"""`fsdpdoctor reference list|run`: the reference scenarios (reference_jobs/).

`run` is a thin wrapper over
``python -m torch.distributed.run --nproc_per_node N --master_port P reference_jobs/<script> ...``
where the script is the scenario's (train.py, hf_decoder.py, cnn.py, seq_encoder.py or moe.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from fsdpdoctor.errors import InputError


def reference_dir() -> Path:
    import fsdpdoctor

    path = Path(fsdpdoctor.__file__).resolve().parents[1] / "reference_jobs"
    if not (path / "train.py").is_file() or not (path / "scenarios.py").is_file():
        raise InputError(None, "`fsdpdoctor reference` needs the source checkout: its jobs (reference_jobs/) "
                               "are not in an installed package; run it from a clone (pip install -e .)")
    return path


def load_scenarios() -> dict:
    path = reference_dir() / "scenarios.py"
    spec = importlib.util.spec_from_file_location("fsdpdoctor_reference_scenarios", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise InputError(path, f"cannot load the scenario table: {exc}") from exc
    return module.SCENARIOS


def free_port() -> int:
    import socket   # here and below: loaded when the verb runs, not by every start

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_command(name: str, args, script: str = "train.py") -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc_per_node", str(args.nproc), "--master_port", str(free_port()),
           str(reference_dir() / script), "--scenario", name, "--out", str(args.out)]
    for opt in ("steps", "wait", "warmup", "active", "slow_rank", "delay_ms"):
        val = getattr(args, opt, None)
        if val is not None:
            cmd += [f"--{opt.replace('_', '-')}", str(val)]
    if getattr(args, "no_stack", False):
        cmd.append("--no-stack")
    return cmd


def cmd_list(args) -> int:
    from fsdpdoctor.report.reference import render

    render(load_scenarios())
    return 0


def cmd_run(args) -> int:
    import subprocess
    import time

    scenarios = load_scenarios()
    if args.scenario not in scenarios:
        raise InputError(None, f"unknown scenario {args.scenario!r}; valid: {', '.join(scenarios)}")
    if args.nproc < 1:
        raise InputError(None, f"--nproc must be >= 1, got {args.nproc}")
    if importlib.util.find_spec("torch") is None:
        raise InputError(None, "torch is not installed (needed to run the reference jobs)")
    for attempt in (1, 2):
        started = time.time()
        script = scenarios[args.scenario].get("script", "train.py")
        # with several processes torchrun sets OMP_NUM_THREADS=1 itself and prints a banner saying so:
        # the same setting given first, without the banner (the capture's output is its own lines)
        env = ({**os.environ, "OMP_NUM_THREADS": "1"} if args.nproc > 1 and "OMP_NUM_THREADS" not in os.environ
               else None)
        proc = subprocess.run(build_command(args.scenario, args, script), env=env)  # a fresh port each attempt
        if proc.returncode == 0:
            return 0
        if _run_complete(Path(args.out), started):
            # gloo sometimes aborts at process exit ("terminate called without an active exception",
            # about 1 job in 20, with or without the profiler) after everything was written
            print(f"fsdpdoctor: warning: torchrun exited with status {proc.returncode} after the run folder "
                  f"{args.out} was complete; the traces are usable", file=sys.stderr)
            return 0
        if attempt == 1:
            print("fsdpdoctor: reference job failed; retrying once", file=sys.stderr)
    print(f"fsdpdoctor: error: reference job {args.scenario} failed: torchrun exited with "
          f"status {proc.returncode}", file=sys.stderr)
    return 1


def _run_complete(out: Path, since: float) -> bool:
    """manifest.json and a trace for every profiled rank were written by this attempt."""
    import json

    try:
        manifest = json.loads((out / "manifest.json").read_text())
        paths = [out / "manifest.json", *(out / name for name in manifest.get("files", {}).values())]
        return len(paths) > 1 and all(p.is_file() and p.stat().st_size > 0 and p.stat().st_mtime >= since - 1
                                      for p in paths)
    except (OSError, ValueError):
        return False


def register(p) -> None:
    p.description = __doc__
    sub = p.add_subparsers(dest="reference_cmd", metavar="{list,run}")
    p_list = sub.add_parser("list", help="table of scenarios: name, wrapping, what it injects")
    p_list.set_defaults(func=cmd_list)
    p_run = sub.add_parser("run", help="run one scenario under torchrun and capture its traces")
    p_run.add_argument("scenario", metavar="NAME")
    p_run.add_argument("--nproc", type=int, default=2, help="processes (ranks), default 2")
    p_run.add_argument("--out", required=True, help="run folder to write")
    p_run.add_argument("--steps", type=int, default=None)
    p_run.add_argument("--wait", type=int, default=None)
    p_run.add_argument("--warmup", type=int, default=None)
    p_run.add_argument("--active", type=int, default=None)
    p_run.add_argument("--slow-rank", type=int, default=None)
    p_run.add_argument("--delay-ms", type=float, default=None)
    p_run.add_argument("--no-stack", action="store_true")
    p_run.set_defaults(func=cmd_run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
