"""Reading one trace file's bytes (plain or gzip), with errors a user can act on."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from fsdpdoctor.errors import InputError

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
