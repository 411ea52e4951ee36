"""Reference job: training loops written the way other people write them, with settings no other
reference job uses:

- ``vit_fsdp2_bf16_ckpt``: a small ViT, ``fully_shard`` per block with
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` and every block
  recomputed in backward (``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` called in
  the model's forward, not a wrapper): the recompute is its one injected cost;
- ``gru_lm_amp_accum`` (healthy): a GRU language model under DDP with ``gradient_as_bucket_view=True``
  (with ``static_graph=True`` torch 2.13's reducer asserts on the first ``no_sync()`` micro-step:
  ``gru_lm_static_graph`` runs it without accumulation), the forward under
  ``torch.autocast("cpu", torch.bfloat16)``, three micro-steps per optimizer step with the first two in
  ``no_sync()``;
- ``gru_lm_amp_accum_sync_every``: the same without ``no_sync()`` (all-reduce every micro-step);
- ``mlp_loss_allreduce``: an MLP regressor under DDP with a hand-written loop that keeps its
  gradients (``zero_grad(set_to_none=False)``) and averages the loss over the ranks for its log every
  step (``dist.all_reduce`` of one scalar, then ``.item()``): a real extra collective, small and cheap, that
  must not be taken for gradient sync, and a real host sync (free on CPU, named at info);
- ``mlp_compiled_loss_allreduce``: the same loop with ``torch.compile(DDP(model))``;
- ``gru_lm_static_graph`` (healthy): the GRU language model under DDP with ``static_graph=True``, one
  micro-step per optimizer step.

    torchrun --nproc_per_node 2 reference_jobs/user_loops.py --scenario mlp_loss_allreduce --out runs/u
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402
from wrapping import BATCH, CLASSES, SIZE, TinyViT  # noqa: E402

VOCAB, EMBED, HIDDEN, SEQ, LM_BATCH = 2048, 64, 128, 16, 16


class CheckpointedViT(TinyViT):
    """The ViT of wrapping.py with every block recomputed in backward."""

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(self.norm(x).mean(1))


class GRULanguageModel(nn.Module):
    """Next-token prediction with a two-layer GRU (under autocast on CPU it runs step by step: short
    sequences keep the trace small)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.gru = nn.GRU(EMBED, HIDDEN, num_layers=2, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)


def vit_fsdp2(rank: int, steps: int):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = CheckpointedViT()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(CLASSES, (BATCH,), generator=g))
               for _ in range(steps)]
    it = iter(batches)

    def train_step():
        x, y = next(it)
        F.cross_entropy(model(x).float(), y).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, train_step, BATCH


def gru_lm(rank: int, steps: int, no_sync: bool, static: bool = False):
    model = DDP(GRULanguageModel(), gradient_as_bucket_view=True, static_graph=static)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    accum = 1 if static else 3
    g = torch.Generator().manual_seed(rank)
    batches = iter([torch.randint(VOCAB, (LM_BATCH, SEQ + 1), generator=g) for _ in range(steps * accum)])

    def train_step():
        for micro in range(accum):
            tokens = next(batches)
            last = micro == accum - 1
            with (model.no_sync() if no_sync and not last else contextlib.nullcontext()):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) / accum
                loss.backward()
        opt.step()
        opt.zero_grad()

    return model, opt, train_step, LM_BATCH * accum


def mlp_loss_allreduce(rank: int, steps: int, world: int, compiled: bool = False):
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    batches = iter([(torch.randn(64, 256, generator=g), torch.randn(64, 1, generator=g)) for _ in range(steps)])
    log = []

    def train_step():
        x, y = next(batches)
        opt.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)                 # the mean loss over the ranks, for the log
        log.append(avg.item() / world)

    return model, opt, train_step, 64


def main(argv=None) -> int:
    args, sc, p, rank, world = jobkit.start(SCENARIOS, __doc__, argv)
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    if p["loop"] == "vit_fsdp2_bf16_ckpt":
        model, opt, train_step, per_rank = vit_fsdp2(rank, steps)
    elif p["loop"] in ("gru_lm", "gru_lm_sync_every"):
        model, opt, train_step, per_rank = gru_lm(rank, steps, no_sync=p["loop"] == "gru_lm")
    elif p["loop"] == "gru_lm_static":
        model, opt, train_step, per_rank = gru_lm(rank, steps, no_sync=False, static=True)
    else:
        model, opt, train_step, per_rank = mlp_loss_allreduce(rank, steps, world, compiled=p["loop"] == "mlp_compiled")
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=per_rank * world)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
