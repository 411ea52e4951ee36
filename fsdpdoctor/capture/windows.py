"""Windows on demand and on anomaly: how the ranks agree on which steps to profile.

One rank (the coordinator, rank 0) decides: it reads the trigger file that ``fsdpdoctor trigger``
writes (``RUN_DIR/fsdpdoctor.trigger``) and, with ``auto=True``, watches its own step times. A decision
is a *plan* (sequence number, first step, number of steps, reason) published through the process
group's key-value store (a file in the run folder without one); every rank polls for the next
sequence number at a bounded rate and profiles exactly those steps. No collective is involved:
a rank that is gone or late never makes another wait.

Pure Python (no torch): ``fsdpdoctor trigger`` writes the request with :func:`write_request`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

# none of these names ends in .json: a run folder's .json files are traces to the loader
TRIGGER_NAME = "fsdpdoctor.trigger"
REJECTED_SUFFIX = ".rejected"
TAKEN_NAME = ".fsdpdoctor-trigger.taken"   # requests taken that the job could not remove
PLAN_PREFIX = ".fsdpdoctor-plan-"
PART_WRITTEN = "written"          # a rank's report on a window whose trace it wrote
WINDOW_PREFIX = "window-"
TRIGGER_MAX_BYTES = 4096          # a request is a few dozen bytes; anything larger is not one
MAX_WINDOW_STEPS = 1000           # a trace of more steps is too large to read back in one go

# Ranks poll the trigger file / the plan board at most this often (seconds): one stat() or one
# store round trip (~0.1 ms) per half second is < 0.1 % of the training thread.
POLL_S = 0.5

Reason = Literal["demand", "anomaly", "schedule"]


@dataclass
class Plan:
    seq: int
    first: int          # first profiled step (the step before it is the profiler's warm-up)
    steps: int
    why: Reason
    reason: str         # in words, for the manifest and the report
    requested: str | None = None   # when the trigger was written (UTC), for demand windows
    decided_step: int | None = None   # the coordinator's step count when it decided
    decided_unix: float | None = None  # and its wall clock then

    @property
    def last(self) -> int:
        return self.first + self.steps - 1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> Plan:
        d = json.loads(text)
        return Plan(seq=int(d["seq"]), first=int(d["first"]), steps=int(d["steps"]), why=d["why"],
                    reason=str(d["reason"]), requested=d.get("requested"), decided_step=d.get("decided_step"),
                    decided_unix=d.get("decided_unix"))


def window_dir(run_dir: Path, first: int) -> Path:
    return Path(run_dir) / f"{WINDOW_PREFIX}{first}"


# ---------------------------------------------------------------------------------- trigger file
@dataclass
class Request:
    steps: int
    requested: str | None
    id: str | None


def write_request(run_dir: Path, steps: int, *, replace: bool = False) -> Path:
    """Write ``RUN_DIR/fsdpdoctor.trigger``, whole when it appears. Unless ``replace``, only where no
    request is there: of two callers at the same instant one gets FileExistsError, so no request is
    dropped while its caller is told it will be taken."""
    run_dir = Path(run_dir)
    path = run_dir / TRIGGER_NAME
    body = json.dumps({"fsdpdoctor_trigger": 1, "steps": int(steps), "id": uuid.uuid4().hex,
                       "requested": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n"
    tmp = run_dir / f".{TRIGGER_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "x") as fh:
            fh.write(body)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)   # fails with FileExistsError when a request is there
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_request(path: Path) -> tuple[Request | None, str | None]:
    """(the request, None), or (None, the problem) when the file is not a valid request, or (None, None)
    when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    if st.st_size > TRIGGER_MAX_BYTES:
        return None, f"{st.st_size} bytes, not a request"
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(TRIGGER_MAX_BYTES))
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    if not isinstance(doc, dict) or doc.get("fsdpdoctor_trigger") != 1:
        return None, "not an fsdpdoctor trigger"
    n = doc.get("steps")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WINDOW_STEPS:
        return None, f"steps must be 1..{MAX_WINDOW_STEPS}"
    req, rid = doc.get("requested"), doc.get("id")
    return Request(n, req if isinstance(req, str) else None, rid if isinstance(rid, str) else None), None


def request_key(path: Path, request: Request | None) -> str:
    """What names one request for the job: its id, or for a file without one, its inode and time."""
    if request is not None and request.id:
        return request.id
    try:
        st = os.lstat(path)
        return f"file:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
    except OSError:
        return "file:gone"


def read_taken(run_dir: Path) -> set[str]:
    """Requests the running job took but could not remove (``RUN_DIR/.fsdpdoctor-trigger.taken``)."""
    try:
        doc = json.loads((Path(run_dir) / TAKEN_NAME).read_bytes()[:TRIGGER_MAX_BYTES * 4])
        return {str(k) for k in doc.get("taken", [])}
    except (OSError, ValueError, AttributeError, TypeError):
        return set()


def forget_taken(run_dir: Path) -> None:
    """At the job's end: the record goes once no request it names is left (a later job reads it at start,
    so that a request nobody can remove is not taken by every job that comes)."""
    request, _ = read_request(Path(run_dir) / TRIGGER_NAME)
    if request is None or request_key(Path(run_dir) / TRIGGER_NAME, request) not in read_taken(run_dir):
        try:
            (Path(run_dir) / TAKEN_NAME).unlink()
        except OSError:
            pass


def write_taken(run_dir: Path, keys: list[str]) -> None:
    path = Path(run_dir) / TAKEN_NAME
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"taken": keys[-16:]}))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------- plan board
class Board:
    """Where the coordinator publishes plans and the other ranks look for them."""

    def __init__(self, run_dir: Path, store=None):
        self.run_dir = Path(run_dir)
        self.store = store
        self._key = f"fsdpdoctor.capture/{os.path.abspath(run_dir)}/plan/"

    def publish(self, plan: Plan) -> None:
        if self.store is not None:
            self.store.set(self._key + str(plan.seq), plan.to_json())
            return
        path = self.run_dir / f"{PLAN_PREFIX}{plan.seq}"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(plan.to_json())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def clear(self, last_seq: int, ranks: range | list[int] = ()) -> None:
        """Remove the plan files (and the ranks' reports on them) of a finished job (the store goes away
        with the job)."""
        if self.store is not None:
            return
        for seq in range(1, last_seq + 1):
            for path in [self.run_dir / f"{PLAN_PREFIX}{seq}", *(self._part_path(seq, r) for r in ranks)]:
                try:
                    path.unlink()
                except OSError:
                    pass

    # A rank's part in a window, for the rank that writes its manifest: PART_WRITTEN, or why its trace
    # is missing (a manifest lists only the files that are on disk).
    def _part_path(self, seq: int, rank: int) -> Path:
        return self.run_dir / f"{PLAN_PREFIX}{seq}.rank{rank}"

    def report_part(self, seq: int, rank: int, status: str) -> None:
        if self.store is not None:
            self.store.set(f"{self._key}{seq}/part/{rank}", status)
            return
        path = self._part_path(seq, rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(status)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def parts(self, seq: int, ranks: list[int], one_by_one: bool = False) -> dict[int, str]:
        """The reports of ``ranks`` on plan ``seq`` that have arrived. Through the store, one round trip
        when all have (``one_by_one``: a round trip per rank, to name those that have not)."""
        if self.store is not None:
            keys = [f"{self._key}{seq}/part/{r}" for r in ranks]
            if keys and self.store.check(keys):
                return {r: v.decode(errors="replace") for r, v in zip(ranks, self.store.multi_get(keys))}
            if not one_by_one:
                return {}
            return {r: self.store.get(k).decode(errors="replace") for r, k in zip(ranks, keys) if self.store.check([k])}
        got = {}
        for r in ranks:
            try:
                got[r] = self._part_path(seq, r).read_bytes()[:TRIGGER_MAX_BYTES].decode(errors="replace")
            except OSError:
                pass
        return got

    def read(self, seq: int) -> Plan | None:
        if self.store is not None:
            key = self._key + str(seq)
            if not self.store.check([key]):
                return None
            return Plan.from_json(self.store.get(key))
        path = self.run_dir / f"{PLAN_PREFIX}{seq}"
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            return Plan.from_json(path.read_bytes()[:TRIGGER_MAX_BYTES])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def lead_steps(step_s: float | None) -> int:
    """Steps between the coordinator's decision and the window's first profiled step.

    Every other rank polls the board every POLL_S, at the end of a step: it learns of a plan at most
    POLL_S plus one step after it was published. Ranks of one job run within a step of each other (they
    meet in every step's collectives), and the step before the window is the profiler's warm-up. So the
    lead covers 1.5 poll periods (half of one as margin for a late poll on a loaded host) in steps of
    the time they take now (``step_s``: during a slowdown, the slow steps), plus three steps.
    """
    if not step_s or step_s <= 0 or not math.isfinite(step_s):
        return 10
    return min(100_000, math.ceil(1.5 * POLL_S / step_s) + 3)
