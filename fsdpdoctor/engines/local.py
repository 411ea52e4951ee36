"""The map on this machine: in this process, in forked workers, or in a process pool.

A map calls ``fn(unit)`` for every unit (``fn(unit, pieces)`` in this process: the cores a pool would
have used for other units) and yields (unit, answer) as units complete. ``fn`` is a plain
module-level function (a pool pickles it by name); answers travel back pickled.
"""

from __future__ import annotations

import os
import sys
import time
from array import array
from typing import Any
from collections.abc import Callable, Iterator

from fsdpdoctor.engines.forking import Lifeline, can_fork, die_with_parent, pool_context, quiet_child
from fsdpdoctor.errors import InputError

try:  # forked workers exist only where fork does (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

Step = Callable[..., Any]  # fn(unit, pieces=1) -> answer


class SerialEngine:
    """In this process, one rank at a time (only one rank's tables in memory); a large trace may be
    decoded in ``pieces`` forked pieces (the cores a process pool would have used for other ranks)."""

    def __init__(self, pieces: int = 1):
        self.pieces = pieces

    def map(self, fn: Step, units: list) -> Iterator[tuple[Any, Any]]:
        for u in units:
            yield u, fn(u, self.pieces)

    def close(self) -> None:
        pass


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class LocalEngine:
    """A process pool on this machine, one worker per core by default."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or cpu_count()

    def map(self, fn: Step, units: list) -> Iterator[tuple[Any, Any]]:
        n = max(1, min(self.workers, len(units)))
        if n == 1:
            yield from SerialEngine(pieces=self.workers).map(fn, units)
        elif can_fork():
            yield from _forked_map(fn, units, n)
        elif _pool_can_start():
            yield from _pool_map(fn, units, n)
        else:
            yield from SerialEngine(pieces=1).map(fn, units)

    def close(self) -> None:
        pass


def _pool_can_start() -> bool:
    """Whether a pool can start its workers from a fresh process here: multiprocessing hands its helper
    processes this process's stderr by its file descriptor, and a stream put in its place whose
    ``fileno()`` says -1 (the TUI's) makes every start fail; then the ranks are mapped in this process."""
    try:
        return sys.stderr.fileno() >= 0
    except Exception:  # noqa: BLE001 - no descriptor at all: multiprocessing does without it
        return True


def _died(unit) -> InputError:
    return InputError(unit.label, "a worker process died while analysing this rank (out of memory? try --jobs 1)")


def _forked_map(fn: Step, units: list, n: int):
    """This process and ``n - 1`` forked workers take the next rank from a ``_RankQueue`` until none
    is left; workers send results back over their own pipes.

    A fork is ~1 ms and the workers inherit the units, so nothing is sent to them. A process pool
    costs ~10 ms more to start and stop, and leaves this process idle: on two small ranks (recsys,
    0.2 MB) it was no faster than one process, this is 25 % faster (benchmarks/README.md).
    A worker still on one rank after ``_stuck_after`` is taken for stuck (a lock some thread held at
    the fork): it is killed and this process analyses that rank itself."""
    queue = _RankQueue.of(len(units))
    if queue is None:  # more ranks than the pipe holds
        yield from _pool_map(fn, units, n)
        return
    import multiprocessing as mp   # here, not at import: one rank in this process needs none of it

    ctx = mp.get_context("fork")
    workers = {}  # pipe -> [process, index of the unit it is on (None: between units), when it began]
    answered: set[int] = set()
    slowest = 0.0  # the longest rank this process analysed (s)
    lifeline = Lifeline()   # the workers die with this process, however it ends
    try:
        for _ in range(n - 1):
            here, there = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_serve, args=(fn, units, queue, there, lifeline.child_args()), daemon=True)
            try:
                proc.start()
            finally:
                there.close()
            workers[here] = [proc, None, 0.0]
        lifeline.started()
        while (i := queue.claim()) is not None:
            answered.add(i)
            t0 = time.monotonic()
            res = fn(units[i])
            slowest = max(slowest, time.monotonic() - t0)
            yield units[i], res
            yield from _replies(units, workers, answered, timeout=0)
        while workers:
            yield from _replies(units, workers, answered, timeout=1.0)
            for conn, (proc, i, began) in list(workers.items()):
                if i is not None and time.monotonic() - began > _stuck_after(slowest):
                    proc.kill()
                    proc.join()
                    conn.close()
                    del workers[conn]
                    answered.add(i)
                    yield units[i], fn(units[i])
        lost = [u for i, u in enumerate(units) if i not in answered]
        if lost:  # claimed by a worker that died before it said so
            raise _died(lost[0])
    finally:
        for proc, *_ in workers.values():
            proc.kill()
        for conn, (proc, *_) in workers.items():
            conn.close()
            proc.join()
        lifeline.close()
        queue.close()


# a worker is stuck when one rank has taken it this long and this many times the slowest rank this
# process analysed (ranks of one job are alike; a 1 GB trace takes minutes, so the floor is generous)
_STUCK_MIN_S = 600.0
_STUCK_FACTOR = 20.0


def _stuck_after(slowest: float) -> float:
    return max(_STUCK_MIN_S, _STUCK_FACTOR * slowest)


class _RankQueue:
    """The indexes of the ranks not yet claimed, 4 bytes each in a pipe every process reads: one read
    of 4 bytes is one claim (the kernel serialises readers), and nothing is held between claims, so a
    process killed at any moment cannot stop the others (a shared lock could be left taken)."""

    def __init__(self, read_fd: int):
        self.fd = read_fd

    @classmethod
    def of(cls, n: int) -> _RankQueue | None:
        """All ``n`` indexes written, the writing end closed; None when the pipe cannot hold them."""
        r, w = os.pipe()
        data = array("i", range(n)).tobytes()
        try:
            if len(data) > 65536 and hasattr(fcntl, "F_SETPIPE_SZ"):  # Linux: a larger pipe
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(data))
            os.set_blocking(w, False)
            written = os.write(w, data) if data else 0
        except OSError:
            written = -1
        finally:
            os.close(w)
        if written != len(data):
            os.close(r)
            return None
        return cls(r)

    def claim(self) -> int | None:
        got = os.read(self.fd, 4)
        return int.from_bytes(got, sys.byteorder, signed=True) if len(got) == 4 else None

    def close(self) -> None:
        os.close(self.fd)


def _replies(units: list, workers: dict, answered: set[int], timeout: float | None):
    """The (unit, results) that workers have sent (waiting up to ``timeout`` for the first message).
    Every waiting message is read: a worker blocks once its pipe is full."""
    from multiprocessing.connection import wait as wait_any

    for conn in wait_any(list(workers), timeout):
        entry = workers[conn]
        while conn in workers:
            try:
                if not conn.poll():
                    break
                kind, i, value = conn.recv()
            except (EOFError, OSError):
                if entry[1] is None:  # it ended between units, without saying so: nothing is lost
                    del workers[conn]
                    entry[0].join()
                    break
                raise _died(units[entry[1]]) from None
            if kind == "start":
                entry[1], entry[2] = i, time.monotonic()
            elif kind == "done":
                del workers[conn]
                conn.close()
                entry[0].join()
            elif kind == "error":
                raise value
            else:
                entry[1] = None
                answered.add(i)
                yield units[i], value


def _serve(fn: Step, units: list, queue: _RankQueue, conn, lifeline: tuple) -> None:
    """A forked worker: map the ranks it claims until none is left. It says which one it starts (the
    parent names it if the worker dies); errors travel back as values, as a process pool's do; an
    interrupt (Ctrl-C reaches the whole process group) ends it quietly and the parent reports."""
    try:
        die_with_parent(*lifeline)
        quiet_child()
        while (i := queue.claim()) is not None:
            conn.send(("start", i, None))
            try:
                reply = ("result", i, fn(units[i]))
            except Exception as exc:  # noqa: BLE001 - re-raised in the parent
                reply = ("error", i, exc)
            try:
                conn.send(reply)
            except Exception as exc:  # noqa: BLE001 - an exception that does not pickle
                conn.send(("error", i, RuntimeError(f"{type(exc).__name__} in a worker: {exc}")))
        conn.send(("done", None, None))
    except BaseException:  # noqa: BLE001
        pass
    finally:
        conn.close()


def _pool_map(fn: Step, units: list, n: int):
    """A process pool (where forking is not possible or not safe: spawn platforms, other threads alive:
    then a fork server, a fresh process, starts the workers)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    ctx = pool_context()
    forked = ctx.get_start_method() == "fork"
    # one task per rank and a fresh worker every few ranks: a worker's heap does not keep the
    # high-water mark of the largest trace it ever parsed
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, max_tasks_per_child=None if forked else 16,
                             initializer=_pool_worker, initargs=(os.getpid() if forked else None,)) as pool:
        futures = {pool.submit(fn, u): u for u in units}
        try:
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    raise _died(futures[fut]) from None
                yield futures[fut], res
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _pool_worker(parent: int | None) -> None:
    """A pool worker dies with the process that started it (a fork server's workers with the fork
    server, which ends when this process does)."""
    die_with_parent(parent if parent is not None else os.getppid())
