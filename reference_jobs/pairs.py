"""Fault/fix reference jobs: one job per pair of pair_table.py, run with the problem or with its fix.

    torchrun --nproc_per_node 2 reference_jobs/pairs.py --pair ddp_single_bucket --variant fault --out runs/f
    torchrun --nproc_per_node 2 reference_jobs/pairs.py --pair ddp_single_bucket --variant fix \\
        --no-profile --steps 12 --times runs/fix_times.json

With capture (the default) the run folder holds what ``fsdpdoctor analyze`` reads. With ``--no-profile``
the job runs bare and ``--times`` gets rank 0's wall time of every step (the calibration benchmark's
clean timed runs). ``--variant alternate`` builds both variants in one process and runs them bare in
alternating blocks (``--blocks`` of ``--block-steps`` steps each), for timing on a machine whose load
drifts: every block of one variant has a block of the other beside it. The models are this file's own (an MLP-Mixer, pre-LN transformer blocks, a VGG-style
conv net, a residual MLP), not the bundled scenarios'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import jobkit  # noqa: E402
from pair_table import ALL_PAIRS, VARIANTS, params  # noqa: E402

CLASSES, IMAGE, BASE_LEN, VOCAB = 10, 32, 32, 1000
BARE_AFTER = 8   # GPU captures: unprofiled steps after the window (analysis/profiler_cost.MIN_BARE_STEPS: 5)


# --------------------------------------------------------------------------- models
class MixerBlock(nn.Module):
    """MLP-Mixer block: an MLP across tokens, then one across channels."""

    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.ln2(x))


class Mixer(nn.Module):
    def __init__(self, dim: int = 64, depth: int = 4, patch: int = 8):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.ModuleList(MixerBlock((IMAGE // patch) ** 2, dim) for _ in range(depth))
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=1))


class EncoderBlock(nn.Module):
    """Pre-LN transformer encoder block (bidirectional attention)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=2))
        x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c))
        return x + self.ff(self.ln2(x))


class Encoder(nn.Module):
    def __init__(self, dim: int = 64, depth: int = 3, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads) for _ in range(depth))
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=1))


class ConvNet(nn.Module):
    """VGG-style: 3x3 convolutions with GroupNorm, pooled between stages (0.40 M parameters, 1.6 MB of
    gradients: more than DDP's 1 MB first bucket, so its default buckets are two)."""

    def __init__(self):
        super().__init__()
        chans, layers = [3, 16, 32, 64, 128], []
        for cin, cout in zip(chans, chans[1:]):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.ReLU(), nn.MaxPool2d(2)]
        layers += [nn.Conv2d(128, 256, 3, padding=1), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=(2, 3)))


class ResidualMLP(nn.Module):
    def __init__(self, dim: int = 256, depth: int = 4):
        super().__init__()
        self.inp = nn.Linear(IMAGE * IMAGE * 3 // 4, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                                  nn.Linear(2 * dim, dim)) for _ in range(depth))
        self.head = nn.Linear(dim, CLASSES)

    checkpoint = False  # recompute every block in backward (torch.utils.checkpoint, non-reentrant)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        x = self.inp(x)
        for b in self.blocks:
            x = x + (checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x))
        return self.head(x)


class GRULM(nn.Module):
    """A GRU language model: token embedding, two GRU layers, a head on the last state (classification of the
    sequence, so the data and loss are the encoder's)."""

    def __init__(self, dim: int = 128, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out[:, -1])


MODELS = {"mixer": (Mixer, MixerBlock), "encoder": (Encoder, EncoderBlock), "convnet": (ConvNet, None),
          "mlp": (ResidualMLP, None), "gru": (GRULM, None)}


# --------------------------------------------------------------------------- data
class Synthetic(Dataset):
    """Deterministic random samples for a model; optional per-sample sleep (slow reads)."""

    def __init__(self, model: str, n: int, seed: int, length: int, item_sleep_ms: float):
        self.model, self.n, self.seed, self.length, self.item_sleep_ms = model, n, seed, length, item_sleep_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_sleep_ms:
            slow_read(self.item_sleep_ms)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        y = int(torch.randint(CLASSES, (1,), generator=g))
        if self.model in ("encoder", "gru"):
            return torch.randint(VOCAB, (self.length,), generator=g), y
        if self.model == "mlp":
            return torch.randn(IMAGE * IMAGE * 3 // 4, generator=g), y
        return torch.randn(3, IMAGE, IMAGE, generator=g), y


def slow_read(ms: float) -> None:
    """Injected slow data loading (loader_workers pair)."""
    time.sleep(ms / 1000.0)


def straggler_sleep(ms: float) -> None:
    """Injected host-side straggler: rank 1 arrives late at every step's first collective."""
    time.sleep(ms / 1000.0)


# --------------------------------------------------------------------------- wrapping
def wrap(model: nn.Module, block, p: dict, world: int, device: torch.device) -> nn.Module:
    if p["wrap"] == "none":
        return model
    if p["wrap"] == "ddp":
        return nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=p["find_unused_parameters"],
            **({"bucket_cap_mb": p["bucket_cap_mb"]} if p["bucket_cap_mb"] is not None else {}))
    if p["wrap"] == "fsdp1":
        from torch.distributed.fsdp import BackwardPrefetch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        bp = p["backward_prefetch"]
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({block}), device_id=device,
                    backward_prefetch=None if bp == "none" else BackwardPrefetch[bp],
                    forward_prefetch=p["forward_prefetch"])
    if p["wrap"] == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        from fsdpdoctor.capture import track_fsdp2_prefetch_calls

        track_fsdp2_prefetch_calls()  # so the manifest reports the explicit prefetch lists
        kw = {}
        if p["offload"]:
            from torch.distributed.fsdp import CPUOffloadPolicy

            kw["offload_policy"] = CPUOffloadPolicy()
        for b in model.blocks:
            fully_shard(b, **kw)
        fully_shard(model, **kw)
        if p["fsdp2_prefetch"] == "self":
            for m in [*model.blocks, model]:
                m.set_modules_to_backward_prefetch([m])  # prefetches itself: disables backward prefetch
        return model
    raise ValueError(f"unknown wrap {p['wrap']!r}")


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, choices=sorted(ALL_PAIRS))
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="where the model runs (default: the pair's; cuda uses NCCL and this rank's GPU)")
    ap.add_argument("--variant", required=True, choices=[*VARIANTS, "alternate"],
                    help="alternate: both, bare, in blocks fault, fix, fix, fault, ... (ABBA; --blocks, --block-steps, --times)")
    ap.add_argument("--out", default=None, help="run folder of the capture (manifest.json, rank<N>.json.gz)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: schedule + 1)")
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=6)
    ap.add_argument("--no-profile", action="store_true", help="run without capture (timing)")
    ap.add_argument("--times", default=None, help="--no-profile: write rank 0's step times (s) here as JSON")
    ap.add_argument("--blocks", type=int, default=5, help="alternate: blocks of each variant")
    ap.add_argument("--block-steps", type=int, default=6, help="alternate: steps per block")
    args = ap.parse_args(argv)
    if not args.no_profile and not args.out and args.variant != "alternate":
        ap.error("--out is required unless --no-profile")
    args.ranks, args.no_stack = None, False
    args.scenario = f"{args.pair}/{args.variant}"  # jobkit.finish names the run by it
    return args


def build(pair_name: str, variant: str, rank: int, world: int, steps: int, device: torch.device):
    """One variant's job: (train_step, model, optimizer, parameters), its data enough for ``steps`` steps."""
    pair, p = ALL_PAIRS[pair_name], params(pair_name, variant)
    torch.manual_seed(0)
    cls, block = MODELS[pair["model"]]
    net = cls(dim=256 * int(p["width"])) if pair["model"] == "mlp" else cls()
    net.checkpoint = bool(p["checkpoint"])
    model = wrap(net.to(device), block, p, world, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    length = round(BASE_LEN * p["lengths"][min(rank, len(p["lengths"]) - 1)])
    accum, batch = int(p["accum"]), int(p["batch"])
    one_batch = p["resident_data"] or p["host_batch"]
    ds = Synthetic(pair["model"], batch * (1 if one_batch else accum * (steps + 2)), rank, length,
                   p["item_sleep_ms"])
    nw = int(p["num_workers"])
    loader = DataLoader(ds, batch_size=batch, num_workers=nw, persistent_workers=nw > 0, drop_last=True,
                        pin_memory=device.type == "cuda")
    if p["resident_data"]:  # one batch on the device, reused: the step holds no data loading at all
        resident = tuple(t.to(device) for t in next(iter(loader)))
        it = iter(lambda: resident, None)
    elif p["host_batch"]:  # one batch on the host, copied to the device every step (pinned or pageable)
        held = tuple(t.clone().pin_memory() if p["pin"] and device.type == "cuda" else t.clone()
                     for t in next(iter(loader)))
        it = iter(lambda: held, None)
    else:
        it = iter(loader)
    use_no_sync = p["wrap"] == "ddp" and p["no_sync"] and accum > 1

    def micro_step(m: int):
        x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if rank == 1 and p["sleep_ms"] and m == 0:
            straggler_sleep(p["sleep_ms"])
        ctx = model.no_sync() if use_no_sync and m < accum - 1 else contextlib.nullcontext()
        with ctx:
            if p["readback"]:
                per_sample = F.cross_entropy(model(x), y, reduction="none")
                loss = per_sample.mean() / accum
            else:
                loss = F.cross_entropy(model(x), y) / accum
            loss.backward()
        if p["readback"]:  # per-sample values logged every step: one copy and one sync per value, or one in all
            rows = per_sample.detach()[:int(p["readback"])]
            logged = rows.tolist() if p["readback_batched"] else [v.item() for v in rows]
            del logged
        return loss

    def train_step():
        losses = [micro_step(m) for m in range(accum)]
        if p["clip_grad"]:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if p["host_sync"]:  # the fault: the values read back inside the step
                line = f"loss {sum(x.item() for x in losses):.4f} grad_norm {norm.item():.3f}"
                del line
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    if p["cuda_graph"]:
        replay, opt = _graphed(model, micro_step, device)
        return replay, model, opt, p
    return train_step, model, opt, p


def _graphed(model, micro_step, device: torch.device):
    """The whole step as one CUDA graph (torch.cuda.graphs, "whole network capture"): warmed up on a side
    stream, captured once with a capturable AdamW, then each step is one replay."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    def step():
        opt.zero_grad(set_to_none=False)
        micro_step(0)
        opt.step()

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def replay():
        graph.replay()

    replay.keep = (graph, step)  # the graph reads the tensors step's closures hold: they must outlive it
    return replay, opt


def timed(train_step, steps: int, device: torch.device) -> list[float]:
    """Wall time of each of ``steps`` steps (s): this rank's, which waits for the others at every collective.

    On a GPU the host runs ahead of the device, so one step's host time says nothing: the first step is
    timed to a synchronisation, and every later one gets the mean of the rest, timed to the next."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for _ in range(steps - 1):
            train_step()
        torch.cuda.synchronize()
        rest = (time.perf_counter() - t1) / max(steps - 1, 1)
        return [t1 - t0] + [rest] * (steps - 1)
    times, t_prev = [], time.perf_counter()
    for _ in range(steps):
        train_step()
        t = time.perf_counter()
        times.append(t - t_prev)
        t_prev = t
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    pair = ALL_PAIRS[args.pair]
    device = torch.device(args.device or pair.get("device", "cpu"))
    rank, world = jobkit.launcher_rank()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # two ranks on two cores: one thread each, as a GPU job has one stream
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if args.variant == "alternate":
        # both variants in one process, in alternating blocks: fault, fix, fault, fix, ... (load that drifts
        # between blocks hits both alike, and one interpreter start serves every timed run)
        jobs = {v: build(args.pair, v, rank, world, args.blocks * args.block_steps, device)[0] for v in VARIANTS}
        # ABBA: the order flips every pair of blocks, so load that drifts steadily over the launch (it does,
        # by 2x, at load 16) does not always land on the variant run first
        blocks = [{"variant": v, "step_s": timed(jobs[v], args.block_steps, device), "loadavg": os.getloadavg()}
                  for i in range(args.blocks) for v in (VARIANTS if i % 2 == 0 else VARIANTS[::-1])]
        if args.times and rank == 0:
            Path(args.times).write_text(json.dumps({"pair": args.pair, "world": world, "blocks": blocks}))
        steps, elapsed = 2 * args.blocks * args.block_steps, sum(sum(b["step_s"]) for b in blocks)
        return jobkit.finish(args, steps, world, elapsed, barrier=dist.is_initialized())
    # on a GPU, unprofiled steps after the window: the step series then measures what the profiler added
    # (analysis/profiler_cost.py), which a host-bound step's idle holds
    after = BARE_AFTER if device.type == "cuda" else 0
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1 + after
    train_step, model, opt, p = build(args.pair, args.variant, rank, world, steps, device)
    if args.no_profile:
        times = timed(train_step, steps, device)
        elapsed = sum(times)
        if args.times and rank == 0:
            Path(args.times).write_text(json.dumps({"pair": args.pair, "variant": args.variant, "world": world,
                                                    "step_s": times, "loadavg": os.getloadavg()}))
    else:
        tokens = int(p["batch"]) * int(p["accum"]) * sum(round(BASE_LEN * f) for f in p["lengths"][:world]) \
            if pair["model"] == "encoder" else None
        scenario = {"name": f"pair_{args.pair}_{args.variant}", "injects": pair["case"] if args.variant == "fault"
                    else "the fix of: " + pair["case"], "params": {k: v for k, v in p.items() if k != "lengths"}}
        elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                                   samples_per_step=int(p["batch"]) * int(p["accum"]) * world, tokens_per_step=tokens)
    return jobkit.finish(args, steps, world, elapsed, barrier=dist.is_initialized())


if __name__ == "__main__":
    sys.exit(main())
