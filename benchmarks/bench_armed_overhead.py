"""Cost of capture() armed for the whole run, outside its windows.

Times ``--calls`` steps of an empty loop (a) bare and (b) calling ``cap.step()`` on a capture armed
with no fixed window (the step series, its writes every half second, the trigger polls: all of it
amortised over the calls; CPU time of the process), (c) the same with ``auto=True`` (the anomaly rule), (d) with the batch
wrapper ``cap.batches()`` as well. Rounds alternate to spread noise; medians are printed as ns per
step above the bare loop and as the ratio of loop times. Also: threads before and after start()
(the capture adds none), and bytes of step series per step.

    python benchmarks/bench_armed_overhead.py [--calls 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsdpdoctor.capture import capture  # noqa: E402


# CPU time of this process, not wall time: on a shared machine the wall clock also counts the time other
# processes held the core
clock = time.process_time


def bare(n: int) -> float:
    t0 = clock()
    for _ in range(n):
        pass
    return clock() - t0


def armed(n: int, auto: bool, batches: bool) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        threads = threading.active_count()
        with capture(tmp, fixed_window=False, auto=auto) as cap:
            added = threading.active_count() - threads
            step = cap.step
            t0 = clock()
            if batches:
                for _ in cap.batches(range(n)):
                    step()
            else:
                for _ in range(n):
                    step()
            elapsed = clock() - t0
        size = (Path(tmp) / "steps" / "rank0.steps").stat().st_size
    return elapsed, added, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.calls
    cases = {"step()": (False, False), "step(), auto=True": (True, False), "step() + batches()": (False, True)}
    times: dict[str, list[float]] = {"bare": []} | {k: [] for k in cases}
    added, size = 0, 0
    for _ in range(args.rounds):
        times["bare"].append(bare(n))
        for name, (auto, batches) in cases.items():
            t, a, size = armed(n, auto, batches)
            times[name].append(t)
            added = max(added, a)
    base = statistics.median(times["bare"])
    print(f"{n} steps, median of {args.rounds} rounds; bare loop {base / n * 1e9:.0f} ns per iteration")
    for name in cases:
        t = statistics.median(times[name])
        print(f"  {name:22s} {(t - base) / n * 1e9:6.0f} ns per step above the bare loop "
              f"(loop time ratio {t / base:.1f}x)")
    print(f"threads added by the capture: {added}; step series: {(size - 40) / n:.0f} bytes per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
