"""Reference job with a small mixture-of-experts model, the way an expert-parallel user writes one: one
expert MLP per rank, tokens sent to their expert's rank and back with ``all_to_all_single`` (dispatch
and combine), the dense layers (embedding, router, head) replicated with DDP, captured with
``fsdpdoctor.capture.capture``. gloo on CPU, NCCL where CUDA is there.

    torchrun --nproc_per_node 2 reference_jobs/moe.py --scenario moe_routing_skew --out runs/moe

The router picks one expert per token (top-1) from its scores plus a per-expert bias that is steered
every step towards a target load (the bias update of auxiliary-loss-free load balancing).
``moe_balanced`` targets equal loads. ``moe_routing_skew`` targets ``expert_skew`` times the tokens
for rank ``slow_rank``'s expert as for each other expert (a balancing target gone wrong, a collapsing
router): that rank runs its expert on more tokens every step, and the others wait for it in the
all-to-all that brings the tokens back.
"""

from __future__ import annotations

import os
import sys
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

BATCH, SEQ, VOCAB, CLASSES, D_MODEL, D_EXPERT = 16, 128, 1000, 16, 128, 3072
BIAS_RATE = 0.02  # bias step per routing step, as a share of the scores' spread


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with variable splits; its gradient goes back the same way, splits swapped."""

    @staticmethod
    def forward(ctx, x, send_counts: list[int], recv_counts: list[int]):
        ctx.counts = (send_counts, recv_counts)
        out = x.new_empty((sum(recv_counts),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        out = grad.new_empty((sum(send_counts),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_counts, recv_counts)
        return out, None, None


class Expert(nn.Module):
    """This rank's expert: not replicated, each rank trains its own."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D_MODEL, D_EXPERT)
        self.down = nn.Linear(D_EXPERT, D_MODEL)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Dense(nn.Module):
    """The replicated layers: embedding, a dense block, the router and the head."""

    def __init__(self, experts: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.block = nn.Linear(D_MODEL, D_MODEL)
        self.router = nn.Linear(D_MODEL, experts)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens, moe_layer):
        x = self.embed(tokens).flatten(0, 1)
        h = x + F.gelu(self.block(x))
        return self.head(h + moe_layer(h, self.router(h)))


class MoE(nn.Module):
    """Dense layers under DDP; the expert outside it (its gradients are its own, not averaged)."""

    def __init__(self, world: int, target: torch.Tensor, device: torch.device):
        super().__init__()
        self.dense = nn.parallel.DistributedDataParallel(Dense(world).to(device))
        self.expert = Expert().to(device)
        self.register_buffer("bias", torch.zeros(world, device=device))
        self.target = target.to(device)  # share of the tokens each expert should get
        self.loads: list[list[int]] = []
        self.bias_step = 0.0          # set by calibrate_bias

    def forward(self, tokens):
        return self.dense(tokens, self.moe_layer)

    def counts(self, choice: torch.Tensor) -> torch.Tensor:
        """Tokens per expert (bincount would read its largest value on the host: a sync in the step)."""
        return (choice[:, None] == torch.arange(len(self.bias), device=choice.device)).sum(dim=0)

    def route(self, scores: torch.Tensor) -> torch.Tensor:
        """Top-1 expert per token from the scores plus the balancing bias; the bias then moves towards
        the target load."""
        with torch.no_grad():
            choice = (scores + self.bias).argmax(dim=1)
            load = self.counts(choice).float() / len(choice)
            self.bias += self.bias_step * torch.sign(self.target - load)
        return choice

    def moe_layer(self, h: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        choice = self.route(scores)
        gate = scores.softmax(dim=1).gather(1, choice[:, None])
        order = torch.argsort(choice, stable=True)
        send = self.counts(choice)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # how many tokens each rank gets from each rank
        send_counts, recv_counts = send.tolist(), recv.tolist()
        self.loads.append(send_counts)
        mine = AllToAll.apply(h[order], send_counts, recv_counts)       # dispatch
        back = AllToAll.apply(self.expert(mine), recv_counts, send_counts)  # combine
        out = torch.empty_like(back)
        out[order] = back
        return gate * out

    def calibrate_bias(self, scores: torch.Tensor, rounds: int = 400) -> None:
        """Start the bias where the target load is met on one batch (then each step keeps it there)."""
        self.bias_step = BIAS_RATE * float(scores.std())  # once, here: std() reads a scalar on the host
        for _ in range(rounds):
            self.route(scores)


def targets(world: int, slow_rank: int, skew: float) -> torch.Tensor:
    """Each expert's share of the tokens: ``skew`` times as many for the slow rank's expert."""
    w = torch.ones(world)
    if 0 <= slow_rank < world:
        w[slow_rank] = skew
    return w / w.sum()


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda") if cuda else torch.device("cpu")

    torch.manual_seed(0)
    model = MoE(world, targets(world, p["slow_rank"], p["expert_skew"]), device)
    torch.manual_seed(1 + rank)  # each rank its own expert
    for prm in model.expert.parameters():
        nn.init.normal_(prm, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 * rank)

    def batch():
        tokens = torch.randint(VOCAB, (BATCH, SEQ), generator=gen)
        labels = torch.randint(CLASSES, (BATCH * SEQ,), generator=gen)
        return tokens.to(device), labels.to(device)

    with torch.no_grad():
        dense = model.dense.module
        tokens, _ = batch()
        x = dense.embed(tokens).flatten(0, 1)
        model.calibrate_bias(dense.router(x + F.gelu(dense.block(x))))

    def train_step():
        tokens, labels = batch()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    model.train()
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world, tokens_per_step=BATCH * SEQ * world)
    # the tokens each expert got, summed over the ranks, in the last step
    load = torch.tensor(model.loads[-1], device=device)
    dist.all_reduce(load)
    return jobkit.finish(args, steps, world, elapsed, extra=f"; tokens per expert in the last step {load.tolist()}")


if __name__ == "__main__":
    sys.exit(main())
