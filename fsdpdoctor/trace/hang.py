"""Reading the hang watchdog's dumps (``<run>/hang/rank<N>.json`` and the C-level
``rank<N>.faulthandler.txt``) into typed records. No torch.

A JSON dump holds the flight-recorder entries, the process groups, every thread's Python stack
and the last completed step (written by ``fsdpdoctor.capture.watch``). A faulthandler file holds
only stacks: the rank's watchdog could not run (the GIL was held), or the rank died of a fatal
signal or was sent SIGTERM. Ranks with neither are "silent".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from fsdpdoctor.hang_format import (DUMP_NAME, DUMP_VERSION, FAULTHANDLER_NAME, FOLDER, FaultHeader, Frame, Trigger,
                                   parse_header)
from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.io import DOCUMENT_MAX, read_raw, read_text
from fsdpdoctor.trace.limits import parse_bounded
from fsdpdoctor.visible_text import encodable

FH_NAME = FAULTHANDLER_NAME
FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\])? \(most recent call first\):")
FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass
class ThreadStack:
    name: str
    main: bool
    frames: list[Frame]          # outermost first, innermost last


@dataclass
class FrEntry:
    """One flight-recorder entry (a collective as this rank issued it)."""

    group: str                   # process group name (the key of pg_status)
    seq: int                     # collective_seq_id in that group
    op: str                      # "all_reduce" (profiling_name without the backend prefix)
    backend: str | None          # "gloo", "nccl" (profiling_name's prefix)
    input_sizes: list
    output_sizes: list
    dtypes: list
    state: str
    is_p2p: bool
    time_created_ns: int | None
    frames: list[Frame]          # where it was issued, outermost first (pickle dumps only)

    def signature(self) -> tuple:
        """What every rank of the group must agree on for this collective: the op, and the sizes
        and dtypes where they must match (not for all-to-all with uneven splits, gather/scatter
        whose root holds the lists, or point-to-point)."""
        if any(k in self.op for k in ("all_to_all", "alltoall", "gather", "scatter", "send", "recv")) \
                and "all_gather" not in self.op and "allgather" not in self.op and "reduce_scatter" not in self.op:
            return (self.op,)
        return (self.op, json.dumps(self.input_sizes), json.dumps(self.dtypes))


@dataclass
class GroupStatus:
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


@dataclass
class RankDump:
    rank: int
    source: str                  # the file it came from
    kind: str                    # "json" or "faulthandler"
    trigger: Trigger
    last_step: int | None        # completed steps (faulthandler: at the last re-arm, a lower bound)
    seconds_since_step: float | None = None
    world_size: int | None = None
    host: str | None = None
    time_unix: float | None = None
    exception: dict | None = None            # {"type", "message", "frames": [Frame]}
    fatal: str | None = None                 # "Aborted", "Segmentation fault" (faulthandler)
    fr_entries: list[FrEntry] = field(default_factory=list)
    fr_status: dict[str, GroupStatus] = field(default_factory=dict)
    fr_note: str | None = None
    fr_error: str | None = None
    groups: dict[str, dict] = field(default_factory=dict)  # name -> {"desc", "backend", "ranks"}
    threads: list[ThreadStack] = field(default_factory=list)
    main_samples: list[Frame] = field(default_factory=list)
    main_runnable_share: float | None = None  # share of the sampling window the main thread was runnable

    @property
    def main_thread(self) -> ThreadStack | None:
        for t in self.threads:
            if t.main:
                return t
        return self.threads[0] if self.threads else None


@dataclass
class HangDumps:
    run_dir: str
    dumps: dict[int, RankDump]
    world_size: int | None       # from the dumps (or the manifest)
    # ranks whose faulthandler file holds only its header and that wrote nothing else: the process
    # ended without running any handler (SIGKILL, the OOM killer) or is frozen
    vanished: dict[int, FaultHeader] = field(default_factory=dict)


def _bad(path: Path, problem: str) -> InputError:
    return InputError(path, f"not a hang dump: {problem}")


def _frames(raw, path: Path) -> list[Frame]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad(path, "frames is not a list")
    out = []
    for f in raw:
        if not isinstance(f, dict):
            raise _bad(path, "a frame is not an object")
        file, line = f.get("file", f.get("filename")), f.get("line")
        name = f.get("function", f.get("name"))
        if not isinstance(file, str) or not isinstance(line, int) or not isinstance(name, str):
            raise _bad(path, "a frame lacks file/line/function")
        out.append(Frame(file, line, name, str(f.get("code") or "")))
    return out


def _int(v) -> int | None:
    """A count, id, line or clock reading of a dump (all whole numbers in [0, 2^63) as torch and the
    watchdog write them), or None: a negative, fractional, boolean or 64-bit-overflowing value is no
    reading of any of them (a sequence number of -5 was shown as the collective where ranks diverge)."""
    if isinstance(v, str) and v.isascii() and v.isdigit():
        v = int(v)
    elif isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 63 else None


def _fr_entry(e, path: Path) -> FrEntry:
    if not isinstance(e, dict):
        raise _bad(path, "a flight-recorder entry is not an object")
    pg = e.get("process_group")
    group = str(pg[0]) if isinstance(pg, list) and pg else str(e.get("pg_id", ""))
    seq = _int(e.get("collective_seq_id"))
    name = e.get("profiling_name")
    if seq is None or not isinstance(name, str):
        raise _bad(path, "a flight-recorder entry lacks collective_seq_id (a non-negative integer) "
                         "or profiling_name")
    backend, _, op = name.rpartition(":")
    frames = _frames(e.get("frames"), path)[::-1]  # torch lists the innermost frame first
    return FrEntry(group=group, seq=seq, op=op or name, backend=backend or None,
                   input_sizes=e.get("input_sizes") or [], output_sizes=e.get("output_sizes") or [],
                   dtypes=e.get("input_dtypes") or [], state=str(e.get("state") or ""),
                   is_p2p=bool(e.get("is_p2p")), time_created_ns=_int(e.get("time_created_ns")), frames=frames)


def read_json_dump(path: Path) -> RankDump:
    try:
        doc = encodable(parse_bounded(json.loads, read_raw(path, DOCUMENT_MAX), path, "hang dump"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "fsdpdoctor_hang" not in doc:
        raise _bad(path, "no fsdpdoctor_hang version field")
    if not isinstance(doc["fsdpdoctor_hang"], int) or doc["fsdpdoctor_hang"] > DUMP_VERSION:
        raise _bad(path, f"unsupported version {doc['fsdpdoctor_hang']!r} (this fsdpdoctor reads {DUMP_VERSION})")
    rank = doc.get("rank")
    if not isinstance(rank, int) or rank < 0:
        raise _bad(path, "rank missing or not a non-negative integer")
    fr = doc.get("flight_recorder") or {}
    if not isinstance(fr, dict):
        raise _bad(path, "flight_recorder is not an object")
    entries = fr.get("entries") or []
    status = fr.get("pg_status") or {}
    threads = doc.get("threads") or []
    if not isinstance(entries, list) or not isinstance(status, dict) or not isinstance(threads, list):
        raise _bad(path, "entries/pg_status/threads have the wrong type")
    st = {}
    for g, s in status.items():
        if not isinstance(s, dict):
            raise _bad(path, f"pg_status[{g!r}] is not an object")
        st[str(g)] = GroupStatus(_int(s.get("last_enqueued_collective")), _int(s.get("last_started_collective")),
                                 _int(s.get("last_completed_collective")))
    ths = []
    for t in threads:
        if not isinstance(t, dict):
            raise _bad(path, "a thread is not an object")
        ths.append(ThreadStack(str(t.get("name", "")), bool(t.get("main")), _frames(t.get("frames"), path)))
    exc = doc.get("exception")
    if exc is not None:
        if not isinstance(exc, dict):
            raise _bad(path, "exception is not an object")
        exc = {"type": str(exc.get("type", "")), "message": str(exc.get("message", "")),
               "frames": _frames(exc.get("frames"), path)}
    groups = doc.get("groups") or {}
    if not isinstance(groups, dict):
        raise _bad(path, "groups is not an object")
    samples = [Frame(str(s.get("file", "")), _int(s.get("line")) or 0, str(s.get("function", "")))
               for s in doc.get("main_samples") or [] if isinstance(s, dict)]
    return RankDump(
        rank=rank, source=str(path), kind="json", trigger=str(doc.get("trigger") or "timeout"),
        last_step=_int(doc.get("last_step")), seconds_since_step=doc.get("seconds_since_step"),
        world_size=_int(doc.get("world_size")), host=doc.get("host"), time_unix=doc.get("time_unix"),
        exception=exc, fr_entries=[_fr_entry(e, path) for e in entries], fr_status=st,
        fr_note=fr.get("note"), fr_error=fr.get("error"),
        groups={str(k): v for k, v in groups.items() if isinstance(v, dict)}, threads=ths, main_samples=samples,
        main_runnable_share=doc.get("main_runnable_share")
        if isinstance(doc.get("main_runnable_share"), (int, float)) else None)


def read_faulthandler(path: Path) -> RankDump | None:
    """A faulthandler file, or None when it holds only its header (no handler ran)."""
    return read_faulthandler_file(path)[1]


def read_faulthandler_file(path: Path) -> tuple[FaultHeader, RankDump | None]:
    """A faulthandler file's header, and its stacks as a dump (None when it holds only the header)."""
    text = read_text(path)
    lines = text.splitlines()
    head = parse_header(lines[0]) if lines else None
    if head is None:
        raise _bad(path, "no fsdpdoctor faulthandler header line")
    rank, last_step = head.rank, head.last_step
    body = [ln for ln in lines[1:] if ln.strip()]
    if not body:
        return head, None
    fatal = None
    trigger = "sigterm"
    threads: list[ThreadStack] = []
    cur: ThreadStack | None = None
    for ln in body:
        if ln.startswith("Fatal Python error:"):
            fatal = ln.split(":", 1)[1].strip()
            trigger = "fatal-signal"
        elif ln.startswith("Timeout ("):
            trigger = "gil-timeout"
        elif m := FH_THREAD.match(ln):
            # faulthandler lists the current thread too; the main thread is the one whose
            # outermost frame is the program's <module> (checked below)
            cur = ThreadStack(name=m.group(3) or m.group(2), main=False, frames=[])
            threads.append(cur)
        elif (m := FH_FRAME.match(ln)) and cur is not None:
            cur.frames.insert(0, Frame(m.group(1), int(m.group(2)), m.group(3).strip()))
        elif ln.startswith("Stack (most recent call first):"):  # single-thread format
            cur = ThreadStack(name="main", main=True, frames=[])
            threads.append(cur)
    if not threads:
        raise _bad(path, "no traceback after the header")
    mains = [t for t in threads if t.frames and t.frames[0].function == "<module>"]
    (mains[0] if mains else threads[0]).main = True
    return head, RankDump(rank=rank, source=str(path), kind="faulthandler", trigger=trigger, last_step=last_step,
                          fatal=fatal, threads=threads, world_size=head.world_size)


def load_hang_dumps(run_dir: str | Path) -> HangDumps:
    """Every rank's dump in ``run_dir/hang`` (or ``run_dir`` itself when it is the hang folder).
    A JSON dump wins over a faulthandler file of the same rank."""
    root = Path(run_dir)
    if not root.exists():
        raise InputError(root, "no such file or directory")
    if not root.is_dir():
        raise InputError(root, "not a folder (give the run folder that holds hang/)")
    folder = root / FOLDER if (root / FOLDER).is_dir() else root
    dumps: dict[int, RankDump] = {}
    headers: dict[int, FaultHeader] = {}
    seen_any = False
    for p in sorted(folder.iterdir()):
        if m := DUMP_NAME.match(p.name):
            seen_any = True
            d = read_json_dump(p)
            if d.rank != int(m.group(1)):
                raise _bad(p, f"the file says rank {d.rank}")
            dumps[d.rank] = d
    for p in sorted(folder.iterdir()):
        if (m := FH_NAME.match(p.name)) and int(m.group(1)) not in dumps:
            seen_any = True
            head, d = read_faulthandler_file(p)
            if head.rank != int(m.group(1)):
                raise _bad(p, f"the file says rank {head.rank}")
            headers[head.rank] = head
            if d is not None:
                dumps[d.rank] = d
    if not seen_any:
        raise InputError(root, "no hang dumps (hang/rank<N>.json): was the job run with hang_timeout_s / watch()?")
    if not dumps:
        raise InputError(folder, "the hang folder holds only empty faulthandler files (no rank stalled or failed)")
    vanished = {r: h for r, h in headers.items() if r not in dumps}
    world = max((w for w in [*(d.world_size for d in dumps.values()), *(h.world_size for h in headers.values())]
                 if w), default=None)
    manifest = root / "manifest.json"
    if world is None and manifest.is_file():
        try:
            world = int(parse_bounded(json.loads, read_raw(manifest, DOCUMENT_MAX), manifest).get("world_size"))
        except (ValueError, TypeError, AttributeError, OSError, InputError):
            world = None
    return HangDumps(run_dir=str(root), dumps=dumps, world_size=world, vanished=vanished)


def has_hang_dumps(path: str | Path) -> bool:
    """The run folder holds the watchdog's dumps (``hang/rank<N>.json`` or faulthandler files)."""
    folder = Path(path) / FOLDER
    try:
        return folder.is_dir() and any(DUMP_NAME.match(p.name) or FH_NAME.match(p.name) for p in folder.iterdir())
    except OSError:
        return False


def hang_note(path: str | Path) -> str | None:
    """The note ``analyze`` adds when the run folder holds hang dumps."""
    if not has_hang_dumps(path):
        return None
    return (f"{Path(path) / FOLDER} holds hang dumps from the watchdog: run `fsdpdoctor hang {path}` for which rank "
            "stopped, where and why")
