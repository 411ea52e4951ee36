"""Shared plumbing of the user-style reference jobs (hf_decoder.py, cnn.py, ...):
command line, the injected stragglers and their calibration, the steps under capture, the end of a
job, and the GRU sequence classifier two of them train.

The straggler is sized from the job's own step time, measured before the
profiled window, so the injected share of the step is what the scenario says
on any machine: with a healthy step of T seconds and an injected extra time E
on the slow rank, the step becomes about T + E and the slow rank's share of
it E / (T + E) = ``straggler_share``, so E = T * share / (1 - share).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def parse_args(scenarios: dict, doc: str, argv=None):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(scenarios))
    ap.add_argument("--out", required=True, help="run folder (manifest.json, rank<N>.json.gz)")
    ap.add_argument("--steps", type=int, default=None, help="profiled-loop steps (default: schedule + 1)")
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=3)
    ap.add_argument("--ranks", default=None, help="comma-separated ranks to profile (default all)")
    ap.add_argument("--no-stack", action="store_true", help="with_stack=False")
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--delay-ms", type=float, default=None,
                    help="straggler: fixed extra time instead of the calibrated share")
    ap.add_argument("--no-profile", action="store_true", help="run without capture (timing)")
    return ap.parse_args(argv)


class GRUClassifier(torch.nn.Module):
    """A two-layer GRU over a sequence of feature vectors, classified from its last step."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.gru = torch.nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class SyntheticImages(torch.utils.data.Dataset):
    """``n`` random images (3 x size x size) with random labels, the same for a given index on every run;
    ``as_dict``: {"pixels", "labels"} items (the Hugging Face Trainer's shape)."""

    def __init__(self, n: int, size: int, classes: int, as_dict: bool = False):
        self.n, self.size, self.classes, self.as_dict = n, size, classes, as_dict

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(int(i))
        x = torch.randn(3, self.size, self.size, generator=g)
        y = int(torch.randint(self.classes, (1,), generator=g))
        return {"pixels": x, "labels": y} if self.as_dict else (x, y)


def launcher_rank() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (1 process without it)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def straggler_sleep(seconds: float) -> None:
    """Injected straggler: this rank sleeps before every forward."""
    time.sleep(seconds)


_A = None


def straggler_extra_matmul(reps: int) -> None:
    """Injected straggler: this rank multiplies matrices nobody needs before every forward."""
    global _A
    if _A is None:
        _A = torch.randn(256, 256)
    acc = _A
    for _ in range(reps):
        acc = torch.tanh(acc @ _A)


def time_matmul_rep(n: int = 30) -> float:
    straggler_extra_matmul(3)  # allocate and warm up
    t0 = time.perf_counter()
    straggler_extra_matmul(n)
    return (time.perf_counter() - t0) / n


def calibrate(train_step, steps: int, synchronized: bool) -> float:
    """Median step time (s) of ``steps`` healthy steps (the first excluded), the
    largest over the ranks when they communicate."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[1:] if len(times) > 1 else times)
    if synchronized and dist.is_available() and dist.is_initialized():
        box = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        t = float(box.item())
    return t


class Straggler:
    """The slow rank's extra work before each forward.

    Sized from the step time measured by :func:`calibrate`, then kept at the
    target share as the machine's load changes: after every step the slow rank
    takes the rest of its step (everything but the injected work: its own
    healthy step) and sizes the next injection from the median of the last
    three, E = rest * share / (1 - share); for matmuls the repetitions follow
    from the measured time per repetition.
    """

    def __init__(self, kind: str, slow: bool, share: float, delay_ms: float | None):
        self.kind, self.slow, self.share, self.delay_ms = kind, slow, share, delay_ms
        self.active = kind != "none" and slow
        self.extra_s = 0.0
        self.reps = 0
        self.rep_s = None
        self.step_s = None
        self.reported_reps = 0
        self._rests: list[float] = []
        self._t_begin = self._t_after = None

    def size(self, step_s: float, synchronized: bool) -> None:
        self.step_s = step_s
        self._target(step_s)
        if synchronized and dist.is_available() and dist.is_initialized():
            box = torch.tensor([self.reps], dtype=torch.int64)  # so the manifest rank knows it too
            dist.all_reduce(box, op=dist.ReduceOp.MAX)
            self.reported_reps = int(box.item())

    def _target(self, healthy_s: float) -> None:
        self.extra_s = (self.delay_ms / 1000.0 if self.delay_ms is not None
                        else healthy_s * self.share / (1.0 - self.share))
        if self.kind == "matmul" and self.slow:
            if self.rep_s is None:
                self.rep_s = time_matmul_rep()
            self.reps = max(1, round(self.extra_s / self.rep_s))

    def __call__(self) -> None:
        """The injected work; call it before the forward."""
        if not self.active:
            return
        self._t_begin = time.perf_counter()
        if self.kind == "sleep":
            straggler_sleep(self.extra_s)
        elif self.kind == "matmul":
            straggler_extra_matmul(self.reps)
        self._t_after = time.perf_counter()
        if self.kind == "matmul" and self.reps:
            self.rep_s = (self._t_after - self._t_begin) / self.reps

    def step_done(self) -> None:
        """Call at the end of every step: resize the next injection from this step."""
        # nothing to resize before calibrate() sized it, so the calibration steps stay healthy
        if not self.active or self._t_after is None or self.delay_ms is not None or self.step_s is None:
            return
        self._rests = (self._rests + [time.perf_counter() - self._t_after])[-3:]
        self._target(statistics.median(self._rests))
        self._t_after = None

    def facts(self) -> dict:
        return {"calibrated_step_ms": None if self.step_s is None else round(self.step_s * 1000, 1),
                "target_share": self.share if self.delay_ms is None else None,
                "matmul_reps_at_start": max(self.reps, self.reported_reps)}


def run_steps(args, steps: int, train_step, *, model, optimizer, scenario: dict, samples_per_step: int,
              tokens_per_step: int | None = None) -> float:
    """``steps`` calls of ``train_step`` under ``fsdpdoctor.capture`` (or bare with --no-profile), as the
    README shows: the elapsed seconds."""
    import contextlib

    from fsdpdoctor.capture import capture

    if args.no_profile:
        cm = contextlib.nullcontext(None)
    else:
        ranks = None if args.ranks is None else [int(r) for r in args.ranks.split(",") if r != ""]
        cm = capture(args.out, model=model, optimizer=optimizer, wait=args.wait, warmup=args.warmup,
                     active=args.active, ranks=ranks, with_stack=not args.no_stack,
                     samples_per_step=samples_per_step, tokens_per_step=tokens_per_step, scenario=scenario)
    t0 = time.perf_counter()
    with cm as cap:
        for _ in range(steps):
            train_step()
            if cap is not None:
                cap.step()
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the elapsed time includes the last step's kernels
    return time.perf_counter() - t0


def finish(args, steps: int, world: int, elapsed: float, *, barrier: bool = True, extra: str = "") -> int:
    """End the job as every reference job does: wait for the other ranks (``barrier``), leave the process
    group, and say on rank 0 what was recorded where. The exit status."""
    import torch.distributed as dist

    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
    if launcher_rank()[0] == 0:
        print(f"{args.scenario}: {steps} steps on {world} process(es) in {elapsed:.1f} s -> {args.out}{extra}")
    return 0


def start(scenarios: dict, doc: str, argv=None):
    """The start-up every reference job shares: its command line, its scenario's parameters, the rank and
    world size from the launcher, a gloo process group and a fixed seed. (args, scenario, params, rank,
    world)."""
    args = parse_args(scenarios, doc, argv)
    sc = scenarios[args.scenario]
    rank, world = launcher_rank()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    return args, sc, dict(sc["params"]), rank, world
