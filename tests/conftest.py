"""Shared pytest fixtures and helpers (others may append below)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None

# Decorate tests that need torch: ``@requires_torch``
requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs the [capture] extra (torch)")


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def pytest_collection_modifyitems(config, items):
    """Tests of an optional part skip, naming the extra, where it is not installed (a venv with only
    ``pip install -e .`` and pytest): async tests without pytest-asyncio, the TUI's screenshots without
    pytest-textual-snapshot (their fixture would be missing: an error, not a skip)."""
    import inspect

    no_asyncio, no_snapshots = _missing("pytest_asyncio"), _missing("pytest_textual_snapshot")
    for item in items:
        fn = getattr(item, "obj", None)
        if no_asyncio and (item.get_closest_marker("asyncio") or (fn is not None and inspect.iscoroutinefunction(fn))):
            item.add_marker(pytest.mark.skip(reason="needs the [test] extra (pytest-asyncio)"))
        elif no_snapshots and "snap_compare" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason="needs the [test] extra (pytest-textual-snapshot)"))


def torch_or_skip():
    """Import torch or skip the calling test."""
    return pytest.importorskip("torch", reason="needs the [capture] extra (torch)")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The bundled traces, as committed (a pristine copy: see tests/bundled.py)."""
    from bundled import TRACES

    return TRACES


@pytest.fixture(scope="module")
def dask_address():
    """A real Dask LocalCluster, in this process (threads, no worker processes: cheap to start)."""
    distributed = pytest.importorskip("distributed", reason="needs the [dask] extra (distributed)")

    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def _shared_bytecode() -> None:
    """Compile each module once, not once per process. Where PYTHONDONTWRITEBYTECODE is set (this
    machine's shell), every xdist worker and every ``python -m fsdpdoctor`` a test starts compiled the
    package and rewrote the test modules again: ~4.6 CPU s of each worker's 8 s collection, ~0.3 s of
    each CLI subprocess. The bytecode is written where Python writes it by default, ``__pycache__``
    beside each source (ignored by git), so the workers and subprocesses read it. A folder of the temp
    dir per run (PYTHONPYCACHEPREFIX, the earlier way) also hid the bytecode pip wrote for every
    installed package: each run compiled numpy, textual, torch, transformers and Lightning again, in
    every process that imported one before another had written it (torch: 4.6 CPU s cold, 2.8 s warm;
    transformers and Lightning: 17.2 s cold, 9.0 s warm)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_shared_bytecode()

# Under tests a violated analysis invariant fails (fsdpdoctor/analysis/invariants.py); in production the
# figure is withheld or bounded with a note. Set here, so CLI subprocesses started by tests inherit it.
os.environ.setdefault("FSDPDOCTOR_STRICT_INVARIANTS", "1")


# A line the loader prints on stderr while a long analysis runs (pipeline._Reporter): on a busy machine
# any analysis may take long enough to print one, so an assertion on stderr's lines ignores them.
_PROGRESS = re.compile(r"^fsdpdoctor: \d+/\d+ ranks analysed ")


def error_lines(stderr: str) -> list[str]:
    """stderr's lines without the progress lines a slow machine adds (one-line errors: ``== 1``)."""
    return [line for line in stderr.strip().splitlines() if not _PROGRESS.match(line)]


def _one_process_analyses():
    """The analyses a test runs in its own process take their ranks one at a time, in that process.
    By default an analysis forks a worker per core (``engines.local``): under pytest-xdist every core
    already runs a test process, so each fork only added its own cost (tests/test_diagnose.py: 37 CPU s
    forking, 32 s not, mostly the kernel's time to copy a test process of a few hundred MB). A test
    that names ``--jobs`` or ``workers`` still gets those workers; tests/test_forked_map.py and
    tests/test_split.py test the forked map and the pieces (``machine_cores`` gives a test the cores
    back); the CLI subprocesses the tests start run as a user's would, one worker per core."""
    from fsdpdoctor import engines
    from fsdpdoctor.engines import local

    real = local.cpu_count
    engines.cpu_count = local.cpu_count = lambda: 1
    return real


_REAL_CPU_COUNT = _one_process_analyses()


@pytest.fixture
def machine_cores(monkeypatch):
    """This machine's cores as the engines count them (the default of an analysis outside the tests)."""
    from fsdpdoctor import engines
    from fsdpdoctor.engines import local

    monkeypatch.setattr(engines, "cpu_count", _REAL_CPU_COUNT)
    monkeypatch.setattr(local, "cpu_count", _REAL_CPU_COUNT)
    return _REAL_CPU_COUNT()


@pytest.fixture(scope="session")
def ddp_reference_run(tmp_path_factory) -> tuple[int, Path]:
    """``fsdpdoctor reference run ddp_default --nproc 2`` (wait 1, warmup 1, active 3: steps 2-4 profiled),
    run once per test process for the tests that read it (tests/test_reference_jobs.py, the 2-process side
    of tests/test_scaling.py): its exit code and run folder. One torchrun job less than a job per test;
    the tests share an xdist group, so the slow half's ``--dist loadgroup`` runs them in one process."""
    from fsdpdoctor.cli import main

    out = tmp_path_factory.mktemp("ddp_reference") / "run"
    for _attempt in range(2):  # gloo jobs occasionally abort at exit (see test_capture.torchrun)
        rc = main(["reference", "run", "ddp_default", "--nproc", "2", "--out", str(out),
                   "--wait", "1", "--warmup", "1", "--active", "3"])
        if rc == 0:
            break
    return rc, out
