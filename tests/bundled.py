"""The bundled traces (``traces/``) as committed, for the tests to read: a copy made once per test
process, without what a user's own runs of the verbs left beside them (``fsdpdoctor summarize
traces/straggler`` writes summaries there that git ignores). The tests then read what the repository
holds, and whatever a test writes into a run folder lands in the copy, never in the repository."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "traces"


def _ignored() -> set[str] | None:
    """The files under traces/ that git ignores (None without git or outside a clone)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--others", "--ignored",
                              "--exclude-standard", "traces"], capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {n for n in out.decode().split("\0") if n}


def _copy() -> Path:
    if not SOURCE.is_dir():
        return SOURCE  # absent: the tests that need it skip on their own
    ignored = _ignored()
    dest = Path(tempfile.mkdtemp(prefix="fsdpdoctor-traces-")) / "traces"
    atexit.register(shutil.rmtree, dest.parent, ignore_errors=True)

    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(REPO)
        if ignored is None:  # no git: leave out what the verbs write (summaries, hidden files)
            return {n for n in names if n.endswith(".summary.msgpack") or n.startswith(".")}
        return {n for n in names if (rel / n).as_posix() in ignored}

    shutil.copytree(SOURCE, dest, ignore=ignore)
    return dest


TRACES = _copy()


def expectations() -> dict[Path, dict]:
    """Each bundled recording's folder (in the copy) -> what it must and must not show, derived from
    the scenario tables (reference_jobs/expectations.py); no file in traces/ holds a copy."""
    import sys

    sys.path.insert(0, str(REPO / "reference_jobs"))
    from expectations import expectations as derive

    return derive(TRACES)
