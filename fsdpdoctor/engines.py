"""Where the per-rank map runs: this process, a local process pool, or a Dask cluster.

A work unit is the trace file(s) of one rank; its result is the msgpack-encoded
``RankResult`` (small, so only summaries travel back). The map function is a plain
module-level function, so Dask workers need nothing but ``fsdpdoctor`` installed and
the trace paths readable (shared storage: see docs/scale-out.md).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from fsdpdoctor.errors import InputError

# below this many bytes on disk, starting worker processes costs more than it saves
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
            return
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
                        raise InputError(futures[fut].files[0], "a worker process died while analysing this rank "
                                         "(out of memory? try --jobs 1)") from None
                    yield futures[fut], res
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def close(self) -> None:
        pass


class DaskEngine:
    """The map as tasks on a Dask cluster: ``address`` of a running scheduler, or "local"
    for a LocalCluster on this machine (one single-threaded worker process per core)."""

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
        from distributed import as_completed as dask_completed

        futures = self.client.map(map_unit, units, pure=False)
        by_key = dict(zip((f.key for f in futures), units))
        for fut in dask_completed(futures):
            yield by_key[fut.key], fut.result()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def make_engine(dask: str | None = None, workers: int | None = None, total_bytes: int | None = None,
                n_units: int = 0) -> Engine:
    if dask:
        return DaskEngine(dask)
    if workers == 1:
        return SerialEngine()
    if n_units < 2 or (workers is None and total_bytes is not None and total_bytes < PARALLEL_MIN_BYTES):
        return SerialEngine(pieces=workers or cpu_count())
    return LocalEngine(workers)
