"""Growth: wall time and peak memory of the whole process tree over 8 / 64 / 256 / 1,024 ranks,
from traces and from per-rank summaries.

The ranks are copies of one real GPU trace (default: the project's H100 NCCL recording
``traces-cuda/ddp_default``, 0.3 MB gz); each copy gets its own ``distributedInfo`` (rank N of
the world size). Copies are cheap to make: a gzip file may hold several members that
decompress to their concatenation, so the trace body is compressed once and each rank file
is that member plus a small one holding ``"distributedInfo": {...}}``.

Every measurement is a fresh ``python -m fsdpdoctor`` child. Peak RSS is the largest sum of
the RSS of the child and all its descendants, sampled every 200 ms from /proc (the worker
processes count); CPU seconds are the child's and its reaped workers' (``wait4``), which other
jobs on the machine do not inflate the way they inflate wall time. The load average of the machine is printed beside each row: other jobs
share its cores.

    python benchmarks/bench_growth.py                        # 8 64 256 1024 ranks
    python benchmarks/bench_growth.py --ranks 8 64 --jobs 1 2 --json /tmp/growth.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = [Path(os.environ.get("FSDPDOCTOR_SHARED") or REPO.parent / "shared") / "traces-cuda"]


def make_ranks(src: Path, dst: Path, n: int) -> None:
    doc = msgspec.json.decode(gzip.decompress(src.read_bytes()))
    dist = dict(doc.pop("distributedInfo", None) or {})
    body = msgspec.json.encode(doc)
    assert body.endswith(b"}")
    head = gzip.compress(body[:-1] + b",", compresslevel=6)   # the document without its closing brace
    dst.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        d = dict(dist, rank=r, world_size=n)
        tail = gzip.compress(b'"distributedInfo":' + msgspec.json.encode(d) + b"}")
        (dst / f"rank{r}.json.gz").write_bytes(head + tail)


def tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                ppid = kib = 0
                for line in f:
                    if line.startswith("PPid:"):
                        ppid = int(line.split()[1])
                    elif line.startswith("VmRSS:"):
                        kib = int(line.split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(p))
        rss[int(p)] = kib
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(children.get(p, ()))
    return total


def measure(argv: list[str], out: Path | None = None) -> dict:
    """A fresh child's wall, CPU (its own and its reaped workers') and the peak RSS of its tree;
    ``out``: its stdout is written there and the size reported (``doc_mb``)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    with open(out or os.devnull, "wb") as sink:
        p = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE, env=env, cwd=REPO)
        peak = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, tree_rss_kib(p.pid))
            time.sleep(0.1 if out else 0.2)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace").strip()
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {err[-200:]}"}
    # CPU seconds of the child and every descendant it reaped (the workers): what the work costs,
    # whatever else the machine runs at the same time; the child's own ru_maxrss (KiB) bounds the
    # sampled peak from below where sampling missed it
    row = {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_tree_mib": max(peak, ru.ru_maxrss) / 1024,
           "load": os.getloadavg()[0]}
    if out:
        row["doc_mb"] = out.stat().st_size / 1e6
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[8, 64, 256, 1024])
    ap.add_argument("--jobs", type=int, nargs="*", default=[None], help="worker processes (default: one per core)")
    ap.add_argument("--trace", type=Path, help="the rank trace to copy (default traces-cuda/ddp_default)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    src = args.trace
    if src is None:
        root = next((p for p in CANDIDATES if p.is_dir()), None)
        if root is None:
            print("traces-cuda not found; pass --trace", file=sys.stderr)
            return 2
        src = root / "ddp_default" / "rank0.json.gz"
    tmp = Path(tempfile.mkdtemp(prefix="fsdpdoctor-growth-"))
    rows = []
    try:
        for n in args.ranks:
            folder = tmp / f"r{n}"
            make_ranks(src, folder, n)
            for jobs in args.jobs:
                jarg = ["--jobs", str(jobs)] if jobs else []
                row = {"ranks": n, "jobs": jobs or "auto", "mb_gz": sum(f.stat().st_size for f in folder.iterdir()) / 1e6}
                row["traces"] = measure([sys.executable, "-m", "fsdpdoctor", "analyze", str(folder), "--json",
                                         "--no-summaries", *jarg])
                row["summarize"] = measure([sys.executable, "-m", "fsdpdoctor", "summarize", str(folder), "-q", *jarg])
                row["from_summaries"] = measure([sys.executable, "-m", "fsdpdoctor", "analyze", str(folder), "--json"])
                for f in folder.glob("*.summary.msgpack"):
                    f.unlink()
                rows.append(row)
                print(_line(row), flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def _line(row: dict) -> str:
    def f(m):
        if "error" in m:
            return m["error"][:80]
        return f"{m['wall_s']:6.1f} s wall {m['cpu_s']:6.1f} s cpu {m['peak_tree_mib']:5.0f} MiB (load {m['load']:.1f})"
    per = row["traces"].get("cpu_s", 0) / row["ranks"]
    return (f"{row['ranks']:5d} ranks {row['mb_gz']:7.0f} MB gz jobs {row['jobs']}: traces {f(row['traces'])} "
            f"[{per * 1e3:.0f} ms cpu/rank] | summarize {f(row['summarize'])} | from summaries {f(row['from_summaries'])}")


if __name__ == "__main__":
    sys.exit(main())
