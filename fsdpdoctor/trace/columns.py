"""One run of trace events -> the loader's columns (``Columns``: names, name ids, categories, times, tracks,
correlation ids, the args kept, thread names, allocator samples...).

Three readings, each giving the same columns: ``from_bytes`` reads the JSON bytes of whole events with the
compiled scanner (``_scan.c``: one pass, no object per event) where it is built and sure of every event;
``from_events`` reads decoded events (msgspec structs) by whole-list passes; ``per_event`` reads them one
at a time, skipping and counting the ones it cannot read.
"""

from __future__ import annotations

from array import array
from itertools import count
from struct import error as StructError
from typing import NamedTuple

import msgspec
import numpy as np

from fsdpdoctor.trace.events import CorrArgs, _events_decoder, corr_args, memory_args, memory_args_list, raw_args
from fsdpdoctor.trace.scanner import TURNED_OFF, scan as _scan
from fsdpdoctor.trace.table import (
    CATEGORY_NAMES, KERNEL, MEMCPY, MEMSET, RUNTIME, Track, category_code, float64_column, in_set, packed,
    packed_int32,
)
from fsdpdoctor.trace.vocabulary import keeps_args

SCANNER = _scan is not None and not TURNED_OFF   # the compiled scanner reads what it can (tests turn it off)


class Columns(NamedTuple):
    """One run of events as the loader's columns (``loader._build`` makes a ``RankTrace`` of them): the
    per-event arrays are one row per complete ("X") event, in the order of the file."""
    names: list            # each name once, in order of first appearance
    name_id: np.ndarray    # int32: a row's index in names
    cat: np.ndarray        # int8: a row's category code (table.CATEGORY_NAMES)
    ts: np.ndarray         # float64, us
    dur: np.ndarray        # float64, us (0.0 without one)
    track: np.ndarray      # int32: a row's index in tracks
    corr: np.ndarray       # int64: the correlation id of device and runtime rows (-1: none)
    tracks: list           # Track per (pid, tid), in order of first appearance
    thread_names: dict     # (pid, tid) -> the thread's name; (pid, PROCESS_TID) -> the process's
    args: dict             # row -> its args, for the rows whose args are read
    memory_events: list    # allocator samples (_add_samples)
    unreadable: int        # events skipped as unreadable (only the per-event reading skips any)
    categories: dict       # complete events per category as written

_KEPT_PHASES = frozenset(("M", "i", "I"))
# the key under which a process's name and labels are kept among the thread names: a tid no thread has
PROCESS_TID = "\x00process"
_NEEDS_CORR = np.array([KERNEL, RUNTIME, MEMCPY, MEMSET], dtype=np.int8)
_corr_list_decoder = msgspec.json.Decoder(list[CorrArgs])


def _non_complete(e, thread_names: dict, memory_events: list) -> None:
    """Metadata and instant events: thread names and allocator samples are all we keep."""
    ph = e.ph
    if ph == "M" and e.name == "thread_name":
        a = raw_args(e.args)
        # gloo threads may be named twice ("python3" then "pt_gloo_runloop"): keep the last
        thread_names[(e.pid, e.tid)] = str(a.get("name", ""))
    elif ph == "M" and e.name in ("process_name", "process_labels"):
        # a process's name and labels, kept beside the thread names under a tid no thread has
        a = raw_args(e.args)
        key = (e.pid, PROCESS_TID)
        text = str(a.get("name", a.get("labels", "")))
        thread_names[key] = f"{thread_names[key]} | {text}" if thread_names.get(key) else text
    elif (ph == "i" or ph == "I") and e.name == "[memory]":
        _add_samples(memory_events, [e], [memory_args(e.args)])


def _add_samples(memory_events: list, events: list, args: list) -> None:
    """Allocator samples as (phase, ts, raw args, ``MemoryArgs``); one without a total is no sample.
    ``trace.quality`` checks them; ``allocator_samples`` gives them back as Chrome events."""
    memory_events.extend([(e.ph, e.ts, bytes(e.args), a) for e, a in zip(events, args) if a.total is not None])


def from_events(events: list):
    """Columns by whole-list passes (comprehensions, ``map``, ``struct``), ~3x faster than a loop with appends.
    None when some event has an odd shape (unhashable name, text time...): the caller then reads
    event by event, skipping and counting the unreadable ones."""
    thread_names: dict[tuple, str] = {}
    memory_events: list[dict] = []
    try:
        xs = [e for e in events if e.ph == "X"]
        if len(xs) != len(events) and not _read_non_complete(events, thread_names, memory_events):
            return None
        n = len(xs)
        kid, ki = _key_ids(xs)
        ni: dict = {}
        nid = packed_int32([ni.setdefault(k[0], len(ni)) for k in ki])[kid]
        names = list(ni)
        if not all(type(k) is str for k in names):
            return None
        ti: dict = {}
        trk = packed_int32([ti.setdefault((k[2], k[3]), len(ti)) for k in ki])[kid]
        track_keys = list(ti)
        ci: dict = {}
        cat_ix = packed_int32([ci.setdefault(k[1], len(ci)) for k in ki])[kid]
        cat_values = list(ci)
        ts = float64_column([e.ts for e in xs], None)  # a missing time reads as NaN: refused below
        dur = float64_column([e.dur for e in xs], 0.0)
    except (TypeError, ValueError, OverflowError, StructError):
        return None
    if ts.shape != (n,) or dur.shape != (n,) or not (np.isfinite(ts).all() and np.isfinite(dur).all()):
        return None
    cat, categories = _category_column(cat_values, cat_ix)
    keep_name = np.fromiter(map(_keeps_args, names), bool, len(names))
    found = _ids_and_args(xs, cat, keep_name[nid])
    if found is None:
        return None
    corr, args = found
    tracks = [Track(pid=k[0], tid=k[1]) for k in track_keys]
    return Columns(names, nid, cat, ts, dur, trk, corr, tracks, thread_names, args, memory_events, 0, categories)


def _read_non_complete(events: list, thread_names: dict, memory_events: list) -> bool:
    """Thread names and memory records from the events that are not complete spans; False when one has no
    phase (the per-event reading counts it). Flow arrows ("s"/"f") are most of them: skipped first, cheaply."""
    rest = [e for e in events if e.ph != "X" and e.ph != "f" and e.ph != "s"]
    samples = []
    for e in [e for e in rest if e.ph.__class__ is not str or e.ph in _KEPT_PHASES]:
        if e.ph.__class__ is not str:
            return False
        if e.name == "[memory]" and e.ph != "M":
            samples.append(e)
        else:
            _non_complete(e, thread_names, memory_events)
    if samples:  # all in one decode: a memory-profiled trace holds 10^4-10^5 of them
        _add_samples(memory_events, samples, memory_args_list([e.args for e in samples]))
    return True


def _key_ids(xs: list):
    """Each span's (name, category, pid, tid) key numbered densely in order of first appearance, and the keys.

    One dict lookup per event: a few thousand distinct keys, from which names, tracks and categories are
    numbered in order of first appearance (as if each had its own pass, ~1.7 ms less on 27 k events);
    ``map`` in C, each event given the position of the first event of its key, renumbered densely; the keys
    built by a comprehension: ~25 % less than ``map(attrgetter(4 fields))`` (v100 pieces)."""
    ki: dict = {}
    n = len(xs)
    first = packed(list(map(ki.setdefault, [(e.name, e.cat, e.pid, e.tid) for e in xs], count())), "q",
                    np.int64)
    dense = np.empty(n, dtype=np.int32)
    dense[packed(list(ki.values()), "q", np.int64)] = np.arange(len(ki), dtype=np.int32)
    return dense[first], ki


def _ids_and_args(xs: list, cat: np.ndarray, keeps: np.ndarray):
    """The correlation id of every span (-1 without one) and the args kept (rows whose name keeps them, and
    communication kernels); None when an id cannot be read. Device and runtime rows' ids come from one
    decode of all their args at once."""
    n = len(xs)
    corr = np.full(n, -1, dtype=np.int64)
    args: dict[int, dict] = {}
    for r in (np.nonzero(keeps)[0] if n else np.empty(0, np.int64)).tolist():
        a = raw_args(xs[r].args)
        args[r] = a
        corr[r] = _corr_value(a.get("correlation", -1))
    dev = (np.nonzero(in_set(cat, _NEEDS_CORR, len(CATEGORY_NAMES)) & ~keeps)[0] if n else
           np.empty(0, np.int64)).tolist()
    raws = [xs[r].args for r in dev]
    if not all(raws):  # rows without args have no id to read
        dev, raws = [r for r, a in zip(dev, raws) if a], [a for a in raws if a]
    if not dev:
        return corr, args
    try:
        parsed = _corr_list_decoder.decode(b"".join((b"[", b",".join(raws), b"]")))
    except msgspec.MsgspecError:
        return None
    values = [ca.correlation for ca in parsed]
    if set(map(type, values)) != {int}:  # one C pass, not a Python test per id
        values = [_corr_value(v) for v in values]
    try:
        corr[dev] = packed(values, "q", np.int64)
    except (OverflowError, StructError):
        return None
    named = [ca.collective for ca in parsed]
    if named.count(None) != len(named):  # communication kernels: their args are kept
        for r, c in zip(dev, named):
            if c is not None and cat[r] == KERNEL:
                args[r] = raw_args(xs[r].args)
    return corr, args


_keeps: dict[str, bool] = {}  # keeps_args by name, across the pieces of a trace (a regex match each)


def _keeps_args(name: str) -> bool:
    got = _keeps.get(name)
    if got is None:
        if len(_keeps) > 1 << 16:
            _keeps.clear()
        got = _keeps[name] = keeps_args(name)
    return got


def _category_column(cat_values: list, cat_ix: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """Each row's category code, from the categories as written (numbered by first appearance, ``cat_ix``
    a row's number), and the complete events per category as written."""
    if not len(cat_ix):
        return np.empty(0, np.int8), {}
    cat = np.array([category_code(c) for c in cat_values], dtype=np.int8)[cat_ix]
    return cat, _category_counts(cat_values, np.bincount(cat_ix, minlength=len(cat_values)))


def _category_counts(values: list, counts) -> dict[str, int]:
    """Complete events per category as written (``trace/kind.py`` names an accelerator by them)."""
    out: dict[str, int] = {}
    for v, c in zip(values, counts):
        key = v if isinstance(v, str) else "" if v is None else str(v)
        out[key] = out.get(key, 0) + int(c)
    return out


def _corr_value(cid) -> int:
    return int(cid) if isinstance(cid, (int, float)) and not isinstance(cid, bool) and cid == cid else -1


def per_event(events: list):
    """One event at a time; an event whose fields cannot be read is skipped and counted."""
    name_index: dict[str, int] = {}
    track_index: dict[tuple, int] = {}
    tracks: list[Track] = []
    thread_names: dict[tuple, str] = {}
    memory_events: list[dict] = []
    n_id, cats, tss, durs, trk, corr = array("i"), array("b"), array("d"), array("d"), array("i"), array("q")
    args: dict[int, dict] = {}
    keep_name: dict[int, bool] = {}
    categories: dict[str, int] = {}
    unreadable = 0
    for i, e in enumerate(events):
        events[i] = None  # free each event as soon as it is read: lower peak memory
        try:
            if e.ph.__class__ is not str:
                raise TypeError("phase is not text")
            if e.ph != "X":
                _non_complete(e, thread_names, memory_events)
                continue
            if e.ts is None:
                raise ValueError("no time")
            ts, dur = float(e.ts), float(e.dur or 0.0)
            if ts != ts or dur != dur or abs(ts) == float("inf") or abs(dur) == float("inf"):
                raise ValueError("not a finite time")
            name = e.name
            if not isinstance(name, str):
                raise TypeError("name is not text")  # the sanitizer drops and counts it
            key = (e.pid, e.tid)
            hash(key)
            raw_cat = e.cat if isinstance(e.cat, str) or e.cat is None else str(e.cat)
            code = category_code(raw_cat)
            a = cid = None
            nid = name_index.get(name)
            keep = keep_name.get(nid) if nid is not None else keeps_args(name)
            if keep:
                a = raw_args(e.args)
                cid = a.get("correlation", -1)
            elif code in (KERNEL, RUNTIME, MEMCPY, MEMSET) and e.args:
                ca = corr_args(e.args)
                cid = ca.correlation
                if code == KERNEL and ca.collective is not None:
                    a = raw_args(e.args)
        except (TypeError, ValueError, AttributeError, OverflowError, msgspec.MsgspecError):
            unreadable += 1
            continue
        if nid is None:
            nid = name_index[name] = len(name_index)
            keep_name[nid] = bool(keep)
        t = track_index.get(key)
        if t is None:
            t = track_index[key] = len(tracks)
            tracks.append(Track(pid=key[0], tid=key[1]))
        row = len(tss)
        if a is not None:
            args[row] = a
        categories[raw_cat or ""] = categories.get(raw_cat or "", 0) + 1
        n_id.append(nid)
        cats.append(code)
        tss.append(ts)
        durs.append(dur)
        trk.append(t)
        corr.append(_corr_value(cid))
    names = list(name_index)
    return Columns(names, np.frombuffer(n_id, dtype=np.int32).copy(), np.frombuffer(cats, dtype=np.int8).copy(),
                   np.frombuffer(tss, dtype=np.float64).copy(), np.frombuffer(durs, dtype=np.float64).copy(),
                   np.frombuffer(trk, dtype=np.int32).copy(), np.frombuffer(corr, dtype=np.int64).copy(), tracks,
                   thread_names, args, memory_events, unreadable, categories)


def from_bytes(piece) -> Columns | None:
    """The columns of ``piece`` (the JSON of whole events, ``{...},{...}``: bytes, bytearray or a
    memoryview of one) read by the compiled scanner; None when it is not built or leaves these events to
    the decoding readings (an escaped name, a field written twice, an unknown phase, text for a time...)."""
    if not SCANNER:
        return None
    got = _scan(piece)   # a _scan.Scanned (fields named in _scan.pyi)
    if got is None:
        return None
    thread_names: dict[tuple, str] = {}
    memory_events: list = []
    if got.others:  # metadata and instants (thread names, allocator samples): decoded from their own bytes
        events = _events_decoder.decode(b"[" + b",".join([bytes(piece[a:b]) for a, b in got.others]) + b"]")
        if not _read_non_complete(events, thread_names, memory_events):
            return None
    nid, cat_ix, trk = (np.frombuffer(c, dtype=np.int32) for c in (got.name_ids, got.category_ids, got.track_ids))
    ts, dur = np.frombuffer(got.ts, dtype=np.float64), np.frombuffer(got.dur, dtype=np.float64)
    corr, lo, hi = (np.frombuffer(c, dtype=np.int64) for c in (got.correlations, got.args_starts, got.args_ends))
    cat, categories = _category_column(got.categories, cat_ix)
    names = got.names
    keeps = np.fromiter(map(_keeps_args, names), bool, len(names))[nid]
    # the scanner read every args object's correlation; the loader keeps it for device and runtime rows
    # only, and reads the kept rows' from their whole args, as ``from_events`` does
    dev = in_set(cat, _NEEDS_CORR, len(CATEGORY_NAMES)) & ~keeps
    corr[~dev] = -1
    args: dict[int, dict] = {}
    for r in np.nonzero(keeps)[0].tolist():
        a = raw_args(bytes(piece[lo[r]:hi[r]])) if hi[r] > lo[r] else {}
        args[r] = a
        corr[r] = _corr_value(a.get("correlation", -1))
    named = dev & (np.frombuffer(got.collective, dtype=np.uint8) != 0) & (cat == KERNEL)
    for r in np.nonzero(named)[0].tolist():  # communication kernels: their args are kept
        args[r] = raw_args(bytes(piece[lo[r]:hi[r]]))
    tracks = [Track(pid=k[0], tid=k[1]) for k in got.tracks]
    return Columns(names, nid, cat, ts, dur, trk, corr, tracks, thread_names, args, memory_events, 0, categories)
