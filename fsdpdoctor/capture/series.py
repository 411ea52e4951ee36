"""The step series: every step of every rank, for the whole run (``RUN_DIR/steps/rank<N>.steps``).

Format (docs/capture.md), little-endian, append-only so that a killed job leaves every record
flushed before it died:

* header, 40 bytes: ``b"FDSTEPS1"``, rank (u32), world size (u32), wall clock of the series'
  origin in ns since the epoch (i64), pid (u32), 12 reserved bytes;
* then one 20-byte record per step: step number (u32), start in ns since the origin (u64),
  duration in us (u32), time spent waiting for the batch in us (u32; ``NO_WAIT`` when unknown).

A file whose size is not the header plus a whole number of records was cut mid-write: the
reader keeps the whole records and says so. Pure Python, no torch: the CLI reads it too.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"FDSTEPS1"
HEADER = struct.Struct("<8sIIqI12x")
RECORD = struct.Struct("<IQII")
NO_WAIT = 0xFFFFFFFF
U32_MAX = 0xFFFFFFFF
SERIES_DIR = "steps"
SUFFIX = ".steps"
# a series file larger than this is not one we wrote (40 years of 1 ms steps is far below it)
MAX_BYTES = 1 << 34


def series_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / SERIES_DIR / f"rank{rank}{SUFFIX}"


def encode_header(rank: int, world: int, origin_unix_ns: int, pid: int) -> bytes:
    return HEADER.pack(MAGIC, rank, world, origin_unix_ns, pid & U32_MAX)


_RECORD_DTYPE = [("step", "<u4"), ("start", "<u8"), ("dur", "<u4"), ("wait", "<u4")]


def encode_records(first_step: int, ends_ns: list[int], prev_end_ns: int, origin_ns: int,
                   waits_us: dict[int, int]) -> bytes:
    """Records of steps ``first_step ..``: step k runs from the previous step's end to ``ends_ns[k]``
    (clock readings in ns, ``origin_ns`` being the series' origin). Vectorised: a flush of a thousand
    fast steps costs microseconds, not a Python loop per step."""
    import numpy as np

    n = len(ends_ns)
    ends = np.asarray(ends_ns, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = prev_end_ns
    starts[1:] = ends[:-1]
    rec = np.empty(n, dtype=_RECORD_DTYPE)
    rec["step"] = (np.arange(first_step, first_step + n, dtype=np.int64) & U32_MAX).astype(np.uint32)
    rec["start"] = np.maximum(starts - origin_ns, 0).astype(np.uint64)
    rec["dur"] = np.minimum(np.maximum(ends - starts, 0) // 1000, U32_MAX - 1).astype(np.uint32)
    rec["wait"] = NO_WAIT
    for step, us in waits_us.items():
        if first_step <= step < first_step + n:
            rec["wait"][step - first_step] = min(U32_MAX - 1, max(0, us))
    return rec.tobytes()


@dataclass
class StepSeries:
    """One rank's series as read back."""

    rank: int
    world_size: int
    origin_unix_s: float
    pid: int
    steps: list[int] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)      # since the origin
    duration_s: list[float] = field(default_factory=list)
    wait_s: list[float | None] = field(default_factory=list)
    cut: bool = False     # the file ends inside a record (the writer was stopped mid-write)
    dropped: int = 0      # records out of the writer's sequence, left out (a damaged or doubled file)


def read_series(path: Path) -> StepSeries:
    """Read one series file. Raises ValueError (one line) when it is not one."""
    p = Path(path)
    st = p.stat()
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p.name}: not a regular file")
    if st.st_size > MAX_BYTES:
        raise ValueError(f"{p.name}: {st.st_size} bytes, larger than any step series")
    with open(p, "rb") as fh:
        data = fh.read(min(os.fstat(fh.fileno()).st_size, MAX_BYTES))  # a buffer of the file's size, not 16 GiB
    if len(data) < HEADER.size:
        raise ValueError(f"{p.name}: too short for a step-series header")
    magic, rank, world, origin_ns, pid = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError(f"{p.name}: not a step series (no {MAGIC.decode()} header)")
    named = p.name[len("rank"):-len(SUFFIX)] if p.name.startswith("rank") and p.name.endswith(SUFFIX) else ""
    if named.isascii() and named.isdigit() and int(named) != rank:   # the writer names it by its rank
        raise ValueError(f"{p.name}: the header says rank {rank} (a copy of another rank's series?)")
    body = len(data) - HEADER.size
    n = body // RECORD.size
    s = StepSeries(rank=rank, world_size=world, origin_unix_s=origin_ns / 1e9, pid=pid, cut=bool(body % RECORD.size))
    records = list(RECORD.iter_unpack(memoryview(data)[HEADER.size:HEADER.size + n * RECORD.size]))
    # the writer numbers its records one step apart, each starting where the previous one ended
    # (coordinator._flush): record k is step first + k for the first step that most records agree on. A
    # record off that sequence, or starting before the one kept before it, was not written as it reads
    # (a damaged or doubled file): it is left out and counted, never plotted or measured
    offsets = Counter(rec[0] - k for k, rec in enumerate(records))
    first = offsets.most_common(1)[0][0] if offsets else 0
    last_start = -1
    for k, (step, start_ns, dur_us, wait_us) in enumerate(records):
        if step != first + k or start_ns < last_start:
            s.dropped += 1
            continue
        last_start = start_ns
        s.steps.append(step)
        s.start_s.append(start_ns / 1e9)
        s.duration_s.append(dur_us / 1e6)
        s.wait_s.append(None if wait_us == NO_WAIT else wait_us / 1e6)
    return s


def series_files(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / SERIES_DIR
    try:
        return sorted((p for p in d.iterdir() if p.name.startswith("rank") and p.name.endswith(SUFFIX)),
                      key=lambda p: (len(p.name), p.name))
    except OSError:
        return []


class SeriesWriter:
    """Appends records to one rank's file; every failure is swallowed (the caller warns once)."""

    def __init__(self, path: Path, rank: int, world: int, origin_unix_ns: int):
        self.path = path
        self._fd: int | None = None
        self.failed: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a rerun into the same folder starts the series afresh, as its traces replace the old ones
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
            self._write(encode_header(rank, world, origin_unix_ns, os.getpid()))
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = f"{self.path}: {exc.strerror or exc}"
        self.close()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def append(self, data: bytes) -> bool:
        if self._fd is None or not data:
            return self._fd is not None
        try:
            self._write(data)
            return True
        except OSError as exc:  # a full disk: stop writing, keep what is there (whole records or a cut one)
            self._fail(exc)
            return False

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
