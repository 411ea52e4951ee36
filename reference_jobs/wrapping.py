"""Reference job: how a model is cut into FSDP units. A small vision transformer (patch embedding,
three pre-norm attention blocks, a classification head) on synthetic images, sharded three ways:

- ``per_block`` (healthy): ``fully_shard`` on every block, then the root;
- ``fsdp2_root_only``: ``fully_shard(model)`` alone: one unit, one all-gather of everything;
- ``fsdp1_no_policy``: ``FullyShardedDataParallel(model)`` without an ``auto_wrap_policy``: one unit too;
- ``fsdp1_per_block_no_prefetch`` with ``collate_sleep_ms``: two faults at once, FSDP1
  ``backward_prefetch=None`` and a rank whose batch collation takes that much longer.

One unit cannot overlap: its all-gather must finish before the first layer runs and its reduce-scatter
starts after the last gradient, and the whole model is unsharded at once (peak memory of the unsharded
parameters and gradients).

    torchrun --nproc_per_node 2 reference_jobs/wrapping.py --scenario wrap_fsdp2_root_only --out runs/w
"""

from __future__ import annotations

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
from torch.utils.data import DataLoader  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

BATCH, SIZE, PATCH, DIM, DEPTH, CLASSES = 8, 32, 4, 128, 3, 10


class ViTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.pos = nn.Parameter(torch.zeros(1, (SIZE // PATCH) ** 2, DIM))
        self.blocks = nn.ModuleList([ViTBlock() for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(1))


def shard(model: TinyViT, how: str):
    if how in ("fsdp1_no_policy", "fsdp1_per_block_no_prefetch"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if how == "fsdp1_no_policy":
            return FSDP(model, device_id=torch.device("cpu"))
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({ViTBlock}), backward_prefetch=None,
                    device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard

    if how == "per_block":
        for b in model.blocks:
            fully_shard(b)
    fully_shard(model)
    return model


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = shard(TinyViT(), p["units"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    slow_collate_s = p["collate_sleep_ms"] / 1000.0 if rank == p["slow_rank"] else 0.0

    def tokenize_and_collate(items):
        """The batch's preprocessing; on the slow rank it takes collate_sleep_ms longer (a slow disk, a
        tokenizer on a busy core)."""
        if slow_collate_s:
            time.sleep(slow_collate_s)
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])

    data = [(torch.randn(3, SIZE, SIZE, generator=g), int(torch.randint(CLASSES, (1,), generator=g)))
            for _ in range(BATCH * (steps + 1))]
    it = iter(DataLoader(data, batch_size=BATCH, collate_fn=tokenize_and_collate))

    def train_step():
        x, y = next(it)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
