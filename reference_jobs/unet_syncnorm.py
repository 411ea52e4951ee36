"""Reference job: a small U-Net segmenting synthetic images per pixel, with a synchronised BatchNorm after every
convolution (the gloo-capable SyncBatchNorm of syncbn.py: torch's refuses CPU tensors), under DDP.

Each of its 10 norms all-gathers the ranks' batch statistics in forward and all-reduces two gradient sums in
backward: 20 small exchanges a step, each waiting for the layer before it. They are the synchronised norms'
own, not DDP's gradient buckets, so the fix for them is about the norms (fewer synchronised layers, plain
BatchNorm with a larger per-rank batch), never ``bucket_cap_mb``.

    torchrun --nproc_per_node 2 reference_jobs/unet_syncnorm.py --scenario unet_syncnorm_ddp --out runs/unet
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402
from syncbn import GlooSyncBatchNorm  # noqa: E402

BATCH, SIZE, CLASSES, WIDTH = 8, 32, 4, 12


def conv_norm(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), GlooSyncBatchNorm(cout), nn.ReLU())


class UNet(nn.Module):
    """Two down and two up levels with skip connections: 10 convolutions, each with a synchronised norm."""

    def __init__(self, w: int = WIDTH):
        super().__init__()
        self.enc1 = nn.Sequential(conv_norm(3, w), conv_norm(w, w))
        self.enc2 = nn.Sequential(conv_norm(w, 2 * w), conv_norm(2 * w, 2 * w))
        self.mid = nn.Sequential(conv_norm(2 * w, 4 * w), conv_norm(4 * w, 2 * w))
        self.dec2 = nn.Sequential(conv_norm(4 * w, 2 * w), conv_norm(2 * w, w))
        self.dec1 = nn.Sequential(conv_norm(2 * w, w), conv_norm(w, w))
        self.head = nn.Conv2d(w, CLASSES, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([F.interpolate(m, scale_factor=2.0), e2], dim=1))
        d1 = self.dec1(torch.cat([F.interpolate(d2, scale_factor=2.0), e1], dim=1))
        return self.head(d1)


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(CLASSES, (BATCH, SIZE, SIZE), generator=g)


def main(argv=None) -> int:
    args, sc, p, rank, world = jobkit.start(SCENARIOS, __doc__, argv)
    model = nn.parallel.DistributedDataParallel(UNet())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    counter = iter(range(10 ** 9))

    def train_step():
        images, masks = batch_for(rank, next(counter))
        loss = F.cross_entropy(model(images), masks)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    model.train()
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
