"""Where the per-rank map runs: this process, a local process pool, or a Dask cluster.

A work unit is the trace file(s) of one rank; its result is the msgpack-encoded
``RankResult`` (small, so only summaries travel back). The map function is a plain
module-level function, so Dask workers need nothing but ``fsdpdoctor`` installed and
the trace paths readable (shared storage: see docs/scale-out.md).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time
from array import array
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any
from pathlib import Path
from typing import Iterator, Protocol

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.split import can_fork, quiet_child

try:  # forked workers exist only where fork does (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

# below this many bytes on disk, a process pool's start costs more than it saves (forked workers
# are cheap enough for any size: ``_forked_map``)
PARALLEL_MIN_BYTES = 8 << 20


@dataclass(frozen=True)
class RankUnit:
    """The files of one rank (several when the profiler ran several cycles), and how to analyse them."""

    files: tuple[str, ...]
    steps: tuple[int, ...] | None = None
    param_dtype: str | None = None
    write_summary: bool = False          # `summarize`: write ``<trace>.summary.msgpack`` beside the trace
    summary_dir: str | None = None       # ... or into this folder
    cycle_files: tuple[str, ...] | None = None  # the manifest's profiler-cycle files of this rank (None: not listed)


def map_unit(unit: RankUnit, pieces: int = 1) -> list[bytes]:
    """Load, analyse and summarise one rank (runs in a worker). One result per rank found.

    ``pieces``: cores this rank may use to decode a large trace (``trace.split``)."""
    from fsdpdoctor.analysis import rankresult
    from fsdpdoctor.analysis.engine import analyze_rank
    from fsdpdoctor.trace.loader import _merge_cycles, load_file

    paths = [Path(f) for f in unit.files]
    traces = [load_file(p, pieces) for p in paths]
    # the manifest's word on which files are cycles of one process, for this rank only
    manifest = None if unit.cycle_files is None else {"cycle_files": {str(t.rank): list(unit.cycle_files)
                                                                      for t in traces}}
    traces = _merge_cycles(traces, manifest)
    steps = set(unit.steps) if unit.steps is not None else None
    out = []
    for t in traces:
        files = paths if len(traces) == 1 else [t.path]
        res = analyze_rank(t, steps, files=files, param_dtype=unit.param_dtype)
        if unit.write_summary:
            for p in files:  # one summary per trace file (a cycled rank gets the merged result once per file)
                dest = rankresult.summary_path(p)
                if unit.summary_dir:
                    dest = Path(unit.summary_dir) / dest.name
                rankresult.write(res, dest)
        out.append(rankresult.encode(res))
        del t
    return out


class Engine(Protocol):
    def map(self, units: list[RankUnit]) -> Iterator[tuple[RankUnit, list[bytes]]]:
        """(unit, results) as units complete, in any order; an error raised for a unit re-raises here."""

    def close(self) -> None: ...


class SerialEngine:
    """In this process, one rank at a time (only one rank's tables in memory); a large trace may be
    decoded in ``pieces`` forked pieces (the cores a process pool would have used for other ranks)."""

    def __init__(self, pieces: int = 1):
        self.pieces = pieces

    def map(self, units):
        for u in units:
            yield u, map_unit(u, self.pieces)

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

    def map(self, units):
        n = max(1, min(self.workers, len(units)))
        if n == 1:
            yield from SerialEngine(pieces=self.workers).map(units)
        elif can_fork():
            yield from _forked_map(units, n)
        else:
            yield from _pool_map(units, n)

    def close(self) -> None:
        pass


def _died(unit: RankUnit) -> InputError:
    return InputError(unit.files[0], "a worker process died while analysing this rank (out of memory? try --jobs 1)")


def _forked_map(units: list[RankUnit], n: int):
    """This process and ``n - 1`` forked workers take the next rank from a ``_RankQueue`` until none
    is left; workers send results back over their own pipes.

    A fork is ~1 ms and the workers inherit the units, so nothing is sent to them. A process pool
    costs ~10 ms more to start and stop, and leaves this process idle: on two small ranks (recsys,
    0.2 MB) it was no faster than one process, this is 25 % faster (benchmarks/README.md).
    A worker still on one rank after ``_stuck_after`` is taken for stuck (a lock some thread held at
    the fork): it is killed and this process analyses that rank itself."""
    queue = _RankQueue.of(len(units))
    if queue is None:  # more ranks than the pipe holds
        yield from _pool_map(units, n)
        return
    ctx = mp.get_context("fork")
    workers = {}  # pipe -> [process, index of the unit it is on (None: between units), when it began]
    answered: set[int] = set()
    slowest = 0.0  # the longest rank this process analysed (s)
    try:
        for _ in range(n - 1):
            here, there = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_serve, args=(units, queue, there), daemon=True)
            proc.start()
            there.close()
            workers[here] = [proc, None, 0.0]
        while (i := queue.claim()) is not None:
            answered.add(i)
            t0 = time.monotonic()
            res = map_unit(units[i])
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
                    yield units[i], map_unit(units[i])
        lost = [u for i, u in enumerate(units) if i not in answered]
        if lost:  # claimed by a worker that died before it said so
            raise _died(lost[0])
    finally:
        for proc, *_ in workers.values():
            proc.kill()
        for conn, (proc, *_) in workers.items():
            conn.close()
            proc.join()
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
    def of(cls, n: int) -> "_RankQueue | None":
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


def _replies(units: list[RankUnit], workers: dict, answered: set[int], timeout: float | None):
    """The (unit, results) that workers have sent (waiting up to ``timeout`` for the first message).
    Every waiting message is read: a worker blocks once its pipe is full."""
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


def _serve(units: list[RankUnit], queue: _RankQueue, conn) -> None:
    """A forked worker: map the ranks it claims until none is left. It says which one it starts (the
    parent names it if the worker dies); errors travel back as values, as a process pool's do; an
    interrupt (Ctrl-C reaches the whole process group) ends it quietly and the parent reports."""
    try:
        quiet_child()
        while (i := queue.claim()) is not None:
            conn.send(("start", i, None))
            try:
                reply = ("result", i, map_unit(units[i]))
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


def _pool_map(units: list[RankUnit], n: int):
    """A process pool (where forking is not possible or not safe: spawn platforms, other threads alive)."""
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    # one task per rank and a fresh worker every few ranks: a worker's heap does not keep the
    # high-water mark of the largest trace it ever parsed
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context(method),
                             max_tasks_per_child=16 if method != "fork" else None) as pool:
        futures = {pool.submit(map_unit, u): u for u in units}
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


class DaskEngine:
    """The map as tasks on a Dask cluster: ``address`` of a running scheduler, or "local"
    for a LocalCluster on this machine (one single-threaded worker process per core).

    Trust: Dask sends results back with pickle, so a worker of the cluster can run code in this
    process (docs/trust.md); name only a cluster you would let run code as you."""

    def __init__(self, address: str):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError(None, "--dask needs the 'distributed' package: pip install 'fsdpdoctor[dask]'") from None
        self.cluster = None
        try:
            if address == "local":
                self.cluster = LocalCluster(n_workers=cpu_count(), threads_per_worker=1, processes=True,
                                            dashboard_address=None)
                self.client = Client(self.cluster)
            else:
                self.client = Client(address, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise InputError(None, f"--dask {address}: cannot reach the scheduler ({exc})") from None

    def map(self, units):
        """Paths travel absolute (a worker's working folder is not ours); the units yielded are the
        ones given. What comes back is only what a worker sent: the caller checks it before use."""
        from distributed import as_completed as dask_completed

        sent = [_absolute(u) for u in units]
        futures = self.client.map(map_unit, sent, pure=False)
        by_key = dict(zip((f.key for f in futures), units))
        for fut in dask_completed(futures):
            yield by_key[fut.key], fut.result()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _absolute(u: RankUnit) -> RankUnit:
    return dataclasses.replace(u, files=tuple(os.path.abspath(f) for f in u.files),
                               summary_dir=os.path.abspath(u.summary_dir) if u.summary_dir else None)


def make_engine(dask: str | None = None, workers: int | None = None, total_bytes: int | None = None,
                n_units: int = 0) -> Engine:
    if dask:
        return DaskEngine(dask)
    if workers == 1:
        return SerialEngine()
    small = workers is None and total_bytes is not None and total_bytes < PARALLEL_MIN_BYTES
    if n_units < 2 or (small and not can_fork()):
        return SerialEngine(pieces=workers or cpu_count())
    return LocalEngine(workers)
