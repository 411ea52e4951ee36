"""In-process figures (the second table of benchmarks/README.md): fsdpdoctor vs HTA vs the decode floor,
timed inside fresh child processes after their imports, with peak memory.

What a user waits for is the whole process, start-up and imports included: that is
``bench_whole.py`` (the headline). Here each child is timed from after its imports to its result:

* ours: ``open_analysis(path)`` (load + map + reduce + diagnosis) and its ``--json`` document;
* bare: the decode floor of ``bench_whole.py`` (gunzip + a typed msgspec Struct per event, raw args);
* HTA:  ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap()`` + ``get_temporal_breakdown()``
  (the Python of ``--hta-python``, default this one).

"work" is timed inside the child after imports; "process" is the child's whole wall time including
interpreter start and imports. HTA parses several ranks in worker processes; their peak RSS is included.

Usage (see benchmarks/README.md):
    python benchmarks/bench_analyze.py [--reps 3] [--scale 10] [--hta-python PY]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PUBLIC_CANDIDATES = [Path(os.environ.get("FSDPDOCTOR_SHARED") or REPO.parent / "shared") / "traces-public"]
GPU_TRACES = ["ddp_a100_rank0", "recsys_2_of_128_ranks", "v100_trace_diff_test", "mi300_rccl_ddp_act_checkpoint",
              "resnet50_loader_num_workers_0", "resnet50_loader_num_workers_4"]

OURS_CHILD = r"""
import json, sys, time
from fsdpdoctor.pipeline import open_analysis
t0 = time.perf_counter()
a = open_analysis(sys.argv[1], use_summaries=False)
doc = a.to_json()
out = {}
for r in a.ranks:
    comm = sum(s.comm_us for s in r.steps)
    out[r.rank] = 100.0 * sum(s.overlapped_comm_us for s in r.steps) / comm if comm else None
t1 = time.perf_counter()
print(json.dumps({"work_s": t1 - t0, "overlap": out}))
"""

# the decode floor and HTA's overlap + temporal breakdown, as the whole-process benchmark runs them
# (bench_whole.py): the floor's typed decode, HTA's two calls; timed here after their imports
from bench_whole import FLOOR as BARE_CHILD  # noqa: E402
from bench_whole import HTA as HTA_CHILD  # noqa: E402


def public_root() -> Path | None:
    return next((p for p in PUBLIC_CANDIDATES if p.is_dir()), None)


def run_child(argv: list[str], env: dict | None = None) -> dict:
    """Run one child; return its JSON line plus wall time and peak RSS (MiB, child and its reaped children)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace").strip().splitlines()
        if p.returncode != 0 or not text:
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            return {"error": f"exit {p.returncode}: " + " | ".join(tail)}
        res = json.loads(text[-1])
    res["process_s"] = wall
    res["rss_mib"] = ru.ru_maxrss / 1024.0  # Linux: KiB
    return res


def replicate_trace(src: Path, dst: Path, copies: int) -> Path:
    """A synthetic large trace: ``copies`` back-to-back repetitions of every event of ``src``.

    Timestamps are shifted by the trace span (+1 ms) per copy; ProfilerStep numbers,
    correlation / External ids and flow ids are offset so that copies do not collide.
    """
    with gzip.open(src, "rb") as f:
        doc = json.loads(f.read())
    events = doc["traceEvents"]
    xs = [e for e in events if "ts" in e]
    t_min = min(float(e["ts"]) for e in xs)
    t_max = max(float(e["ts"]) + float(e.get("dur") or 0) for e in xs)
    span = (t_max - t_min) + 1000.0
    steps = sorted({int(m.group(1)) for e in events if (m := re.match(r"ProfilerStep#(\d+)$", str(e.get("name", ""))))})
    n_steps = (steps[-1] - steps[0] + 1) if steps else 0
    id_off = 1 + max([int(e.get("id", 0)) for e in events if isinstance(e.get("id"), int)]
                     + [int(e["args"][k]) for e in events if isinstance(e.get("args"), dict)
                        for k in ("correlation", "External id") if isinstance(e["args"].get(k), int)] + [0])
    out = []
    meta = [e for e in events if "ts" not in e or e.get("ph") == "M"]
    body = [e for e in events if "ts" in e and e.get("ph") != "M"]
    out.extend(meta)
    for k in range(copies):
        for e in body:
            e2 = dict(e)
            e2["ts"] = float(e["ts"]) + k * span
            if k:
                m = re.match(r"ProfilerStep#(\d+)$", str(e.get("name", "")))
                if m:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + k * n_steps}"
                if isinstance(e.get("id"), int):
                    e2["id"] = e["id"] + k * id_off
                a = e.get("args")
                if isinstance(a, dict):
                    a2 = dict(a)
                    for key in ("correlation", "External id"):
                        if isinstance(a.get(key), int) and a[key] > 0:
                            a2[key] = a[key] + k * id_off
                    e2["args"] = a2
            out.append(e2)
    doc = dict(doc)
    doc["traceEvents"] = out
    dst.mkdir(parents=True, exist_ok=True)
    path = dst / src.name
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(json.dumps(doc).encode())
    return dst


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per trace and tool (median reported)")
    ap.add_argument("--scale", type=int, default=10, help="copies of the v100 trace in the synthetic trace (0: none)")
    ap.add_argument("--hta-python", default=os.environ.get("FSDPDOCTOR_HTA_PYTHON", sys.executable),
                    help="python of a virtualenv with HolisticTraceAnalysis installed")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--traces", nargs="*", help="folders to benchmark instead of the public GPU traces")
    ap.add_argument("--json", metavar="FILE", help="also write all measurements here")
    ap.add_argument("--make-synthetic", nargs=3, metavar=("SRC", "DST", "COPIES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make_synthetic:
        src, dst, n = args.make_synthetic
        replicate_trace(Path(src), Path(dst), int(n))
        return 0

    root = public_root()
    folders: list[Path] = []
    if args.traces:
        folders = [Path(p) for p in args.traces]
    elif root is None:
        print("public traces not found (looked in " + ", ".join(map(str, PUBLIC_CANDIDATES)) + ")", file=sys.stderr)
        return 2
    else:
        folders = [root / n for n in GPU_TRACES if (root / n).is_dir()]
    tmp = Path(tempfile.mkdtemp(prefix="fsdpdoctor-bench-"))
    try:
        if args.scale > 1 and root is not None and (root / "v100_trace_diff_test").is_dir():
            src = root / "v100_trace_diff_test" / "test.json.gz"
            dst = tmp / f"v100_x{args.scale}"
            # in a child: building it in this process would raise our RSS, which the timed
            # children inherit as their ru_maxrss starting point (fork + exec keep the high-water mark)
            subprocess.run([sys.executable, __file__, "--make-synthetic", str(src), str(dst), str(args.scale)], check=True)
            folders.append(dst)
        have_hta = not args.skip_hta and Path(args.hta_python).exists()
        if not args.skip_hta and not have_hta:
            print(f"HTA python {args.hta_python} not found: timing fsdpdoctor only "
                  "(pip install --no-deps traceinsight, with what it imports: see the README's test command)")
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        results = []
        for folder in folders:
            row = {"trace": folder.name, "mb_gz": size_mb(folder)}
            for tool, argv_ in (("ours", [sys.executable, "-c", OURS_CHILD, str(folder)]),
                                ("bare", [sys.executable, "-c", BARE_CHILD, str(folder)]),
                                ("hta", [args.hta_python, "-c", HTA_CHILD, str(folder)])):
                if tool == "hta" and not have_hta:
                    continue
                runs = [run_child(argv_, env) for _ in range(args.reps)]
                errs = [r["error"] for r in runs if "error" in r]
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    row[tool] = {"error": errs[0]}
                    continue
                row[tool] = {
                    "work_s": statistics.median(r["work_s"] for r in ok),
                    "process_s": statistics.median(r["process_s"] for r in ok),
                    "rss_mib": max(r["rss_mib"] for r in ok),
                    "overlap": ok[0].get("overlap"),
                    "runs": len(ok),
                }
            results.append(row)
            _print_row(row)
        _print_table(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _fmt_overlap(d: dict | None) -> str:
    if not d:
        return "-"
    return " ".join(f"r{k}:{'nan' if v is None else f'{v:.1f}'}" for k, v in d.items())


def _print_row(row: dict) -> None:
    print(f"# {row['trace']}: " + "; ".join(
        f"{tool} {row[tool]}" if "error" in row[tool] else
        f"{tool} work {row[tool]['work_s']:.2f}s process {row[tool]['process_s']:.2f}s rss {row[tool]['rss_mib']:.0f}MiB"
        for tool in ("ours", "bare", "hta") if tool in row), flush=True)


def _print_table(results: list[dict]) -> None:
    hdr = (f"{'trace':34} {'MB.gz':>6} {'ours s':>7} {'bare s':>7} {'ours/bare':>9} {'HTA s':>7} {'HTA/ours':>8} "
           f"{'ours proc':>9} {'HTA proc':>9} {'ours MiB':>8} {'HTA MiB':>8}  overlap % ours | HTA")
    print()
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        o, h, b = r.get("ours", {}), r.get("hta", {}), r.get("bare", {})
        ow, hw, bw = o.get("work_s"), h.get("work_s"), b.get("work_s")
        ratio = f"{hw / ow:8.1f}" if ow and hw else f"{'-':>8}"
        bratio = f"{ow / bw:9.2f}" if ow and bw else f"{'-':>9}"
        def f(v, w, p):  # noqa: E306
            return f"{v:{w}.{p}f}" if isinstance(v, float) else f"{'-':>{w}}"
        print(f"{r['trace']:34} {r['mb_gz']:6.1f} {f(ow, 7, 2)} {f(bw, 7, 2)} {bratio} {f(hw, 7, 2)} {ratio} "
              f"{f(o.get('process_s'), 9, 2)} "
              f"{f(h.get('process_s'), 9, 2)} {f(o.get('rss_mib'), 8, 0)} {f(h.get('rss_mib'), 8, 0)}  "
              f"{_fmt_overlap(o.get('overlap'))} | {_fmt_overlap(h.get('overlap')) if 'error' not in h else h['error'][:60]}")


if __name__ == "__main__":
    sys.exit(main())
