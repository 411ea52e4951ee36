"""Reference job: FSDP2 HSDP on a (2, 2) DeviceMesh over gloo, 4 ranks, where one rank sleeps in a metrics
call every step (a straggler seen through two process groups).

The mesh's dimensions are ("replicate", "shard"): each block is sharded over a pair of ranks and its
gradients all-reduced with the pair's replica. The slow rank is late only at the collectives of its own
groups; the rank that shares no group with it waits for it through the others, who are late because they
waited. Its saving is what the others would not wait without it, not the next-latest rank's wait.

    torchrun --nproc_per_node 4 reference_jobs/hsdp_straggler.py --out runs/hsdp --sleep-ms 150
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import jobkit  # noqa: E402

DIM, DEPTH, BATCH, CLASSES = 64, 3, 16, 10


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def log_metrics(ms: float) -> None:
    """The injected straggler: a metrics call that blocks this rank (a slow logger, a sync to a tracker)."""
    time.sleep(ms / 1000.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="run folder (manifest.json, rank<N>.json.gz)")
    ap.add_argument("--sleep-ms", type=float, default=150.0, help="the slow rank's sleep per step")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=4)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args(argv)
    args.ranks, args.no_stack, args.scenario = None, False, "hsdp_straggler"
    if not args.no_profile and not args.out:
        ap.error("--out is required unless --no-profile")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 4:
        raise SystemExit("hsdp_straggler: run with --nproc_per_node 4 (a (2, 2) mesh)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)

    def train_step():
        x, y = torch.randn(BATCH, DIM, generator=g), torch.randint(CLASSES, (BATCH,), generator=g)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == args.slow_rank:
            log_metrics(args.sleep_ms)

    steps = args.wait + args.warmup + args.active + 1
    scenario = {"name": "hsdp_straggler", "injects": f"rank {args.slow_rank} sleeps {args.sleep_ms:g} ms a step in "
                "a metrics call (FSDP2 HSDP, (2, 2) mesh)", "params": {"sleep_ms": args.sleep_ms,
                                                                      "slow_rank": args.slow_rank}}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
