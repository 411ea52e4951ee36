"""What the per-rank map hands to the cross-rank reduce: a compact, serialisable summary.

``RankResult`` holds everything cross-rank work needs (step windows, per-step breakdown,
every collective with its process group, sequence number, issue/start/end and size,
host syncs, data-loader facts, prefetch and DDP counts), so the reduce never sees a
rank's event tables. It is msgspec-encoded to ``<trace>.summary.msgpack`` beside the
trace, stamped with the trace's size and mtime and ``ANALYSIS_VERSION``.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from fsdpdoctor.results import (
    Collective, DataLoaderInfo, DialectTraits, GpuIdle, HostSync, OffloadInfo, RankDataQuality, RankSetup, RankSummary,
    RecomputeInfo,
)
from fsdpdoctor.trace.identity import RankIdentity

# Bump whenever what analyze_rank computes changes: older summaries are then rebuilt from the traces.
ANALYSIS_VERSION = "5"
SUMMARY_SUFFIX = ".summary.msgpack"


class TraceStamp(msgspec.Struct, frozen=True):
    """Identity of a trace file a summary was made from, checked without parsing it: size, plus
    mtime or the file's last 16 bytes (a gzip member ends with the CRC32 and length of its content,
    so a copy that did not keep the mtime is still recognised)."""

    path: str
    size: int
    mtime_ns: int
    tail: str = ""

    @classmethod
    def of(cls, path: Path) -> "TraceStamp":
        st = os.stat(path)
        return cls(path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns, tail=_tail(path, st.st_size))

    def current(self, path: Path) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != self.size:
            return False
        return st.st_mtime_ns == self.mtime_ns or (bool(self.tail) and _tail(path, st.st_size) == self.tail)


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(size - 16, 0))
            return f.read(16).hex()
    except OSError:
        return ""


class Window(msgspec.Struct, array_like=True):
    step: int | None
    start: float
    end: float


class PrefetchCounts(msgspec.Struct):
    """FSDP prefetch facts only the rank's own tables can tell."""

    framework: str | None = None        # "fsdp1", "fsdp2" from annotations or frames
    annotations: int = 0                # prefetch annotations seen
    empty_annotations: int = 0          # ... that enclose no all-gather issue
    explicit_backward: bool = False     # FSDP2 backward prefetch outside pre_backward (explicit lists)


class DdpCounts(msgspec.Struct):
    """DDP structure on one rank, summed over its analysed steps."""

    forward_annotations: int = 0        # DistributedDataParallel.forward
    reducer_ops: int = 0                # reducer:: / reducer. cpu ops
    reducer_events: int = 0             # any event named reducer:: (tells DDP without annotations)
    search_unused: int = 0
    search_unused_us: float = 0.0
    grads_accumulated: int = 0
    bucket_copies: int = 0
    backward_passes: int = 0
    backward_passes_with_allreduce: int = 0
    allreduce_busy_us: float = 0.0      # all-reduces of analysed steps
    allreduce_after_backward_us: float = 0.0


class WorkCounts(msgspec.Struct):
    """How much work one rank's steps hold, per step: what tells a rank given more work (longer
    sequences, uneven shards) from one doing the same work slower."""

    ops: float = 0.0                    # torch ops on the main thread
    kernels: float = 0.0                # device kernels started in the step
    input_elems: float | None = None    # elements of the first input of model-level ops (None: no shapes)
    shaped_ops: float = 0.0             # model-level ops with recorded shapes


class RankResult(msgspec.Struct):
    """One rank, analysed: the unit the map produces and the reduce consumes."""

    rank: int
    rank_source: str                    # "distributedInfo", "file name" or "default"
    files: list[TraceStamp]
    dialect: str                        # Dialect.name
    family: str                         # "gpu" / "cpu"
    traits: DialectTraits
    world_size: int | None
    backend: str | None
    host: str | None
    device: str | None
    has_stacks: bool
    steps_filter: list[int] | None      # the --steps it was made for (None: all)
    windows: list[Window]
    summary: RankSummary
    collectives: list[Collective]
    dialect_note: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    backward_end: dict[int, float] = msgspec.field(default_factory=dict)
    host_syncs: list[HostSync] = msgspec.field(default_factory=list)
    sleep_source: str | None = None
    dataloader: DataLoaderInfo | None = None
    prefetch: PrefetchCounts = msgspec.field(default_factory=PrefetchCounts)
    ddp: DdpCounts = msgspec.field(default_factory=DdpCounts)
    param_dtype: str | None = None      # model dtype assumed for collectives recorded without one
    skipped: bool = False               # none of the requested steps is in the trace
    available_steps: list[int] = msgspec.field(default_factory=list)  # a skipped rank's steps, to say so
    setup: RankSetup | None = None      # backend, process groups, wrapper: what setup faults are judged on
    gpu_idle: GpuIdle | None = None     # device-timeline dialects only
    recompute: RecomputeInfo | None = None
    offload: OffloadInfo | None = None
    user_frames: dict[str, float] = msgspec.field(default_factory=dict)  # user frame -> inclusive us per step
    work: WorkCounts | None = None      # ops, kernels and input sizes per step (stragglers: more work or slower)
    quality: RankDataQuality | None = None   # what the loader dropped from this rank's file(s)
    identity: RankIdentity | None = None     # what the one-job checks compare across ranks
    analysis_version: str = ANALYSIS_VERSION


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RankResult)


def encode(r: RankResult) -> bytes:
    return _encoder.encode(r)


def decode(data: bytes) -> RankResult:
    return _decoder.decode(data)


def summary_path(trace_path: Path) -> Path:
    """``rank3.json.gz`` -> ``rank3.summary.msgpack`` (same folder)."""
    name = trace_path.name
    for ext in (".json.gz", ".json"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return trace_path.with_name(name + SUMMARY_SUFFIX)


def write(r: RankResult, path: Path) -> None:
    """Atomic: a reader never sees half a summary; a failed write (a full disk) leaves no temp file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(encode(r))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_current(trace_path: Path) -> RankResult | None:
    """The summary beside ``trace_path`` if it was made from this very file by this analysis version."""
    sp = summary_path(trace_path)
    try:
        r = decode(sp.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if r.analysis_version != ANALYSIS_VERSION or r.steps_filter is not None or len(r.files) != 1:
        return None
    if Path(r.files[0].path).name != trace_path.name or not r.files[0].current(trace_path):
        return None
    return r
