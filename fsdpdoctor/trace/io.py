"""Reading one trace file into a Python object, with errors a user can act on."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from fsdpdoctor.errors import InputError

try:  # orjson parses Kineto JSON several times faster than the stdlib
    import orjson

    def _loads(data: bytes):
        return orjson.loads(data)

    _DECODE_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a declared dependency

    def _loads(data: bytes):
        return json.loads(data)

    _DECODE_ERRORS = (ValueError,)


TRACE_SUFFIXES = (".json", ".json.gz", ".gz")


def is_trace_file(path: Path) -> bool:
    name = path.name
    return path.is_file() and (name.endswith(".json") or name.endswith(".json.gz") or name.endswith(".pt.trace.json.gz"))


def read_bytes(path: Path) -> bytes:
    """The decompressed bytes of a ``.json`` or ``.json.gz`` file (read-only)."""
    if not path.exists():
        raise InputError(path, "no such file or directory")
    if not path.is_file():
        raise InputError(path, "not a regular file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
    return raw


def read_trace_json(path: Path):
    """Parse a trace file. Returns a dict (Kineto) or a list (bare event list)."""
    data = read_bytes(path)
    if not data.strip():
        raise InputError(path, "empty file")
    try:
        doc = _loads(data)
    except _DECODE_ERRORS as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "invalid JSON"
        raise InputError(path, f"not valid JSON ({msg[:120]}); truncated file?") from None
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise InputError(path, "JSON is not a Chrome/Kineto trace (no 'traceEvents' list)")
    elif isinstance(doc, list):
        if doc and not all(isinstance(e, dict) for e in doc[:50]):
            raise InputError(path, "JSON list is not a list of trace events")
    else:
        raise InputError(path, "JSON is not a Chrome/Kineto trace")
    return doc
