"""A/B reference job for `diff` and `check --baseline` on short profiles: a small
1-D convolutional classifier on synthetic sequences, DDP over gloo, captured with
``fsdpdoctor.capture.capture`` and the README's ``active=3``.

    torchrun --nproc_per_node 2 reference_jobs/ab_conv1d.py --variant healthy --out runs/ab/healthy
    torchrun --nproc_per_node 2 reference_jobs/ab_conv1d.py --variant sleep --out runs/ab/sleep

Variants: ``healthy``; ``sleep`` (rank 1 sleeps ``--sleep-ms`` in user code before every
forward: a regression of the job); ``slow-machine`` (the same job as ``healthy`` while
every rank runs a CPU-bound background process for the whole run, standing for a
loaded machine: every part of the step should slow alike).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fsdpdoctor.capture import capture  # noqa: E402

BATCH, CHANNELS, LENGTH, CLASSES = 16, 8, 1024, 5

# a busy loop in a child process: it competes for the cores, not for the job's GIL
_SPIN = "import time\nprint('spinning', flush=True)\nt = time.time() + {s}\nwhile time.time() < t:\n    sum(range(1000))\n"


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(CHANNELS, 64, 7, padding=3), nn.ReLU(),
            nn.Conv1d(64, 128, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(128, 128, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(128, 256, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=2))


def injected_sleep(seconds: float) -> None:
    """The A/B regression: this rank waits in user code before every forward."""
    time.sleep(seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=["healthy", "sleep", "slow-machine"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--active", type=int, default=3)
    ap.add_argument("--sleep-ms", type=float, default=100.0)
    ap.add_argument("--length", type=int, default=LENGTH,
                    help="sequence length (256: ~15 ms steps on 2 CPU cores, where the sleep dominates the step)")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Conv1dNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    wait, warmup = 1, 1
    steps = wait + warmup + args.active + 1
    spin = None
    if args.variant == "slow-machine":
        spin = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=600)], stdout=subprocess.PIPE, text=True)
        spin.stdout.readline()  # it competes for the cores before the first step
    try:
        with capture(args.out, model=model, optimizer=opt, wait=wait, warmup=warmup, active=args.active,
                     samples_per_step=BATCH * world,
                     scenario={"name": f"ab_conv1d_{args.variant}", "injects": args.variant,
                               "params": {"sleep_ms": args.sleep_ms, "length": args.length}}) as cap:
            for _ in range(steps):
                x = torch.randn(BATCH, CHANNELS, args.length, generator=g)
                y = torch.randint(CLASSES, (BATCH,), generator=g)
                if args.variant == "sleep" and rank == 1:
                    injected_sleep(args.sleep_ms / 1e3)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                cap.step()
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
