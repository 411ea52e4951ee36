"""Start-up: CPU of ``fsdpdoctor --help`` and of an argument error, against a bare interpreter,
each a fresh process, interleaved rounds, medians (CPU from ``os.wait4``: user + system).

    python benchmarks/bench_startup.py --reps 15

``-S`` rows leave out ``site`` (whatever .pth files this environment's site-packages load): what the
package itself costs."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "bare": ["-c", "pass"],
    "--help": ["-m", "fsdpdoctor", "--help"],
    "analyze --bogus": ["-m", "fsdpdoctor", "analyze", "--bogus"],
}


def cpu(argv: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_utime + ru.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    rows = {f"{flag}{name}": [] for flag in ("", "-S ") for name in CASES}
    for _ in range(args.reps + 1):   # the first round warms the page cache and bytecode, not counted
        for flag in ("", "-S "):
            for name, a in CASES.items():
                rows[f"{flag}{name}"].append(cpu((["-S"] if flag else []) + a))
    print(f"load average {os.getloadavg()[0]:.1f}")
    for key, v in rows.items():
        print(f"{key:22s} {statistics.median(v[1:]) * 1e3:6.0f} ms CPU (median of {args.reps})")
    for flag in ("", "-S "):
        base = statistics.median(rows[f"{flag}bare"][1:])
        print(f"{flag or 'with site '}--help over bare: {(statistics.median(rows[f'{flag}--help'][1:]) - base) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
