"""Every limit on what an input file may make this process do, in one place (the table: docs/trust.md).

A file is data from somewhere else. Its size on disk says little about what reading it costs: a
gzip member inflates up to ~1000x, JSON may nest 100k levels deep (each level a Python stack frame
in ``json``, ``tomllib``, ``msgspec``), one string may be gigabytes long (every regular expression
that meets it scans it whole). The readers ask this module before they spend, and past a limit
the input is refused in one line (``InputError``, exit 2) or, for one long name, shortened:

- ``INFLATE_RATIO``: traces compress 8-20x (JSON of repeated event names); 100x leaves five times
  that. A larger output is a zip bomb or not a trace. Below ``INFLATE_FLOOR`` (64 MiB) the ratio is not
  asked: a small synthetic file may compress 1000x, and 64 MiB costs nothing to hold.
- ``MEMORY_SHARE``: what is inflated must also fit in half of the memory this process may still use
  (the free memory, or the address space ``ulimit -v`` leaves), as decoding needs about as much again.
- ``MAX_DEPTH``: documents written here nest under 10 levels (a saved ``--json`` 7, a hang dump 6);
  100 is far above them and far below the ~1000 frames of Python's recursion limit.
- ``MAX_NAME_CHARS``: the longest names a profiler writes are C++ template kernels of a few KiB;
  a name beyond 64 KiB is kept to its first 64 KiB (marked), before any regular expression sees it.
- ``DOCUMENT_MAX``: a manifest, hang dump or thresholds file read whole (a flight recorder of 2,000
  entries with stacks is ~2 MB).
"""

from __future__ import annotations

import os
import re

from fsdpdoctor.errors import InputError

INFLATE_RATIO = 100
INFLATE_FLOOR = 64 << 20
MEMORY_SHARE = 0.5
MAX_DEPTH = 100
MAX_NAME_CHARS = 64 << 10
DOCUMENT_MAX = 64 << 20


# ----------------------------------------------------------------------------- decompressed size
def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) still allows this process to map; None without such a limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", "rb") as fh:
            used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0)


def memory_budget() -> int | None:
    """Bytes one input may take once inflated: ``MEMORY_SHARE`` of what this process can still use."""
    known = [v for v in (_meminfo_available(), _address_space_left()) if v is not None]
    return int(MEMORY_SHARE * min(known)) if known else None


def inflate_cap(compressed_bytes: int, whole: bool = True) -> int:
    """The most ``compressed_bytes`` of gzip data may inflate to; ``whole``: held whole in memory (a reader
    that inflates and decodes a piece at a time is bounded by the ratio alone)."""
    cap = max(INFLATE_RATIO * compressed_bytes, INFLATE_FLOOR)
    budget = memory_budget() if whole else None
    return cap if budget is None else min(cap, budget)


def too_inflated(path, compressed_bytes: int, cap: int) -> InputError:
    """The one-line refusal of gzip data that inflates beyond ``cap``."""
    why = (f"the larger of {INFLATE_RATIO}x its {compressed_bytes:,} bytes on disk and {INFLATE_FLOOR >> 20} MiB"
           if cap >= max(INFLATE_RATIO * compressed_bytes, INFLATE_FLOOR)
           else f"{MEMORY_SHARE:.0%} of the memory this process can still use")
    return InputError(path, f"gzip data inflates to more than {cap:,} bytes ({why}): not a trace this tool reads")


# ----------------------------------------------------------------------------- nesting depth
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
# TOML: multi-line and single-line strings of both kinds, and comments (brackets inside them do not nest)
_TOML_SKIPPED = re.compile(rb'"""(?:[^\\]|\\.)*?"""' rb"|'''.*?'''" rb'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
                           rb"|'[^'\n]*'|#[^\n]*", re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(data: bytes | str, toml: bool = False) -> int:
    """How deep the arrays and objects (tables) of a JSON (or TOML) document nest, without parsing it."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if b"[" not in data and b"{" not in data:
        return 0
    brackets = (_TOML_SKIPPED if toml else _JSON_STRING).sub(b"", data).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:  # a small document: the running sum in Python
        depth = deepest = 0
        for b in brackets:
            depth += 1 if b in b"[{" else -1
            deepest = max(deepest, depth)
        return deepest
    import numpy as np

    opens = np.frombuffer(brackets, np.uint8)
    return int(np.cumsum(np.where((opens == ord("[")) | (opens == ord("{")), 1, -1)).max())


def check_depth(data: bytes | str, path, what: str = "document", toml: bool = False) -> None:
    """Refuse (``InputError``) a document nested deeper than ``MAX_DEPTH``."""
    if nesting_depth(data, toml) > MAX_DEPTH:
        raise InputError(path, f"{what} nested deeper than {MAX_DEPTH} levels: not a file this tool wrote or reads")


def parse_bounded(parse, data, path, what: str = "document", toml: bool = False):
    """``parse(data)`` after ``check_depth``; a parser that still recurses too deep is refused the same way."""
    check_depth(data, path, what, toml)
    try:
        return parse(data)
    except RecursionError:
        raise InputError(path, f"{what} nested too deeply: not a file this tool wrote or reads") from None


# ----------------------------------------------------------------------------- string lengths
def bounded_name(name: str) -> str:
    """``name``, or its first ``MAX_NAME_CHARS`` characters marked as cut (a name no profiler writes)."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return f"{name[:MAX_NAME_CHARS]}...[{len(name) - MAX_NAME_CHARS:,} more characters]"
