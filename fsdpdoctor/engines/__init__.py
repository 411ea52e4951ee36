"""Where a map runs: this process, forked workers or a process pool on this machine, or a Dask cluster.

An engine calls a plain module-level function on every unit of work (in the pipeline: the per-rank
step on one rank's files) and yields (unit, answer) as units complete, in any order. All of the
project's process machinery lives in this package: the local map (``local``), Dask (``dask``), and
forking (``forking``: also the forked pieces of one large trace).
"""

from __future__ import annotations

from typing import Any, Protocol
from collections.abc import Iterator

from fsdpdoctor.engines.forking import can_fork
from fsdpdoctor.engines.local import LocalEngine, SerialEngine, Step, cpu_count

# below this many bytes on disk, a process pool's start costs more than it saves (forked workers
# are cheap enough for any size: ``local._forked_map``)
PARALLEL_MIN_BYTES = 8 << 20


class Engine(Protocol):
    def map(self, fn: Step, units: list) -> Iterator[tuple[Any, Any]]:
        """(unit, fn(unit)) as units complete, in any order; an error raised for a unit re-raises here."""

    def close(self) -> None: ...


def make_engine(dask: str | None = None, workers: int | None = None, total_bytes: int | None = None,
                n_units: int = 0) -> Engine:
    if dask:
        from fsdpdoctor.engines.dask import DaskEngine

        return DaskEngine(dask)
    if workers == 1:
        return SerialEngine()
    small = workers is None and total_bytes is not None and total_bytes < PARALLEL_MIN_BYTES
    if n_units < 2 or (small and not can_fork()):
        return SerialEngine(pieces=workers or cpu_count())
    return LocalEngine(workers)
