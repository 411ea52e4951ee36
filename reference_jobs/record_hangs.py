"""Run the hanging reference scenarios under torchrun and keep their dumps:
traces/<scenario>/ gets manifest.json, rank<N>.json.gz (the profiled steps before the fault),
hang/rank<N>.json (the watchdog's dumps); the expected verdict stays in hang_scenarios.py.

    python reference_jobs/record_hangs.py [--out traces] [--only hang_loader ...]

The launcher is what ends a hung job: it waits until every rank that can dump has dumped (or
the job ended by itself), then kills torchrun's whole process group. The watchdog itself never
kills anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hang_scenarios import HANG_SCENARIOS, HANG_TIMEOUT_S  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dumped(out: Path) -> set[int]:
    """Ranks that left a JSON dump or a faulthandler traceback (more than its header line)."""
    ranks = set()
    for p in (out / "hang").glob("rank*.*"):
        stem = p.name[4:].split(".")[0]
        if not stem.isdigit():
            continue
        if p.name.endswith(".json") or (p.name.endswith(".faulthandler.txt") and "\n" in p.read_text().strip()):
            ranks.add(int(stem))
    return ranks


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each worker in a session of its own, so
    killing torchrun's process group would leave the workers running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(pid: int) -> None:
    for p in [pid, *_descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_hang(scenario: str, out: Path, nproc: int = 2, hang_timeout_s: float = HANG_TIMEOUT_S,
             deadline_s: float = 120.0) -> dict:
    """Run one scenario into ``out`` and end it once the dumps are in. Returns
    {"rc", "killed", "seconds", "stderr"}."""
    if out.exists():
        shutil.rmtree(out)
    exp = HANG_SCENARIOS[scenario]["expected"]
    want = set(range(nproc)) - set(exp.get("silent") or [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()), str(HERE / "hang_job.py"), "--scenario", scenario,
           "--out", str(out), "--hang-timeout", str(hang_timeout_s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    errf = open(out.parent / f".{out.name}.stderr", "w+") if out.parent.exists() else None
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf or subprocess.DEVNULL, env=env,
                            start_new_session=True)
    killed = False
    try:
        while proc.poll() is None and time.time() - t0 < deadline_s:
            if want <= _dumped(out):
                time.sleep(0.5)  # the last writer's rename is atomic; let stragglers finish theirs
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            killed = True
        _kill_tree(proc.pid)  # also the workers of a torchrun that already exited
        proc.wait()
    stderr = ""
    if errf is not None:
        errf.seek(0)
        stderr = errf.read()
        errf.close()
        os.unlink(errf.name)
    return {"rc": proc.returncode, "killed": killed, "seconds": time.time() - t0, "stderr": stderr}


def anonymize(out: Path) -> None:
    """Bundled dumps name no machine: the repository root, the Python install and the host name
    are replaced (frames keep their shape: .../lib/python3.X/site-packages/torch/...)."""
    stdlib = os.path.dirname(os.__file__)  # <prefix>/lib/python3.X
    subs = [(str(HERE.parent) + "/", ""), (stdlib, f"/usr/lib/{Path(stdlib).name}"),
            (f'"host": "{socket.gethostname()}"', '"host": "node0"')]
    for p in (out / "hang").iterdir():
        text = p.read_text()
        for old, new in subs:
            text = text.replace(old, new)
        p.write_text(text)


def record(scenario: str, out_root: Path, tries: int = 2) -> None:
    out = out_root / scenario
    for attempt in range(tries):
        res = run_hang(scenario, out)
        ok = _dumped(out) >= set(range(2)) - set(HANG_SCENARIOS[scenario]["expected"]["silent"])
        if ok and (out / "manifest.json").exists():
            break
        print(f"  {scenario}: attempt {attempt + 1} incomplete (rc {res['rc']})\n{res['stderr'][-2000:]}",
              file=sys.stderr)
    else:
        raise SystemExit(f"{scenario}: failed")
    for p in (out / "hang").glob("*.faulthandler.txt"):
        if (out / "hang" / p.name.replace(".faulthandler.txt", ".json")).exists():
            p.unlink()  # the JSON dump has the stacks already
        # a file with only its header stays: that rank vanished (killed, or frozen) and the reader names it
    anonymize(out)
    # no expected.json: the expected verdict is derived from HANG_SCENARIOS (expectations.py)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6
    print(f"{scenario:30s} {res['seconds']:5.1f} s  {size:5.2f} MB  {'killed' if res['killed'] else 'exited'}",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE.parent / "traces"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    names = args.only or list(HANG_SCENARIOS)
    unknown = set(names) - set(HANG_SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown: {sorted(unknown)}")
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    for name in names:
        record(name, out_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
