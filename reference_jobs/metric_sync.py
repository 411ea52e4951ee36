"""Reference job: a graph convolutional network classifying small synthetic graphs, 2 ranks over gloo,
with its metrics kept by torchmetrics, as Lightning users and hand-written loops keep them.

- ``metrics=step``: ``MulticlassAccuracy`` (macro: four per-class states) and ``MeanMetric`` (the loss)
  with ``dist_sync_on_step=True``: every step's ``metric(preds, target)`` syncs each state across the
  ranks (torchmetrics' gather_all_tensors: a barrier and one or two all-gathers per state, 6 barriers and
  10 all-gathers a step);
- ``metrics=epoch``: the same metrics with ``dist_sync_on_step=False`` (the default): the step updates
  local state only, ``compute()`` syncs once at the end of the epoch (here, the job);
- ``variant=clip_fsdp1``: the model under FSDP1 (one unit per graph layer), ``model.clip_grad_norm_``
  every step (FSDP all-reduces the squared norm of its shards);
- ``variant=zero``: DDP with ``ZeroRedundancyOptimizer`` (each rank updates its shard of Adam's state,
  then broadcasts its parameters to the others after every step).

    torchrun --nproc_per_node 2 reference_jobs/metric_sync.py --scenario gcn_metric_sync_step --out runs/gcn
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchmetrics  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

GRAPHS, NODES, FEATURES, HIDDEN, CLASSES, LAYERS = 32, 48, 32, 160, 8, 4


class GraphConv(nn.Module):
    """One graph convolution: mix each node with its neighbours (the normalised adjacency), then a
    linear map, with a residual connection."""

    def __init__(self, dim: int):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, h, adj):
        return h + F.gelu(self.lin(self.norm(torch.bmm(adj, h))))


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.layers = nn.ModuleList([GraphConv(HIDDEN) for _ in range(LAYERS)])
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, adj):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, adj)
        return self.head(h.mean(1))   # graph-level readout


def graphs(g: torch.Generator):
    """A batch of random graphs: node features, the symmetric normalised adjacency (with self-loops),
    labels."""
    x = torch.randn(GRAPHS, NODES, FEATURES, generator=g)
    a = (torch.rand(GRAPHS, NODES, NODES, generator=g) < 0.1).float()
    a = ((a + a.transpose(1, 2)) > 0).float() + torch.eye(NODES)
    d = a.sum(-1).rsqrt()
    return x, d[:, :, None] * a * d[:, None, :], torch.randint(CLASSES, (GRAPHS,), generator=g)


def wrap(model: nn.Module, variant: str):
    if variant == "clip_fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({GraphConv}), device_id=torch.device("cpu"))
    return nn.parallel.DistributedDataParallel(model)


def optimizer(model: nn.Module, variant: str):
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def main(argv=None) -> int:
    args, sc, p, rank, world = jobkit.start(SCENARIOS, __doc__, argv)
    model = wrap(GCN(), p["variant"])
    opt = optimizer(model, p["variant"])
    on_step = p["metrics"] == "step"
    accuracy = torchmetrics.classification.MulticlassAccuracy(CLASSES, average="macro", dist_sync_on_step=on_step)
    mean_loss = torchmetrics.MeanMetric(dist_sync_on_step=on_step)
    g = torch.Generator().manual_seed(rank)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    metric_s = []

    def train_step():
        x, adj, y = graphs(g)
        logits = model(x, adj)
        loss = F.cross_entropy(logits, y)
        # the per-step values a progress bar shows: with dist_sync_on_step=True each call syncs its states
        t0 = time.perf_counter()
        accuracy(logits.detach(), y), mean_loss(loss.detach())
        metric_s.append(time.perf_counter() - t0)
        loss.backward()
        if p["variant"] == "clip_fsdp1":
            model.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # the job's own clock, before the captured steps: its step and the time in its metric calls
    t0 = time.perf_counter()
    for _ in range(4):
        train_step()
    probe_ms = (time.perf_counter() - t0) / 4 * 1e3
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p,
                "facts": {"step_ms_before_capture": round(probe_ms, 1),
                          "metric_calls_ms_before_capture": round(sum(metric_s) / len(metric_s) * 1e3, 1)}}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=GRAPHS * world)
    # the end of the epoch: one sync of every metric's state (what dist_sync_on_step=False defers to)
    epoch = (float(accuracy.compute()), float(mean_loss.compute()))
    return jobkit.finish(args, steps, world, elapsed, extra=f" (epoch accuracy {epoch[0]:.3f}, loss {epoch[1]:.3f})")


if __name__ == "__main__":
    sys.exit(main())
