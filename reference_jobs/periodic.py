"""Reference job: periodic work on rank 0 inside the training loop, as jobs do it: a checkpoint saved
every 4th step, or an evaluation pass every 3rd step. The model is a small recommender (embedding bags
for categorical features, an MLP over them and the dense features), DDP over gloo.

    torchrun --nproc_per_node 2 reference_jobs/periodic.py --scenario periodic_checkpoint --out runs/ckpt

The periodic work is sized from the job's own step time, measured before the captured steps (a
checkpoint of about three healthy steps, an evaluation of a few), so it stands out of the noise on any
machine; the job runs 20 steps so the step series holds several periods. ``periodic_checkpoint_short``
runs only the profiled steps (wait 1, warmup 1, active 8): the stall is seen twice, in the profiled window
alone. ``periodic_eval_all_ranks``: every rank evaluates its own share of the held-out set (a share of
about four steps each), so every rank's step holds the work and none waits for another.
"""

from __future__ import annotations

import os
import sys
import tempfile
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
from scenarios import SCENARIOS  # noqa: E402

BATCH, TABLES, ROWS, DIM, DENSE = 256, 8, 5000, 32, 16


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList([nn.EmbeddingBag(ROWS, DIM, mode="sum") for _ in range(TABLES)])
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, DIM))
        self.top = nn.Sequential(nn.Linear(DIM * (TABLES + 1), 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, dense, sparse):
        feats = [self.bottom(dense)] + [t(sparse[:, i]) for i, t in enumerate(self.tables)]
        return self.top(torch.cat(feats, 1)).squeeze(1)


def batch(g: torch.Generator):
    return (torch.randn(BATCH, DENSE, generator=g), torch.randint(ROWS, (BATCH, TABLES, 4), generator=g),
            torch.rand(BATCH, generator=g))


def save_checkpoint(model, opt, path: str, copies: int) -> None:
    """Rank 0's checkpoint: the model and optimizer state, written and flushed to disk."""
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    for i in range(copies):
        with open(f"{path}.{i}", "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())


def evaluate(model, batches: list) -> float:
    """Rank 0's evaluation pass over held-out batches."""
    model.eval()
    total = torch.zeros(())
    with torch.no_grad():
        for dense, sparse, y in batches:
            total += F.binary_cross_entropy_with_logits(model(dense, sparse), y)
    model.train()
    return total / len(batches)   # a tensor: the caller logs it when it needs the value


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Recommender())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    steps = args.steps if args.steps is not None else p.get("total_steps") or 20
    everyone = p.get("periodic_ranks") == "all"

    def train_step():
        dense, sparse, y = batch(g)
        loss = F.binary_cross_entropy_with_logits(model(dense, sparse), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_s = jobkit.calibrate(train_step, 4, synchronized=True)
    kind, every = p["periodic"], p["every"]
    tmp = tempfile.mkdtemp(prefix="fsdpdoctor-ckpt-")
    copies, eval_batches = 1, []
    if kind == "checkpoint" and rank == 0:
        t0 = time.perf_counter()
        save_checkpoint(model.module, opt, os.path.join(tmp, "probe"), 1)
        copies = max(1, round(3 * step_s / max(time.perf_counter() - t0, 1e-4)))
    if kind == "eval" and (rank == 0 or everyone):
        eg = torch.Generator().manual_seed(1000)
        probe = [batch(eg) for _ in range(4)]
        evaluate(model.module, probe[:1])   # warm
        t0 = time.perf_counter()
        evaluate(model.module, probe)
        n_eval = max(1, round(4 * step_s / max(time.perf_counter() - t0, 1e-4)))
        if everyone:   # every rank's share of the evaluation set the same size (about four steps long)
            box = torch.tensor([n_eval])
            dist.all_reduce(box, op=dist.ReduceOp.MAX)
            n_eval = int(box.item())
        eval_batches = [batch(eg) for _ in range(n_eval)]
    i = 0

    def step_with_periodic_work():
        nonlocal i
        train_step()
        if (rank == 0 or everyone) and i % every == every - 1:
            if kind == "checkpoint":
                save_checkpoint(model.module, opt, os.path.join(tmp, f"step{i}"), copies)
            elif kind == "eval":
                evaluate(model.module, eval_batches)
        i += 1

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p,
                "facts": {"calibrated_step_ms": round(step_s * 1000, 1), "checkpoint_copies": copies,
                          "eval_batches": len(eval_batches)}}
    elapsed = jobkit.run_steps(args, steps, step_with_periodic_work, model=model, optimizer=opt,
                               scenario=scenario, samples_per_step=BATCH * world)
    for f in Path(tmp).iterdir():
        f.unlink()
    os.rmdir(tmp)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
