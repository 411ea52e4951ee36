"""Hanging reference job: a tiny DDP model on CPU ranks (gloo), profiled for a few steps, with
the hang watchdog on; one fault from hang_scenarios.py is injected at HANG_STEP.

    python reference_jobs/record_hangs.py            # runs it under torchrun, kills it after the dumps

    torchrun --nproc_per_node 2 reference_jobs/hang_job.py --scenario hang_loader --out runs/h

Every step: next batch from a DataLoader, forward, backward (DDP all-reduces the gradients on
the default group), optimizer step, then ``log_metrics`` all-reduces the loss on the
``metrics`` group and a token count on the ``stats`` group (two more process groups).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

from hang_scenarios import GLOO_TIMEOUT_S, HANG_SCENARIOS, HANG_STEP, HANG_TIMEOUT_S  # noqa: E402

from fsdpdoctor.capture import capture, enable_flight_recorder  # noqa: E402

enable_flight_recorder()  # before the process groups exist

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

SCENARIO = ""
RANK = 0
STEP = 0
NEVER = threading.Event()


def read_shard(i: int) -> torch.Tensor:
    """The 'storage read' of one sample. hang_loader: rank 1 slows down step by step, then blocks
    forever at HANG_STEP (a stalled network filesystem, a dead reader process)."""
    if SCENARIO == "hang_loader" and RANK == 1:
        if STEP >= HANG_STEP:
            while not NEVER.wait(1.0):
                pass
        time.sleep(0.004 * STEP)
    g = torch.Generator().manual_seed(i)
    return torch.randn(32, generator=g)


class Samples(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        x = read_shard(i)
        return x, x.sum(0, keepdim=True)


def check_batch(x: torch.Tensor) -> None:
    """Input validation. hang_rank_raises: rank 1 rejects its batch at HANG_STEP."""
    if SCENARIO == "hang_rank_raises" and RANK == 1 and STEP == HANG_STEP:
        raise ValueError(f"batch at step {STEP} has {x.shape[0]} samples with NaN features")


def log_metrics(loss: torch.Tensor, groups: dict) -> None:
    """All-reduce the loss on the metrics group and a sample count on the stats group."""
    if SCENARIO in ("hang_skip_collective", "hang_skip_collective_default") and RANK == 1 and STEP == HANG_STEP:
        return  # the injected fault: only rank 1 skips logging this step
    order = ["metrics", "stats"]
    if SCENARIO == "hang_collective_order" and RANK == 1 and STEP == HANG_STEP:
        order.reverse()  # the injected fault: rank 1 reduces in the other order
    for name in order:
        t = loss.detach().reshape(1).clone() if name == "metrics" else torch.ones(3)
        dist.all_reduce(t, group=groups[name])


def main(argv=None) -> int:
    global SCENARIO, RANK, STEP
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(HANG_SCENARIOS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--hang-timeout", type=float, default=HANG_TIMEOUT_S)
    ap.add_argument("--steps", type=int, default=HANG_STEP + 4)
    args = ap.parse_args(argv)
    SCENARIO = args.scenario
    timeout = datetime.timedelta(seconds=GLOO_TIMEOUT_S)
    dist.init_process_group("gloo", timeout=timeout)
    RANK = dist.get_rank()
    groups = {
        "metrics": dist.group.WORLD if SCENARIO == "hang_skip_collective_default"
        else dist.new_group(backend="gloo", timeout=timeout, group_desc="metrics"),
        "stats": dist.new_group(backend="gloo", timeout=timeout, group_desc="stats"),
    }
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(DataLoader(Samples(), batch_size=8, num_workers=0))
    with capture(args.out, model=model, optimizer=opt, wait=1, warmup=1, active=3,
                 samples_per_step=8 * dist.get_world_size(), hang_timeout_s=args.hang_timeout,
                 scenario={"name": SCENARIO, "injects": HANG_SCENARIOS[SCENARIO]["injects"]}) as cap:
        for STEP in range(args.steps):
            if SCENARIO == "hang_dead_rank" and RANK == 1 and STEP == HANG_STEP:
                os.kill(os.getpid(), signal.SIGSTOP)  # the injected fault: this rank stops for good
            if SCENARIO == "hang_killed_rank" and RANK == 1 and STEP == HANG_STEP:
                os.kill(os.getpid(), signal.SIGKILL)  # the injected fault: no handler can run
            x, y = next(loader)
            check_batch(x)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            log_metrics(loss, groups)
            cap.step()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
