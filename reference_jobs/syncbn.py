"""Reference job: a pre-activation ResNet with synchronised BatchNorm under DDP, on synthetic images.

torch's ``nn.SyncBatchNorm`` refuses CPU tensors, so the layers here are a gloo-capable equivalent written
the same way: the forward all-gathers each rank's batch mean, mean of squares and count, the backward
all-reduces the two gradient sums (``SyncBatchNormStats``, an autograd Function). Each of those small
exchanges waits for the layer before it, so no DDP bucket can merge them; DDP also broadcasts the
running statistics (buffers) from rank 0 before every forward.

    torchrun --nproc_per_node 2 reference_jobs/syncbn.py --scenario syncbn_ddp --out runs/syncbn
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

BATCH, SIZE, CLASSES = 16, 16, 10
_DIMS = (0, 2, 3)


def _bcast(v):
    return v[None, :, None, None]


class SyncBatchNormStats(torch.autograd.Function):
    """Batch normalisation over the batches of every rank (what torch's SyncBatchNorm computes)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps: float, momentum: float):
        c = x.shape[1]
        n = x.numel() // c
        stats = torch.cat([x.mean(_DIMS), (x * x).mean(_DIMS), torch.tensor([float(n)])])
        parts = [torch.empty_like(stats) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, stats)
        g = torch.stack(parts)
        counts = g[:, -1:]
        total = counts.sum()
        mean = (g[:, :c] * counts).sum(0) / total
        var = (g[:, c:2 * c] * counts).sum(0) / total - mean * mean
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var * total / (total - 1))
        invstd = torch.rsqrt(var + eps)
        xhat = (x - _bcast(mean)) * _bcast(invstd)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total = total   # a tensor: float() here would be a host sync per layer
        return xhat * _bcast(weight) + _bcast(bias)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        c = dy.shape[1]
        local = torch.cat([dy.sum(_DIMS), (dy * xhat).sum(_DIMS)])
        sums = local.clone()
        dist.all_reduce(sums)
        sum_dy, sum_dy_xhat = sums[:c], sums[c:]
        n = ctx.total
        dx = _bcast(weight * invstd / n) * (n * dy - _bcast(sum_dy) - xhat * _bcast(sum_dy_xhat))
        # parameter gradients stay local: DDP averages them with the others
        return dx, local[c:], local[:c], None, None, None, None


class GlooSyncBatchNorm(nn.BatchNorm2d):
    def forward(self, x):
        if not self.training:
            return super().forward(x)
        return SyncBatchNormStats.apply(x, self.weight, self.bias, self.running_mean, self.running_var,
                                        self.eps, self.momentum)


class PreActBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.bn1, self.bn2 = GlooSyncBatchNorm(cin), GlooSyncBatchNorm(cout)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.short = nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None

    def forward(self, x):
        y = F.relu(self.bn1(x))
        s = self.short(y) if self.short is not None else x
        return self.conv2(F.relu(self.bn2(self.conv1(y)))) + s


class PreActResNet(nn.Module):
    """Pre-activation ResNet-18 layout (2 blocks in each of 4 stages), narrow: 17 synchronised norms."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        blocks, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for i in range(2):
                blocks.append(PreActBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.bn = GlooSyncBatchNorm(cin)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        x = F.relu(self.bn(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))



def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(PreActResNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    ds = jobkit.SyntheticImages(BATCH * world * (steps + 2), SIZE, CLASSES)
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, world, rank, shuffle=False),
                        drop_last=True)
    it = iter(loader)

    def train_step():
        images, labels = next(it)
        loss = F.cross_entropy(model(images), labels)
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
