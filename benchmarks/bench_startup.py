"""Start-up: CPU of ``fsdpdoctor --help`` and of an argument error, against a bare interpreter,
each a fresh process, interleaved rounds, medians (CPU from ``os.wait4``: user + system).

    python benchmarks/bench_startup.py --reps 15
    python benchmarks/bench_startup.py --reps 15 --against ../main    # another checkout, interleaved

``-m`` rows run ``python -m fsdpdoctor`` (which loads runpy), ``script`` rows what pip's console
script for ``fsdpdoctor`` runs. ``-S`` rows leave out ``site`` (whatever .pth files this environment's
site-packages load: here an editable install's finder and a CA bundle's, which load pathlib, typing,
importlib.resources...): what the package itself costs."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what pip's console script (the `fsdpdoctor` command) runs, with the arguments after it
SCRIPT = ("import re, sys; from fsdpdoctor.cli import main; "
          "sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0]); sys.exit(main())")
CASES = {
    "bare": ["-c", "pass"],
    "-m --help": ["-m", "fsdpdoctor", "--help"],
    "-m analyze --bogus": ["-m", "fsdpdoctor", "analyze", "--bogus"],
    "script --help": ["-c", SCRIPT, "--help"],
    "script analyze --bogus": ["-c", SCRIPT, "analyze", "x", "--bogus"],
}


def cpu(argv: list[str], repo: Path = REPO) -> float:
    env = dict(os.environ, PYTHONPATH=str(repo))
    # run in the checkout: `-m`/`-c` put the working directory first on the path, before PYTHONPATH
    p = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         cwd=repo)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_utime + ru.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--against", type=Path, help="another checkout, measured in the same rounds")
    args = ap.parse_args(argv)
    repos = {"": REPO, **({"B ": args.against.resolve()} if args.against else {})}
    keys = [(tag, flag, name) for tag in repos for flag in ("", "-S ") for name in CASES
            if not (tag and name == "bare")]
    rows: dict[tuple, list[float]] = {k: [] for k in keys}
    for _ in range(args.reps + 1):   # the first round warms the page cache and bytecode, not counted
        for tag, flag, name in keys:
            rows[tag, flag, name].append(cpu((["-S"] if flag else []) + CASES[name], repos[tag]))
    med = {k: statistics.median(v[1:]) for k, v in rows.items()}
    print(f"load average {os.getloadavg()[0]:.1f}" + (f"; B = {args.against}" if args.against else ""))
    for tag, flag, name in keys:
        over = "" if name == "bare" else f"  ({(med[tag, flag, name] - med['', flag, 'bare']) * 1e3:+.0f} over bare)"
        print(f"{tag}{flag}{name:24s} {med[tag, flag, name] * 1e3:6.0f} ms CPU{over} (median of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
