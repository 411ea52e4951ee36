"""Which job owns a run folder: its coordinator (rank 0) holds ``RUN_DIR/.fsdpdoctor-job`` for as
long as it runs, refreshing its time at every poll; another job aimed at the folder moves aside to
``RUN_DIR-2``, ``-3``... with a warning.

The claim is taken by an exclusive create (a complete file hard-linked to the claim's name, which
fails when that name exists; ``O_EXCL`` where links are not supported), never by a look followed by a
write: of jobs that start at the same instant, exactly one owns the folder. A claim not refreshed for
``CLAIM_STALE_S`` belongs to a job that is gone and is taken over: it is first renamed to a name of the
taker's own, which only one taker can do, and put back if what was moved turns out to be fresh.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from fsdpdoctor.capture.windows import POLL_S, TRIGGER_MAX_BYTES

CLAIM_NAME = ".fsdpdoctor-job"
# A claim not refreshed for this long belongs to a job that is gone (the coordinator refreshes it at every poll).
CLAIM_STALE_S = 20 * POLL_S
MAX_FOLDERS = 99


@dataclass
class Claim:
    job: str
    host: str
    pid: int


def _read_claim(path: Path) -> tuple[Claim | None, float]:
    """(the claim, its age in seconds); an unreadable claim (being written, or not ours) has claim None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None, float("inf")
    age = time.time() - st.st_mtime
    if not stat.S_ISREG(st.st_mode) or st.st_size > TRIGGER_MAX_BYTES:
        return None, age
    try:
        d = json.loads(path.read_bytes())
        return Claim(job=str(d["job"]), host=str(d["host"]), pid=int(d["pid"])), age
    except (OSError, ValueError, KeyError, TypeError):
        return None, age


def live_claim(folder: Path) -> Claim | None:
    """The job that holds ``folder`` now (its coordinator refreshed the claim recently), or None."""
    claim, age = _read_claim(Path(folder) / CLAIM_NAME)
    return claim if claim is not None and age < CLAIM_STALE_S else None


def _create_exclusive(path: Path, body: str) -> bool:
    """Create ``path`` holding ``body`` unless it exists; True when this call created it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(body)
        try:
            os.link(tmp, path)       # atomic, fails if the name exists, and the file is whole when it appears
            return True
        except FileExistsError:
            return False
        except OSError:              # no hard links on this file system: an exclusive create
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as fh:
                fh.write(body)
            return True
    finally:
        tmp.unlink(missing_ok=True)


def _take_stale(path: Path) -> None:
    """Move a stale claim out of the way; of several takers only one rename succeeds. What was moved is
    put back when it is fresh after all (another taker's new claim slipped in between)."""
    aside = path.with_name(f".{path.name}.stale.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except OSError:
        return
    try:
        _, age = _read_claim(aside)
        if age < CLAIM_STALE_S:
            try:
                os.link(aside, path)
            except OSError:
                pass
    finally:
        aside.unlink(missing_ok=True)


def _try_claim(folder: Path, body: str, job: str) -> tuple[bool, Claim | None]:
    """(owned, the holder when not owned) for one folder."""
    path = folder / CLAIM_NAME
    for _ in range(3):
        if _create_exclusive(path, body):
            return True, None
        holder, age = _read_claim(path)
        if holder is not None and holder.job == job:
            return True, None
        if age < CLAIM_STALE_S:      # held (an unreadable fresh claim is one being written: held too)
            return False, holder or Claim(job="?", host="?", pid=0)
        _take_stale(path)
    return False, Claim(job="?", host="?", pid=0)


def claim_folder(out_dir: Path, job: str, host: str) -> tuple[Path, Claim | None]:
    """The folder this job writes into: ``out_dir``, or ``out_dir-2``, ``-3``... when a job that is
    still running holds it. Returns (folder, the other job's claim when the folder moved)."""
    out_dir = Path(out_dir)
    body = json.dumps(asdict(Claim(job=job, host=host, pid=os.getpid())))
    other = None
    for k in range(1, MAX_FOLDERS + 1):
        folder = out_dir if k == 1 else out_dir.with_name(f"{out_dir.name}-{k}")
        folder.mkdir(parents=True, exist_ok=True)
        owned, holder = _try_claim(folder, body, job)
        if owned:
            return folder, other
        other = other or holder
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
