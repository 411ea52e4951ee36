"""Shared pytest fixtures and helpers (others may append below)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None

# Decorate tests that need torch: ``@requires_torch``
requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def torch_or_skip():
    """Import torch or skip the calling test."""
    return pytest.importorskip("torch", reason="torch is not installed")


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
    import distributed

    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


# Under tests a violated analysis invariant fails (fsdpdoctor/analysis/invariants.py); in production the
# figure is withheld or bounded with a note. Set here, so CLI subprocesses started by tests inherit it.
os.environ.setdefault("FSDPDOCTOR_STRICT_INVARIANTS", "1")


# A line the loader prints on stderr while a long analysis runs (pipeline._Reporter): on a busy machine
# any analysis may take long enough to print one, so an assertion on stderr's lines ignores them.
_PROGRESS = re.compile(r"^fsdpdoctor: \d+/\d+ ranks analysed ")


def error_lines(stderr: str) -> list[str]:
    """stderr's lines without the progress lines a slow machine adds (one-line errors: ``== 1``)."""
    return [line for line in stderr.strip().splitlines() if not _PROGRESS.match(line)]
