"""Reference job: a Wide & Deep click model (an embedding bag per categorical field beside a linear "wide" part
over the same ids, and an MLP over the bags and dense features) on synthetic click logs, under DDP, logging
metrics the ways users do:

- ``widedeep_lightning_sync_dist``: Lightning ``Trainer(strategy=DDPStrategy(...))``, the training step logs
  its loss with ``self.log(..., sync_dist=True)`` and five batch statistics with
  ``self.log_dict(..., sync_dist=True)``: a barrier and an all-reduce per value, every step;
- ``widedeep_torchmetrics_compute``: a hand-written DDP loop with a torchmetrics ``MetricCollection``
  (accuracy, precision, recall, mean loss) updated every step and ``compute()``-d every step for a progress
  line: ``sync_on_compute=True`` (the default) gathers every state from every rank at each ``compute()``;
- ``widedeep_lightning_epoch``: the Lightning job logging the way that syncs nothing per step: the loss without
  ``sync_dist``, the accuracy as a torchmetrics object with ``on_step=False, on_epoch=True`` (synced once, at
  the epoch's end).

    torchrun --nproc_per_node 2 reference_jobs/lightning_metrics.py --scenario widedeep_lightning_sync_dist \
        --out runs/widedeep
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
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

FIELDS, VOCAB, IDS_PER_FIELD, DENSE, EMB, BATCH = 6, 1000, 4, 13, 16, 256


class ClickLogs(Dataset):
    """``n`` batches of ``BATCH`` synthetic impressions: ``IDS_PER_FIELD`` ids in each of ``FIELDS`` categorical
    fields, ``DENSE`` dense features and a click label, the same on every run. Made once, in memory, and read a
    batch at a time (the loader's batch_size=None): reading costs next to nothing, the job is about logging."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(VOCAB, (n, BATCH, FIELDS, IDS_PER_FIELD), generator=g)
        self.dense = torch.randn(n, BATCH, DENSE, generator=g)
        self.clicks = (torch.rand(n, BATCH, generator=g) < 0.2).float()

    def __len__(self):
        return len(self.clicks)

    def __getitem__(self, i):
        return self.ids[i], self.dense[i], self.clicks[i]


class WideDeep(nn.Module):
    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(VOCAB, EMB, mode="mean") for _ in range(FIELDS))
        self.wide = nn.EmbeddingBag(FIELDS * VOCAB, 1, mode="sum")
        self.deep = nn.Sequential(nn.Linear(FIELDS * EMB + DENSE, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                  nn.Linear(128, 1))

    def forward(self, ids, dense):
        bags = [bag(ids[:, f]) for f, bag in enumerate(self.bags)]
        offset = torch.arange(FIELDS).view(1, FIELDS, 1) * VOCAB
        wide = self.wide((ids + offset).flatten(1))
        return (wide + self.deep(torch.cat(bags + [dense], dim=1))).squeeze(1)


def _loader(world: int, rank: int | None, steps: int) -> DataLoader:
    ds = ClickLogs(world * (steps + 4))
    sampler = None if rank is None else DistributedSampler(ds, world, rank, shuffle=False)
    return DataLoader(ds, batch_size=None, sampler=sampler, shuffle=False)


def _torchmetrics_loop(args, sc, p, rank, world, steps):
    from torchmetrics import MeanMetric, MetricCollection
    from torchmetrics.classification import BinaryAccuracy, BinaryPrecision, BinaryRecall

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(WideDeep())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    metrics = MetricCollection({"acc": BinaryAccuracy(), "precision": BinaryPrecision(),
                                "recall": BinaryRecall()})
    mean_loss = MeanMetric()
    it = iter(_loader(world, rank, steps))
    progress = []

    def train_step():
        ids, dense, clicks = next(it)
        logits = model(ids, dense)
        loss = F.binary_cross_entropy_with_logits(logits, clicks)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        metrics.update(logits.detach().sigmoid(), clicks.long())
        mean_loss.update(loss.detach())
        # the progress line: compute() syncs every state across the ranks (sync_on_compute=True)
        progress.append({k: v for k, v in metrics.compute().items()} | {"loss": mean_loss.compute()})

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world)
    return jobkit.finish(args, steps, world, elapsed)


def _lightning(args, sc, p, rank, world, steps):
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
    from torchmetrics.classification import BinaryAccuracy

    from fsdpdoctor.capture.lightning import FsdpdoctorCallback

    sync_every_step = p["logging"] == "sync_dist"

    class LitWideDeep(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = WideDeep()
            self.train_acc = BinaryAccuracy()

        def training_step(self, batch, batch_idx):
            ids, dense, clicks = batch
            logits = self.net(ids, dense)
            loss = F.binary_cross_entropy_with_logits(logits, clicks.float())
            probs = logits.detach().sigmoid()
            if sync_every_step:
                self.log("train_loss", loss, sync_dist=True)
                hits = (probs > 0.5).float()
                self.log_dict({"train_acc": (hits == clicks).float().mean(), "train_click_rate": clicks.mean(),
                               "train_mean_prob": probs.mean(), "train_pred_rate": hits.mean(),
                               "train_recall": (hits * clicks).sum() / clicks.sum().clamp(min=1.0)},
                              sync_dist=True)
            else:
                self.log("train_loss", loss)
                self.train_acc(probs, clicks.long())
                self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=DDPStrategy(process_group_backend="gloo"),
                        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        # samples_per_step given: the loader reads whole batches (batch_size=None)
                        callbacks=[FsdpdoctorCallback(args.out, wait=args.wait, warmup=args.warmup, active=args.active,
                                                      with_stack=not args.no_stack, samples_per_step=BATCH * world,
                                                      scenario={"name": args.scenario, "injects": sc["injects"],
                                                                "params": p})])
    trainer.fit(LitWideDeep(), _loader(world, None, steps))   # Lightning adds the distributed sampler
    return jobkit.finish(args, steps, world, 0.0)


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    if p["logging"] == "torchmetrics_compute":
        return _torchmetrics_loop(args, sc, p, rank, world, steps)
    return _lightning(args, sc, p, rank, world, steps)


if __name__ == "__main__":
    sys.exit(main())
