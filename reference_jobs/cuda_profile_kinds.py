"""Record the GPU inputs a reader must name rather than misread (issue "Know what you read"); needs a CUDA GPU.

    python reference_jobs/cuda_profile_kinds.py --out DIR

Writes, each as ``DIR/<name>/rank0.json.gz`` from plain ``torch.profiler`` (no fsdpdoctor capture):

- ``no_cuda_activity``: a training loop on the GPU profiled with ``activities=[ProfilerActivity.CPU]``
  only: kernel launches in the host timeline and no device timeline (the user forgot the CUDA activity);
- ``startup_in_window``: the profiler started before the process touched the GPU, so the first step
  holds context creation, the first cuBLAS call and module loads (one-time start-up inside the window);
- ``startup_no_steps``: the same with no schedule, as ``with profile(...)`` around a loop is often
  written: torch records no ``ProfilerStep#`` marker then, and the window is one span;
- ``copies_only``: a host loop that stages batches on the GPU and reads rows back (host-to-device,
  device-to-device and device-to-host copies, no arithmetic on the device): a device timeline of copies and
  no kernel, which is still a device timeline (its copies, and the syncs of the reads back).

Each runs the same MLP, world size 1, no process group; the first two with a schedule (``ProfilerStep#``
markers, written by ``on_trace_ready`` when the active steps end).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule


def _model(device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
                         nn.Linear(2048, 10)).to(device)


def _loop(prof, device, steps: int) -> None:
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=device), torch.randint(10, (256,), device=device)
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        prof.step()
    torch.cuda.synchronize()


def _copies_loop(prof, device, steps: int) -> None:
    """Copies only: no op here launches a kernel (contiguous same-dtype copies go through cudaMemcpyAsync)."""
    host = torch.randn(2048, 2048).pin_memory()
    staged = torch.empty(2048, 2048, device=device)
    for _ in range(steps):
        batch = host.to(device, non_blocking=True)  # Memcpy HtoD (pinned)
        staged.copy_(batch)  # Memcpy DtoD
        rows = [staged[i].cpu() for i in range(0, 2048, 32)]  # 64 Memcpy DtoH, each a host sync
        del rows
        prof.step()
    torch.cuda.synchronize()


def _write(prof, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(folder / "rank0.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def _profiled(out: Path, name: str, device, activities, sched, steps: int, loop=_loop) -> None:
    """``steps`` training steps under one profiler; the trace written when the schedule's cycle ends (or at
    the exit, without a schedule)."""
    ready = None if sched is None else (lambda p: _write(p, out / name))
    with profile(activities=activities, schedule=sched, on_trace_ready=ready, record_shapes=True,
                 with_stack=True) as prof:
        loop(prof, device, steps)
    if sched is None:
        _write(prof, out / name)
    print(f"wrote {out / name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--which", choices=["startup_in_window", "startup_no_steps", "no_cuda_activity", "copies_only"],
                    default="startup_in_window", help="one recording per process: start-up happens once")
    args = ap.parse_args()
    out, device = Path(args.out), torch.device("cuda")
    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    if args.which == "startup_in_window":  # this process has not touched the GPU yet: start-up is in step 1
        _profiled(out, args.which, device, both, schedule(wait=0, warmup=0, active=4, repeat=1), 4)
    elif args.which == "startup_no_steps":
        _profiled(out, args.which, device, both, None, 4)
    elif args.which == "copies_only":
        torch.zeros(1, device=device)  # context created before the window: the copies alone are recorded
        _profiled(out, args.which, device, both, schedule(wait=1, warmup=1, active=4, repeat=1), 6, _copies_loop)
    else:
        _profiled(out, args.which, device, [ProfilerActivity.CPU], schedule(wait=1, warmup=1, active=4, repeat=1), 6)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
