"""Reference job: one small MLP-Mixer on synthetic images, trained under DDP by the loops people
actually run, so their breakdowns can be compared phase by phase:

- ``plain``: a hand-written loop (forward, backward, ``opt.step()``);
- ``lightning``: PyTorch Lightning ``Trainer(strategy="ddp")``, forward and backward inside
  ``optimizer.step(closure)``, captured with ``fsdpdoctor.capture.lightning.FsdpdoctorCallback``;
- ``lbfgs``: the same model with ``torch.optim.LBFGS`` (``max_iter=1``: one closure call per step);
- ``hf_trainer``: the Hugging Face ``Trainer`` (Accelerate underneath), captured with
  ``fsdpdoctor.capture.hf.FsdpdoctorCallback``.

    torchrun --nproc_per_node 2 reference_jobs/frameworks.py --scenario mixer_lightning --out runs/lit
"""

from __future__ import annotations

import sys
import tempfile
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

BATCH, SIZE, PATCH, CLASSES = 32, 32, 4, 10


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    """MLP-Mixer: patches embedded, then token-mixing and channel-mixing MLPs."""

    def __init__(self, dim: int = 96, depth: int = 4):
        super().__init__()
        tokens = (SIZE // PATCH) ** 2
        self.embed = nn.Conv2d(3, dim, PATCH, PATCH)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim) for _ in range(depth)])
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(1))



def _plain(args, sc, p, rank, world, steps, lbfgs: bool):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Mixer())
    opt = (torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=1, history_size=5) if lbfgs
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    ds = jobkit.SyntheticImages(BATCH * world * (steps + 2), SIZE, CLASSES)
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, world, rank, shuffle=False),
                        drop_last=True)
    it = iter(loader)

    def train_step():
        images, labels = next(it)
        if lbfgs:
            def closure():
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(images), labels)
                loss.backward()
                return loss
            opt.step(closure)
            return
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world)
    return jobkit.finish(args, steps, world, elapsed)


def _capture_kwargs(args, sc, p) -> dict:
    return dict(wait=args.wait, warmup=args.warmup, active=args.active, with_stack=not args.no_stack,
                scenario={"name": args.scenario, "injects": sc["injects"], "params": p})


def _lightning(args, sc, p, rank, world, steps):
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    from fsdpdoctor.capture.lightning import FsdpdoctorCallback

    class LitMixer(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Mixer()

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return F.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    torch.manual_seed(0)
    ds = jobkit.SyntheticImages(BATCH * world * (steps + 2), SIZE, CLASSES)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=False, drop_last=True)  # Lightning adds the sampler
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=DDPStrategy(process_group_backend="gloo"),
                        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        callbacks=[FsdpdoctorCallback(args.out, **_capture_kwargs(args, sc, p))])
    trainer.fit(LitMixer(), loader)
    return jobkit.finish(args, steps, world, 0.0)


def _hf_trainer(args, sc, p, rank, world, steps):
    from transformers import Trainer, TrainingArguments

    from fsdpdoctor.capture.hf import FsdpdoctorCallback

    class MixerForTrainer(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Mixer()

        def forward(self, pixels, labels):
            return {"loss": F.cross_entropy(self.net(pixels), labels)}

    torch.manual_seed(0)
    ds = jobkit.SyntheticImages(BATCH * world * (steps + 2), SIZE, CLASSES, as_dict=True)
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, per_device_train_batch_size=BATCH, max_steps=steps,
                                  use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                                  logging_strategy="no", learning_rate=0.05, optim="sgd",
                                  lr_scheduler_type="constant", dataloader_num_workers=0,
                                  disable_tqdm=True)
        trainer = Trainer(model=MixerForTrainer(), args=targs, train_dataset=ds)
        trainer.add_callback(FsdpdoctorCallback(args.out, trainer=trainer, **_capture_kwargs(args, sc, p)))
        trainer.train()
    return jobkit.finish(args, steps, world, 0.0)


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    loop = p["loop"]
    if loop == "lightning":
        return _lightning(args, sc, p, rank, world, steps)
    if loop == "hf_trainer":
        return _hf_trainer(args, sc, p, rank, world, steps)
    return _plain(args, sc, p, rank, world, steps, lbfgs=loop == "lbfgs")


if __name__ == "__main__":
    sys.exit(main())
