"""A large trace decoded in pieces: one after the other in this process, or on several cores.

A rank's trace of 10^5..10^6 events spends most of its load time in two steps that work event by
event: the JSON decode and the column building. So the ``traceEvents`` array is cut at event
boundaries, each piece is read into columns (by the compiled scanner, ``columns.from_bytes``, where it
is sure of every event; else decoded by msgspec and turned into columns), and the columns are joined
in file order.

In this process the pieces are small (``PIECE_BYTES``) and decoded one after the other: only one
piece's event objects are alive at a time, they stay in the CPU caches for the column passes, and
the memory freed by one piece is reused by the next. On a 10 MB trace that took the analysis from
54 to 45 ms, and it lowers the peak memory. With cores to spare, forked workers each take a share
of the array (in small pieces too) while this process does the first share.

Nothing here is trusted: the cut points are found by a byte search, and the result is used only
if the document without its events decodes as a trace and every piece decodes on its own as a
list of events (a cut inside an event or a string leaves a piece that is not valid JSON). Then
the pieces, joined with commas, are exactly the array the whole-file decode would have read.
Anything else (an odd event, a failed or dead worker, another layout) returns None and the caller
reads the file the ordinary way, which also gives the ordinary error messages.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from fsdpdoctor.engines.forking import can_fork, forked_shares
from fsdpdoctor.trace.columns import Columns
from fsdpdoctor.trace.events import _FIRST_TOKEN, _events_decoder, decode_trace
from fsdpdoctor.trace.io import GZIP_ERRORS, bytes_read, inflater
from fsdpdoctor.trace.limits import inflate_cap, too_inflated

# JSON per piece decoded in this process: small enough that a piece's events stay in cache, large
# enough that the per-piece costs (a copy, a decode call, a join) stay small; the analysis of the
# 10 MB ddp_a100 trace took 54 ms with the array decoded whole, 55 / 47 / 45 / 48 / 51 ms in pieces
# of 4 MB / 1 MB / 512 KB / 256 KB / 128 KB (medians of 7 fresh processes)
PIECE_BYTES = 512 << 10
PIECES_MIN_BYTES = 2 * PIECE_BYTES  # below: the whole file is one piece anyway
_STREAM_CHUNK = 4 * PIECE_BYTES     # inflated at a time by ``stream_columns``
# from this much JSON a gzip trace is inflated a piece at a time (``stream_columns``): then the JSON is
# never whole in memory (v100, 33 MB: peak 75 -> 50 MiB; ResNet, 26 MB: 67 -> 48 MiB) and it is no
# slower (v100 118 -> 114-118 ms, ResNet 89 -> 81-83 ms); on the 9.8 MB ddp_a100 trace it was ~3 ms
# slower in a fresh process (46 -> 48 ms), and 4 MiB of peak is not worth that
STREAM_MIN_BYTES = 16 << 20
# below this much JSON, a second core is not worth its CPU: a forked share decodes as slowly as this
# process does and adds the fork, the transfer of its columns and two processes' contention. On the
# 24-33 MB public traces the whole `analyze --json` process took 35-45 ms more CPU in forked shares
# (v100 0.32 -> 0.36 s, ResNet 0.27 -> 0.30 s, medians of 7 on 2 vCPUs) for at most 17 % of the
# load's wall time on an idle machine (none on a busy one); from 64 MB the saving is over 0.1 s
SPLIT_MIN_BYTES = 64 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_BOUNDARY_BEFORE = re.compile(rb"\}\s*,\s*\{\Z")  # a boundary that ends where the search ends
_BOUNDARY_REACH = 256  # whitespace looked through before an event's "{"
_KEY = b'"traceEvents"'
_OPEN = re.compile(rb"\s*:\s*\[")
_TAIL_TRIES = 16          # "]" found after the array's own, inside the keys that follow it, tried by a decode
# what follows the events array's "]": the next key, or the document's end. A "]" inside a string (HTA's
# traces end with an "INFO" array of log lines, "CuptiActivityProfiler.cpp:1058] ...") is passed over
# without a decode: 16 to 30 of them used up the tries, and the file was read three times (4-5 s, not 0.5)
_AFTER_CLOSE = re.compile(rb'\s*(?:,\s*"|\}\s*\Z)')
_CLOSE_LOOKS = 1 << 14    # "]" looked at from the end at most (a bound on a pathological tail)


def events_span(data: bytes) -> tuple[int, int] | None:
    """Offsets of the ``[`` and ``]`` of the top-level ``traceEvents`` array, as far as bytes tell."""
    key = data.find(_KEY)
    if key < 0:
        return None
    m = _OPEN.match(data, key + len(_KEY))
    if not m:
        return None
    start = m.end() - 1
    end = array_close(data, start + 1)
    return (start, end) if end is not None else None


def array_close(data, lo: int) -> int | None:
    """Offset of the ``]`` closing the events array, searched from the end back to ``lo``: the rest of
    the document after it must parse as the object's other keys; arrays among those keys end in such
    a "]" too, so the earliest one that parses is the array's."""
    found, end, tries = None, len(data), 0
    for _ in range(_CLOSE_LOOKS):
        end = data.rfind(b"]", lo, end)
        if end < 0 or tries == _TAIL_TRIES:
            break
        if _AFTER_CLOSE.match(data, end + 1) is None:
            continue
        tries += 1
        tail = bytes(data[end + 1:]).strip()
        if tail == b"}":
            found = end
        elif tail.startswith(b",") and tail.endswith(b"}"):
            try:
                if isinstance(msgspec.json.decode(b"{" + tail[1:]), dict):
                    found = end
            except msgspec.MsgspecError:
                pass
    return found


def cut_points(data: bytes, start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    """(begin, end) byte ranges of ``pieces`` runs of whole events inside the array."""
    ranges, begin = [], start + 1
    for i in range(1, pieces):
        m = _BOUNDARY.search(data, max(begin, start + (end - start) * i // pieces), end)
        if not m:
            break
        ranges.append((begin, m.start() + 1))
        begin = m.end() - 1
    ranges.append((begin, end))
    return ranges


def _piece_columns(data: bytes, begin: int, end: int, columns, path="", scan=None):
    """The columns of the events in ``data[begin:end]``, decoded in pieces of about ``PIECE_BYTES``
    one after the other; None when some piece is not a clean run of readable events. Progress is told
    in bytes of the whole file, at the pace of this range (the shares of one file go at one pace)."""
    parts = []
    for b, e in cut_points(data, begin - 1, end, max(1, (end - begin) // PIECE_BYTES)):
        part = _one_piece(memoryview(data)[b:e], columns, scan)
        if part is None:
            return None
        parts.append(part)
        bytes_read(path, (e - begin) * len(data) // (end - begin), len(data))
    return parts[0] if len(parts) == 1 else join_columns(parts)


def _one_piece(piece, columns, scan=None):
    """The columns of a run of whole events (the bytes between two event boundaries), or None when
    they are not that, or hold an event of an odd shape, or events the tolerant reading must count.
    ``scan`` reads them from the bytes (``columns.from_bytes``) when it can; else they are decoded."""
    if scan is not None:
        try:
            part = scan(piece)
        except Exception:  # noqa: BLE001 - the decoding reading below decides, and reports
            part = None
        if part is not None:
            return part
    try:
        events = _events_decoder.decode(b"".join((b"[", piece, b"]")))
        part = columns(events) if events else None
    except Exception:  # noqa: BLE001 - whatever it is, the whole-file reading reports it
        return None
    if part is None or part.unreadable:  # events the tolerant reading must count
        return None
    return part


def stream_columns(raw: bytes, path, columns, scan=None):
    """(document fields, columns) of a gzip-compressed Kineto trace, inflated and decoded a piece at
    a time: the JSON is never whole in memory (a 1 GB trace needs its columns, not 1 GB more) and each
    piece is decoded while its bytes are still in the CPU caches. None on any doubt (another layout,
    a cut that is not between events, several gzip members, an odd event): the caller reads the file
    whole, which also gives the ordinary errors.

    Each inflated chunk is decoded where it lies, up to its last event boundary; only the event its end
    cuts is copied, joined to the next chunk (a buffer the chunks were appended to cost two to three
    copies of the whole JSON: 65 M instructions on the 33 MB v100 trace)."""
    d = inflater()
    rest, tail, head, parts = raw, b"", None, []  # tail: inflated, not yet decoded
    before = bytearray()  # the document's start while the events array has not opened (the first chunk, normally)
    cap, inflated = inflate_cap(len(raw), whole=False), 0
    try:
        while True:
            out = d.decompress(rest, _STREAM_CHUNK)
            rest = d.unconsumed_tail
            inflated += len(out)
            if inflated > cap:
                raise too_inflated(path, len(raw), cap)
            bytes_read(path, len(raw) - len(rest), len(raw))
            start = 0
            if head is None:
                before += out
                first = _FIRST_TOKEN.search(before)
                if first is not None and before[first.start()] != ord("{"):
                    return None   # not an object (an event list, a byte-order mark...): read whole, once
                head, start = _events_open(before)
                if head is not None:
                    out, before = bytes(before), None
            if head is not None:
                if d.eof:
                    tail += out[start:]   # to the array's end: the last piece reads it
                else:
                    tail = _decode_chunk(tail, out, start, columns, parts, scan)
                    if tail is None:
                        return None
            if d.eof:
                break
            if not rest:
                return None  # the data ends before the gzip stream does
    except GZIP_ERRORS:
        return None
    if head is None or d.unused_data:
        return None
    return _last_piece(tail, head, columns, parts, path, scan)


def _events_open(pending: bytes) -> tuple[bytes | None, int]:
    """The document up to and including the events array's "[" and where the events begin; (None, 0)
    while it has not arrived yet."""
    key = pending.find(_KEY)
    m = _OPEN.match(pending, key + len(_KEY)) if key >= 0 else None
    return (bytes(pending[:m.end()]), m.end()) if m else (None, 0)


def _last_boundary(data: bytes, start: int):
    """The last event boundary in ``data[start:]`` (a match of ``_BOUNDARY``), found from the end: each "{"
    looked at is an event's start when "}" and "," (whitespace around) come before it. A search from the
    start would stop at every "}" of the chunk."""
    end = len(data)
    while True:
        brace = data.rfind(b"{", start, end)
        if brace < 0:
            return None
        m = _BOUNDARY_BEFORE.search(data, max(start, brace - _BOUNDARY_REACH), brace + 1)
        if m is not None:
            return m
        end = brace


def _decode_chunk(tail: bytes | bytearray, out: bytes, start: int, columns, parts: list,
                  scan=None) -> bytes | bytearray | None:
    """Decode the events of ``tail + out[start:]`` up to the last event boundary in ``out``, in pieces of
    about PIECE_BYTES: the event ``tail`` begins, joined to its end in ``out``, then the rest in ``out``
    itself. What follows the last boundary is returned (an event cut by the chunk's end); None when a
    piece cannot be decoded."""
    last = _last_boundary(out, start)
    if last is None:  # no boundary: one event longer than the chunk, read on (appended in place: linear)
        tail = tail if isinstance(tail, bytearray) else bytearray(tail)
        tail += memoryview(out)[start:]
        return tail
    begin = start
    if tail:
        first = _BOUNDARY.search(out, start)
        part = _one_piece(tail + out[start:first.start() + 1], columns, scan)
        if part is None:
            return None
        parts.append(part)
        begin = first.end() - 1
    if begin <= last.start():
        for b, e in cut_points(out, begin - 1, last.start() + 1, max(1, (last.start() - begin) // PIECE_BYTES)):
            part = _decode_slice(out, b, e, columns, scan)
            if part is None:
                return None
            parts.append(part)
    return out[last.end() - 1:]


def _last_piece(pending: bytes, head: bytes, columns, parts: list, path, scan=None):
    """The events left after the stream ended, up to the array's close, and the document's fields around
    the array: (document fields, columns), or None on any doubt."""
    end = array_close(pending, 0)
    if end is None:
        return None
    if pending[:end].strip():
        part = _decode_slice(pending, 0, end, columns, scan)
        if part is None:
            return None
        parts.append(part)
    meta = _document_fields(head + bytes(pending[end:]), path)
    if meta is None or not parts:
        return None
    return meta, parts[0] if len(parts) == 1 else join_columns(parts)


def _decode_slice(buf: bytes, begin: int, end: int, columns, scan=None):
    """``_one_piece`` of ``buf[begin:end]`` without copying it first. The views are released before
    returning, so that a frame still referenced (a profiler thread sampling it, as Dask workers do)
    holds no export of the chunk: a bytearray given here could be resized after."""
    with memoryview(buf) as whole, whole[begin:end] as piece:
        return _one_piece(piece, columns, scan)


def _document_fields(outside: bytes, path) -> dict | None:
    """The fields of the job from the document without its events (``"traceEvents": []``), or None
    when that is not a Kineto trace with an empty events array: then the cut was not the array's."""
    try:
        meta, events, fmt = decode_trace(outside, path)
    except Exception:  # noqa: BLE001 - whatever is wrong, the ordinary reading reports it
        return None
    return meta if fmt == "kineto" and not events else None


def decode_columns(data: bytes, path, workers: int, columns, scan=None):
    """(document fields, columns) of a Kineto trace decoded in pieces by ``workers`` processes
    (1: this one only), or None.

    ``columns`` turns a list of decoded events into the loader's ``Columns`` (or None); ``scan``, when
    given, reads a piece's bytes into them first (or None: then the piece is decoded)."""
    if data[:1] not in (b"{", b"\n", b" ", b"\r", b"\t"):
        return None
    if workers > 1 and not can_fork():
        workers = 1
    span = events_span(data)
    if span is None:
        return None
    start, end = span
    meta = _document_fields(data[:start + 1] + data[end:], path)
    if meta is None:
        return None
    ranges = cut_points(data, start, end, workers)
    if len(ranges) < 2:
        got = _piece_columns(data, start + 1, end, columns, path, scan)
        return None if got is None else (meta, got)
    parts = forked_shares([lambda b=b, e=e: _piece_columns(data, b, e, columns, path, scan) for b, e in ranges])
    if any(p is None for p in parts):  # a failed share (``_one_piece`` refuses unreadable events too)
        return None
    return meta, join_columns(parts)


def join_columns(parts: list[Columns]) -> Columns:
    """The loader's columns of consecutive pieces, as if read in one pass."""
    name_ix: dict[str, int] = {}
    track_ix: dict[tuple, int] = {}
    tracks, thread_names, args, memory = [], {}, {}, []
    nids, trks, offset = [], [], 0
    categories: dict[str, int] = {}
    for part in parts:
        for k, v in part.categories.items():
            categories[k] = categories.get(k, 0) + v
        p_names = part.names
        name_map = np.fromiter((name_ix.setdefault(n, len(name_ix)) for n in p_names), np.int32, len(p_names))
        nids.append(name_map[part.name_id] if len(p_names) else part.name_id)
        track_map = []
        for tr in part.tracks:
            key = (tr.pid, tr.tid)
            if key not in track_ix:
                track_ix[key] = len(tracks)
                tracks.append(tr)
            track_map.append(track_ix[key])
        trks.append(np.asarray(track_map, dtype=np.int32)[part.track] if len(track_map) else part.track)
        thread_names.update(part.thread_names)  # a thread named twice: the later name wins, as in one pass
        args.update({row + offset: a for row, a in part.args.items()})
        memory.extend(part.memory_events)
        offset += len(part.ts)
    joined = {k: np.concatenate([getattr(p, k) for p in parts]) for k in ("cat", "ts", "dur", "corr")}
    return Columns(list(name_ix), np.concatenate(nids).astype(np.int32), joined["cat"], joined["ts"], joined["dur"],
                   np.concatenate(trks).astype(np.int32), joined["corr"], tracks, thread_names, args, memory, 0,
                   categories)
