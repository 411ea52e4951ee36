"""The profiler's own host cost per recorded event on a GPU machine (torch.profiler with CPU and CUDA
activities, record_shapes and with_stack, as fsdpdoctor.capture records), measured as bare against profiled
loops of one kind of call each; needs a CUDA GPU.

    python benchmarks/profiler_cost_cuda.py OUT.json

Each loop runs N iterations bare and profiled, interleaved (bare, profiled, bare, profiled, ...; medians of
``--reps``), and the profiled trace's events per iteration are counted by category: the extra host time per
iteration, divided among torch ops, CUDA runtime calls and Python frames by a least-squares fit over the loops.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

N = 4000


def _loops(dev):
    x = torch.zeros(16, device=dev)
    big = torch.zeros(1024, device=dev)

    def add():  # one op, one kernel launch
        for _ in range(N):
            x.add_(1)

    def empty():  # one op, no runtime call (caching allocator)
        for _ in range(N):
            torch.empty(16, device=dev)

    def view():  # a view op: one op, nothing on the device
        for _ in range(N):
            big[3]

    def item():  # select + item + _local_scalar_dense, a copy and a sync
        for i in range(N):
            big[i % 1024].item()

    def f():
        x.add_(1)

    def pyfunc():  # the add_ launch inside a Python function: one more Python frame
        for _ in range(N):
            f()

    lin = torch.nn.Linear(16, 16, device=dev)

    def module():  # an nn.Module call: its Python frames, a linear's ops and launches
        for _ in range(N):
            lin(x)

    return {"add": add, "empty": empty, "view": view, "item": item, "pyfunc": pyfunc, "module": module}


def _bare(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / N


def _profiled(fn, keep: Path | None):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 with_stack=True) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / N
    counts = None
    if keep is not None:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "t.json"
            prof.export_chrome_trace(str(raw))
            ev = json.loads(raw.read_text())["traceEvents"]
        counts = collections.Counter(e.get("cat") for e in ev if e.get("ph") == "X")
        counts = {k: v / N for k, v in counts.items() if k}
    return dt, counts


def main() -> int:
    out = Path(sys.argv[1])
    dev = torch.device("cuda")
    loops = _loops(dev)
    for fn in loops.values():  # warm up: context, allocator, kernels loaded
        fn()
    res = {}
    for name, fn in loops.items():
        bare, prof, counts = [], [], None
        for rep in range(5):
            bare.append(_bare(fn))
            dt, c = _profiled(fn, out if rep == 0 else None)
            prof.append(dt)
            counts = counts or c
        res[name] = {"bare_us": statistics.median(bare) * 1e6, "profiled_us": statistics.median(prof) * 1e6,
                     "bare_all_us": [b * 1e6 for b in bare], "profiled_all_us": [p * 1e6 for p in prof],
                     "events_per_iter": counts}
        print(name, round(res[name]["bare_us"], 2), round(res[name]["profiled_us"], 2), counts, flush=True)
    res["torch"] = torch.__version__
    res["gpu"] = torch.cuda.get_device_name()
    out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
