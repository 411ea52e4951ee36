"""Instructions, not seconds: `analyze DIR --json` against the decode floor, counted by callgrind.

    python benchmarks/bench_instructions.py                          # the public traces of 20 MB or more
    python benchmarks/bench_instructions.py --against BASE_CHECKOUT  # another checkout's analyze too
    python benchmarks/bench_instructions.py --traces RUN_DIR ...

On a shared machine CPU seconds move with the load by +-30 % from run to run; the number of
instructions a process executes does not (``PYTHONHASHSEED=0``, the same files, the same bytecode).
Each command runs once under ``valgrind --tool=callgrind`` (forked workers included: each writes its
own output, all are summed), after one plain run that writes the bytecode cache. The floor is
bench_whole.py's (gunzip + typed msgspec decode, nothing else). ~40x slower than a plain run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_whole import FLOOR, REPO, json_mb, public_root  # noqa: E402

TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def instructions(argv: list[str], env: dict, cwd: Path) -> int:
    """Instructions executed by the command and every process it forked, under callgrind."""
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["valgrind", "--tool=callgrind", "--trace-children=yes",
                        f"--callgrind-out-file={tmp}/cg.%p", *argv],
                       env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        total = 0
        for f in Path(tmp).iterdir():
            m = TOTAL.search(f.read_bytes())
            total += int(m.group(1)) if m else 0
        return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="*", type=Path)
    ap.add_argument("--against", type=Path, metavar="CHECKOUT")
    ap.add_argument("--min-mb", type=float, default=20.0)
    args = ap.parse_args(argv)
    traces = args.traces or sorted(d for d in (public_root() or Path("/nonexistent")).glob("*")
                                   if d.is_dir() and json_mb(d) >= args.min_mb)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="0", PYTHONWARNINGS="ignore")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    checkouts = {"ours": REPO}
    if args.against:
        checkouts["base"] = args.against.resolve()
    print(f"{'trace':34} {'floor G':>8} " + " ".join(f"{k + ' G':>8} {k + '/floor':>10}" for k in checkouts))
    for d in traces:
        d = d.resolve()
        floor = instructions([sys.executable, "-c", FLOOR, str(d)], env, REPO)
        row = f"{d.name:34} {floor / 1e9:8.3f} "
        for root in checkouts.values():
            n = instructions([sys.executable, "-m", "fsdpdoctor", "analyze", str(d), "--json"],
                             dict(env, PYTHONPATH=str(root)), root)
            row += f"{n / 1e9:8.3f} {n / floor:10.2f} "
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
