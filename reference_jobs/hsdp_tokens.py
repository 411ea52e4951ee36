"""Reference job: a small LLaMA-style decoder (RMSNorm, causal attention, SwiGLU) trained as a language model
with FSDP2 HSDP on a (2, 2) DeviceMesh over gloo, 4 ranks, the way a user packs batches by a token budget
that one rank does not keep.

The mesh's dimensions are ("replicate", "shard"): each block is sharded over a pair of ranks and its
gradients all-reduced with the pair's replica. ``hsdp_token_skew``: rank ``slow_rank``'s batches hold
``token_skew`` times the tokens of the others' (the same number of sequences, longer ones), so it computes
longer and makes its shard peer and its replica peer wait; the fourth rank, which shares no group with it,
waits for it through them. ``hsdp_balanced`` is the same job with equal batches.

    torchrun --nproc_per_node 4 reference_jobs/hsdp_tokens.py --scenario hsdp_token_skew --out runs/hsdp
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

VOCAB, DIM, HEADS, DEPTH, BATCH, BASE_LEN = 512, 128, 4, 2, 16, 96


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DecoderBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM, bias=False)
        self.gate, self.up = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, 3 * DIM, bias=False)
        self.down = nn.Linear(3 * DIM, DIM, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, DIM))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(DecoderBlock() for _ in range(DEPTH))
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.norm(x))


def packed_batch(rank: int, step: int, length: int) -> torch.Tensor:
    """BATCH sequences of ``length`` + 1 tokens (inputs and shifted targets)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(VOCAB, (BATCH, length + 1), generator=g)


def main(argv=None) -> int:
    args, sc, p, rank, world = jobkit.start(SCENARIOS, __doc__, argv)
    if world != 4:
        raise SystemExit("hsdp_tokens: run with --nproc_per_node 4 (a (2, 2) mesh)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = TinyDecoder()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    length = round(BASE_LEN * p["token_skew"]) if rank == p["slow_rank"] else BASE_LEN
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    counter = iter(range(10 ** 9))

    def train_step():
        seq = packed_batch(rank, next(counter), length)
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tokens_per_step = BATCH * (BASE_LEN * (world - 1) + round(BASE_LEN * p["token_skew"]))
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world, tokens_per_step=tokens_per_step)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
