"""Write `fsdpdoctor analyze RUN --json` of every bundled, CUDA and shared public run into one folder.

    python benchmarks/json_snapshot.py OUT_DIR [--jobs N] [-- EXTRA ANALYZE ARGS]

Run it before and after a change and compare with `diff -r BEFORE AFTER`: a change that should not
alter behaviour leaves every file identical. A run the CLI refuses is saved as `<name>.err` (exit
code and stderr), so a new refusal shows up in the comparison too. The package analysed is the one
in this checkout (PYTHONPATH is set to the repository root).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FSDPDOCTOR_SHARED", ROOT.parent / "shared"))
TRACE_SUFFIXES = (".json", ".json.gz", ".msgpack")


def _has_traces(d: Path) -> bool:
    return any(p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name != "expected.json"
               for p in d.iterdir())


def runs() -> list[tuple[str, Path]]:
    """(label, folder) of every run folder: bundled traces, bundled CUDA traces, shared public and CUDA."""
    found = []
    for family, base in (("bundled", ROOT / "traces"), ("cuda", ROOT / "traces" / "cuda"),
                         ("public", SHARED / "traces-public"), ("shared-cuda", SHARED / "traces-cuda")):
        if not base.is_dir():
            continue
        for d in sorted(p for p in base.iterdir() if p.is_dir()):
            if _has_traces(d):
                found.append((f"{family}__{d.name}", d))
    return found


def snapshot(label: str, run: Path, out: Path, extra: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    proc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", os.path.relpath(run, ROOT), "--json", *extra],
                          capture_output=True, env=env, cwd=ROOT)
    if proc.returncode in (0, 1):
        (out / f"{label}.json").write_bytes(proc.stdout)
        return f"{label}: ok"
    (out / f"{label}.err").write_bytes(f"exit {proc.returncode}\n".encode() + proc.stderr)
    return f"{label}: exit {proc.returncode}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="arguments passed to analyze (after --)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda lr: snapshot(*lr, args.out, args.extra), runs()):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
