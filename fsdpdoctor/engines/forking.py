"""Forked processes: when forking is safe, a forked worker that stays quiet, and calls shared out to
forked workers (the pieces of one large trace, ``trace.split``)."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import warnings
from typing import TypeVar
from collections.abc import Callable

T = TypeVar("T")

# a forked share not answered within this many times what this process's own share took (stuck in a
# lock a thread held at the fork), and at least this long, is killed and counts as failed
_WORKER_GRACE = 5.0
_WORKER_MIN_WAIT_S = 10.0


def other_threads() -> int:
    """Threads of this process besides the calling one: the kernel's count where it gives one (Linux),
    which includes the threads C libraries start (an OpenMP pool after a torch operation, OpenBLAS's,
    a test runner's I/O thread) that ``threading`` does not list; else the threads ``threading`` knows."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17]) - 1   # field 20: num_threads
    except (OSError, ValueError, IndexError):
        return threading.active_count() - 1


def can_fork() -> bool:
    """Whether forking is safe here: this is the main thread and the only thread of the process. A
    lock another thread holds at the fork stays held forever in the child (an OpenMP pool's barrier,
    a progress bar's stream lock), so a worker that needed it would hang; where other threads exist,
    pools start their workers from a fresh process instead (``pool_context``)."""
    import multiprocessing as mp   # here, not at import: a run that forks nothing loads none of it

    if "fork" not in mp.get_all_start_methods():
        return False
    return threading.current_thread() is threading.main_thread() and other_threads() == 0


def pool_context():
    """The multiprocessing context for a process pool: fork where ``can_fork()``, else a fork server
    (a fresh single-threaded process that forks the workers; POSIX), else spawn."""
    import multiprocessing as mp

    if can_fork():
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


_PR_SET_PDEATHSIG = 1   # linux/prctl.h


def die_with_parent(parent: int, lifeline: int | None = None, keep: tuple[int, ...] = ()) -> None:
    """In a worker, first thing: end when the process that started it ends, however it ends (returns,
    raises, is killed). Linux: the kernel sends SIGKILL when the parent dies (PR_SET_PDEATHSIG); a
    parent that died before that was set is seen by the pid this process now reports to. Everywhere:
    ``lifeline``, the reading end of a pipe whose writing end only the parent holds, reaches its end
    when the parent closes it or dies, and a thread that waits on it ends this process. ``keep``:
    inherited pipe ends that are not this worker's to hold (the writing end of the lifeline)."""
    for fd in keep:
        try:
            os.close(fd)
        except OSError:
            pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)
    if lifeline is not None:
        def watch() -> None:
            try:
                while os.read(lifeline, 1):
                    pass
            except OSError:
                pass
            os._exit(1)

        threading.Thread(target=watch, name="fsdpdoctor-lifeline", daemon=True).start()


class Lifeline:
    """A pipe from the parent to its forked workers: the parent holds the writing end and closes it when
    it is done with them (``close``), or the kernel does when the parent dies; each worker passes
    ``child_args()`` to ``die_with_parent``."""

    def __init__(self):
        self.parent = os.getpid()
        self.read_fd, self.write_fd = os.pipe()

    def child_args(self) -> tuple[int, int, tuple[int, ...]]:
        return self.parent, self.read_fd, (self.write_fd,)

    def started(self) -> None:
        """In the parent, once the workers are forked: they have their own copy of the reading end."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def close(self) -> None:
        self.started()
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


def quiet_child() -> None:
    """In a forked worker: never write to the parent's terminal. Its own stdout/stderr objects may
    carry a lock that another thread of the parent held at the fork, and a worker that wrote a warning
    through them would wait on it forever: they go to /dev/null."""
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker


def _share(call: Callable[[], T], conn, lifeline: tuple) -> None:
    try:
        die_with_parent(*lifeline)
        quiet_child()
        conn.send_bytes(pickle.dumps(call(), protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException:  # noqa: BLE001 - the parent falls back; a worker must never print a traceback
        try:
            conn.send_bytes(pickle.dumps(None))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        conn.close()


def _receive(proc, conn, deadline: float):
    """A worker's pickled answer, or None when it died or is still silent at ``deadline``."""
    try:
        while not conn.poll(0.05):
            if not proc.is_alive() or time.monotonic() > deadline:
                return None
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError):
        return None
    finally:
        _reap(proc, conn)


def _reap(proc, conn) -> None:
    conn.close()
    if proc.is_alive():
        proc.kill()
    proc.join()


def forked_shares(calls: list[Callable[[], T]]) -> list[T | None]:
    """Every call's answer: the first in this process, each other one in a forked worker (the workers
    inherit what the calls close over, so nothing is sent to them). A worker that fails, dies or stays
    silent too long answers None; the caller falls back. Only where ``can_fork()``. No worker outlives
    this call: an error here kills them at once, and they die with this process."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = []
    lifeline = Lifeline()
    try:
        try:
            for call in calls[1:]:
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_share, args=(call, send, lifeline.child_args()), daemon=True)
                try:
                    proc.start()
                finally:
                    send.close()
                procs.append((proc, recv))
            lifeline.started()
            t0 = time.monotonic()  # the wait for the workers is measured by this process's own share
            first = calls[0]()
        except BaseException:
            for proc, conn in procs:
                _reap(proc, conn)
            raise
        deadline = time.monotonic() + max(_WORKER_MIN_WAIT_S, _WORKER_GRACE * (time.monotonic() - t0))
        return [first, *[_receive(p, c, deadline) for p, c in procs]]
    finally:
        lifeline.close()
