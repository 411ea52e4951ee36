"""All ranks on one timeline: a Chrome/Perfetto JSON trace (``fsdpdoctor export --perfetto``).

Trace Event Format (the JSON Perfetto and chrome://tracing load): a ``traceEvents``
list of events with ``ph`` (phase), ``ts`` in microseconds, ``pid``/``tid``:

* ``M`` metadata names each rank's process (``process_name``, ``process_sort_index``)
  and each track (``thread_name``, ``thread_sort_index``);
* ``X`` complete slices (``ts`` + ``dur``): steps, collectives, findings, and the
  original trace events;
* ``s``/``f`` flow events (same ``cat``, ``name`` and ``id``; ``bp: "e"`` binds each
  end to the slice that encloses it) link one collective across ranks: every rank's
  call points at the call of the rank that arrived last, the one everybody waited for;
* a finding is a slice over each step it concerns, on its own track in each rank it
  concerns, with its title, severity, fix and evidence in ``args``.

Every time is mapped onto the reference rank's clock with the offsets of
``Analysis.clock`` (analysis/clock.py), then shifted so that the trace starts at 0.
Each rank is a process (``pid`` = rank + 1: pid 0 is the idle task in Perfetto's
process model) with tracks: steps, collectives (as many lanes as calls overlap),
one track per finding that concerns the rank, then the original threads and streams.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict

from fsdpdoctor.analysis.clock import to_reference
from fsdpdoctor.results import Analysis, Collective, Finding
from fsdpdoctor.trace.io import write_atomic
from fsdpdoctor.trace.table import CATEGORY_NAMES, RankTrace

TID_STEPS = 1
TID_COLLECTIVES = 10          # lanes 10.. for overlapping collectives
TID_FINDINGS = 100            # one track per finding
TID_TRACE = 1000              # the original tracks from 1000 (plus a lane where events do not nest)
SEVERITY_COLOR = {"error": "terrible", "warning": "bad", "info": "generic_work"}   # chrome://tracing cnames


def pid_of(rank: int) -> int:
    return rank + 1


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: a lane per call so that calls on one lane never overlap."""
    ends: list[float] = []
    out = []
    for s, e in intervals:
        lane = next((i for i, end in enumerate(ends) if end <= s), None)
        if lane is None:
            ends.append(e)
            lane = len(ends) - 1
        else:
            ends[lane] = e
        out.append(lane)
    return out


def _finding_scope(f: Finding, a: Analysis) -> tuple[set[int], set]:
    ranks = set(f.ranks) | {e.rank for e in f.evidence if e.rank is not None}
    steps = {e.step for e in f.evidence if e.step is not None}
    return ranks or {r.rank for r in a.ranks}, steps or {s.step for r in a.ranks for s in r.steps}


def to_trace_events(a: Analysis, traces: list[RankTrace] | None = None) -> list[dict]:
    clk = a.clock

    def t(rank: int, ts: float) -> float:
        return to_reference(clk, rank, ts)

    ev: list[dict] = []
    for r in a.ranks:
        pid = pid_of(r.rank)
        off = clk.of(r.rank) if clk else None
        label = f"rank {r.rank}" + (f" ({r.host})" if r.host else "")
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": r.rank}})
        if off is not None:
            ev.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                       "args": {"labels": f"clock offset {off.offset_us:+.1f} ± {off.uncertainty_us:.1f} us"}})
        for tid, name in ((TID_STEPS, "steps"),):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for s in r.steps:
            ev.append({"ph": "X", "name": f"step {s.step}", "cat": "step", "pid": pid, "tid": TID_STEPS,
                       "ts": t(r.rank, s.start_us), "dur": s.duration_us,
                       "args": {k: round(getattr(s, k), 1) for k in (
                           "compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us",
                           "data_loading_us", "idle_us")}})
    ev += _collective_events(a, t)
    ev += _finding_events(a, t)
    for tr in traces or []:
        ev += _raw_events(tr, t)
    t0 = min((e["ts"] for e in ev if "ts" in e), default=0.0)
    for e in ev:
        if "ts" in e:
            e["ts"] = round(e["ts"] - t0, 3)
        if "dur" in e:
            e["dur"] = round(max(e["dur"], 0.0), 3)
    return ev


def _collective_events(a: Analysis, t) -> list[dict]:
    ev: list[dict] = []
    by_rank: dict[int, list[Collective]] = defaultdict(list)
    for c in a.collective_events:
        by_rank[c.rank].append(c)
    slot: dict[int, tuple[int, float]] = {}       # id(collective) -> (tid, aligned start)
    for rank, cs in by_rank.items():
        cs.sort(key=lambda c: c.start_us)
        lanes = _lanes([(t(rank, c.start_us), t(rank, c.end_us)) for c in cs])
        pid = pid_of(rank)
        for lane in sorted(set(lanes)):
            tid = TID_COLLECTIVES + lane
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": "collectives" + (f" ({lane + 1})" if lane else "")}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for c, lane in zip(cs, lanes):
            tid = TID_COLLECTIVES + lane
            start = t(rank, c.start_us)
            slot[id(c)] = (tid, start)
            ev.append({"ph": "X", "name": c.kind, "cat": "collective", "pid": pid, "tid": tid, "ts": start,
                       "dur": c.duration_us,
                       "args": {"step": c.step, "index": c.index, "phase": c.phase, "raw_name": c.raw_name,
                                "exposed_us": round(c.exposed_us, 1), "size_bytes": c.size_bytes,
                                "busbw_gbps": c.busbw_gbps, "prefetch": c.prefetch, "source": c.source}})
    # one collective across ranks: matched by (step, issue order within the step), same kind
    groups: dict[tuple[int, object], list[Collective]] = defaultdict(list)
    for c in a.collective_events:
        groups[(c.rank, c.step)].append(c)
    flow_id = 0
    for step in sorted({s for (_, s) in groups if s is not None}):
        lists = [sorted(groups.get((r, step), []), key=lambda c: c.index) for r in sorted(by_rank)]
        if len(lists) < 2:
            continue
        for k in range(min(len(x) for x in lists)):
            cs = [x[k] for x in lists]
            if len({c.kind for c in cs}) > 1:
                break
            last = max(cs, key=lambda c: slot[id(c)][1])
            ltid, lstart = slot[id(last)]
            for c in cs:
                if c is last:
                    continue
                flow_id += 1
                tid, start = slot[id(c)]
                common = {"name": f"{c.kind} step {step} #{k}", "cat": "collective-link", "id": flow_id, "bp": "e"}
                ev.append({"ph": "s", "pid": pid_of(c.rank), "tid": tid, "ts": start, **common})
                ev.append({"ph": "f", "pid": pid_of(last.rank), "tid": ltid, "ts": lstart, **common})
    return ev


def _finding_events(a: Analysis, t) -> list[dict]:
    ev: list[dict] = []
    steps_of = {r.rank: {s.step: s for s in r.steps} for r in a.ranks}
    for i, f in enumerate(a.findings):
        ranks, steps = _finding_scope(f, a)
        tid = TID_FINDINGS + i
        args = {"id": f.id, "severity": f.severity, "title": f.title, "summary": f.summary, "fix": f.fix,
                "impact_ms_per_step": round(f.impact_us / 1e3, 2), "confidence": f.confidence,
                "source": f.source, "caused_by": f.caused_by}
        for rank in sorted(ranks):
            if rank not in steps_of:
                continue
            pid = pid_of(rank)
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"finding: {f.id} ({f.severity})"}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
            for st in sorted(s for s in steps if s in steps_of[rank]):
                s = steps_of[rank][st]
                evidence = [e.text for e in f.evidence if e.rank in (None, rank) and e.step in (None, st)]
                ev.append({"ph": "X", "name": f.title, "cat": "finding", "pid": pid, "tid": tid,
                           "ts": t(rank, s.start_us), "dur": s.duration_us,
                           "cname": SEVERITY_COLOR.get(f.severity, "generic_work"),
                           "args": args | {"step": st, "evidence": evidence[:8]}})
    return ev


def nest_lanes(starts, ends) -> list[int]:
    """A lane per slice such that the slices of one lane nest (none partly overlaps another).

    Kineto's per-thread events almost always nest; the few that do not (a Python frame
    ending just after the op it encloses began) would be misdrawn, so they move to an
    extra lane. Input in any order; the lanes are returned in input order.
    """
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -(ends[i] - starts[i])))
    stacks: list[list[float]] = []
    out = [0] * len(starts)
    for i in order:
        s, e = starts[i], ends[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                out[i] = lane
                break
        else:
            stacks.append([e])
            out[i] = len(stacks) - 1
    return out


def _raw_events(tr: RankTrace, t) -> list[dict]:
    """The rank's own trace events (complete slices), on the aligned clock."""
    pid = pid_of(tr.rank)
    ev: list[dict] = []
    names, cats = tr.names, CATEGORY_NAMES
    rows_by_track: dict[int, list[int]] = defaultdict(list)
    for row in range(tr.n_events):
        rows_by_track[int(tr.track[row])].append(row)
    tid = TID_TRACE
    for i, track in enumerate(tr.tracks):
        rows = rows_by_track.get(i, [])
        if not rows:
            continue
        starts = [t(tr.rank, float(tr.ts[r])) for r in rows]
        ends = [s + float(tr.dur[r]) for s, r in zip(starts, rows)]
        lanes = nest_lanes(starts, ends)
        base = track.name or (f"stream {track.tid}" if track.is_device else f"thread {track.tid}")
        for lane in range(max(lanes) + 1):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid + lane,
                       "args": {"name": base + (f" (overlapping events {lane})" if lane else "")}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid + lane,
                       "args": {"sort_index": tid + lane}})
        for r, s, e, lane in zip(rows, starts, ends, lanes):
            ev.append({"ph": "X", "name": names[tr.name_id[r]], "cat": cats[tr.cat[r]], "pid": pid,
                       "tid": tid + lane, "ts": s, "dur": e - s})
        tid += max(lanes) + 1
    return ev


def write(a: Analysis, path, traces: list[RankTrace] | None = None) -> int:
    """Write the merged trace to ``path``; returns the number of events."""
    ev = to_trace_events(a, traces)
    doc = {"traceEvents": ev, "displayTimeUnit": "ms",
           "otherData": {"producer": "fsdpdoctor export --perfetto", "source": a.source,
                        "clock": None if a.clock is None else {
                            "reference_rank": a.clock.reference_rank,
                            "offsets_us": {str(r.rank): r.offset_us for r in a.clock.ranks},
                            "uncertainty_us": {str(r.rank): r.uncertainty_us for r in a.clock.ranks}}}}

    def dump(fh) -> None:  # streamed, as the events may be most of a run
        text = io.TextIOWrapper(fh, encoding="utf-8")
        json.dump(doc, text, separators=(",", ":"), default=str)
        text.flush()
        text.detach()

    write_atomic(path, dump)
    return len(ev)
