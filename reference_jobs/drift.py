"""Long reference job whose behaviour changes mid-run: a small GRU sequence classifier under DDP,
captured armed for the whole run (``capture(..., auto=True)``), with no fixed window.

    torchrun --nproc_per_node 2 reference_jobs/drift.py --out runs/drift --change lag --change-at 80

``--change lag``: from step ``--change-at`` on, rank ``--slow-rank`` sleeps before every forward
(a rank that starts to lag, as after a checkpoint on one host); ``--change loader``: from then on
its dataset takes that long per batch (single-process loading: the loader slows). The extra time
is ``--factor`` times the healthy step, measured on the steps before the change (the largest over
the ranks, agreed through an all-reduce), so the change is the same share of the step on any
machine. ``--change none`` runs healthy throughout (the trigger test uses it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

from fsdpdoctor.capture import capture  # noqa: E402

import jobkit  # noqa: E402  (beside this file)

BATCH, SEQ, FEATURES, HIDDEN, CLASSES = 16, 32, 16, 48, 5


class Sequences(Dataset):
    """Synthetic sequences; ``delay_s`` per batch (spread over its samples) once the loader is made slow."""

    delay_s = 0.0

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s / BATCH)
        g = torch.Generator().manual_seed(int(i))
        return torch.randn(SEQ, FEATURES, generator=g), int(torch.randint(CLASSES, (1,), generator=g))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder")
    ap.add_argument("--steps", type=int, default=130)
    ap.add_argument("--change", choices=("lag", "loader", "none"), default="lag")
    ap.add_argument("--change-at", type=int, default=60)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--factor", type=float, default=3.0, help="extra time on the slow rank, in healthy steps")
    ap.add_argument("--window-steps", type=int, default=3)
    ap.add_argument("--min-rise", type=float, default=0.1, help="capture(min_rise=...): least slowdown worth a window")
    ap.add_argument("--no-auto", action="store_true", help="no windows on anomaly (trigger only)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(jobkit.GRUClassifier(FEATURES, HIDDEN, CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = Sequences(BATCH * world * (args.steps + 2))
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, world, rank, shuffle=False),
                        drop_last=True)
    slow = rank == args.slow_rank
    healthy: list[float] = []
    extra_s = 0.0
    t0 = time.perf_counter()
    with capture(args.out, model=model, optimizer=opt, fixed_window=False, auto=not args.no_auto,
                 window_steps=args.window_steps, min_rise=args.min_rise, samples_per_step=BATCH * world,
                 scenario={"name": f"drift_{args.change}", "injects": args.change,
                           "params": {"change_at": args.change_at, "slow_rank": args.slow_rank,
                                      "factor": args.factor}}) as cap:
        for step, (x, y) in enumerate(cap.batches(loader)):
            if step >= args.steps:
                break
            if step == args.change_at and args.change != "none":
                box = torch.tensor([statistics.median(healthy[5:] or healthy)], dtype=torch.float64)
                dist.all_reduce(box, op=dist.ReduceOp.MAX)
                extra_s = float(box.item()) * args.factor
                if slow and args.change == "loader":
                    Sequences.delay_s = extra_s
            s0 = time.perf_counter()
            if slow and args.change == "lag" and step >= args.change_at:
                time.sleep(extra_s)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step < args.change_at:
                healthy.append(time.perf_counter() - s0)
            cap.step()
    elapsed = time.perf_counter() - t0
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"drift_{args.change}: {args.steps} steps on {world} ranks in {elapsed:.1f} s, change at step "
              f"{args.change_at} (+{extra_s * 1e3:.1f} ms on rank {args.slow_rank}), windows: "
              + ("; ".join(f"{w['first']}-{w['last']} ({w['why']}: {w['reason']})" for w in cap._windows) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
