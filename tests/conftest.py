"""Shared pytest fixtures and helpers (others may append below)."""

from __future__ import annotations

import importlib.util
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
def traces_dir(repo_root) -> Path:
    return repo_root / "traces"
