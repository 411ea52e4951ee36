"""Trace files -> per-rank ``RankTrace`` tables; run folders -> their manifest and trace files."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from pathlib import Path
from collections.abc import Callable

import msgspec
import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.results import DataQuality
import fsdpdoctor.trace.identity as identity
import fsdpdoctor.trace.kind as kind
import fsdpdoctor.trace.quality as quality
import fsdpdoctor.trace.split as split
from fsdpdoctor.trace.manifest import read_manifest
from fsdpdoctor.trace.columns import PROCESS_TID, Columns, from_bytes, from_events, per_event
from fsdpdoctor.trace.events import decode_trace, is_blank, raw_args
from fsdpdoctor.trace.limits import MAX_NAME_CHARS, bounded_name
from fsdpdoctor.trace.io import gzip_size, inflate, is_gzip, missing_reason, read_bytes, read_raw, shown
from fsdpdoctor.trace.vocabulary import STEP_NAME
from fsdpdoctor.trace.table import DEVICE_CATEGORIES, PYFUNC, RankTrace, Track, distinct

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)

Progress = Callable[[str, int, int], None]  # (file name, files done, files total)


def rank_from_filename(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and len(m.group(1)) < 10 else None


# what a malformed event raises in ``_build``: a list as name, text as ts, args that are not an object...
_SHAPE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, OverflowError, RecursionError, msgspec.MsgspecError)


def build_rank_trace(meta: dict, events: list, fmt: str, path: Path,
                     reread: Callable[[], list] | None = None, columns: Columns | None = None) -> RankTrace:
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


def _build(meta: dict, events: list, fmt: str, path: Path, cols: Columns | None = None) -> RankTrace:
    """``cols``: the columns when they were built already (``trace.split``), else read from ``events``."""
    dist = meta.get("distributedInfo") or {}
    if not isinstance(dist, dict):
        dist = {}
    if cols is None:
        cols = from_events(events)
    if cols is None:  # an event of an odd shape somewhere: the tolerant per-event reading
        cols = per_event(events)
    if not len(cols.ts):
        raise InputError(path, quality.without_spans(events))
    events.clear()  # the structs are no longer needed: free them before building the trace
    names = [n if len(n) <= MAX_NAME_CHARS else bounded_name(n) for n in cols.names]  # before any pattern sees them
    trk_arr, cat_arr, tracks, thread_names = cols.track, cols.cat, cols.tracks, cols.thread_names

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
        name_id=cols.name_id,
        cat=cat_arr,
        ts=cols.ts,
        dur=cols.dur,
        track=trk_arr,
        corr=cols.corr,
        tracks=tracks,
        args=cols.args,
        memory_events=cols.memory_events,
        has_stacks=bool(np.any(cat_arr == PYFUNC)),
        format=fmt,
        rank_source=source,
        distributed_info=dist,
        unreadable_events=cols.unreadable,
        categories=cols.categories,
    )


def allocator_samples(t: RankTrace) -> list[dict]:
    """The checked allocator samples of a trace as the profiler wrote them (Chrome ``[memory]`` events)."""
    return [{"name": "[memory]", "ph": ph, "ts": ts, "args": raw_args(raw)} for ph, ts, raw, _ in t.memory_events]


def load_file(path: Path, pieces: int = 1) -> RankTrace:
    """One trace file's tables; a large one is decoded in small pieces, by up to ``pieces`` processes."""
    raw = read_raw(path)
    reread = lambda: decode_trace(read_bytes(path), path)[1]  # noqa: E731
    size = gzip_size(raw) if is_gzip(raw) else 0
    if size >= split.STREAM_MIN_BYTES and (pieces < 2 or size < split.SPLIT_MIN_BYTES):
        got = split.stream_columns(raw, path, from_events, from_bytes)  # inflated and decoded a piece at a time
        if got is not None:
            del raw
            return build_rank_trace(got[0], [], "kineto", path, reread=reread, columns=got[1])
    data = inflate(raw, path)
    del raw
    if is_blank(data):
        raise InputError(path, "empty file")
    if len(data) >= split.PIECES_MIN_BYTES:
        got = split.decode_columns(data, path, pieces if len(data) >= split.SPLIT_MIN_BYTES else 1, from_events,
                                   from_bytes)
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
        if not (p.name.endswith(".json.gz") or p.name.endswith(".json")) or p.name == "manifest.json":
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
    trainer state, a step log), named as skipped, not read. A file named for a rank whose listed trace is
    here (``job_steps_rank0.json`` beside ``rank0.json.gz``) is the user's too: that rank is already read."""
    listed: dict[str, str] = {}   # file name -> the rank it is listed for
    for key in ("files", "cycle_files"):
        v = (manifest or {}).get(key)
        for rank, names in (v.items() if isinstance(v, dict) else ()):
            listed.update((n, str(rank)) for n in ([names] if isinstance(names, str) else
                                                    names if isinstance(names, list) else ()) if isinstance(n, str))
    here = {f.name for f in files}
    if not here & set(listed):
        return files
    covered = {rank: name for name, rank in listed.items() if name in here}
    keep, others = [], []
    for f in files:
        r = rank_from_filename(f)
        if f.name in listed or (r is not None and str(r) not in covered):
            keep.append(f)
        else:
            others.append(shown(f.name) + (f" (rank {r}'s listed trace is {shown(covered[str(r)])})"
                                           if r is not None else ""))
    if others:
        notes.append(f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''} skipped: not a trace manifest.json "
                     "lists")
    return keep


# a plain .json file up to this size is looked into before it is read as a trace (larger: left to the reader)
_LOOK_MAX_BYTES = 64 << 20


def _traces_by_content(files: list[Path], notes: list[str]) -> list[Path]:
    """``files`` less the plain JSON documents that cannot be traces (an object that never names
    "traceEvents": a trainer's state, a metrics log, a test's expectations), skipped with a note. Where
    that would leave nothing, all are kept: the reader then says what is wrong with them."""
    if len(files) < 2:
        return files
    others = [f for f in files if _not_a_trace(f)]
    if not others or len(others) == len(files):
        return files
    notes.append(f"{', '.join(shown(f.name) for f in others[:5])}{' ...' if len(others) > 5 else ''} skipped: "
                 "not a trace (a JSON object without traceEvents)")
    return [f for f in files if f not in others]


def _not_a_trace(p: Path) -> bool:
    if not p.name.endswith(".json"):
        return False
    try:
        if p.stat().st_size > _LOOK_MAX_BYTES:
            return False
        data = p.read_bytes()
    except OSError:
        return False   # the reader names the problem
    return data.lstrip()[:1] == b"{" and b'"traceEvents"' not in data


def input_files(path: Path, dq: DataQuality) -> tuple[dict | None, list[Path]]:
    """(manifest, trace files) of a file or a run folder; what cannot be trusted or read is noted in ``dq``."""
    if not path.exists():
        raise InputError(path, missing_reason(path))
    if not path.is_dir():
        return None, [path]
    manifest, dq.manifest = read_manifest(path)
    files = _traces_by_content(_listed_only(manifest, _trace_files(path, dq.notes), dq.notes), dq.notes)
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
