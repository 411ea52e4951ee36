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
PLAN_PREFIX = ".fsdpdoctor-plan-"
CLAIM_NAME = ".fsdpdoctor-job"
WINDOW_PREFIX = "window-"
TRIGGER_MAX_BYTES = 4096          # a request is a few dozen bytes; anything larger is not one
MAX_WINDOW_STEPS = 1000           # a trace of more steps is too large to read back in one go

# Ranks poll the trigger file / the plan board at most this often (seconds): one stat() or one
# store round trip (~0.1 ms) per half second is < 0.1 % of the training thread.
POLL_S = 0.5
# A claim on a run folder not refreshed for this long belongs to a job that is gone
# (the coordinator refreshes it at every poll, POLL_S).
CLAIM_STALE_S = 20 * POLL_S

Reason = Literal["demand", "anomaly", "schedule"]


@dataclass
class Plan:
    seq: int
    first: int          # first profiled step (the step before it is the profiler's warm-up)
    steps: int
    why: Reason
    reason: str         # in words, for the manifest and the report
    requested: str | None = None   # when the trigger was written (UTC), for demand windows

    @property
    def last(self) -> int:
        return self.first + self.steps - 1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> "Plan":
        d = json.loads(text)
        return Plan(seq=int(d["seq"]), first=int(d["first"]), steps=int(d["steps"]), why=d["why"],
                    reason=str(d["reason"]), requested=d.get("requested"))


def window_dir(run_dir: Path, first: int) -> Path:
    return Path(run_dir) / f"{WINDOW_PREFIX}{first}"


# ---------------------------------------------------------------------------------- trigger file
def write_request(run_dir: Path, steps: int) -> Path:
    """Write ``RUN_DIR/fsdpdoctor.trigger`` atomically (a temp name of this writer, then rename)."""
    run_dir = Path(run_dir)
    path = run_dir / TRIGGER_NAME
    body = json.dumps({"fsdpdoctor_trigger": 1, "steps": int(steps), "id": uuid.uuid4().hex,
                       "requested": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n"
    tmp = run_dir / f".{TRIGGER_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "x") as fh:
            fh.write(body)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_request(path: Path) -> tuple[int | None, str | None, str | None]:
    """(steps, requested, problem) of a trigger file; steps None with a problem when it is not a valid request."""
    try:
        st = os.lstat(path)
    except OSError:
        return None, None, None
    if not stat.S_ISREG(st.st_mode):
        return None, None, "not a regular file"
    if st.st_size > TRIGGER_MAX_BYTES:
        return None, None, f"{st.st_size} bytes, not a request"
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(TRIGGER_MAX_BYTES))
    except (OSError, ValueError) as exc:
        return None, None, f"unreadable ({type(exc).__name__})"
    if not isinstance(doc, dict) or doc.get("fsdpdoctor_trigger") != 1:
        return None, None, "not an fsdpdoctor trigger"
    n = doc.get("steps")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WINDOW_STEPS:
        return None, None, f"steps must be 1..{MAX_WINDOW_STEPS}"
    req = doc.get("requested")
    return n, req if isinstance(req, str) else None, None


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

    def clear(self, last_seq: int) -> None:
        """Remove the plan files of a finished job (the store goes away with the job)."""
        if self.store is not None:
            return
        for seq in range(1, last_seq + 1):
            try:
                (self.run_dir / f"{PLAN_PREFIX}{seq}").unlink()
            except OSError:
                pass

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


def lead_steps(median_step_s: float | None) -> int:
    """Steps between the coordinator's decision and the window's warm-up step.

    Every other rank learns of the plan at its next poll (at most POLL_S later) and ranks of one job
    run within a step or two of each other (they meet in every step's collectives): the plan must
    reach them before the warm-up step, so the lead covers two poll periods in steps plus two steps.
    """
    if not median_step_s or median_step_s <= 0 or not math.isfinite(median_step_s):
        return 10
    return min(100_000, math.ceil(2 * POLL_S / median_step_s) + 2)


# ---------------------------------------------------------------------------------- anomaly rule
# A step is "slow" when it exceeds the median of the reference steps by more than
#   max(SIGMAS * robust sigma, MIN_RISE * median)     (robust sigma = 1.4826 * MAD)
# and a window opens after RUN consecutive slow steps. Measured on the reference job's healthy
# phase (docs/capture.md, "the anomaly rule"): a single step beyond 5 robust sigmas happens about once
# in 200 steps (scheduler and GC hiccups: the tail is far heavier than Gaussian) but never three in a
# row in 20,000 steps; MIN_RISE keeps a job whose steps are unusually steady from opening windows
# for changes too small to be worth a trace (a 10 % slower step).
REFERENCE_STEPS = 30
RUN = 3
SIGMAS = 5.0
MIN_RISE = 0.10


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class Reference:
    median: float
    limit: float


def reference_of(durations: list[float], min_rise: float = MIN_RISE) -> Reference:
    med = _median(durations)
    mad = _median([abs(d - med) for d in durations])
    return Reference(median=med, limit=med + max(SIGMAS * 1.4826 * mad, min_rise * med))


class AnomalyRule:
    """Consecutive slow steps against the reference of the steps before them (see above).

    ``feed`` takes the durations of the steps completed since the last poll, so the rule costs
    nothing per step; the reference is refreshed at every poll from the last REFERENCE_STEPS steps
    that are not slow, so a slowdown is judged against the behaviour before it.
    """

    def __init__(self, min_rise: float = MIN_RISE):
        self.min_rise = min_rise
        self.history: list[float] = []     # recent steps that were not slow (bounded)
        self.run: list[tuple[int, float]] = []   # the current run of slow steps (step, duration)
        self.ref: Reference | None = None

    def reset(self) -> None:
        """Forget the recent steps (after a window: the profiled steps are slower by design)."""
        self.history.clear()
        self.run.clear()
        self.ref = None

    def feed(self, first_step: int, durations: list[float]) -> str | None:
        """The reason of an anomaly when one is found among these steps, else None."""
        found = None
        for i, d in enumerate(durations):
            ref = self.ref
            if ref is not None and d > ref.limit:
                self.run.append((first_step + i, d))
                if len(self.run) >= RUN and found is None:
                    a, b = self.run[0][0], self.run[-1][0]
                    ratio = _median([x for _, x in self.run]) / ref.median if ref.median > 0 else float("inf")
                    found = (f"steps {a}-{b} took {ratio:.1f}x the median of the {len(self.history)} steps before "
                             f"({ref.median * 1e3:.1f} ms; limit {ref.limit * 1e3:.1f} ms)")
                continue
            self.run.clear()
            self.history.append(d)
            if len(self.history) > REFERENCE_STEPS:
                del self.history[0]
            if self.ref is None and len(self.history) >= REFERENCE_STEPS:
                self.ref = reference_of(self.history, self.min_rise)
        if self.history and len(self.history) >= REFERENCE_STEPS:
            self.ref = reference_of(self.history, self.min_rise)
        if found:
            self.run.clear()
        return found


# ---------------------------------------------------------------------------------- folder claim
@dataclass
class Claim:
    job: str
    host: str
    pid: int


def _read_claim(path: Path) -> tuple[Claim | None, float]:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > TRIGGER_MAX_BYTES:
            return None, st.st_mtime
        d = json.loads(path.read_bytes())
        return Claim(job=str(d["job"]), host=str(d["host"]), pid=int(d["pid"])), st.st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return None, 0.0


def live_claim(folder: Path, now: float | None = None) -> Claim | None:
    """The job that holds ``folder`` now (its coordinator refreshed the claim recently), or None."""
    claim, mtime = _read_claim(Path(folder) / CLAIM_NAME)
    if claim is None:
        return None
    return claim if (now if now is not None else time.time()) - mtime < CLAIM_STALE_S else None


def claim_folder(out_dir: Path, job: str, host: str) -> tuple[Path, Claim | None]:
    """The folder this job writes into: ``out_dir``, or ``out_dir-2``, ``-3``... when a job that is
    still running holds it. Returns (folder, the other job's claim when the folder moved)."""
    out_dir = Path(out_dir)
    other = None
    for k in range(1, 100):
        folder = out_dir if k == 1 else out_dir.with_name(f"{out_dir.name}-{k}")
        holder = live_claim(folder)
        if holder is not None and holder.job != job:
            other = other or holder
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CLAIM_NAME
        tmp = folder / f".{CLAIM_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.write_text(json.dumps(asdict(Claim(job=job, host=host, pid=os.getpid()))))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return folder, other
    return out_dir, other


def refresh_claim(folder: Path) -> None:
    try:
        os.utime(Path(folder) / CLAIM_NAME)
    except OSError:
        pass


def release_claim(folder: Path, job: str) -> None:
    claim, _ = _read_claim(Path(folder) / CLAIM_NAME)
    if claim is not None and claim.job == job:
        try:
            (Path(folder) / CLAIM_NAME).unlink()
        except OSError:
            pass
