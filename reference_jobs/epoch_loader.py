"""Reference job: short epochs whose DataLoader workers start again at every epoch, as a loop written
``for epoch in ...: for batch in loader:`` does with ``persistent_workers=False`` (the default). The model
is a small keyword spotter (1-D convolutions over 40 filter-bank channels of one-second clips), DDP over
gloo. Each loader worker opens the clip archive when it starts (``worker_init_fn``: a remote archive's
index, a wait) and then reads each clip quickly; two loader workers per rank.

    torchrun --nproc_per_node 2 reference_jobs/epoch_loader.py --scenario loader_epoch_restart --out runs/el

Every epoch is 4 batches per rank. At each epoch start ``iter(loader)`` shuts the last epoch's workers
down, forks two new ones, and the first ``__next__`` waits for them to open the archive and fill their
first batch; in the steady state they keep ahead of the step. Opening the archive is sized from the
job's own step time (measured before the captured steps, without the loader) at half a step: both ranks
then wait about half a step at every epoch start. ``loader_epoch_persistent`` is the same job with
``persistent_workers=True``: the workers start and open the archive once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

BATCH, CHANNELS, FRAMES, WORDS, EPOCH_BATCHES, WORKERS = 32, 40, 98, 12, 4, 2


class KeywordSpotter(nn.Module):
    """Depthwise-separable 1-D convolutions over filter-bank frames, pooled over time."""

    def __init__(self, width: int = 128):
        super().__init__()
        self.stem = nn.Conv1d(CHANNELS, width, 5, padding=2)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv1d(width, width, 9, padding=4, groups=width),
                                                   nn.Conv1d(width, width, 1), nn.BatchNorm1d(width), nn.ReLU())
                                     for _ in range(4)])
        self.head = nn.Linear(width, WORDS)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for b in self.blocks:
            x = x + b(x)
        return self.head(x.mean(-1))


class Clips(Dataset):
    """Synthetic filter-bank clips from an archive each worker opens once (``open_archive``)."""

    def __init__(self, n: int, open_s: float):
        self.n, self.open_s, self.index = n, open_s, None

    def open_archive(self) -> None:
        time.sleep(self.open_s)          # the archive's index, fetched from remote storage
        self.index = list(range(self.n))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.index[int(i)])
        return torch.randn(CHANNELS, FRAMES, generator=g), int(torch.randint(WORDS, (1,), generator=g))


def open_in_worker(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.open_archive()


def main(argv=None) -> int:
    args, sc, p, rank, world = jobkit.start(SCENARIOS, __doc__, argv)
    model = nn.parallel.DistributedDataParallel(KeywordSpotter())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)

    def train_on(x, y):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def probe_step():
        train_on(torch.randn(BATCH, CHANNELS, FRAMES, generator=g), torch.randint(WORDS, (BATCH,), generator=g))

    step_s = jobkit.calibrate(probe_step, 5, synchronized=True)
    open_s = 0.5 * step_s             # a worker's start takes about half a step
    ds = Clips(BATCH * world * EPOCH_BATCHES, open_s)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=WORKERS, drop_last=True,
                        worker_init_fn=open_in_worker, persistent_workers=p["persistent_workers"])
    steps = args.steps if args.steps is not None else 28
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p,
                "facts": {"calibrated_step_ms": round(step_s * 1000, 1), "archive_open_ms": round(open_s * 1000, 1),
                          "epoch_batches": EPOCH_BATCHES}}

    from fsdpdoctor.capture import capture

    t0 = time.perf_counter()
    done = 0
    with capture(args.out, model=model, optimizer=opt, wait=args.wait, warmup=args.warmup, active=args.active,
                 with_stack=not args.no_stack, samples_per_step=BATCH * world, scenario=scenario) as cap:
        for epoch in range((steps + EPOCH_BATCHES - 1) // EPOCH_BATCHES):
            sampler.set_epoch(epoch)
            for x, y in loader:
                train_on(x, y)
                cap.step()
                done += 1
                if done == steps:
                    break
    return jobkit.finish(args, steps, world, time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
