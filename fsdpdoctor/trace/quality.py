"""Data quality: the values in a trace the analysis cannot trust, dropped and counted before any metric.

A trace is untrusted input. Every event field the analysis reads is checked here, in one place:

- at decode time (``Drops.event``, ``sanitize``): fields of the wrong type (no ``ph``/``ts``, a name that is
  not text, ``args`` that are not an object or nest too deeply, an id that is a list...);
- on the built columns (``check``, vectorised): non-finite or negative times, times beyond any real clock,
  events reaching further outside the recording than the recording is long, profiler steps out of order
  or overlapping the next step;
- the document's ``distributedInfo``/``deviceProperties``/host (``clean_meta``) and the allocator samples.

What is wrong is dropped and counted per reason and per kind of event (``RankDataQuality``). Past the
limits below the file is refused (exit 2): the numbers left would be missing a part the report could not
show. The limits, and why:

- ``MAX_DROPPED_EVENT_SHARE`` (1 % of a rank's complete events): a profiler never writes these defects, so
  dropped events mean a damaged or edited file. Counts the rules read (collectives, buckets, forwards per
  step) move by at most this share, under every count-based threshold's resolution.
- ``MAX_DROPPED_COMM_SHARE`` (1 % of the communication events, counting a drop whose name and time are
  both unknown as possibly communication): communication is what the report is about, and the rules
  count collectives per step (buckets, all-gathers): one lost in 100 moves those counts by 1 %.
- ``MAX_DROPPED_STEP_SHARE`` (1 % of the profiled step time covered by dropped events whose times are known):
  every share in the report would otherwise be off by more than the 1 percentage point the thresholds
  are compared at.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgspec
import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.results import RankDataQuality
from fsdpdoctor.trace.io import shown
from fsdpdoctor.trace.table import ANNOTATION, CATEGORY_NAMES, CPU_OP, RankTrace, category_code
from fsdpdoctor.trace.vocabulary import STEP_NAME, is_comm_name, reads_args

# A profiler clock is an int64 count of nanoseconds: no real start or duration exceeds 2^63 ns.
MAX_CLOCK_US = 2.0 ** 63 / 1e3
MAX_DROPPED_EVENT_SHARE = 0.01
MAX_DROPPED_COMM_SHARE = 0.01
MAX_DROPPED_STEP_SHARE = 0.01
# An event may reach beyond the extent of all the other events by this many times that extent. Trace
# filters (HTA's sampler) keep the profiler's own span event and drop events inside it: on a public
# sampled trace it reaches 1.05x the others' extent; a value off by orders of magnitude is not a clock's.
REACH_FACTOR = 10.0
# Below this many events the other events do not describe the recording's extent (one event's reach
# cannot be judged against them).
MIN_EVENTS_FOR_REACH = 50

_SCALARS = (int, float, str)


def _kind(name: Any, cat: Any) -> str:
    if not isinstance(name, str):
        return "unnamed"
    if is_comm_name(name):
        return "communication"
    try:
        return CATEGORY_NAMES[category_code(cat if isinstance(cat, str) else None)]
    except TypeError:
        return "other"


def _num(v: Any) -> float | None:
    """A finite float from a JSON number (or numeric text); None for anything else."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


class Drops:
    """Events dropped from one file: counts per reason and kind, and where they were (when known)."""

    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.unlocated = 0
        self.unnamed_unlocated = 0   # may have been communication, and its time is unknown too

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def _add(self, reason: str, kind: str, ts: float | None, end: float | None) -> None:
        self.by_reason[reason] += 1
        self.by_kind[kind] += 1
        if ts is not None and end is not None and 0 <= ts <= end <= MAX_CLOCK_US:
            self.starts.append(ts)
            self.ends.append(end)
        else:
            self.unlocated += 1
            self.unnamed_unlocated += kind == "unnamed"

    def event(self, reason: str, e) -> None:
        """A decoded event (``events.Event``) dropped for ``reason``."""
        ts, dur = _num(e.ts), _num(e.dur) if e.dur is not None else 0.0
        self._add(reason, _kind(e.name, e.cat), ts, ts + dur if ts is not None and dur is not None else None)

    def rows(self, reason: str, t: RankTrace, rows: np.ndarray, located: bool) -> None:
        """Rows of the built columns dropped for ``reason`` (vectorised: there may be many)."""
        if not len(rows):
            return
        comm = np.isin(t.name_id[rows], comm_name_ids(t))
        kinds = np.where(comm, len(CATEGORY_NAMES), t.cat[rows].astype(np.int64))
        counts = np.bincount(kinds)  # not np.unique: it imports numpy.ma (15-25 ms)
        for k in np.flatnonzero(counts).tolist():
            self.by_kind["communication" if k == len(CATEGORY_NAMES) else CATEGORY_NAMES[k]] += int(counts[k])
        self.by_reason[reason] += len(rows)
        if located:
            self.starts.extend(t.ts[rows].tolist())
            self.ends.extend((t.ts[rows] + t.dur[rows]).tolist())
        else:
            self.unlocated += len(rows)


def comm_name_ids(t: RankTrace) -> np.ndarray:
    return np.fromiter((i for i, n in enumerate(t.names) if is_comm_name(n)), dtype=np.int32)


# ---------------------------------------------------------------- decode level

def _args_ok(raw) -> str | None:
    """None when ``args`` decode to an object, else the reason."""
    if not raw:
        return None
    try:
        a = msgspec.json.decode(raw)
    except RecursionError:
        return "args nested too deeply"
    except msgspec.MsgspecError:
        return "args not valid JSON"
    return None if isinstance(a, dict) else "args not an object"


def sanitize(events: list, drops: Drops) -> list:
    """The events whose fields have the types the loader reads; the others counted in ``drops``.

    Only run when the fast path met a malformed event: it decodes ``args`` where the loader would."""

    out = []
    for e in events:
        ph = e.ph
        if not isinstance(ph, str):
            bad = "missing ph" if ph is None else "ph not text"
        else:
            bad = _span_problem(e) if ph == "X" else _other_problem(e)
        if bad:
            drops.event(bad, e)
        else:
            out.append(e)
    return out


def _ids_ok(e) -> bool:
    return isinstance(e.pid, _SCALARS + (type(None),)) and isinstance(e.tid, _SCALARS + (type(None),))


def _other_problem(e) -> str | None:
    """Why a non-span event cannot be read: metadata and instants need a text name, readable args where
    the loader reads them (thread names, memory records) and ids; other phases pass as they are."""
    if not (e.ph == "M" or e.ph in ("i", "I")):
        return None
    if not isinstance(e.name, str):
        return "name not text"
    bad = _args_ok(e.args) if e.name in ("thread_name", "[memory]") else None
    if bad:
        return bad
    return None if _ids_ok(e) else "pid/tid not a number or text"


def _span_problem(e) -> str | None:
    """Why a complete event (``ph`` X) cannot be read, the first reason in the loader's order of reading."""
    if e.ts is None:
        return "missing ts"
    if e.name is None:
        return "null name"
    if not isinstance(e.name, str):
        return "name not text"
    if _num(e.ts) is None and not _huge(e.ts):
        return "ts not a number"
    if e.dur is not None and _num(e.dur) is None and not _huge(e.dur):
        return "dur not a number"
    if _huge(e.ts) or (e.dur is not None and _huge(e.dur)):
        return "time beyond any clock"
    if not _ids_ok(e):
        return "pid/tid not a number or text"
    if e.cat is not None and not isinstance(e.cat, str):
        return "cat not text"
    return (reads_args(e.name, e.cat) and _args_ok(e.args)) or None


def _huge(v: Any) -> bool:
    """A number too large for a float (a huge JSON integer) or an infinity/NaN: a time no clock gives."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return not math.isfinite(float(v))
    except OverflowError:
        return True


def clean_meta(meta: dict) -> tuple[dict, list[str]]:
    """The document fields with wrong-typed values removed, and a note per removal."""
    notes: list[str] = []
    out = dict(meta)
    dist = meta.get("distributedInfo")
    if dist is not None and not isinstance(dist, dict):
        notes.append("distributedInfo is not an object: ignored (rank from the file name)")
        dist = None
    if dist:
        dist = dict(dist)
        for key, ok in (("rank", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31),
                        ("world_size", lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31),
                        ("backend", lambda v: isinstance(v, str)),
                        ("pg_config", lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v))):
            if key in dist and dist[key] is not None and not ok(dist[key]):
                notes.append(f"distributedInfo.{key} = {_short(dist[key])} is not a valid {key}: ignored")
                del dist[key]
        r, w = dist.get("rank"), dist.get("world_size")
        if isinstance(r, int) and isinstance(w, int) and r >= w:
            notes.append(f"distributedInfo.rank {r} is outside its world_size {w}: world_size ignored")
            del dist["world_size"]
    out["distributedInfo"] = dist or {}
    host = meta.get("host_name")
    if host is not None and not isinstance(host, str):
        notes.append(f"host_name = {_short(host)} is not text: ignored")
        out["host_name"] = None
    props = meta.get("deviceProperties")
    if props is not None and not (isinstance(props, list) and all(isinstance(p, dict) for p in props)
                                  and all(isinstance(p.get("name", ""), str) for p in props)):
        notes.append("deviceProperties is not a list of devices with text names: ignored")
        out["deviceProperties"] = None
    base = meta.get("baseTimeNanoseconds")
    if base is not None and not (isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 2**63):
        notes.append(f"baseTimeNanoseconds = {_short(base)} is not a clock reading: ignored")
        out["baseTimeNanoseconds"] = None
    return out, notes


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


# ---------------------------------------------------------------- column level

def check(t: RankTrace, drops: Drops, notes: list[str], world_size_known: bool = False) -> RankTrace:
    """Drop implausible rows from ``t`` (vectorised), attach its ``RankDataQuality``, refuse past the limits."""
    n_read = t.n_events + drops.total  # rows built + events dropped while decoding
    ts, dur = t.ts, t.dur
    with np.errstate(invalid="ignore", over="ignore"):
        end = ts + dur
        bad_value = ~np.isfinite(ts) | ~np.isfinite(dur)
        negative = ~bad_value & ((dur < 0) | (ts < 0))
        beyond = ~bad_value & ~negative & ((ts > MAX_CLOCK_US) | (dur > MAX_CLOCK_US) | (end > MAX_CLOCK_US))
    keep = ~(bad_value | negative | beyond)
    drops.rows("time not finite", t, np.nonzero(bad_value)[0], located=False)
    drops.rows("negative time or duration", t, np.nonzero(negative)[0], located=False)
    drops.rows("time beyond any clock", t, np.nonzero(beyond)[0], located=False)
    reach = _reach_outliers(ts, end, keep)
    drops.rows("outside the recording by more than 10x its length", t, np.nonzero(reach)[0], located=False)
    keep &= ~reach
    bad_steps = _bad_steps(t, end, keep)
    for reason, rows in bad_steps.items():
        drops.rows(reason, t, rows, located=reason != "profiler step overlaps the next step")
        keep[rows] = False
    t.memory_events, mem_dropped = _clean_memory(t.memory_events)
    if mem_dropped:
        drops.by_reason["allocator sample with bad fields"] += mem_dropped
        drops.by_kind["[memory] sample"] += mem_dropped
        drops.unlocated += mem_dropped
    if not keep.all():
        t = _filter(t, keep)
    if t.n_events == 0:
        raise InputError(t.path, f"no usable events: {describe_drops(drops)}")
    q = _quality(t, drops, notes, n_read)
    t.quality = q
    _enforce_limits(t, q, drops, world_size_known)
    return t


def _reach_outliers(ts: np.ndarray, end: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Events that start before, or end after, all the other events by more than the others' extent.

    Leave-one-out: the top event by end (and the bottom by start) is judged against the rest, repeated
    while one is found. A real recording's events all lie within its profiling window."""
    out = np.zeros(len(ts), dtype=bool)
    alive = np.nonzero(ok)[0]
    if len(alive) < MIN_EVENTS_FOR_REACH:
        return out
    e, s = end[alive], ts[alive]
    live = np.ones(len(alive), dtype=bool)
    for _ in range(64):
        idx = np.nonzero(live)[0]
        if len(idx) < MIN_EVENTS_FOR_REACH:
            break
        ee, ss = e[idx], s[idx]
        top = int(np.argmax(ee))
        bottom = int(np.argmin(ss))
        # the others' extent, without the candidate
        e_wo = np.delete(ee, top)
        s_wo_top = np.delete(ss, top)
        ext_top = float(e_wo.max() - s_wo_top.min())
        found = False
        if ee[top] > e_wo.max() + REACH_FACTOR * ext_top:
            live[idx[top]] = False
            found = True
        s_wo = np.delete(ss, bottom)
        e_wo_bottom = np.delete(ee, bottom)
        ext_bottom = float(e_wo_bottom.max() - s_wo.min())
        if ss[bottom] < s_wo.min() - REACH_FACTOR * ext_bottom and live[idx[bottom]]:
            live[idx[bottom]] = False
            found = True
        if not found:
            break
    out[alive[~live]] = True
    return out


def _bad_steps(t: RankTrace, end: np.ndarray, keep: np.ndarray) -> dict[str, np.ndarray]:
    """ProfilerStep annotations out of order or overlapping the next step on the same thread."""
    ids = {i: int(m.group(1)) for i, m in ((i, STEP_NAME.match(n)) for i, n in enumerate(t.names)) if m}
    if not ids:
        return {}
    rows = np.nonzero(np.isin(t.name_id, list(ids)) & np.isin(t.cat, (ANNOTATION, CPU_OP)) & keep)[0]
    if len(rows) < 2:
        return {}
    rows = rows[np.argsort(t.ts[rows], kind="stable")]
    track = t.track[rows[0]]
    rows = rows[t.track[rows] == track]
    out_of_order, overlapping = [], []
    seen: dict[int, int] = {}
    prev_num, prev_row = -1, None
    for r in rows:
        num = ids[int(t.name_id[r])]
        if num in seen:
            if t.ts[r] == t.ts[seen[num]]:
                continue  # the same step written twice (some traces do): the analysis keeps one
            out_of_order.append(r)
            continue
        if num < prev_num:
            out_of_order.append(r)
            continue
        # a step ends where the next begins; ts are written with ns precision (3 decimals of a us)
        if prev_row is not None and end[prev_row] > t.ts[r] + 1e-3 * max(1.0, t.dur[prev_row] * 1e-6):
            overlapping.append(prev_row)
        seen[num] = r
        prev_num, prev_row = num, r
    res = {}
    if out_of_order:
        res["profiler step out of order or repeated"] = np.asarray(out_of_order, dtype=np.int64)
    if overlapping:
        res["profiler step overlaps the next step"] = np.asarray(overlapping, dtype=np.int64)
    return res


def _clean_memory(samples: list[tuple]) -> tuple[list[tuple], int]:
    """The allocator samples ((phase, ts, raw args, ``MemoryArgs``)) whose time and figures are numbers
    a clock and an allocator give, with the time as a float; and how many were not. Column by column:
    a memory-profiled trace holds 10^4-10^5 samples (14 k: 35 -> 5 ms)."""
    if not samples:
        return [], 0
    args = [s[3] for s in samples]
    times = [s[1] for s in samples]
    ts = _floats(times)
    ok = (ts >= 0) & (ts <= MAX_CLOCK_US) & ~np.isnan(_floats([a.total for a in args]))
    for present in ([a.bytes for a in args], [a.reserved for a in args]):  # may be absent, not malformed
        ok &= ~np.isnan(_floats([0 if v is msgspec.UNSET else v for v in present]))
    device_type, device_id = [a.device_type for a in args], [a.device_id for a in args]
    if not (set(map(type, device_type)) <= {int} and set(map(type, device_id)) <= {int, type(None)}):
        ok &= np.array([type(t) is int and (i is None or type(i) is int) for t, i in zip(device_type, device_id)],
                       dtype=bool)
    if ok.all() and set(map(type, times)) <= {float}:
        return samples, 0  # the usual case: nothing to drop, every time a float already
    out = [(s[0], t, s[2], s[3]) for s, t, keep in zip(samples, ts.tolist(), ok.tolist()) if keep]
    return out, len(samples) - len(out)


def _floats(values: list) -> np.ndarray:
    """``_num`` of every value as a float64 column, NaN where it gives None."""
    if set(map(type, values)) <= {float, int}:  # JSON numbers: one conversion
        try:
            a = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer beyond a double
            a = None
        if a is not None:
            a[~np.isfinite(a)] = np.nan
            return a
    return np.array([np.nan if (f := _num(v)) is None else f for v in values], dtype=np.float64)


def _filter(t: RankTrace, keep: np.ndarray) -> RankTrace:
    new_row = np.cumsum(keep) - 1
    for col in ("name_id", "cat", "ts", "dur", "track", "corr"):
        setattr(t, col, getattr(t, col)[keep])
    t.args = {int(new_row[r]): a for r, a in t.args.items() if keep[r]}
    counts = np.bincount(t.track, minlength=len(t.tracks))
    for i, tr in enumerate(t.tracks):
        tr.n_events = int(counts[i])
    return t


def _step_time(t: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    ids = [i for i, n in enumerate(t.names) if STEP_NAME.match(n)]
    rows = np.nonzero(np.isin(t.name_id, ids) & np.isin(t.cat, (ANNOTATION, CPU_OP)))[0] if ids else []
    if len(rows):
        return t.ts[rows], t.ts[rows] + t.dur[rows]
    return np.array([t.ts.min()]), np.array([(t.ts + t.dur).max()])


def _union_len(starts: np.ndarray, ends: np.ndarray) -> float:
    if len(starts) == 0:
        return 0.0
    o = np.argsort(starts)
    s, e = starts[o], np.maximum.accumulate(ends[o])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    grp = np.cumsum(new) - 1
    gs = s[new]
    ge = np.zeros(len(gs))
    np.maximum.at(ge, grp, e)
    return float((ge - gs).sum())


def _quality(t: RankTrace, drops: Drops, notes: list[str], n_read: int) -> RankDataQuality:
    covered = None
    if drops.starts:
        ss, se = _step_time(t)
        total = _union_len(ss, se)
        ds, de = np.asarray(drops.starts), np.asarray(drops.ends)
        # the dropped intervals clipped to the step windows
        inter = 0.0
        if total > 0:
            for a, b in zip(ss, se):
                cs, ce = np.clip(ds, a, b), np.clip(de, a, b)
                inter += _union_len(cs, ce)
            covered = min(inter / total, 1.0)
    comm_left = int(np.count_nonzero(np.isin(t.name_id, comm_name_ids(t))))
    return RankDataQuality(
        rank=t.rank, file=shown(t.path), events_read=n_read, dropped=drops.total,
        by_reason=dict(drops.by_reason.most_common()), by_kind=dict(drops.by_kind.most_common()),
        dropped_communication=drops.by_kind.get("communication", 0), communication_events=comm_left,
        dropped_unnamed=drops.by_kind.get("unnamed", 0), step_share_covered=covered,
        unlocated=drops.unlocated, notes=list(notes))


# phases torch.profiler never writes (it writes spans as complete 'X' events, plus instants, flows and
# metadata): a file holding such events and no span is another tool's Chrome trace, not an empty recording
_FOREIGN_PHASES = {"B": "begin/end", "E": "begin/end", "b": "async begin/end", "e": "async begin/end",
                   "n": "async begin/end", "C": "counter", "P": "sample", "N": "object", "O": "object",
                   "D": "object"}


def without_spans(events: list) -> str:
    """Why a file without complete events is refused: another tool's file where it holds events of phases
    the profiler never writes (x2trace's B/E pairs, a server's async b/e), else an empty recording."""
    kinds: dict[str, int] = {}
    for e in events:
        what = _FOREIGN_PHASES.get(e.ph) if e.ph.__class__ is str else None
        if what:
            kinds[what] = kinds.get(what, 0) + 1
    if not kinds:
        return "trace holds no complete ('X') events: empty trace"
    held = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return (f"not a torch.profiler recording: another tool's Chrome trace ({held} events, no complete ('X') "
            "span; torch.profiler writes its spans as complete events)")


def describe_drops(drops: Drops) -> str:
    if not drops.total:
        return "trace holds no complete ('X') events: empty trace"
    return f"all {drops.total} events dropped (" + ", ".join(f"{n} {r}" for r, n in drops.by_reason.most_common(3)) + ")"


def _enforce_limits(t: RankTrace, q: RankDataQuality, drops: Drops, world_size_known: bool) -> None:
    if not q.dropped:
        return
    share = q.dropped / max(q.events_read, 1)
    if share > MAX_DROPPED_EVENT_SHARE:
        raise InputError(t.path, f"{q.dropped} of {q.events_read} events ({100 * share:.1f} %) have implausible "
                                 f"or malformed fields ({_top(q.by_reason)}): more than the "
                                 f"{100 * MAX_DROPPED_EVENT_SHARE:g} % the analysis tolerates")
    # communication dropped, and events of unknown name whose time is unknown too (they may have been
    # collectives); an unnamed event with a known time is bounded by the step-time limit below
    possibly_comm = q.dropped_communication + drops.unnamed_unlocated
    comm_total = q.communication_events + possibly_comm
    if possibly_comm and (comm_total or world_size_known):
        cshare = possibly_comm / max(comm_total, 1)
        if cshare > MAX_DROPPED_COMM_SHARE:
            raise InputError(t.path, f"{possibly_comm} dropped event(s) are or may be communication "
                                     f"({_top(q.by_reason)}), {100 * min(cshare, 1):.1f} % of the "
                                     f"{comm_total} communication events: more than the "
                                     f"{100 * MAX_DROPPED_COMM_SHARE:g} % the analysis tolerates")
    if q.step_share_covered is not None and q.step_share_covered > MAX_DROPPED_STEP_SHARE:
        raise InputError(t.path, f"dropped events ({_top(q.by_reason)}) cover {100 * q.step_share_covered:.1f} % "
                                 f"of the step time: more than the {100 * MAX_DROPPED_STEP_SHARE:g} % the "
                                 "analysis tolerates")


def _top(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {r}" for r, n in list(counts.items())[:2])


def merged(parts: list[RankDataQuality | None]) -> RankDataQuality | None:
    """One rank's data quality from the files (profiler cycles) joined into its table."""
    qs = [q for q in parts if q is not None]
    if not qs:
        return None
    by_reason: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    for q in qs:
        by_reason.update(q.by_reason)
        by_kind.update(q.by_kind)
    covered = [q.step_share_covered for q in qs if q.step_share_covered is not None]
    return RankDataQuality(
        rank=qs[0].rank, file=", ".join(q.file for q in qs), events_read=sum(q.events_read for q in qs),
        dropped=sum(q.dropped for q in qs), by_reason=dict(by_reason.most_common()),
        by_kind=dict(by_kind.most_common()), dropped_communication=sum(q.dropped_communication for q in qs),
        communication_events=sum(q.communication_events for q in qs),
        dropped_unnamed=sum(q.dropped_unnamed for q in qs),
        step_share_covered=max(covered) if covered else None, unlocated=sum(q.unlocated for q in qs),
        notes=[n for q in qs for n in q.notes])
