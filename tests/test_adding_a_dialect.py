"""docs/adding-a-dialect.md: its worked example (the dialect's file and its registry entry) runs as
written, on a two-rank trace whose collectives show only as ``record_param_comms`` host ops."""

from __future__ import annotations

import gzip
import json
import re
import sys
import types
from pathlib import Path

import pytest

from fsdpdoctor.analysis import dialects
from fsdpdoctor.pipeline import open_analysis

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-dialect.md"
STEPS, STEP_US, COMPUTE_US, COMM_US, NELEMS = (1, 2, 3), 1000.0, 500.0, 300.0, 1000


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _trace(folder: Path, rank: int) -> None:
    """Each step: 500 µs of compute, then a blocking 4 kB all-reduce of 300 µs (its host op only)."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "MainThread"}}]
    for i, step in enumerate(STEPS):
        t0 = 10.0 + i * STEP_US
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": STEP_US - 10.0})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 50.0,
                   "dur": COMPUTE_US})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                   "ts": t0 + 50.0 + COMPUTE_US, "dur": COMM_US,
                   "args": {"Collective name": "allreduce", "In msg nelems": NELEMS, "Out msg nelems": NELEMS,
                            "dtype": "Float", "Group size": 2, "Rank": rank}})
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "mpi", "rank": rank, "world_size": 2},
           "traceEvents": ev}
    (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))


@pytest.fixture
def mpi_run(tmp_path) -> Path:
    for rank in (0, 1):
        _trace(tmp_path, rank)
    return tmp_path


def test_worked_example_runs(mpi_run, monkeypatch):
    module_src, registry_line = _blocks()
    # before: the host-only gloo reading takes the trace, and finds no collective in it (a contributor who
    # followed the page has the entry in the registry already: "before" is the registry without it)
    monkeypatch.setattr(dialects, "DIALECTS", [d for d in dialects.DIALECTS if d.name != "mpi-host"])
    before = open_analysis(mpi_run, workers=1, use_summaries=False)
    assert before.job.traits.name == "gloo-cpu" and not before.collectives

    # the file, as the page writes it, under the name it gives
    name = "fsdpdoctor.analysis.dialects.mpi_host"
    mpi_host = types.ModuleType(name)
    mpi_host.__file__ = str(DOC)
    monkeypatch.setitem(sys.modules, name, mpi_host)
    exec(compile(module_src, str(DOC), "exec"), vars(mpi_host))
    # the registry entry, as the page writes it, with the registry's own names
    ns = {"Dialect": dialects.Dialect, "nccl_gpu": dialects.nccl_gpu, "gloo_cpu": dialects.gloo_cpu,
          "mpi_host": mpi_host}
    exec(compile(registry_line, str(DOC), "exec"), ns)
    assert [d.name for d in ns["DIALECTS"]] == ["nccl-gpu", "mpi-host", "gloo-cpu"]
    monkeypatch.setattr(dialects, "DIALECTS", ns["DIALECTS"])

    a = open_analysis(mpi_run, workers=1, use_summaries=False)
    assert a.job.traits.name == "mpi-host" and a.job.traits.has_message_sizes
    assert a.job.backend == "mpi" and a.job.dialect == "cpu" and [r.rank for r in a.ranks] == [0, 1]
    (stat,) = a.collectives
    assert (stat.kind, stat.count, stat.size_bytes) == ("all_reduce", 2 * len(STEPS), 2 * len(STEPS) * NELEMS * 4)
    for r in a.ranks:
        assert [s.step for s in r.steps] == list(STEPS)
        for s in r.steps:
            assert s.comm_us == pytest.approx(COMM_US) and s.exposed_comm_us == pytest.approx(COMM_US)
            assert s.compute_us == pytest.approx(COMPUTE_US)
    assert any("MPI trace" in n for n in a.notes)   # the dialect's note, once per job
