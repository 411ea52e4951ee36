"""What a user waits for: whole processes, `fsdpdoctor analyze DIR --json` against HTA and the decode floor.

    python benchmarks/bench_whole.py [--reps 7] [--traces DIR ...] [--hta-python PY] [--skip-hta] [--json FILE]
    python benchmarks/bench_whole.py --skip-hta --against ../main   # another checkout's `analyze`, interleaved

Every measurement is a fresh process started from here, timed from its start to its exit (interpreter
start, imports, reading, analysis, output), its CPU taken from ``os.wait4`` (user + system of the process
and of every child process it waited for: forked workers, HTA's parser pool):

* ours:  ``python -m fsdpdoctor analyze DIR --json`` (this checkout), stdout to /dev/null;
* HTA:   ``TraceAnalysis(trace_dir=DIR)`` + ``get_comm_comp_overlap()`` + ``get_temporal_breakdown()``
  (the overlap and the idle/compute/communication split of each rank, what ``analyze`` reports first);
* floor: gunzip + ``msgspec`` decode of every rank file into a typed Struct (the fields a trace tool
  reads, ``args`` left raw), nothing else: what any tool that reads the JSON into objects pays.

The three run interleaved (one of each per trace, then again), so a change of the machine's load hits
all three; the one-minute load average is printed with every measurement. Medians of ``--reps``, after
one warm-up round that is not counted (it fills the page cache and writes the bytecode cache: the
children may write ``__pycache__`` even where PYTHONDONTWRITEBYTECODE is set, as an installed package
has its bytecode compiled; compiling the package's sources on every start would add ~0.07 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the repository, or the folder FSDPDOCTOR_SHARED names (as tests/shared_data.py)
PUBLIC_CANDIDATES = [Path(os.environ.get("FSDPDOCTOR_SHARED") or REPO.parent / "shared") / "traces-public"]
GPU_TRACES = ["ddp_a100_rank0", "recsys_2_of_128_ranks", "v100_trace_diff_test", "mi300_rccl_ddp_act_checkpoint",
              "resnet50_loader_num_workers_0", "resnet50_loader_num_workers_4"]
NOT_TRACES = ("manifest.json", "expected.json")

# the decode floor: the same gunzip as the loader (ISA-L when installed), a typed struct per event
FLOOR = r"""
import json, sys, time
from pathlib import Path
from typing import Any
import msgspec
try:
    from isal.igzip import decompress as gunzip
except ImportError:
    from gzip import decompress as gunzip

class Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw(b"")

class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []

decoder = msgspec.json.Decoder(Doc)
t0 = time.perf_counter()
n = 0
for f in sorted(Path(sys.argv[1]).iterdir()):
    if f.name in ("manifest.json", "expected.json") or not f.name.endswith((".json", ".json.gz")):
        continue
    data = f.read_bytes()
    n += len(decoder.decode(gunzip(data) if f.name.endswith(".gz") else data).traceEvents)
print(json.dumps({"work_s": time.perf_counter() - t0, "overlap": None, "events": n}))
"""

HTA = r"""
import contextlib, io, json, logging, math, sys, time, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
logging.getLogger("hta").setLevel(logging.ERROR)
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    ta = TraceAnalysis(trace_dir=sys.argv[1])
    df = ta.get_comm_comp_overlap(visualize=False)
    temporal = ta.get_temporal_breakdown(visualize=False)
t1 = time.perf_counter()
out = {int(r): (None if math.isnan(v) else float(v)) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}
print(json.dumps({"work_s": t1 - t0, "overlap": out}))
"""

HTA_VERSION = r"""
from importlib.metadata import PackageNotFoundError, version
for name in ("traceinsight", "HolisticTraceAnalysis"):
    try:
        print(name, version(name)); break
    except PackageNotFoundError:
        pass
"""


def public_root() -> Path | None:
    return next((p for p in PUBLIC_CANDIDATES if p.is_dir()), None)


def json_mb(folder: Path) -> float:
    """MB of JSON in the folder's trace files (a gzip member states its size in its last 4 bytes)."""
    total = 0
    for f in folder.iterdir():
        if f.name in NOT_TRACES or not f.name.endswith((".json", ".json.gz")):
            continue
        if f.name.endswith(".gz"):
            with f.open("rb") as fh:
                fh.seek(-4, os.SEEK_END)
                total += struct.unpack("<I", fh.read(4))[0]
        else:
            total += f.stat().st_size
    return total / 1e6


def measure(argv: list[str], env: dict, cwd: Path = REPO) -> dict:
    """Run one process to its end: wall seconds, CPU seconds (with its waited-for children), peak MiB."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        return {"error": f"exit {code}: " + " | ".join(err.strip().splitlines()[-2:]), "load": load}
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024.0, "load": load}


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"]}
    return {"wall_s": statistics.median(r["wall_s"] for r in ok), "cpu_s": statistics.median(r["cpu_s"] for r in ok),
            "rss_mib": max(r["rss_mib"] for r in ok), "runs": len(ok), "errors": len(runs) - len(ok)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="measurements per trace and tool (medians reported)")
    ap.add_argument("--traces", nargs="*", help="run folders to measure instead of the public GPU traces")
    ap.add_argument("--hta-python", default=os.environ.get("FSDPDOCTOR_HTA_PYTHON", sys.executable),
                    help="python of an environment with HTA installed (default: this one)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write every measurement here")
    ap.add_argument("--against", type=Path, metavar="CHECKOUT",
                    help="also measure this checkout's `analyze --json` (tool `base`) in the same rounds")
    args = ap.parse_args(argv)

    if args.traces:
        folders = [Path(p).resolve() for p in args.traces]
    elif (root := public_root()) is not None:
        folders = [root / n for n in GPU_TRACES if (root / n).is_dir()]
    else:
        print("public traces not found (looked in " + ", ".join(map(str, PUBLIC_CANDIDATES)) + ")", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    tools = {"ours": lambda d: [sys.executable, "-m", "fsdpdoctor", "analyze", str(d), "--json"],
             "floor": lambda d: [sys.executable, "-c", FLOOR, str(d)]}
    # each checkout runs in its own folder: `-m` puts the working directory first on the path
    envs = {"ours": (env, REPO)}
    if args.against:
        base = args.against.resolve()
        envs["base"] = (dict(env, PYTHONPATH=str(base)), base)
        tools["base"] = tools["ours"]
    if not args.skip_hta:
        hta = subprocess.run([args.hta_python, "-c", HTA_VERSION], capture_output=True, text=True)
        if hta.returncode == 0 and hta.stdout.strip():
            print(f"HTA: {hta.stdout.strip()} ({args.hta_python})")
            tools["hta"] = lambda d: [args.hta_python, "-c", HTA, str(d)]
        else:
            print(f"HTA not found for {args.hta_python}: measuring ours and the floor only "
                  "(pip install traceinsight, or --hta-python PY)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average at start "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)

    for d in folders:  # the warm-up round
        for tool, make in tools.items():
            measure(make(d), *envs.get(tool, (env, REPO)))
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.reps):
        for d in folders:
            for tool, make in tools.items():
                r = measure(make(d), *envs.get(tool, (env, REPO)))
                runs.setdefault((d.name, tool), []).append(r)
                shown = r["error"] if "error" in r else f"wall {r['wall_s']:.3f} s  CPU {r['cpu_s']:.3f} s"
                print(f"  rep {rep + 1} {d.name:34} {tool:5} {shown}  load {r['load']:.2f}", flush=True)

    rows = []
    for d in folders:
        row = {"trace": d.name, "mb_json": json_mb(d)}
        for tool in tools:
            row[tool] = summarise(runs[(d.name, tool)])
        row["load"] = [min(r["load"] for t in tools for r in runs[(d.name, t)]),
                       max(r["load"] for t in tools for r in runs[(d.name, t)])]
        rows.append(row)
    _print_table(rows, "hta" in tools, args.reps, "base" in tools)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": {f"{k[0]}/{k[1]}": v for k, v in runs.items()}},
                                              indent=1))
    return 0


def _ratio(a: dict, b: dict, key: str) -> str:
    return f"{a[key] / b[key]:.2f}" if key in a and key in b and b[key] else "-"


def _fig(d: dict) -> str:
    return f"{d['wall_s']:.2f} / {d['cpu_s']:.2f}" if "wall_s" in d else d["error"][:40]


def _print_table(rows: list[dict], hta: bool, reps: int, base: bool = False) -> None:
    print(f"\nmedians of {reps} fresh processes each, wall / CPU seconds:\n")
    head = ["trace", "MB JSON", "ours", "floor", "ours/floor CPU", "ours/floor wall"]
    if base:
        head += ["base", "base/floor CPU"]
    if hta:
        head += ["HTA", "HTA/ours wall", "HTA/ours CPU"]
    head += ["ours MiB", "load"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        o, f = r["ours"], r["floor"]
        cells = [r["trace"], f"{r['mb_json']:.1f}", _fig(o), _fig(f), _ratio(o, f, "cpu_s"), _ratio(o, f, "wall_s")]
        if base:
            cells += [_fig(r["base"]), _ratio(r["base"], f, "cpu_s")]
        if hta:
            h = r["hta"]
            cells += [_fig(h), _ratio(h, o, "wall_s"), _ratio(h, o, "cpu_s")]
        cells += [f"{o['rss_mib']:.0f}" if "rss_mib" in o else "-", f"{r['load'][0]:.2f}-{r['load'][1]:.2f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
