"""One rank's trace as columns: the form every analysis reads.

Kineto traces hold 10^4..10^6 complete ("X") events. We keep them as numpy
columns (name id, category, start, duration, track) and keep ``args`` only for
the few events whose arguments we read (collectives, kernels' comm metadata),
which keeps memory small and the analyses vectorised.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from struct import error as StructError, pack_into
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fsdpdoctor.results import InputKind, RankDataQuality

# Category codes. Old (2021) traces spell them "Operator", "Kernel", "Runtime"...
CPU_OP, ANNOTATION, PYFUNC, KERNEL, MEMCPY, MEMSET, RUNTIME, GPU_ANNOTATION, OTHER = range(9)
CATEGORY_NAMES = ["cpu_op", "user_annotation", "python_function", "kernel", "gpu_memcpy",
                  "gpu_memset", "cuda_runtime", "gpu_user_annotation", "other"]
_CATEGORY_CODES = {
    "cpu_op": CPU_OP, "operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "python_function": PYFUNC,
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY, "memcpy": MEMCPY,
    "gpu_memset": MEMSET, "memset": MEMSET,
    "cuda_runtime": RUNTIME, "runtime": RUNTIME, "cuda_driver": RUNTIME,
    # Intel XPU's Kineto plug-in writes its kernels as "kernel" and their launches (SYCL/Level-Zero) here
    "xpu_runtime": RUNTIME, "xpu_driver": RUNTIME,
    "gpu_user_annotation": GPU_ANNOTATION,
}
DEVICE_CATEGORIES = (KERNEL, MEMCPY, MEMSET)
# the categories other accelerators' profiler plug-ins write their events under (Meta MTIA:
# mtia_ccp_events, mtia_runtime; Intel XPU, Habana HPU / Gaudi, Ascend NPU, PrivateUse1 backends...):
# their runtime/driver calls are runtime calls, the rest device spans; trace/kind.py checks that shape
# (spans on a device's own tracks) and names the device, or sets them back to OTHER as not read
ACCELERATOR = re.compile(r"^(mtia|xpu|hpu|habana|gaudi|npu|ascend|privateuse1|mlu|gcu)(?:[_ :-]|$)", re.I)
_ACCELERATOR_RUNTIME = re.compile(r"[_ :-](runtime|driver|api)$", re.I)
# _rows_of_ids: up to this many names, their rows come from the per-name index (a slice per name)
_INDEXED_IDS_MAX = 64


def distinct(indexes: np.ndarray) -> np.ndarray:
    """The distinct values of an array of small non-negative indexes (tracks, name ids), sorted.
    By ``bincount``, not ``np.unique``: its first call imports ``numpy.ma``, 15-25 ms a process."""
    return np.flatnonzero(np.bincount(np.asarray(indexes, dtype=np.int64)))


def in_set(indexes: np.ndarray, members, size: int) -> np.ndarray:
    """``np.isin`` for small non-negative indexes below ``size`` (name ids, category codes): one lookup
    in a table of ``size`` flags, not a sort of the column (a tenth of the time on 68 k rows)."""
    table = np.zeros(size, dtype=bool)
    members = np.asarray(members, dtype=np.int64).ravel()
    table[members[(members >= 0) & (members < size)]] = True
    return table[indexes]


def packed(values, code: str, dtype) -> np.ndarray:
    """``values`` (a sequence) as a new array, written by ``struct`` in C: per value a few conversions,
    not numpy's type discovery and packing of each object (``np.array``/``np.fromiter`` of a list);
    raises struct.error for a value that is not a number of that kind."""
    out = np.empty(len(values), dtype=dtype)
    pack_into(f"{len(values)}{code}", out, 0, *values)
    return out


def packed_int32(values) -> np.ndarray:
    return packed(values, "i", np.int32)


def float64_column(values: list, none) -> np.ndarray:
    """Times as doubles (``packed``); what it refuses (None, text) converted by numpy as before: None as
    ``none`` (NaN when that is None), text parsed."""
    try:
        return packed(values, "d", np.float64)
    except StructError:
        return np.array([none if v is None else v for v in values] if none is not None else values,
                        dtype=np.float64)


def category_code(cat) -> int:
    if not cat:
        return OTHER
    code = _CATEGORY_CODES.get(cat)
    if code is None:
        code = _CATEGORY_CODES.get(str(cat).lower(), OTHER)
        if code == OTHER and ACCELERATOR.match(str(cat)):
            code = RUNTIME if _ACCELERATOR_RUNTIME.search(str(cat)) else KERNEL
    return code


@dataclass(slots=True)
class Track:
    """A timeline: a CPU thread or a GPU stream."""

    pid: object
    tid: object
    name: str = ""
    is_device: bool = False
    n_events: int = 0
    process: str = ""   # its process's name and labels ("Ascend Hardware", "NPU"...): trace/kind.py reads them


@dataclass(slots=True)
class RankTrace:
    """Everything fsdpdoctor keeps of one rank's trace file."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    host: str | None
    device_name: str | None
    names: list[str]
    name_id: np.ndarray      # int32 index into names
    cat: np.ndarray          # int8 category code
    ts: np.ndarray           # float64 start, microseconds
    dur: np.ndarray          # float64 duration, microseconds
    track: np.ndarray        # int32 index into tracks
    corr: np.ndarray         # int64 correlation id (kernels/runtime), -1 when absent
    tracks: list[Track]
    args: dict[int, dict]    # row -> args, only for rows whose args we read
    has_stacks: bool
    format: str              # "kineto" or "event-list"
    rank_source: str         # "distributedInfo", "file name" or "default"
    distributed_info: dict = field(default_factory=dict)
    # the allocator samples ([memory] instants): (phase, ts, raw args, MemoryArgs); as the profiler
    # wrote them: loader.allocator_samples
    memory_events: list[tuple] = field(default_factory=list)
    unreadable_events: int = 0   # complete events skipped because a field could not be read (ill-typed)
    quality: RankDataQuality | None = None   # what trace/quality.py dropped from this file
    base_time_ns: int | None = None            # baseTimeNanoseconds: ts + base = wall clock (job identity)
    # the capture's schedstat of the training thread over the recorded steps (capture/profiling.py):
    # wall_us, on_cpu_us, runqueue_us, cpus; None in traces not written by fsdpdoctor.capture
    cpu_share: dict | None = None
    # profiler cycles joined into this table (one file each): (first start, last end) per cycle, in time order;
    # empty for one file. A step never spans two of them: the time between cycles was not recorded
    cycles: list[tuple[float, float]] = field(default_factory=list)
    categories: dict[str, int] = field(default_factory=dict)  # complete events per category as written
    kind: InputKind | None = None  # what this file is (trace/kind.py), decided once when it is read
    _sorted_names: tuple | None = field(default=None, repr=False, compare=False)  # ids_with_prefix's index
    _ids_by_cat: dict | None = field(default=None, repr=False, compare=False)      # ids_in_categories' cache
    _rows_by_id: tuple | None = field(default=None, repr=False, compare=False)     # _rows_of_ids' index

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def n_events(self) -> int:
        return len(self.ts)

    def ids_of(self, predicate) -> np.ndarray:
        """Name ids whose string satisfies ``predicate`` (evaluated once per distinct name)."""
        return np.fromiter((i for i, n in enumerate(self.names) if predicate(n)), dtype=np.int32)

    def ids_with_prefix(self, prefix: str | tuple[str, ...]) -> np.ndarray:
        """Name ids starting with ``prefix`` (or any of a tuple), sorted: a binary search over the
        sorted names instead of a test of every name (an analysis asks this ~40 times per rank)."""
        if self._sorted_names is None or self._sorted_names[2] is not self.names:
            order = sorted(range(len(self.names)), key=self.names.__getitem__)
            self._sorted_names = ([self.names[i] for i in order], np.asarray(order, dtype=np.int32), self.names)
        keys, order, _ = self._sorted_names
        parts = []
        for p in ((prefix,) if isinstance(prefix, str) else prefix):
            lo = bisect_left(keys, p)
            hi = lo
            while hi < len(keys) and keys[hi].startswith(p):
                hi += 1
            parts.append(order[lo:hi])
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty(0, np.int32)
        return np.array(sorted(set(ids.tolist())), dtype=np.int32) if len(parts) > 1 else np.sort(ids)

    def rows_with_prefix(self, prefix: str | tuple[str, ...], cat: int | tuple[int, ...] | None = None) -> np.ndarray:
        """``rows_named`` for a name prefix."""
        return self._rows_of_ids(self.ids_with_prefix(prefix), cat)

    def rows_named(self, predicate, cat: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Row indices (sorted by start) of events whose name satisfies ``predicate``."""
        if cat is None:
            return self._rows_of_ids(self.ids_of(predicate), cat)
        # test only the names that occur in those categories (python frames are most names of a
        # trace with stacks, and most queries ask for operators or annotations)
        names = self.names
        ids = np.fromiter((i for i in self.ids_in_categories(cat).tolist() if predicate(names[i])), dtype=np.int32)
        return self._rows_of_ids(ids, cat)

    def ids_in_categories(self, cat: int | tuple[int, ...]) -> np.ndarray:
        """Name ids of the events of these categories."""
        key = cat if isinstance(cat, tuple) else (cat,)
        if self._ids_by_cat is None:
            self._ids_by_cat = {}
        got = self._ids_by_cat.get(key)
        if got is None:
            got = self._ids_by_cat[key] = distinct(self.name_id[in_set(self.cat, key, len(CATEGORY_NAMES))])
        return got

    def _rows_of_ids(self, ids: np.ndarray, cat) -> np.ndarray:
        """Rows with these name ids (and categories), sorted by start. The rows of each name come from
        one index (rows grouped by name id, built on first use): an analysis asks ~35 times per rank,
        and a test of every row's id cost ~0.1 ms per question on 27 k rows."""
        if len(ids) == 0:
            return np.empty(0, dtype=np.int64)
        if len(ids) > _INDEXED_IDS_MAX:  # many names (all user frames...): one test of every row is cheaper
            rows = np.nonzero(in_set(self.name_id, ids, len(self.names)))[0]
        else:
            if self._rows_by_id is None or self._rows_by_id[2] is not self.name_id:
                order = np.argsort(self.name_id, kind="stable")
                bounds = np.searchsorted(self.name_id[order], np.arange(len(self.names) + 1))
                self._rows_by_id = (order, bounds, self.name_id)
            order, bounds, _ = self._rows_by_id
            parts = [order[bounds[i]:bounds[i + 1]] for i in sorted(set(np.asarray(ids).tolist()))
                     if 0 <= i < len(self.names)]
            rows = np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        if cat is not None and len(rows):
            rows = rows[in_set(self.cat[rows], cat, len(CATEGORY_NAMES))]
        rows = rows.astype(np.int64, copy=False)
        return rows[np.argsort(self.ts[rows], kind="stable")]

    def name(self, row: int) -> str:
        return self.names[self.name_id[row]]

    def device_tracks(self) -> list[int]:
        return [i for i, t in enumerate(self.tracks) if t.is_device]
