"""Reading one trace file's bytes (plain or gzip), with errors a user can act on."""

from __future__ import annotations

import errno
import os
import stat
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from collections.abc import Callable

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.limits import DOCUMENT_MAX, inflate_cap, too_inflated

try:  # ISA-L inflate is 2-3x zlib's on traces (benchmarks/README.md); optional: `pip install isal`
    from isal.isal_zlib import decompressobj as _decompressobj
    from isal.isal_zlib import error as _isal_error
except ImportError:  # pragma: no cover - depends on the environment
    _decompressobj, _isal_error = zlib.decompressobj, zlib.error

GZIP_ERRORS = (OSError, EOFError, zlib.error, _isal_error, ValueError, OverflowError)


def inflater():
    """A decompressor of one gzip member (``decompress(data, max_length)``, ``eof``, ``unused_data``)."""
    return _decompressobj(wbits=31)


def gzip_size(raw: bytes) -> int:
    """The uncompressed size a gzip trailer states (modulo 4 GiB; 0 when there is no trailer)."""
    return int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0


def gunzip(raw: bytes, path=None) -> bytes:
    """The decompressed bytes of gzip data, refused (``InputError``) past ``limits.inflate_cap``.

    A file written by one gzip stream (every profiler's) is inflated in one call into a buffer of the
    size its trailer states (trusted only up to the cap: a forged size cannot make the reader allocate
    gigabytes): 4-5 ms less than the general reader on a 10 MB trace, whose output grows by copies.
    Anything else (several members, bytes after the member, a trailer that lies) goes to the general
    reader, member by member, never asking for more than the cap."""
    cap = inflate_cap(len(raw))
    size = gzip_size(raw)
    if 0 < size <= cap:
        try:
            d = inflater()
            out = d.decompress(raw, size + 1)
        except GZIP_ERRORS:
            out = None
        else:
            if d.eof and not d.unused_data and len(out) == size:
                return out
        del out
    return _inflate_members(raw, cap, path)


def _inflate_members(raw: bytes, cap: int, path) -> bytes:
    """Every gzip member of ``raw`` inflated, at most ``cap`` bytes in all (a 16 MB file of many members
    that would inflate to 16 GB is refused after ``cap``, not held)."""
    parts: list[bytes] = []
    done, rest = 0, raw
    while rest:
        d = inflater()
        out = d.decompress(rest, cap + 1 - done)
        done += len(out)
        parts.append(out)
        if done > cap or (not d.eof and d.unconsumed_tail):
            raise too_inflated(path, len(raw), cap)
        if not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        rest = d.unused_data
        if rest and not is_gzip(rest):
            if rest.strip(b"\0"):  # zero padding after the last member is allowed, as gzip allows it
                raise OSError("trailing garbage after the gzip data")
            break
    return b"".join(parts)


def read_bytes(path: Path) -> bytes:
    """The decompressed bytes of a ``.json`` or ``.json.gz`` file (read-only)."""
    return inflate(read_raw(path), path)


def is_gzip(raw: bytes) -> bool:
    return raw[:2] == b"\x1f\x8b"


def inflate(raw: bytes, path: Path) -> bytes:
    """``raw`` itself, or its decompressed bytes when it is gzip data."""
    if is_gzip(raw):
        try:
            return gunzip(raw, path)
        except GZIP_ERRORS as exc:
            raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
    return raw


# DOCUMENT_MAX (imported above from limits): the largest manifest, hang dump or thresholds file read whole


def read_raw(path: Path, limit: int | None = None, follow_links: bool = True, head: int | None = None) -> bytes:
    """The bytes of a regular file as they are on disk (read-only): the one way this package opens a file.

    A named pipe, a device, a socket or a folder is refused before it is opened (a FIFO waits for a
    writer forever, ``/dev/zero`` never ends), and so is a file over ``limit`` bytes; with
    ``follow_links`` False, so is a symbolic link (files only this package writes are never links)."""
    try:
        st = os.stat(path) if follow_links else os.lstat(path)
    except OSError:
        raise InputError(path, missing_reason(path)) from None
    _check_kind(path, st, limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        _check_kind(path, os.fstat(fd), limit)  # what was opened, had the name been swapped since the stat
        with os.fdopen(fd, "rb", closefd=False) as fh:
            # a buffer sized from the file, never from the limit (a read of limit + 1 asks for it all up front)
            data = fh.read(head) if head is not None else fh.read() if limit is None else \
                fh.read(min(limit, os.fstat(fd).st_size) + 1)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise InputError(path, f"larger than {limit >> 20} MiB: not a file this tool wrote or reads")
    return data


def read_head(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a regular file (what kind of document it is), with ``read_raw``'s refusals
    of what is not a regular file; any file size."""
    return read_raw(path, head=n)


def _check_kind(path: Path, st: os.stat_result, limit: int | None) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise InputError(path, "a symbolic link: not followed (this file is only ever written as a regular file)")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(path, f"not a regular file ({file_kind(st.st_mode)})")
    if limit is not None and st.st_size > limit:
        raise InputError(path, f"larger than {limit >> 20} MiB: not a file this tool wrote or reads")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def read_text(path: Path, limit: int | None = DOCUMENT_MAX) -> str:
    """A text file (UTF-8, undecodable bytes replaced) through ``read_raw``."""
    return read_raw(path, limit).decode("utf-8", errors="replace")


def within(folder: Path, name: str) -> Path | None:
    """``folder/name`` when ``name`` (taken from a file's content, e.g. a manifest) stays inside ``folder``
    once links are resolved; None for an absolute name, ``..`` or a link that leads out."""
    if not name or os.path.isabs(name):
        return None
    try:
        root = os.path.realpath(folder)
        target = os.path.realpath(os.path.join(folder, name))
    except (OSError, ValueError):
        return None
    if os.path.commonpath([root, target]) != root or target == root:
        return None
    return Path(folder) / name


def shown(path) -> str:
    """A path as text that any encoder accepts: bytes a file name holds that are not UTF-8 are written
    as ``\\xNN`` (Python keeps them as lone surrogates, which JSON and msgpack cannot encode)."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


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


# ----------------------------------------------------------------------------- writing
def write_atomic(path, data: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Write ``path`` whole or not at all: the one way this package writes a file.

    The content goes to a temporary file of this writer's own (its pid and a random part in the name,
    created exclusively, never through a link) in the same folder, which is then renamed over
    ``path``: a reader sees the old file or the new one, never half of one; two writers never share a
    temporary file; a symbolic link at ``path`` is replaced, never written through. When anything
    fails (a full disk), the temporary file is removed. ``data``: bytes, text (UTF-8), or a function
    that writes into the open binary file.

    A character device or a pipe at ``path`` (or behind a link there: ``/dev/stdout``, ``/dev/null``, a
    named pipe) is written into, never renamed over: run as root, a rename would replace the system's
    device node with a plain file (``--perfetto /dev/full`` did)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode   # through a link: what a write would reach
    except OSError:
        mode = 0
    if stat.S_ISDIR(mode):
        raise InputError(path, "is a folder: name a file to write")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        _write_into_special(path, data)
        return
    if mode and not stat.S_ISREG(mode):
        raise InputError(path, f"is {file_kind(mode)}, not a regular file: name a file to write")
    import secrets  # here: it loads OpenSSL (hmac), ~10 ms of every start

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask decides the mode, as for any new file
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_into_special(path: Path, data) -> None:
    """Write into a character device or a pipe as it stands. A pipe nobody reads is refused at once
    (``O_NONBLOCK`` open: ENXIO) rather than waited on forever; the writes themselves block as usual."""
    import fcntl

    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise InputError(path, "is a named pipe that nobody reads: start its reader first") from None
        raise
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    with os.fdopen(fd, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data.encode() if isinstance(data, str) else data)


# what the readers of a run folder take as theirs: traces, the manifest, summaries
_READ_FROM_A_RUN = (".json", ".json.gz", ".msgpack")


def check_output(out, inputs) -> None:
    """Refuse (``InputError``) to write ``out`` over an input, or into a run folder being read under a
    name its readers would take as one of the run's files (a report named ``merged.json`` beside the
    traces would be read as one more rank the next time)."""
    out = Path(out)
    for given in inputs:
        given = Path(given)
        try:
            if out.exists() and given.exists() and os.path.samefile(out, given):
                raise InputError(out, "is an input of this command: write the output elsewhere")
            if given.is_dir():
                root, where = os.path.realpath(given), os.path.realpath(out.parent)
                if os.path.commonpath([root, where]) == root and out.name.endswith(_READ_FROM_A_RUN):
                    raise InputError(out, f"is inside the run folder {given}, whose readers take every "
                                          f"{', '.join('*' + e for e in _READ_FROM_A_RUN)} file for one of the "
                                          "run's: write it outside the run folder")
        except OSError:
            continue


# ----------------------------------------------------------------------------- progress
ByteProgress = Callable[[str, int, int], None]  # (file name, bytes done, bytes in all)
_byte_progress: tuple[int, ByteProgress] | None = None  # (the pid that set it, the callback)


@contextmanager
def showing_bytes(callback: ByteProgress | None):
    """While inside, the reading of a large trace in this process reports its bytes to ``callback``
    (a progress bar on a terminal). Forked workers inherit the setting but never call it: drawing
    belongs to the process that owns the terminal."""
    global _byte_progress
    before, _byte_progress = _byte_progress, (os.getpid(), callback) if callback else None
    try:
        yield
    finally:
        _byte_progress = before


def bytes_read(path, done: int, total: int) -> None:
    """Report reading progress on ``path`` (a no-op unless ``showing_bytes`` is on in this process)."""
    hook = _byte_progress
    if hook is not None and hook[0] == os.getpid():
        hook[1](shown(Path(path).name), done, total)
