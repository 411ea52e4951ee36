"""Trace files -> per-rank ``RankTrace`` tables; run folders -> their manifest and trace files."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from array import array
from itertools import count
from pathlib import Path
from struct import error as StructError
from typing import Callable

import msgspec
import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.results import DataQuality
import fsdpdoctor.trace.identity as identity
import fsdpdoctor.trace.kind as kind
import fsdpdoctor.trace.quality as quality
import fsdpdoctor.trace.split as split
from fsdpdoctor.trace.manifest import read_manifest
from fsdpdoctor.trace.events import (
    CorrArgs, corr_args, decode_trace, is_blank, memory_args, memory_args_list, raw_args,
)
from fsdpdoctor.trace.limits import MAX_NAME_CHARS, bounded_name
from fsdpdoctor.trace.io import gzip_size, inflate, is_gzip, missing_reason, read_bytes, read_raw, shown
from fsdpdoctor.trace.vocabulary import STEP_NAME, keeps_args
from fsdpdoctor.trace.table import (
    CATEGORY_NAMES, DEVICE_CATEGORIES, KERNEL, MEMCPY, MEMSET, PYFUNC, RUNTIME, RankTrace, Track, category_code,
    distinct, float64_column, in_set, packed, packed_int32,
)

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)

Progress = Callable[[str, int, int], None]  # (file name, files done, files total)


def rank_from_filename(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and len(m.group(1)) < 10 else None


# what a malformed event raises in ``_build``: a list as name, text as ts, args that are not an object...
_SHAPE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, OverflowError, RecursionError, msgspec.MsgspecError)


def build_rank_trace(meta: dict, events: list, fmt: str, path: Path,
                     reread: Callable[[], list] | None = None, columns: tuple | None = None) -> RankTrace:
    """Columns from decoded events (see ``fsdpdoctor.trace.events``), checked by ``trace.quality``.

    The fast reading skips and counts events whose fields it cannot read; when there are any (or an
    event has a shape it cannot handle at all) and ``reread`` gives the file's events again, they are
    sanitized (bad ones dropped and counted by reason) and built once more."""
    meta, notes = quality.clean_meta(meta)
    drops = quality.Drops()
    unreadable = 0
    try:
        t = _build(meta, events, fmt, path, columns)
        unreadable = t.unreadable_events
    except _SHAPE_ERRORS as exc:
        if reread is None:
            raise InputError(path, f"malformed trace event ({type(exc).__name__}: {str(exc)[:80]})") from None
        t, unreadable = None, -1
    except InputError:
        if reread is None:
            raise
        t, unreadable = None, -1  # maybe nothing was readable: the sanitizer says why
    del events
    if unreadable and reread is not None:
        del t
        try:
            t = _build(meta, quality.sanitize(reread(), drops), fmt, path)
        except _SHAPE_ERRORS as exc2:
            raise InputError(path, f"malformed trace event ({type(exc2).__name__}: {str(exc2)[:80]})") from None
        except InputError:
            if drops.total:
                raise InputError(path, f"no usable events: {quality.describe_drops(drops)}") from None
            raise
        if t.unreadable_events:  # what the sanitizer let through and the reading still could not use
            drops.by_reason["unreadable field"] += t.unreadable_events
            drops.by_kind["other"] += t.unreadable_events
            drops.unlocated += t.unreadable_events
        t.unreadable_events = max(unreadable, 0) or drops.total
    base = meta.get("baseTimeNanoseconds")
    t.base_time_ns = base if isinstance(base, int) else None
    cpu = meta.get("fsdpdoctor_cpu")
    t.cpu_share = cpu if isinstance(cpu, dict) and all(
        isinstance(cpu.get(k), (int, float)) for k in ("wall_us", "on_cpu_us", "runqueue_us")) else None
    t = quality.check(t, drops, notes, world_size_known=(t.world_size or 0) > 1)
    kind.classify(t, meta)  # once, here: what the file is, read by everything after
    return t


def _build(meta: dict, events: list, fmt: str, path: Path, cols: tuple | None = None) -> RankTrace:
    """``cols``: the columns when they were built already (``trace.split``), else read from ``events``."""
    dist = meta.get("distributedInfo") or {}
    if not isinstance(dist, dict):
        dist = {}
    if cols is None:
        cols = _columns_fast(events)
    if cols is None:  # an event of an odd shape somewhere: the tolerant per-event reading
        cols = _columns_per_event(events)
    if not len(cols[3]):
        raise InputError(path, quality.without_spans(events))
    events.clear()  # the structs are no longer needed: free them before building the trace
    (names, n_id, cat_arr, ts_arr, dur_arr, trk_arr, corr_arr, tracks, thread_names, args, memory_events,
     unreadable, categories) = cols
    names = [n if len(n) <= MAX_NAME_CHARS else bounded_name(n) for n in names]  # before any pattern sees them

    counts = np.bincount(trk_arr, minlength=len(tracks))
    device_tracks = set(distinct(trk_arr[np.isin(cat_arr, DEVICE_CATEGORIES)]).tolist())
    for i, tr in enumerate(tracks):
        tr.n_events = int(counts[i])
        tr.is_device = i in device_tracks
        tr.name = bounded_name(thread_names.get((tr.pid, tr.tid), ""))
        tr.process = bounded_name(thread_names.get((tr.pid, PROCESS_TID), ""))

    rank, source = None, "default"
    if isinstance(dist.get("rank"), int):
        rank, source = dist["rank"], "distributedInfo"
    else:
        rank = rank_from_filename(path)
        source = "file name" if rank is not None else "default"
        rank = rank or 0
    device_name = None
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device_name = props[0].get("name")
    world = dist.get("world_size")
    host = meta.get("host_name")
    return RankTrace(
        path=path,
        rank=int(rank),
        world_size=int(world) if isinstance(world, int) else None,
        backend=dist.get("backend"),
        host=host if isinstance(host, str) else None,
        device_name=device_name,
        names=names,
        name_id=n_id,
        cat=cat_arr,
        ts=ts_arr,
        dur=dur_arr,
        track=trk_arr,
        corr=corr_arr,
        tracks=tracks,
        args=args,
        memory_events=memory_events,
        has_stacks=bool(np.any(cat_arr == PYFUNC)),
        format=fmt,
        rank_source=source,
        distributed_info=dist,
        unreadable_events=unreadable,
        categories=categories,
    )


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


def allocator_samples(t: RankTrace) -> list[dict]:
    """The checked allocator samples of a trace as the profiler wrote them (Chrome ``[memory]`` events)."""
    return [{"name": "[memory]", "ph": ph, "ts": ts, "args": raw_args(raw)} for ph, ts, raw, _ in t.memory_events]


def _columns_fast(events: list):
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
    cat = np.array([category_code(c) for c in cat_values], dtype=np.int8)[cat_ix] if n else np.empty(0, np.int8)
    categories = _category_counts(cat_values, np.bincount(cat_ix, minlength=len(cat_values)) if n else [])
    keep_name = np.fromiter(map(_keeps_args, names), bool, len(names))
    found = _ids_and_args(xs, cat, keep_name[nid])
    if found is None:
        return None
    corr, args = found
    tracks = [Track(pid=k[0], tid=k[1]) for k in track_keys]
    return names, nid, cat, ts, dur, trk, corr, tracks, thread_names, args, memory_events, 0, categories


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


def _category_counts(values: list, counts) -> dict[str, int]:
    """Complete events per category as written (``trace/kind.py`` names an accelerator by them)."""
    out: dict[str, int] = {}
    for v, c in zip(values, counts):
        key = v if isinstance(v, str) else "" if v is None else str(v)
        out[key] = out.get(key, 0) + int(c)
    return out


def _corr_value(cid) -> int:
    return int(cid) if isinstance(cid, (int, float)) and not isinstance(cid, bool) and cid == cid else -1


def _columns_per_event(events: list):
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
    return (names, np.frombuffer(n_id, dtype=np.int32).copy(), np.frombuffer(cats, dtype=np.int8).copy(),
            np.frombuffer(tss, dtype=np.float64).copy(), np.frombuffer(durs, dtype=np.float64).copy(),
            np.frombuffer(trk, dtype=np.int32).copy(), np.frombuffer(corr, dtype=np.int64).copy(), tracks,
            thread_names, args, memory_events, unreadable, categories)


def load_file(path: Path, pieces: int = 1) -> RankTrace:
    """One trace file's tables; a large one is decoded in small pieces, by up to ``pieces`` processes."""
    raw = read_raw(path)
    reread = lambda: decode_trace(read_bytes(path), path)[1]  # noqa: E731
    size = gzip_size(raw) if is_gzip(raw) else 0
    if size >= split.STREAM_MIN_BYTES and (pieces < 2 or size < split.SPLIT_MIN_BYTES):
        got = split.stream_columns(raw, path, _columns_fast)  # inflated and decoded a piece at a time
        if got is not None:
            del raw
            return build_rank_trace(got[0], [], "kineto", path, reread=reread, columns=got[1])
    data = inflate(raw, path)
    del raw
    if is_blank(data):
        raise InputError(path, "empty file")
    if len(data) >= split.PIECES_MIN_BYTES:
        got = split.decode_columns(data, path, pieces if len(data) >= split.SPLIT_MIN_BYTES else 1, _columns_fast)
        if got is not None:
            del data
            return build_rank_trace(got[0], [], "kineto", path, reread=reread, columns=got[1])
    meta, events, fmt = decode_trace(data, path)
    del data
    return build_rank_trace(meta, events, fmt, path, reread=reread)


def _trace_files(folder: Path, notes: list[str]) -> list[Path]:
    """The trace files of a run folder; what looks like one but cannot be read is named in ``notes``."""
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise InputError(folder, f"cannot list the folder: {exc.strerror or exc}") from None
    files = []
    for p in entries:
        if not (p.name.endswith(".json.gz") or p.name.endswith(".json")) or p.name in ("manifest.json", "expected.json"):
            continue
        problem = _not_a_file(p)
        if problem:
            notes.append(f"{p.name} skipped: {problem}")
        else:
            files.append(p)
    return files


def _not_a_file(p: Path) -> str | None:
    """Why ``p`` cannot be read as a trace file (None when it can)."""
    try:
        st = p.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop"
        if p.is_symlink():
            return f"broken symbolic link (to {os.readlink(p)})"
        return exc.strerror or str(exc)
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a trace file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return None


def _listed_only(manifest: dict | None, files: list[Path], notes: list[str]) -> list[Path]:
    """The files the manifest lists (``files``, ``cycle_files``) where it lists any that are here, and those
    whose name gives a rank (a trace renamed or copied in): a run folder also holds the user's own JSON (a
    trainer state, a step log), named as skipped, not read."""
    listed: set[str] = set()
    for key in ("files", "cycle_files"):
        v = (manifest or {}).get(key)
        for names in (v.values() if isinstance(v, dict) else ()):
            listed.update(n for n in ([names] if isinstance(names, str) else names if isinstance(names, list) else ())
                          if isinstance(n, str))
    if not any(f.name in listed for f in files):
        return files
    keep = [f for f in files if f.name in listed or rank_from_filename(f) is not None]
    others = [shown(f.name) for f in files if f not in keep]
    if others:
        notes.append(f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''} skipped: not a trace manifest.json "
                     "lists")
    return keep


def input_files(path: Path, dq: DataQuality) -> tuple[dict | None, list[Path]]:
    """(manifest, trace files) of a file or a run folder; what cannot be trusted or read is noted in ``dq``."""
    if not path.exists():
        raise InputError(path, missing_reason(path))
    if not path.is_dir():
        return None, [path]
    manifest, dq.manifest = read_manifest(path)
    files = _listed_only(manifest, _trace_files(path, dq.notes), dq.notes)
    for r, why in sorted((manifest or {}).get("missing_ranks", {}).items(), key=lambda kv: int(kv[0])):
        dq.notes.append(f"rank {r} profiled but its trace is missing: {why[:200]}")
    if not files:
        extra = f" ({'; '.join(dq.notes)})" if dq.notes else ""
        raise InputError(path, f"folder holds no .json or .json.gz trace files{extra}")
    return manifest, files


def _steps_of(t: RankTrace) -> set[int]:
    return {int(m.group(1)) for m in map(STEP_NAME.match, t.names) if m}


def _merge_cycles(traces: list[RankTrace], manifest: dict | None) -> list[RankTrace]:
    """Files of one rank that are profiler cycles of one process (``repeat > 1``) become one table.

    Cycles are the files the manifest's ``cycle_files`` lists for that rank; without a manifest, files
    written by the same process (same host and pid) with disjoint profiler steps. Anything else stays
    separate, and ``identity.check_one_job`` refuses two different recordings of one rank."""
    by_rank: dict[int, list[RankTrace]] = {}
    for t in traces:
        by_rank.setdefault(t.rank, []).append(t)
    cycles = (manifest or {}).get("cycle_files") if isinstance((manifest or {}).get("cycle_files"), dict) else None
    out = []
    for rank, group in by_rank.items():
        if len(group) == 1:
            out.extend(group)
            continue
        if cycles is not None and not any(t.rank_source == "default" for t in group):
            listed = set(cycles.get(str(rank), []))
            same_job = listed and all(t.path.name in listed for t in group)
        else:
            same_job = identity.same_process(group)
        steps = [_steps_of(t) for t in group]
        disjoint = all(s for s in steps) and sum(len(s) for s in steps) == len(set().union(*steps))
        if same_job and disjoint:
            out.append(merge_rank_traces(sorted(group, key=lambda t: float(t.ts.min()))))
        else:
            out.extend(group)
    return out


def merge_rank_traces(parts: list[RankTrace]) -> RankTrace:
    """One table from several files of the same rank (name and track ids remapped)."""
    first = parts[0]
    names: list[str] = []
    name_ids: dict[str, int] = {}
    tracks: list[Track] = []
    track_ids: dict[tuple, int] = {}
    cols = {k: [] for k in ("name_id", "cat", "ts", "dur", "track", "corr")}
    args: dict[int, dict] = {}
    offset = 0
    for t in parts:
        nmap = np.empty(len(t.names), dtype=np.int32)
        for i, n in enumerate(t.names):
            if n not in name_ids:
                name_ids[n] = len(names)
                names.append(n)
            nmap[i] = name_ids[n]
        tmap = np.empty(len(t.tracks), dtype=np.int32)
        for i, tr in enumerate(t.tracks):
            key = (tr.pid, tr.tid)
            if key not in track_ids:
                track_ids[key] = len(tracks)
                tracks.append(Track(pid=tr.pid, tid=tr.tid, name=tr.name, is_device=tr.is_device, process=tr.process))
            merged = tracks[track_ids[key]]
            merged.n_events += tr.n_events
            merged.is_device |= tr.is_device
            merged.name = merged.name or tr.name
            tmap[i] = track_ids[key]
        cols["name_id"].append(nmap[t.name_id])
        cols["track"].append(tmap[t.track])
        for k in ("cat", "ts", "dur", "corr"):
            cols[k].append(getattr(t, k))
        args.update({row + offset: a for row, a in t.args.items()})
        offset += t.n_events
    return RankTrace(
        path=first.path, rank=first.rank, world_size=first.world_size, backend=first.backend, host=first.host,
        device_name=first.device_name, names=names, tracks=tracks, args=args,
        **{k: np.concatenate(v) for k, v in cols.items()},
        memory_events=[e for t in parts for e in t.memory_events],
        has_stacks=any(t.has_stacks for t in parts), format=first.format, rank_source=first.rank_source,
        distributed_info=first.distributed_info, quality=quality.merged([t.quality for t in parts]),
        base_time_ns=first.base_time_ns, unreadable_events=sum(t.unreadable_events for t in parts),
        cycles=sorted(span for t in parts for span in (t.cycles or [_span(t)]) if span is not None),
        categories={c: sum(t.categories.get(c, 0) for t in parts) for t in parts for c in t.categories},
        kind=_merged_kind(parts))


def _merged_kind(parts: list[RankTrace]):
    """The cycles' kind: the first file's, its step structure that of the joined table."""
    first = parts[0].kind
    if first is None:
        return None
    return dataclasses.replace(first, steps="profiler-step" if any(t.kind and t.kind.steps == "profiler-step"
                                                                     for t in parts) else "cycles",
                               links=sum(t.kind.links for t in parts if t.kind),
                               backward_links=sum(t.kind.backward_links for t in parts if t.kind))


def _span(t: RankTrace) -> tuple[float, float] | None:
    return (float(t.ts.min()), float((t.ts + t.dur).max())) if t.n_events else None
