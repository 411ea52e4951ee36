"""The map as tasks on a Dask cluster (``pip install 'fsdpdoctor[dask]'``): the workers need nothing but
``fsdpdoctor`` installed and the units' files readable at the same paths (docs/scale-out.md)."""

from __future__ import annotations

from typing import Any
from collections.abc import Iterator

from fsdpdoctor.engines.local import Step, cpu_count
from fsdpdoctor.errors import InputError


class DaskEngine:
    """The map as tasks on a Dask cluster: ``address`` of a running scheduler, or "local"
    for a LocalCluster on this machine (one single-threaded worker process per core).

    Trust: Dask sends results back with pickle, so a worker of the cluster can run code in this
    process (docs/trust.md): name only a cluster you would let run code as you. The caller sends
    paths a worker can open wherever it runs (absolute) and checks what comes back before use."""

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

    def map(self, fn: Step, units: list) -> Iterator[tuple[Any, Any]]:
        from distributed import as_completed as dask_completed

        futures = self.client.map(fn, units, pure=False)
        by_key = dict(zip((f.key for f in futures), units))
        for fut in dask_completed(futures):
            yield by_key[fut.key], fut.result()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
