"""Reference job with two profiler cycles: a small GRU sequence classifier under DDP over gloo,
its DataLoader reading in the training process (``num_workers=0``, 6 ms per sample), profiled
with the profiler's ``repeat=2`` and a 2 s pause between the cycles (an evaluation, a checkpoint).

    torchrun --nproc_per_node 2 reference_jobs/gru_cycles.py --via capture --out runs/gru_cycles
    torchrun --nproc_per_node 2 reference_jobs/gru_cycles.py --via handler --out runs/gru_cycles_handler

``--via capture`` records through ``fsdpdoctor.capture.capture(repeat=2)`` (``rank<N>.json.gz`` and
``rank<N>.cycle2.json.gz``, listed in the manifest's ``cycle_files``); ``--via handler`` through
torch.profiler's own ``schedule(repeat=2)`` and ``tensorboard_trace_handler`` (one
``<host>_<pid>.<ns>.pt.trace.json.gz`` per cycle and process, no manifest). Either way each cycle is
a separate run of steps: the pause is in no step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

from fsdpdoctor.capture import capture  # noqa: E402

import jobkit  # noqa: E402  (beside this file)

BATCH, SEQ, FEATURES, HIDDEN, CLASSES = 8, 32, 16, 64, 5
WAIT, WARMUP, ACTIVE, REPEAT = 1, 1, 3, 2
PAUSE_S = 2.0             # between the cycles: not profiled, in no step
SAMPLE_S = 0.006          # the dataset's read time per sample (in the training process)


class Sequences(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        time.sleep(SAMPLE_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(SEQ, FEATURES, generator=g), int(torch.randint(CLASSES, (1,), generator=g))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--via", choices=("capture", "handler"), required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(jobkit.GRUClassifier(FEATURES, HIDDEN, CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Sequences()
    loader = iter(DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, world, rank), num_workers=0))
    cycle = WAIT + WARMUP + ACTIVE
    steps = REPEAT * cycle + 1

    def train_step() -> None:
        x, y = next(loader)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.via == "capture":
        cm = capture(args.out, model=model, optimizer=opt, wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT,
                     samples_per_step=BATCH * world, scenario={"name": "gru_cycles", "pause_s": PAUSE_S})
    else:
        cm = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True,
            schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.out, use_gzip=True))
    with cm as prof:
        for i in range(steps):
            train_step()
            prof.step()
            if i + 1 == cycle:
                time.sleep(PAUSE_S)  # evaluation / checkpoint between the cycles
    dist.destroy_process_group()
    if rank == 0:
        print(f"wrote {args.out} ({os.listdir(args.out)})")


if __name__ == "__main__":
    main()
