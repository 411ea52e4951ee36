"""Overhead of fsdpdoctor.capture outside its profiled window.

Times N training steps of the reference model (reference_jobs/train.py TinyLM,
single process, no wrapping) (a) bare and (b) inside ``capture()`` after its
schedule has finished (profiler stopped; ``step()`` is a counter increment).
Prints both medians and the ratio b/a. Rounds alternate a/b to spread noise.

    python benchmarks/bench_capture_overhead.py [--steps 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "reference_jobs"))
sys.path.insert(1, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from train import TinyLM  # noqa: E402

from fsdpdoctor.capture import capture  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: less noise)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(512, (args.batch, 64))
    y = torch.randint(512, (args.batch, 64))

    def train_step():
        logits = model(x)
        F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):  # warm up allocator / kernels
        train_step()

    def per_step_ms(step_fn) -> list[float]:
        out = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step_fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        cap = capture(tmp, model=model, optimizer=opt, wait=0, warmup=1, active=1, with_stack=True)
        cap.start()
        for _ in range(2):  # run the whole schedule: profiler stopped afterwards
            train_step()
            cap.step()
        assert cap._prof is None and cap.exported

        def wrapped():
            train_step()
            cap.step()

        bare, inside = [], []
        for _ in range(args.rounds):
            bare += per_step_ms(train_step)
            inside += per_step_ms(wrapped)
        cap.close()

    a, b = statistics.median(bare), statistics.median(inside)
    print(f"steps per variant: {len(bare)} ({args.rounds} alternating rounds of {args.steps})")
    print(f"(a) bare step median:                        {a:8.3f} ms")
    print(f"(b) inside capture(), after its window median: {b:8.3f} ms")
    print(f"ratio b/a: {b / a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
