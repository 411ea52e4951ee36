"""Noise study: healthy runs recorded beside a CPU hog must give no warning or error, and `check` passes them.

    python benchmarks/noise_study.py OUT_DIR                       # record 10 runs of 2 jobs, then judge
    python benchmarks/noise_study.py OUT_DIR --runs 10 --jobs ddp_default,cnn_ddp --hogs 2 --active 6
    python benchmarks/noise_study.py OUT_DIR --judge-only          # judge the runs already in OUT_DIR

Each run is `fsdpdoctor reference run JOB --nproc 2` (gloo, CPU) while ``--hogs`` busy-looping Python
processes (``while 1: pass``) take the same cores; the hogs are started before each job and killed
(by their process ids) after it. Then every run folder is analysed with this checkout's diagnosis and
`fsdpdoctor check` is run on it (default gate: fail on a warning). Printed: one markdown row per run
(step time, step CV, the findings at each severity, check's exit code) and a summary line per job.
The figures go into docs/noise-study.md ("Healthy runs under a CPU hog").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def record(out: Path, jobs: list[str], runs: int, hogs: int, active: int) -> None:
    for i in range(runs):
        for job in jobs:  # interleaved, so a change of the machine's load hits both jobs
            run_dir = out / f"{job}__{i:02d}"
            if run_dir.exists():
                continue
            hog = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
            try:
                load = os.getloadavg()[0]
                t0 = time.time()
                rc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "reference", "run", job, "--nproc", "2",
                                     "--active", str(active), "--out", str(run_dir)], env=_env(),
                                    capture_output=True, text=True).returncode
                print(f"recorded {run_dir.name}: rc {rc}, {time.time() - t0:.0f} s, load {load:.1f}", flush=True)
                (out / f"{run_dir.name}.load").write_text(f"{load:.2f}\n")
            finally:
                for p in hog:
                    p.kill()
                    p.wait()


def judge(out: Path) -> int:
    from fsdpdoctor.pipeline import open_analysis

    rows, by_job = [], {}
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        job = d.name.split("__")[0]
        try:
            a = open_analysis(d)
        except Exception as e:  # a broken recording is reported, not hidden
            rows.append(f"| {d.name} | - | - | - | - | unreadable: {str(e)[:60]} | - |")
            continue
        steps = [s.duration_us for r in a.ranks for s in r.steps]
        cv = statistics.pstdev(steps) / statistics.mean(steps) if len(steps) > 1 else 0.0
        alarms = [f for f in a.findings if f.severity in ("warning", "error")]
        infos = [f for f in a.findings if f.severity == "info"]
        rc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "check", str(d)], env=_env(),
                            capture_output=True, text=True).returncode
        loadf = out / f"{d.name}.load"
        load = loadf.read_text().strip() if loadf.exists() else "-"
        rows.append(f"| {d.name} | {load} | {statistics.mean(steps) / 1e3:.0f} | {cv:.2f} | "
                    f"{', '.join(f'{f.id} ({f.severity})' for f in alarms) or '-'} | "
                    f"{', '.join(f.id for f in infos) or '-'} | {rc} |")
        j = by_job.setdefault(job, {"runs": 0, "alarms": 0, "check_fail": 0, "cv": []})
        j["runs"] += 1
        j["alarms"] += bool(alarms)
        j["check_fail"] += rc != 0
        j["cv"].append(cv)
    print("| run | load (1 min) | step ms | step CV | warning/error | info | check rc |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    bad = 0
    for job, j in by_job.items():
        print(f"{job}: {j['runs']} runs, {j['alarms']} with a warning or error, check failed {j['check_fail']}, "
              f"step CV {min(j['cv']):.2f}-{max(j['cv']):.2f}")
        bad += j["alarms"] + j["check_fail"]
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--jobs", default="ddp_default,cnn_ddp", help="healthy reference scenarios, comma-separated")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--active", type=int, default=6, help="profiled steps per run")
    ap.add_argument("--judge-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.judge_only:
        record(out, args.jobs.split(","), args.runs, args.hogs, args.active)
    return judge(out)


if __name__ == "__main__":
    raise SystemExit(main())
