"""After the tests: the processes the test command left running. Every process it started carries the
mark it exported (FSDPDOCTOR_TEST_RUN=<mark>) in its environment, also one that was orphaned or started
its own session (a parent chain or a process group would lose those). Each is named, the command fails,
and they are killed: a runner that reads the command's output to its end does not wait on them.

    python .ci/leftovers.py MARK [--grace SECONDS]

Linux (/proc); elsewhere it says it did not look and succeeds."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

VAR = "FSDPDOCTOR_TEST_RUN"


def _ancestors() -> set[int]:
    """This process and those it runs under (the test command's own shell carries the mark too)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def marked(mark: str) -> dict[int, str]:
    """pid -> command line of every living process whose environment holds the mark (zombies have none)."""
    needle = f"{VAR}={mark}".encode()
    skip = _ancestors()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
        except OSError:   # ended meanwhile, or not ours to read
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mark")
    ap.add_argument("--grace", type=float, default=5.0, help="seconds left to processes that are ending")
    args = ap.parse_args(argv)
    if not os.path.isdir("/proc/self"):
        print("leftover processes: not checked (no /proc here)")
        return 0
    deadline = time.monotonic() + args.grace
    left = marked(args.mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked(args.mark)
    if not left:
        print("leftover processes: none")
        return 0
    print(f"leftover processes: {len(left)} still running after the tests; killed:")
    for pid, cmd in sorted(left.items()):
        print(f"  {pid}  {cmd}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return 1


if __name__ == "__main__":
    sys.exit(main())
