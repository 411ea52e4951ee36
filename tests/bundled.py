"""The bundled traces (``traces/``) as committed, for the tests to read: a copy made once per test
process, without what a user's own runs of the verbs left beside them (``fsdpdoctor summarize
traces/straggler`` writes summaries there that git ignores). The tests then read what the repository
holds, and whatever a test writes into a run folder lands in the copy, never in the repository."""

from __future__ import annotations

import atexit
import contextlib
import os
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


# ---------------------------------------------------------------- one rank step per trace and process
# The tests that go over every bundled folder (expected findings, check's exit code, fix texts, ...)
# analysed each folder's ranks again in each test: three quarters of an analysis is that per-rank step
# (load, decode, summarise). Inside ``shared_rank_steps()`` a rank's step is taken once per test process
# and its answer (the msgpack bytes a worker sends back) reused for the same files, unchanged on disk,
# and the same options; the reduce, the rules and the invariants still run in every test, on objects
# of its own. Tests of the engines, summaries or tables do not use it.
_STEPS: dict = {}


def _step_key(unit):
    if unit.write_summary or unit.keep_tables:
        return None
    try:
        stats = tuple((s.st_size, s.st_mtime_ns, s.st_ino) for s in map(os.stat, unit.files))
    except OSError:
        return None
    return unit, stats


class _SharedSteps:
    def __init__(self, engine, store: dict):
        self.engine, self.store = engine, store

    def map(self, fn, units):
        todo = []
        for u in units:
            key = _step_key(u)
            if key is not None and key in self.store:
                yield u, self.store[key]
            else:
                todo.append(u)
        for u, outputs in self.engine.map(fn, todo) if todo else ():
            key = _step_key(u)
            if key is not None:
                self.store[key] = outputs
            yield u, outputs

    def close(self) -> None:
        self.engine.close()


@contextlib.contextmanager
def shared_rank_steps(store: dict | None = None):
    """Within: every analysis in this thread reuses the rank steps this process already took (or, given
    ``store``, those taken within this block: for files written and removed again, whose inode, size and
    time a later file may have too)."""
    from fsdpdoctor import pipeline

    real = pipeline.make_engine
    store = _STEPS if store is None else store
    pipeline.make_engine = lambda *a, **kw: _SharedSteps(real(*a, **kw), store)
    try:
        yield
    finally:
        pipeline.make_engine = real


def analysed(path, **selection):
    """``open_analysis(path, **selection)``, its rank steps shared (``shared_rank_steps``)."""
    from fsdpdoctor.pipeline import open_analysis

    with shared_rank_steps():
        return open_analysis(path, **selection)
