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
    from isal.isal_zlib import decompressobj as _decompressobj
    from isal.isal_zlib import error as _isal_error
except ImportError:  # pragma: no cover - depends on the environment
    _gunzip, _decompressobj, _isal_error = gzip.decompress, zlib.decompressobj, zlib.error

GZIP_ERRORS = (OSError, EOFError, zlib.error, _isal_error, ValueError, OverflowError)


def inflater():
    """A decompressor of one gzip member (``decompress(data, max_length)``, ``eof``, ``unused_data``)."""
    return _decompressobj(wbits=31)


def gzip_size(raw: bytes) -> int:
    """The uncompressed size a gzip trailer states (modulo 4 GiB; 0 when there is no trailer)."""
    return int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0


# a gzip trailer's size field is trusted for the one-member path only up to this compression ratio
# (JSON traces compress 8-20x): a forged size then cannot make the reader allocate gigabytes
_MAX_RATIO = 200


def gunzip(raw: bytes) -> bytes:
    """The decompressed bytes of gzip data.

    A file written by one gzip stream (every profiler's) is inflated in one call into a buffer of the
    size its trailer states: 4-5 ms less than the general reader on a 10 MB trace, whose output grows
    by copies. Anything else (several members, bytes after the member, a trailer that lies) goes to
    the general reader, which also raises its errors."""
    size = gzip_size(raw)
    if 0 < size <= _MAX_RATIO * len(raw):
        try:
            d = inflater()
            out = d.decompress(raw, size + 1)
        except GZIP_ERRORS:
            out = None
        else:
            if d.eof and not d.unused_data and len(out) == size:
                return out
        del out
    return _gunzip(raw)


def read_bytes(path: Path) -> bytes:
    """The decompressed bytes of a ``.json`` or ``.json.gz`` file (read-only)."""
    return inflate(read_raw(path), path)


def is_gzip(raw: bytes) -> bool:
    return raw[:2] == b"\x1f\x8b"


def inflate(raw: bytes, path: Path) -> bytes:
    """``raw`` itself, or its decompressed bytes when it is gzip data."""
    if is_gzip(raw):
        try:
            return gunzip(raw)
        except GZIP_ERRORS as exc:
            raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
    return raw


def read_raw(path: Path) -> bytes:
    """The bytes of a file as they are on disk (read-only)."""
    if not path.exists():
        raise InputError(path, missing_reason(path))
    if not path.is_file():
        raise InputError(path, "not a regular file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


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
