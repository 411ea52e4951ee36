"""Hang forensics: from the ranks' dumps (trace/hang.py) to which rank stopped, where, and why.

Per process group, the flight recorder gives each rank's last enqueued collective sequence
number (under gloo every entry's ``state`` stays "scheduled", so the per-group status and the
entries' ``collective_seq_id`` are what count). The highest one is the group's *frontier*: ranks
at it entered that collective and wait inside it; ranks below it never entered it. The stacks
say what the ranks that never entered are doing instead. Same sequence number, different op or
sizes across ranks is a desync (the ranks disagree on what the collective is), not a slow rank.
"""

from __future__ import annotations

from collections import Counter

from fsdpdoctor.results.hang import (
    Activity, Cause, GroupDivergence, HangReport, Mismatch, RankState, Trend,
)
from fsdpdoctor.results.hang import HangVerdict as Verdict
from fsdpdoctor.trace.hang import Frame, FrEntry, HangDumps, RankDump

# default of the hang_busy_runnable_share threshold (diagnose/thresholds.py has its source); the verb
# passes the resolved table so --threshold overrides it
BUSY_RUNNABLE_SHARE = 0.5

# errors a rank gets because a peer went away or disagreed: consequences, not causes
COMM_ERROR_MARKS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "timed out",
                    "Timed out", "doesn't match expected size", "collective mismatch", "DistBackendError",
                    "NCCL error", "ProcessGroup", "gloo")


# --------------------------------------------------------------------------- frames
def is_library(path: str) -> bool:
    p = path.replace("\\", "/")
    if p.startswith("<"):
        return True
    if "/site-packages/" in p or "/dist-packages/" in p:
        return True
    if "/fsdpdoctor/capture/" in p:
        return True
    # the standard library: .../lib/python3.X/<module>.py
    parts = p.split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "lib" and i + 1 < len(parts) and parts[i + 1].startswith("python3"):
            return True
    return False


def user_frame(frames: list[Frame]) -> tuple[Frame | None, str | None]:
    """(innermost user frame, innermost library function below it) of an outermost-first stack."""
    lib = None
    for f in reversed(frames):
        if is_library(f.file):
            if lib is None:
                lib = f.function
            continue
        return f, lib
    return None, lib


def _has(frames: list[Frame], *parts: str) -> bool:
    return any(any(p in f.file.replace("\\", "/") for p in parts) for f in frames)


def in_own_dump(frames: list[Frame]) -> bool:
    """The stack is inside the watchdog's own dump (the capture package's ``Watch.dump``)."""
    return any(f.function == "dump" and f.file.replace("\\", "/").endswith("fsdpdoctor/capture/watch.py")
               for f in frames)


def activity(d: RankDump, busy_runnable_share: float = BUSY_RUNNABLE_SHARE) -> tuple[Activity, Frame | None, str | None]:
    t = d.main_thread
    if t is None or not t.frames:
        return "unknown", None, None
    frames = t.frames
    if d.trigger == "exception" and d.exception and d.exception["frames"]:
        frames = d.exception["frames"]
    fr, lib = user_frame(frames)
    if d.kind == "faulthandler" and in_own_dump(frames):
        # the main thread only writes a dump when an exception leaves the watched block; the launcher
        # stopped it before the dump (flight recorder, exception) was on disk
        return "exception", fr, lib
    if _has(frames, "torch/utils/data/"):
        return "data-loader", fr, lib
    if _has(frames, "torch/serialization.py", "torch/distributed/checkpoint/"):
        return "checkpoint", fr, lib
    if _has(frames, "torch/distributed/distributed_c10d.py", "torch/distributed/_functional_collectives"):
        return "collective", fr, lib
    if _has(frames, "torch/autograd/", "torch/_tensor.py") and lib in ("_engine_run_backward", "backward", "run_backward"):
        return "backward", fr, lib
    if d.trigger == "exception":
        return "exception", fr, lib
    if lib in ("wait", "acquire", "get", "join", "_wait_for_tstate_lock", "select", "poll", "recv", "accept"):
        return "blocked", fr, lib
    lines = {(s.file, s.line) for s in d.main_samples}
    if len(lines) > 1 or (d.main_runnable_share is not None and d.main_runnable_share >= busy_runnable_share):
        return "busy-loop", fr, lib
    if d.main_samples and fr is not None and lib is None:
        # the same user line in every sample and no Python frame below it: a blocking C call
        # (time.sleep, a socket read) or one long C operation
        return "blocked", fr, lib
    return "user-code", fr, lib


def _issue_site(e: FrEntry) -> Frame | None:
    return user_frame(e.frames)[0] if e.frames else None


def _new_site(d: RankDump, e: FrEntry) -> bool:
    """True when ``e`` was issued from a user frame this rank used for no earlier collective."""
    site = _issue_site(e)
    if site is None:
        return False
    key = (site.file, site.line)
    for other in d.fr_entries:
        if other is e:
            return True
        s = _issue_site(other)
        if s is not None and (s.file, s.line) == key:
            return False
    return True


def _sig(e: FrEntry) -> str:
    dt = ",".join(map(str, e.dtypes)) if e.dtypes else ""
    return f"{e.op} {e.input_sizes} {dt}".strip()


# --------------------------------------------------------------------------- analysis
def _labels(dumps: HangDumps) -> tuple[dict[str, str], dict[str, list[int]]]:
    labels: dict[str, str] = {}
    members: dict[str, list[int]] = {}
    for d in dumps.dumps.values():
        for name, g in d.groups.items():
            desc = g.get("desc")
            labels.setdefault(name, desc if desc and desc != "undefined" else ("default_pg" if name == "0" else name))
            if isinstance(g.get("ranks"), list) and g["ranks"]:
                members.setdefault(name, sorted(int(r) for r in g["ranks"]))
    return labels, members


def _enqueued(d: RankDump, group: str) -> int | None:
    st = d.fr_status.get(group)
    seqs = [e.seq for e in d.fr_entries if e.group == group and not e.is_p2p]
    if st is not None and st.last_enqueued is not None and st.last_enqueued >= 0:
        return max([st.last_enqueued, *seqs])
    return max(seqs) if seqs else None


def analyze_hang(dumps: HangDumps, trend: Trend | None = None, thresholds: dict[str, float] | None = None) -> HangReport:
    busy = (thresholds or {}).get("hang_busy_runnable_share", BUSY_RUNNABLE_SHARE)
    # every rank known to have run counts: those that dumped and those that vanished (a header-only
    # faulthandler file), so a killed highest rank is not dropped from the world
    world = max(dumps.world_size or 0, *(r + 1 for r in [*dumps.dumps, *dumps.vanished]))
    everyone = list(range(world))
    silent = [r for r in everyone if r not in dumps.dumps]
    labels, members = _labels(dumps)
    fr_ranks = {r: d for r, d in dumps.dumps.items() if d.kind == "json" and (d.fr_entries or d.fr_status)}
    groups = sorted({e.group for d in fr_ranks.values() for e in d.fr_entries} |
                    {g for d in fr_ranks.values() for g in d.fr_status}, key=lambda g: (len(g), g))
    notes = [f"rank {d.rank}: no flight-recorder entries ({d.fr_note or d.fr_error})" for d in dumps.dumps.values()
             if d.kind == "json" and not d.fr_entries and (d.fr_note or d.fr_error)]
    states = {r: _rank_state(dumps, r, labels, busy) for r in everyone}
    divergences = [d for g in groups if (d := _divergence(g, members.get(g) or everyone, fr_ranks, states, labels))]
    mismatches = [m for g in groups if (m := _first_mismatch(g, fr_ranks, labels))]
    verdicts = _verdicts(dumps, states, divergences, mismatches, silent)
    if trend is not None and trend.available and verdicts:
        lag = set(verdicts[0].ranks)
        trend.lagging_was_straggler = trend.straggler in lag if trend.straggler is not None else False
    return HangReport(dumps.run_dir, world, sorted(dumps.dumps), silent, [states[r] for r in everyone],
                      divergences, mismatches, verdicts, trend, notes)


FAULT_NOTES = {"sigterm": "was sent SIGTERM (stacks only)",
               "gil-timeout": "its Python watchdog could not run: a thread held the GIL"}


def _rank_state(dumps: HangDumps, r: int, labels: dict[str, str], busy: float) -> RankState:
    d = dumps.dumps.get(r)
    if d is None:
        return RankState(r, None, None, None, "unknown", None, None, note=_vanished_note(dumps, r))
    act, fr, lib = activity(d, busy)
    cur = None
    if d.fr_entries:
        last = d.fr_entries[-1]
        cur = {"group": last.group, "label": labels.get(last.group, last.group), "seq": last.seq,
               "op": last.op, "sizes": last.input_sizes}
    exc = None
    if d.exception:
        msg = d.exception["message"]
        exc = f"{d.exception['type']}: {msg.splitlines()[0] if msg else ''}"
    note = None
    if d.kind == "faulthandler":
        note = f"died of a fatal signal ({d.fatal})" if d.trigger == "fatal-signal" else FAULT_NOTES.get(d.trigger)
        if d.trigger == "sigterm" and act == "exception":
            # what it raised and the collective it was in were in the dump it did not finish
            note = ("was sent SIGTERM while writing the dump of an exception that ended its loop: "
                    "its flight recorder and the exception were not saved")
    return RankState(r, d.kind, d.trigger, d.last_step, act, fr, lib, cur, exc, note)


def _divergence(g: str, mem: list[int], fr_ranks: dict[int, RankDump], states: dict[int, RankState],
                labels: dict[str, str]) -> GroupDivergence | None:
    """The group's frontier, who entered it and who never did; None when they all agree."""
    enq = {r: _enqueued(d, g) for r, d in fr_ranks.items() if r in mem}
    enq = {r: s for r, s in enq.items() if s is not None}
    if not enq:
        return None
    comp = {r: d.fr_status[g].last_completed for r, d in fr_ranks.items()
            if g in d.fr_status and d.fr_status[g].last_completed is not None and r in enq}
    frontier = max(enq.values())
    entered = sorted(r for r, s in enq.items() if s >= frontier)
    never = sorted(r for r, s in enq.items() if s < frontier)
    unknown = sorted(r for r in mem if r not in enq)
    waiting = any(states[r].current and states[r].current["group"] == g and states[r].current["seq"] == frontier
                  for r in entered)
    if not never and not (unknown and waiting):
        return None
    # the collective they diverge on: the first one a lagging rank never entered (with NCCL the
    # others may have enqueued several more before blocking), else the frontier itself
    first = min(enq[r] for r in never) + 1 if never else frontier
    entry = next((e for r in entered for e in reversed(fr_ranks[r].fr_entries) if e.group == g and e.seq == first),
                 None)
    return GroupDivergence(g, labels.get(g, g), mem, first, entry.op if entry else "?",
                           entry.input_sizes if entry else [], _issue_site(entry) if entry else None,
                           entered, never, unknown, enq, comp)


def _first_mismatch(g: str, fr_ranks: dict[int, RankDump], labels: dict[str, str]) -> Mismatch | None:
    """The first sequence number of the group at which the ranks issued different collectives."""
    by_seq: dict[int, dict[int, FrEntry]] = {}
    for r, d in fr_ranks.items():
        for e in d.fr_entries:
            if e.group == g and not e.is_p2p:
                by_seq.setdefault(e.seq, {})[r] = e
    for seq in sorted(by_seq):
        es = by_seq[seq]
        if len(es) < 2 or len({e.signature() for e in es.values()}) < 2:
            continue
        top = Counter(e.signature() for e in es.values()).most_common()
        tie = top[0][1] == top[-1][1]
        odd = sorted(r for r, e in es.items() if tie or e.signature() != top[0][0])
        if tie:
            # a tie (e.g. 2 ranks): a rank whose collective comes from a call site it never used
            # before issued something new (a barrier only it calls, an extra collective)
            new = [r for r in odd if _new_site(fr_ranks[r], es[r])]
            if new and len(new) < len(odd):
                odd = new
        sites = {r: (s.where() if (s := _issue_site(e)) else "?") for r, e in es.items()}
        return Mismatch(g, labels.get(g, g), seq, {r: _sig(e) for r, e in sorted(es.items())}, odd, sites)
    return None


def _vanished_note(dumps: HangDumps, rank: int) -> str:
    head = dumps.vanished.get(rank)
    if head is None:
        return "vanished: wrote nothing (no dump, no watchdog file): likely dead or stuck below Python"
    return (f"vanished: its watchdog file holds only the header written when the watchdog armed (at step "
            f"≥{head.last_step}): no handler ran, so the process was killed (SIGKILL, the OOM killer) or is frozen "
            "below Python")


def _where(f: Frame | None) -> str:
    return f"{f.function} ({f.file}:{f.line})" if f else "an unknown place"


def _is_comm_error(exc: dict | None) -> bool:
    """A peer's failure seen from here (or the user interrupting a stuck job): a consequence."""
    if not exc:
        return False
    if exc["type"] in ("KeyboardInterrupt", "SystemExit"):
        return True
    text = f"{exc['type']} {exc['message']}"
    return any(m in text for m in COMM_ERROR_MARKS)


def _verdicts(dumps: HangDumps, states: dict[int, RankState], divs: list[GroupDivergence],
              mismatches: list[Mismatch], silent: list[int]) -> list[Verdict]:
    """The causes, strongest evidence first: a desync explains everything after it; then a rank's
    own error, a fatal signal, per divergent group the ranks that never entered and why, the ranks
    that vanished; with no divergence at all, where the stalled ranks are."""
    done: set[int] = set()
    out = _desync_verdicts(dumps, mismatches, done)
    out += _crash_verdicts(dumps, done)
    out += _fatal_signal_verdicts(dumps, states, done)
    for g in divs:
        out += _divergence_verdicts(g, divs, states, done)
    out += [Verdict("no-dump", [r], None, None, None, None, None, f"rank {r} {states[r].note}",
                    _stopped_peers(states, r))
            for r in silent if r not in done]
    if not out:
        out = _stall_verdicts(states)
    # one verdict per cause and ranks (a cycle is seen from both of its groups)
    merged: list[Verdict] = []
    for v in out:
        if not any(m.cause == v.cause and m.ranks == v.ranks for m in merged):
            merged.append(v)
    return merged


def _desync_verdicts(dumps: HangDumps, mismatches: list[Mismatch], done: set[int]) -> list[Verdict]:
    out = []
    for m in mismatches:
        sites = "; ".join(f"rank {r}: {m.by_rank[r]} from {m.sites.get(r, '?')}" for r in m.by_rank)
        frame = None
        for r in m.odd_ranks:
            e = next((e for e in reversed(dumps.dumps[r].fr_entries) if e.group == m.group and e.seq == m.seq), None)
            frame = frame or (_issue_site(e) if e else None)
        odd_op = m.by_rank[m.odd_ranks[0]].split()[0]
        others = sorted({m.by_rank[r].split()[0] for r in m.by_rank if r not in m.odd_ranks})
        what = "the ranks issued different collectives"
        if odd_op == "barrier" and others and "barrier" not in others:
            what = (f"rank(s) {', '.join(map(str, m.odd_ranks))} call a barrier the others do not (they issued "
                    f"{', '.join(others)})")
        out.append(Verdict("desync", m.odd_ranks, m.group, m.label, m.seq, odd_op, frame,
                           f"desync on group {m.label} at collective #{m.seq}: {what} ({sites})", [sites]))
        done |= set(m.odd_ranks)
    return out


def _crash_verdicts(dumps: HangDumps, done: set[int]) -> list[Verdict]:
    """A rank that raised an error of its own (not a peer's failure seen from there)."""
    out = []
    for r, d in sorted(dumps.dumps.items()):
        if d.exception and not _is_comm_error(d.exception) and r not in done:
            f, _ = user_frame(d.exception["frames"])
            out.append(Verdict("crashed", [r], None, None, None, None, f,
                               f"rank {r} raised {d.exception['type']}: {d.exception['message'][:200]} in {_where(f)}"))
            done.add(r)
    return out


def _fatal_signal_verdicts(dumps: HangDumps, states: dict[int, RankState], done: set[int]) -> list[Verdict]:
    """A rank that died of a fatal signal: inside a collective while another rank was in a
    different one, a desync (gloo's size check aborts); else an abort."""
    out = []
    for r, d in sorted(dumps.dumps.items()):
        if d.kind != "faulthandler" or d.trigger != "fatal-signal" or r in done:
            continue
        st = states[r]
        here = st.frame
        diff = [s for s in states.values() if s.rank != r and s.current] \
            if st.activity == "collective" and here is not None else []
        if diff:
            ranks = sorted({r, *(s.rank for s in diff)})
            ev = [f"rank {r}: {st.library or 'collective'} called from {_where(here)} when it aborted ({d.fatal})"]
            for s in diff:
                e = dumps.dumps[s.rank].fr_entries[-1]
                ev.append(f"rank {s.rank}: group {s.current['label']} collective #{s.current['seq']} "
                          f"{_sig(e)} from {_where(_issue_site(e))}")
            out.append(Verdict("desync", ranks, diff[0].current["group"], diff[0].current["label"],
                               diff[0].current["seq"], st.library, here,
                               f"rank {r} aborted ({d.fatal}) inside {st.library or 'a collective'} from "
                               f"{_where(here)} while rank(s) {', '.join(str(s.rank) for s in diff)} were in a "
                               f"different collective: the ranks disagree on the collective sequence "
                               f"(gloo's size check aborts the process)", ev))
        else:
            # no desync can be shown where the peers' collectives are unknown
            out.append(Verdict("aborted", [r], None, None, None, None, here,
                               f"rank {r} died of a fatal signal ({d.fatal}) in {_where(here)}",
                               _stopped_peers(states, r)))
        done.update(out[-1].ranks)
    return out


def _stopped_peers(states: dict[int, RankState], culprit: int) -> list[str]:
    """Peers the launcher stopped (SIGTERM) before they dumped their flight recorder, once ``culprit``
    had died: where they were is known from their stacks, the collective they were in is not."""
    return [f"rank {s.rank}: stopped by the launcher (SIGTERM) in {s.activity} at {_where(s.frame)}, "
            "no flight recorder: the collective it was in is unknown"
            for s in states.values() if s.rank != culprit and s.trigger == "sigterm" and not s.current]


def _coll(g: GroupDivergence) -> str:
    return f"{g.op} {g.sizes} (collective #{g.seq} of group {g.label})"


def _divergence_verdicts(g: GroupDivergence, divs: list[GroupDivergence], states: dict[int, RankState],
                         done: set[int]) -> list[Verdict]:
    """Per rank of a divergent group that never entered its collective: vanished, caught in a
    cycle with another group, or doing something else (its activity)."""
    out = []
    for r in [r for r in g.never_entered + g.unknown if r not in done]:
        if states[r].dump is None:
            out.append(Verdict("no-dump", [r], g.group, g.label, g.seq, g.op, g.issued_at,
                               f"rank {r} vanished (no dump); rank(s) {', '.join(map(str, g.entered))} wait for it "
                               f"in {_coll(g)}, issued at {_where(g.issued_at)}"))
            done.add(r)
            continue
        # is r itself waiting in another group's frontier the others never entered? a cycle
        other = next((h for h in divs if h is not g and r in h.entered and set(h.never_entered) & set(g.entered)),
                     None)
        if other is None:
            out.append(_lagging_verdict(r, g, states))
            done.add(r)
        else:
            out.append(_cycle_verdict(r, g, other, states))
            done.update({r, *(set(other.never_entered) & set(g.entered))})
    return out


def _cycle_verdict(r: int, g: GroupDivergence, other: GroupDivergence, states: dict[int, RankState]) -> Verdict:
    """r waits in ``other``, which the ranks waiting in ``g`` never entered. At different steps,
    the rank ahead skipped the collective of the group it is behind in; at the same step, the
    ranks issue the two groups' collectives in different orders."""
    peers = sorted(set(other.never_entered) & set(g.entered))
    peer_steps = [states[q].last_step for q in peers if states[q].last_step is not None]
    mine = states[r].last_step
    if mine is None or not peer_steps or mine == max(peer_steps):
        return Verdict(
            "collective-order", sorted({r, *peers}), g.group, g.label, g.seq, g.op, g.issued_at or other.issued_at,
            f"ranks wait on each other in different groups: rank(s) {', '.join(map(str, g.entered))} in {_coll(g)} "
            f"from {_where(g.issued_at)}; rank {r} in {other.op} #{other.seq} of group {other.label} from "
            f"{_where(other.issued_at)}: the ranks issue collectives on these groups in different orders")
    if mine > max(peer_steps):
        skipper, skipped, waiting_in, others = [r], g, other, peers
    else:
        skipper = [q for q in peers if states[q].last_step == max(peer_steps)]
        skipped, waiting_in, others = other, g, [r]
    sk_step = states[skipper[0]].last_step
    ot_step = max(states[q].last_step or 0 for q in others)
    who = ", ".join(map(str, skipper))
    return Verdict(
        "skipped-collective", skipper, skipped.group, skipped.label, skipped.seq, skipped.op, skipped.issued_at,
        f"rank {who} skipped {skipped.op} {skipped.sizes} (collective #{skipped.seq} of group {skipped.label}) that "
        f"rank(s) {', '.join(map(str, skipped.entered))} issued at {_where(skipped.issued_at)}: it went on to step "
        f"{sk_step} (the others are at step {ot_step}) and now waits in {waiting_in.op} #{waiting_in.seq} of group "
        f"{waiting_in.label} at {_where(waiting_in.issued_at)}",
        [f"rank {who} completed {sk_step} steps, rank(s) {', '.join(map(str, others))} {ot_step}"])


# what a rank that never entered the collective is doing instead, as a cause and in words
ACTIVITY_CAUSE: dict[str, Cause] = {"data-loader": "data-loader", "checkpoint": "checkpoint",
                                    "busy-loop": "busy-loop", "blocked": "blocked"}
DOING = {"data-loader": "is blocked in its data loader", "checkpoint": "is still saving/loading a checkpoint",
         "busy-loop": "is looping", "blocked": "is blocked (sleep, lock, queue or a blocking call)",
         "gil-held": "holds the GIL (its watchdog thread could not run)", "aborted": "died",
         "user-code": "is running its own code"}


def _lagging_cause(st: RankState) -> Cause:
    if st.dump == "faulthandler" and st.trigger == "gil-timeout":
        return "gil-held"
    if st.dump == "faulthandler" and st.trigger == "fatal-signal":
        return "aborted"
    return ACTIVITY_CAUSE.get(st.activity, "user-code")


def _lagging_verdict(r: int, g: GroupDivergence, states: dict[int, RankState]) -> Verdict:
    st = states[r]
    cause = _lagging_cause(st)
    code = f": `{st.frame.code}`" if st.frame and st.frame.code else ""
    return Verdict(
        cause, [r], g.group, g.label, g.seq, g.op, st.frame,
        f"rank {r} never entered {_coll(g)}; it {DOING[cause]} in {_where(st.frame)}{code}; rank(s) "
        f"{', '.join(map(str, g.entered))} wait inside it (issued at {_where(g.issued_at)})")


def _stall_verdicts(states: dict[int, RankState]) -> list[Verdict]:
    """No divergence at all: every rank stalled at the same collective point, so what they do
    instead is the answer (all ranks in the loader: a shared filesystem; all looping)."""
    stalled: dict[tuple, list[int]] = {}
    for s in states.values():
        if s.dump and s.activity not in ("collective", "backward", "unknown"):
            stalled.setdefault((s.activity, s.frame.where() if s.frame else None), []).append(s.rank)
    out = []
    for (act, _), ranks in stalled.items():
        st = states[ranks[0]]
        out.append(Verdict(ACTIVITY_CAUSE.get(act, "user-code"), sorted(ranks), None, None, None, None, st.frame,
                           f"no collective divergence: rank(s) {', '.join(map(str, sorted(ranks)))} stalled "
                           f"outside any collective, in {_where(st.frame)} ({act})"))
    return out


def trend_from_analysis(analysis) -> Trend:
    """Was a rank already late in the profiled steps? ``analyze``'s straggler verdict counts only
    when its rule fired (the thresholds of diagnose/thresholds.py: a consistent, large wait), so
    the run must be diagnosed (``open_analysis(..., diagnose=True)``)."""
    s = getattr(analysis, "straggler", None)
    if s is None:
        return Trend(False, summary="the profiled steps name no straggler (fewer than 2 ranks or no collectives)")
    waits = {int(r): float(w) / 1e3 for r, w in (s.wait_by_rank or {}).items()}
    fired = any(f.id == "straggler" for f in getattr(analysis, "findings", []) or [])
    if s.straggler is None or not fired:
        return Trend(True, None, None, waits, "no rank was consistently late in the profiled steps")
    return Trend(True, s.straggler, None, waits,
                 f"in the profiled steps rank {s.straggler} was already the straggler "
                 f"(last in {100 * s.last_fraction:.0f}% of steps, the others waited a median "
                 f"{100 * s.spread_frac:.1f}% of the step for it" + (f"; cause: {s.cause}" if s.cause else "") + ")")
