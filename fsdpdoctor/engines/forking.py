"""Forked processes: when forking is safe, a forked worker that stays quiet, and calls shared out to
forked workers (the pieces of one large trace, ``trace.split``)."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import warnings
from typing import Callable, TypeVar

T = TypeVar("T")

# a forked share not answered within this many times what this process's own share took (stuck in a
# lock a thread held at the fork), and at least this long, is killed and counts as failed
_WORKER_GRACE = 5.0
_WORKER_MIN_WAIT_S = 10.0


def can_fork() -> bool:
    """Whether forking is safe here: no other thread but daemons (a progress bar's refresher), which
    hold no lock the workers need; the TUI and Dask run the analysis in threads, and get no pieces."""
    import multiprocessing as mp   # here, not at import: a run that forks nothing loads none of it

    if "fork" not in mp.get_all_start_methods():
        return False
    main = threading.main_thread()
    return threading.current_thread() is main and all(t is main or t.daemon for t in threading.enumerate())


def quiet_child() -> None:
    """In a forked worker: never write to the parent's terminal. Its own stdout/stderr objects may
    carry a lock that another thread of the parent held at the fork (a progress bar refreshing), and
    a worker that wrote a warning through them would wait on it forever: they go to /dev/null."""
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker


def _share(call: Callable[[], T], conn) -> None:
    try:
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
        conn.close()
        if proc.is_alive():
            proc.kill()
        proc.join()


def forked_shares(calls: list[Callable[[], T]]) -> list[T | None]:
    """Every call's answer: the first in this process, each other one in a forked worker (the workers
    inherit what the calls close over, so nothing is sent to them). A worker that fails, dies or stays
    silent too long answers None; the caller falls back. Only where ``can_fork()``."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = []
    t0 = time.monotonic()
    try:
        for call in calls[1:]:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_share, args=(call, send), daemon=True)
            proc.start()
            send.close()
            procs.append((proc, recv))
        t0 = time.monotonic()  # the wait for the workers is measured by this process's own share
        first = calls[0]()
    finally:
        deadline = time.monotonic() + max(_WORKER_MIN_WAIT_S, _WORKER_GRACE * (time.monotonic() - t0))
        rest = [_receive(p, c, deadline) for p, c in procs]
    return [first, *rest]
