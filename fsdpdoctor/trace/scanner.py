"""Whether the compiled trace scanner (``_scan.c``, built at install where a C compiler exists) reads the
traces here, and if not, why, in words: the CLI says it once per command and in ``--version``; the library
itself says nothing (a caller's program keeps its stderr)."""

from __future__ import annotations

import os

try:  # built from _scan.c at install; without a compiler the Python readings do all the work
    from fsdpdoctor.trace._scan import Scanned, scan  # noqa: F401 - Scanned: a build of these sources
    _WHY = ""
except ImportError as exc:  # pragma: no cover - depends on the install
    scan = None
    # a build of older sources (a tuple, not Scanned) is not used: reinstall to rebuild it
    _WHY = "out of date (reinstall to rebuild it)" if "cannot import name" in str(exc) else \
        "not built (no C compiler at install)"

# FSDPDOCTOR_NO_SCANNER=1: the Python readings only (the tests compare the two)
TURNED_OFF = bool(os.environ.get("FSDPDOCTOR_NO_SCANNER"))
_SLOWER = "traces are read by msgspec, more slowly"


def missing() -> str | None:
    """What to tell a user whose install has no scanner (None when it has one): the one case they may
    want to act on (reinstall where a C compiler exists)."""
    return None if scan is not None else f"{_WHY}: {_SLOWER}"


def state() -> str:
    """The scanner's state in a few words, for ``fsdpdoctor --version``."""
    if scan is None:
        return missing() or ""
    return f"turned off (FSDPDOCTOR_NO_SCANNER): {_SLOWER}" if TURNED_OFF else "compiled"
