"""Automatic windows (``capture(auto=True)``): how soon a slowdown is decided, how soon its window
starts, and how often healthy noise opens one.

Part 1, the detector on simulated step series (fsdpdoctor/capture/slowdown.py, fed as the coordinator
feeds it): false windows in ``--seeds`` healthy runs of 2,000 steps for each noise model (log-normal
noise, 1.5-4x hiccups one step in fifty, short bursts of slow steps, a +50 % drift over the run), and
the steps from a sustained slowdown of one rank (every rank's step takes factor x as long from
step 700) to the decision.

Part 2, a real job: ``reference_jobs/drift.py`` under ``torchrun --nproc_per_node 2`` (gloo), rank 1
sleeping ``--factor`` healthy compute times before every forward from ``--change-at`` on (1.0: steps about 2x,
a 2x slowdown of one rank), the live rule judging the steps with the ranks' CPU wait taken out. From the window's manifest (``decided_at_step``, ``decided_unix``, ``first_step``) and the step
series: steps from the change to the decision, and seconds from the decision to the start of the first
profiled step on each rank. ``--healthy-steps N`` also runs the job healthy for N steps and counts its
windows, and feeds its recorded series to the detector.

    python benchmarks/bench_auto_windows.py [--seeds 20] [--healthy-steps 2000] [--skip-real]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fsdpdoctor.capture.series import read_series, series_path  # noqa: E402
from fsdpdoctor.capture.slowdown import SlowdownRule  # noqa: E402

NOISE = {  # name: (log-normal sigma, hiccup share, burst share)
    "quiet": (0.03, 0.0, 0.0),
    "loaded": (0.15, 0.02, 0.004),
    "very noisy": (0.30, 0.05, 0.01),
}


def healthy(rnd: random.Random, n: int, sigma: float, hiccups: float, bursts: float, drift: float = 0.5):
    out, burst = [], 0
    for i in range(n):
        d = 0.05 * (1 + drift * i / n) * math.exp(rnd.gauss(0, sigma))
        if rnd.random() < hiccups:
            d *= rnd.uniform(1.5, 4.0)
        if burst == 0 and rnd.random() < bursts:
            burst = rnd.randint(2, 3)
        if burst:
            d *= rnd.uniform(1.3, 2.5)
            burst -= 1
        out.append(d)
    return out


def decisions(series, poll: int = 10) -> list[int]:
    rule, found = SlowdownRule(), []
    for k in range(0, len(series), poll):
        for i, d in enumerate(series[k:k + poll]):
            if rule.feed(k + i, [d]):
                found.append(k + i)
                rule.reset()
    return found


def simulated(seeds: int) -> None:
    print("## the detector on simulated series\n")
    print("| noise | false windows in 2,000 healthy steps (runs) | 2x: steps to decision, median / max "
          "| 2.6x | 13.9x | missed within 20 steps |")
    print("|---|---|---|---|---|---|")
    for name, (sigma, hic, bur) in NOISE.items():
        false = [len(decisions(healthy(random.Random(s), 2000, sigma, hic, bur))) for s in range(seeds)]
        cells, missed = [], 0
        for factor in (2.0, 2.6, 13.9):
            lags = []
            for s in range(seeds):
                base = healthy(random.Random(1000 + s), 1000, sigma, hic, bur)
                found = [k for k in decisions([d * (factor if i >= 700 else 1) for i, d in enumerate(base)])
                         if k >= 700]
                lag = found[0] - 700 + 1 if found else None
                missed += lag is None or lag > 20
                lags.append(lag if lag is not None else 10**6)
            cells.append(f"{statistics.median(lags):.0f} / {max(lags)}")
        print(f"| {name} | {sum(false)} in {seeds} x 2,000 | " + " | ".join(cells) + f" | {missed} |")
    print()


def torchrun(out: Path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + os.getpid() % 1000), str(ROOT / "reference_jobs" / "drift.py"), "--out", str(out),
           *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)


def window_starts(out: Path) -> list[dict]:
    rows = []
    for w in sorted(out.glob("window-*"), key=lambda p: int(p.name.split("-")[1])):
        try:
            win = json.loads((w / "manifest.json").read_text())["window"]
        except (OSError, ValueError, KeyError):
            continue
        starts = []
        for r in (0, 1):
            s = read_series(series_path(out, r))
            k = s.steps.index(win["first_step"]) if win["first_step"] in s.steps else None
            starts.append(None if k is None else s.origin_unix_s + s.start_s[k] - win["decided_unix"])
        rows.append({**win, "start_after_s": starts})
    return rows


def sustained(d: list[float], k: int) -> float:
    """How much slower the 30 steps after step k ran than the 100 before it (medians): was it real?"""
    before = d[max(0, k - 100):max(1, k - 10)]
    return statistics.median(d[k:k + 30]) / statistics.median(before) if before and d[k:k + 30] else float("nan")


def real(change_at: int, steps: int, healthy_steps: int, factor: float, keep: str | None) -> None:
    print("## a real job: reference_jobs/drift.py, 2 ranks, gloo\n")
    tmp = Path(tempfile.mkdtemp(prefix="bench_auto_"))
    try:
        load0 = os.getloadavg()[0]
        t0 = time.time()
        proc = torchrun(tmp / "lag", "--change", "lag", "--factor", factor, "--change-at", change_at,
                        "--steps", steps)
        load1 = os.getloadavg()[0]
        if proc.returncode != 0:
            print("job failed:", proc.stderr[-2000:])
            return
        s0 = read_series(series_path(tmp / "lag", 0))
        before = statistics.median(s0.duration_s[change_at - 100:change_at])
        after = statistics.median(s0.duration_s[change_at + 5:])
        print(f"lag on rank 1 (--factor {factor}) from step {change_at}: rank 0's median step {before * 1e3:.1f} -> {after * 1e3:.1f} ms "
              f"({after / before:.2f}x), {time.time() - t0:.0f} s, load {load0:.1f}-{load1:.1f}\n")
        print("| window | decided at step | steps after the change | first step | "
              "seconds from decision to its start, rank 0 / rank 1 | reason |")
        print("|---|---|---|---|---|---|")
        for w in window_starts(tmp / "lag"):
            lag = w["decided_at_step"] - change_at
            st = " / ".join("-" if x is None else f"{x:.2f}" for x in w["start_after_s"])
            print(f"| window-{w['first_step']} | {w['decided_at_step']} | {lag} | {w['first_step']} | {st} | "
                  f"{w['reason']} |")
        print()
        if healthy_steps:
            load0 = os.getloadavg()[0]
            proc = torchrun(tmp / "healthy", "--change", "none", "--steps", healthy_steps)
            load1 = os.getloadavg()[0]
            s0 = read_series(series_path(tmp / "healthy", 0))
            d = s0.duration_s
            med = statistics.median(d)
            print(f"healthy, {healthy_steps} steps (exit {proc.returncode}, load {load0:.1f}-{load1:.1f}): "
                  f"median step {med * 1e3:.1f} ms, p99 {sorted(d)[int(0.99 * len(d))] / med:.2f}x, "
                  f"max {max(d) / med:.1f}x the median\n")
            print("| window | decided at step | the 30 steps after / the 100 before, medians | reason |")
            print("|---|---|---|---|")
            for w in window_starts(tmp / "healthy"):
                k = w["decided_at_step"]
                print(f"| window-{w['first_step']} | {k} | {sustained(d, k):.2f}x | {w['reason']} |")
            replay = decisions(d)
            print(f"\nthe detector replayed on this series' whole steps (the series holds no CPU wait, so "
                  f"nothing is taken out): {len(replay)} decisions "
                  f"({', '.join(f'step {k}: {sustained(d, k):.2f}x' for k in replay)})\n")
            if keep:
                shutil.copytree(tmp / "healthy" / "steps", Path(keep) / "healthy-steps", dirs_exist_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--change-at", type=int, default=300)
    ap.add_argument("--steps", type=int, default=420)
    ap.add_argument("--healthy-steps", type=int, default=2000)
    ap.add_argument("--factor", type=float, default=1.0,
                    help="drift.py --factor: rank 1's extra sleep in healthy compute times (1.0: about 2x the step)")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="copy the healthy run's step series here")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)\n")
    simulated(args.seeds)
    if not args.skip_real:
        real(args.change_at, args.steps, args.healthy_steps, args.factor, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
