"""Reference training job: a small transformer LM on synthetic tokens, wrapped in
DDP, FSDP1 or FSDP2, with one injected problem per scenario (scenarios.py),
profiled with fsdpdoctor.capture.

    torchrun --nproc_per_node 2 reference_jobs/train.py --scenario ddp_default --out runs/ddp

CPU + gloo when no GPU is available, CUDA + NCCL otherwise (unchanged script).
Healthy scenarios never call .item() or sleep.
"""

from __future__ import annotations

import argparse
import contextlib
import os
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
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

from scenarios import SCENARIOS  # noqa: E402

from fsdpdoctor.capture import track_fsdp2_prefetch_calls  # noqa: E402  (capture: jobkit.run_steps)


# --------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, heads: int = 4, seq: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


# --------------------------------------------------------------------------- data
class SyntheticTokens(Dataset):
    """Deterministic random token sequences; optional per-sample sleep (slow I/O)."""

    def __init__(self, n: int, seq: int, vocab: int, item_sleep_ms: float = 0.0):
        self.n, self.seq, self.vocab, self.item_sleep_ms = n, seq, vocab, item_sleep_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_sleep_ms:
            slow_read_sample(self.item_sleep_ms)
        g = torch.Generator().manual_seed(int(i))
        tokens = torch.randint(self.vocab, (self.seq + 1,), generator=g)
        return tokens[:-1], tokens[1:]


def slow_read_sample(ms: float) -> None:
    """Injected slow data loading (dataloader_* scenarios)."""
    time.sleep(ms / 1000.0)


def straggler_sleep_before_forward(ms: float) -> None:
    """Injected straggler: this rank arrives late at every step's first collective."""
    time.sleep(ms / 1000.0)


# --------------------------------------------------------------------------- wrapping
def wrap_model(model, wrap: str, p: dict, device):
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        kw = {}
        if p["bucket_cap_mb"] is not None:
            kw["bucket_cap_mb"] = p["bucket_cap_mb"]
        if device.type == "cuda":
            kw["device_ids"] = [device.index]
        return DDP(model, find_unused_parameters=p["find_unused_parameters"], **kw)
    if wrap == "fsdp1":
        from torch.distributed.fsdp import BackwardPrefetch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        bp = p["fsdp1_backward_prefetch"]
        return FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            backward_prefetch=None if bp in (None, "none") else BackwardPrefetch[bp],
            forward_prefetch=p["fsdp1_forward_prefetch"],
            # CPU/gloo needs an explicit CPU device_id and no sync_module_states
            device_id=device,
        )
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        track_fsdp2_prefetch_calls()  # so the manifest can report an explicit []
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        mode = p["fsdp2_backward_prefetch"]
        # the root too: its default prefetch would otherwise fetch the last block
        for blk in [*model.blocks, model]:
            if mode == "self":
                blk.set_modules_to_backward_prefetch([blk])  # disables backward prefetch
            elif mode == "empty":
                blk.set_modules_to_backward_prefetch([])  # does NOT disable it (no-op)
        return model
    raise ValueError(f"unknown wrap {wrap!r}")


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--out", required=True, help="run folder (manifest.json, rank<N>.json.gz)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: schedule + 1)")
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=3)
    ap.add_argument("--ranks", default=None, help="comma-separated ranks to profile (default all)")
    ap.add_argument("--no-stack", action="store_true", help="with_stack=False")
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--delay-ms", type=float, default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="per-rank micro-batch size")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--no-profile", action="store_true", help="run without capture (timing)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sc = SCENARIOS[args.scenario]
    params = dict(sc["params"])
    if args.slow_rank is not None:
        params["slow_rank"] = args.slow_rank
    if args.delay_ms is not None:
        params["delay_ms"] = args.delay_ms
    if params["slow_rank"] is not None and not params["delay_ms"]:
        params["slow_rank"] = None

    use_cuda = torch.cuda.is_available()
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if use_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:  # plain `python train.py`: single process, no process group
        rank, world = 0, 1
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if sc["wrap"] != "ddp" and world == 1 and not dist.is_initialized():
        print(f"{args.scenario}: {sc['wrap']} needs torchrun (a process group)", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq)
    if sc["wrap"] != "fsdp1":
        model = model.to(device)
    if world > 1 or dist.is_initialized():
        model = wrap_model(model, sc["wrap"], params, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    accum = int(params["accum_steps"])
    schedule_steps = args.wait + args.warmup + args.active
    steps = args.steps if args.steps is not None else schedule_steps + 1
    n = args.batch * world * accum * (steps + 2)
    ds = SyntheticTokens(n, args.seq, args.vocab, params["item_sleep_ms"])
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
    nw = int(params["num_workers"])
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=nw,
                        persistent_workers=nw > 0, pin_memory=use_cuda, drop_last=True)
    it = iter(loader)

    use_no_sync = sc["wrap"] == "ddp" and params["no_sync"] and world > 1
    slow = params["slow_rank"] is not None and rank == params["slow_rank"]
    host_sync = params["host_sync"]

    def micro_step(micro: int):
        x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if slow and micro == 0:
            straggler_sleep_before_forward(params["delay_ms"])
        ctx = model.no_sync() if (use_no_sync and micro < accum - 1) else contextlib.nullcontext()
        with ctx:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)) / accum
            loss.backward()
        return loss

    def train_step():
        losses = [micro_step(m) for m in range(accum)]
        if host_sync:
            # injected host sync: reading scalars back inside the step
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            log_line = f"loss {sum(x.item() for x in losses):.4f} grad_norm {grad_norm.item():.3f}"
            del log_line
        opt.step()
        opt.zero_grad(set_to_none=True)

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": params}
    import jobkit  # here, not at the top: the recorded traces name this file's lines above

    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=args.batch * world * accum,
                               tokens_per_step=args.batch * args.seq * world * accum)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
