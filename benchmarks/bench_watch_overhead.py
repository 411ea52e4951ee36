"""Cost of the hang watchdog (fsdpdoctor.capture.watch) while nothing hangs.

(a) ``Watch.step()`` per call (a counter and a clock reading), against an empty loop;
(b) the watchdog thread's CPU time over a quiet period (it wakes every timeout_s / 4 and
re-arms faulthandler's timer when steps progressed), as a share of one core.

    python benchmarks/bench_watch_overhead.py [--calls 1000000] [--seconds 5] [--timeout 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsdpdoctor.capture.watch import watch  # noqa: E402


def thread_cpu_s(ident: int) -> float:
    tid = next(t.native_id for t in threading.enumerate() if t.ident == ident)
    import os

    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=1.0, help="watchdog timeout (s); it polls every timeout/4")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, watch(tmp, timeout_s=args.timeout) as w:
        t0 = time.perf_counter()
        for _ in range(args.calls):
            pass
        empty = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(args.calls):
            w.step()
        stepped = time.perf_counter() - t0
        print(f"step(): {(stepped - empty) / args.calls * 1e9:.0f} ns per call "
              f"(loop {empty / args.calls * 1e9:.0f} ns)")
        cpu0 = thread_cpu_s(w._thread.ident)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            time.sleep(0.05)  # a 50 ms "step"
            w.step()
        cpu1 = thread_cpu_s(w._thread.ident)
        print(f"watchdog thread: {cpu1 - cpu0:.3f} s CPU in {args.seconds:.0f} s "
              f"({100 * (cpu1 - cpu0) / args.seconds:.2f}% of a core; 10 ms clock resolution)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
