"""The linter's rules (pyproject.toml, [tool.ruff]) hold over the whole repository: run where ruff is
installed (it is in the [test] extra), skipped with the reason otherwise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        return None
    return [find_ruff_bin()]


@pytest.mark.skipif(_ruff() is None, reason="ruff is not installed (pip install 'fsdpdoctor[test]')")
def test_ruff_finds_nothing():
    got = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", str(REPO)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert got.returncode == 0, f"ruff check found (fix them, `ruff check --fix` fixes some):\n{got.stdout}{got.stderr}"
