"""Reading one trace file's bytes (plain or gzip), with errors a user can act on."""

from __future__ import annotations

import errno
import gzip
import os
import zlib
from pathlib import Path

from fsdpdoctor.errors import InputError

try:  # ISA-L inflate is 2-3x zlib's on traces (benchmarks/README.md); optional: `pip install isal`
    from isal.igzip import decompress as _gunzip
    from isal.isal_zlib import error as _isal_error
except ImportError:  # pragma: no cover - depends on the environment
    _gunzip, _isal_error = gzip.decompress, zlib.error


def read_bytes(path: Path) -> bytes:
    """The decompressed bytes of a ``.json`` or ``.json.gz`` file (read-only)."""
    if not path.exists():
        raise InputError(path, missing_reason(path))
    if not path.is_file():
        raise InputError(path, "not a regular file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return _gunzip(raw)
        except (OSError, EOFError, zlib.error, _isal_error, ValueError) as exc:
            raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
    return raw


def missing_reason(path: Path) -> str:
    """Why a path that does not exist cannot be read: a dangling or looping link is not 'no such file'."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop"
        if path.is_symlink():
            return f"broken symbolic link (to {os.readlink(path)})"
        if exc.errno == errno.EACCES:
            return "permission denied"
    return "no such file or directory"
