"""What the per-rank map hands to the cross-rank reduce: a compact, serialisable summary.

``RankResult`` holds everything cross-rank work needs (step windows, per-step breakdown,
every collective with its process group, sequence number, issue/start/end and size,
host syncs, data-loader facts, prefetch and DDP counts), so the reduce never sees a
rank's event tables. It is msgspec-encoded to ``<trace>.summary.msgpack`` beside the
trace, with a hash of its content, stamped with the trace's identity (``TraceStamp``) and
``ANALYSIS_VERSION``.
"""

# Annotations are objects, not text: see results/analysis.py (the decoder of RankResult reads them all).

import os
import stat
from hashlib import blake2b
from pathlib import Path

import msgspec

from fsdpdoctor.results import (
    Collective, DataLoaderInfo, DialectTraits, GpuIdle, HostSync, OffloadInfo, RankDataQuality, RankSetup, RankSummary,
    RecomputeInfo,
)
from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.identity import RankIdentity
from fsdpdoctor.trace.io import read_raw, shown, write_atomic

# Bump whenever what analyze_rank computes changes: older summaries are then rebuilt from the traces.
ANALYSIS_VERSION = "16"
SUMMARY_SUFFIX = ".summary.msgpack"


class TraceStamp(msgspec.Struct, frozen=True):
    """Identity of a trace file a summary was made from, checked without parsing it: its size and a
    digest of its first and last ``_SAMPLE`` bytes. The head holds the trace's own metadata (base time,
    distributed info) and the first events, so a summary of another recording does not match even when
    size and mtime were made to; a gzip file ends with the CRC32 and length of its whole content, so
    any change to a gzip trace changes the digest and a copy that did not keep the mtime still
    matches. A plain JSON file's middle is not sampled: its mtime must match as well."""

    path: str
    size: int
    mtime_ns: int
    sample: str = ""

    @classmethod
    def of(cls, path: Path) -> "TraceStamp":
        st = os.stat(path)
        return cls(path=shown(path), size=st.st_size, mtime_ns=st.st_mtime_ns, sample=_sample(path, st.st_size)[0])

    def current(self, path: Path) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != self.size or not self.sample:
            return False
        sample, gzip = _sample(path, st.st_size)
        return sample == self.sample and (st.st_mtime_ns == self.mtime_ns or gzip)


_SAMPLE = 64 << 10  # two reads per trace, whatever its size: nothing next to parsing it


def _sample(path: Path, size: int) -> tuple[str, bool]:
    """(digest of the size, first and last ``_SAMPLE`` bytes, whether the file is gzip data)."""
    h = blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO named as a trace must not wait for a writer
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "", False
            head = os.pread(fd, _SAMPLE, 0)
            tail = os.pread(fd, _SAMPLE, max(size - _SAMPLE, 0))
        finally:
            os.close(fd)
    except OSError:
        return "", False
    h.update(head)
    h.update(tail)
    return h.hexdigest(), head[:2] == b"\x1f\x8b"


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
    sink_us: float = 0.0                # _DDPSink forward and backward (unused-parameter detection)
    grads_accumulated: int = 0
    bucket_copies: int = 0
    backward_passes: int = 0
    backward_passes_with_allreduce: int = 0
    allreduce_busy_us: float = 0.0      # all-reduces of analysed steps
    allreduce_after_backward_us: float = 0.0
    # per analysed step, net of the profiler's per-frame cost (signals.ddp_counts): DDP's own host work
    # (what dropping the wrapper removes at world size 1)
    own_host_by_step: dict[int, float] = msgspec.field(default_factory=dict)
    unused_host_us: float = 0.0         # what find_unused_parameters=True adds besides the search (medians)


class CpuShare(msgspec.Struct):
    """The training thread's time on a CPU and runnable but waiting for one over the recorded steps (the
    capture's schedstat reading, trace metadata ``fsdpdoctor_cpu``): its speed while it has work to do."""

    wall_us: float
    on_cpu_us: float
    runqueue_us: float
    cpus: int | None = None
    loadavg: list[float] | None = None          # the host's 1-minute load at the window's start and end
    threads_on_cpu_us: float | None = None      # every thread of the process, summed
    threads_runqueue_us: float | None = None


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
    # user frames whose time jumps in some step -> step -> inclusive us (periodic stalls)
    step_frames: dict[str, dict[int, float]] = msgspec.field(default_factory=dict)
    work: WorkCounts | None = None      # ops, kernels and input sizes per step (stragglers: more work or slower)
    cpu_share: CpuShare | None = None   # the capture's schedstat reading (stragglers: shared cores)
    quality: RankDataQuality | None = None   # what the loader dropped from this rank's file(s)
    identity: RankIdentity | None = None     # what the one-job checks compare across ranks
    frameworks: list[str] = msgspec.field(default_factory=list)  # framework loops on the stack (loop_framework)
    analysis_version: str = ANALYSIS_VERSION


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RankResult)

# A summary file: this line, the SHA-256 of the rest, then the msgpack-encoded RankResult. The hash
# tells any damage (a flipped bit, a cut) from a summary; the stamps inside tell which trace it is of.
MAGIC = b"fsdpdoctor rank summary 1\n"
_HASH = 32
# the largest summary read: one ~100-byte record per collective, so ~1 M collectives in one rank's
# window (the largest trace here, 1 GB, has ~30 k); far below what would exhaust memory
SUMMARY_MAX = 256 << 20


class BadSummary(ValueError):
    """A summary file that cannot be trusted, with why in words."""


def encode(r: RankResult) -> bytes:
    """The msgpack of a result (what the map sends back; ``pack`` makes a summary file of it)."""
    return _encoder.encode(r)


def decode(data: bytes) -> RankResult:
    """A result the map sent back: msgpack of a ``RankResult``, checked against its type."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise BadSummary(f"not a rank summary ({str(exc)[:80]})") from None
    except RecursionError:  # msgpack nested past the decoder's depth: the limit of trace/limits.py's MAX_DEPTH kind
        raise BadSummary("not a rank summary (nested too deeply)") from None


def pack(r: RankResult) -> bytes:
    import hashlib  # here: summaries only (it loads OpenSSL)

    body = encode(r)
    return MAGIC + hashlib.sha256(body).digest() + body


def unpack(data: bytes) -> RankResult:
    """The result in a summary file's bytes; ``BadSummary`` when they are not exactly what ``pack`` wrote."""
    if not data.startswith(MAGIC):
        raise BadSummary("not a summary this version of fsdpdoctor writes")
    import hashlib

    digest, body = data[len(MAGIC):len(MAGIC) + _HASH], data[len(MAGIC) + _HASH:]
    if hashlib.sha256(body).digest() != digest:
        raise BadSummary("damaged (its content does not match its hash)")
    return decode(body)


def read_file(path: Path) -> RankResult:
    """A summary file, through the one reading helper: a regular file (never a link: summaries are
    written as files) of at most ``SUMMARY_MAX`` bytes, intact. ``InputError`` or ``BadSummary``."""
    return unpack(read_raw(path, SUMMARY_MAX, follow_links=False))


def summary_path(trace_path: Path) -> Path:
    """``rank3.json.gz`` -> ``rank3.summary.msgpack`` (same folder)."""
    name = trace_path.name
    for ext in (".json.gz", ".json"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return trace_path.with_name(name + SUMMARY_SUFFIX)


def write(r: RankResult, path: Path) -> None:
    """Atomic, under a name of this writer's own: a reader never sees half a summary."""
    write_atomic(path, pack(r))


def read_current(trace_path: Path) -> tuple[RankResult | None, str | None]:
    """(the summary beside ``trace_path`` if it was made from this very file by this analysis version,
    why it was not used): (None, None) when there is no summary."""
    sp = summary_path(trace_path)
    if not os.path.lexists(sp):
        return None, None
    try:
        r = read_file(sp)
    except (InputError, BadSummary) as exc:
        return None, exc.problem if isinstance(exc, InputError) else str(exc)
    if r.analysis_version != ANALYSIS_VERSION:
        return None, f"made by analysis version {r.analysis_version}, this is {ANALYSIS_VERSION}"
    if r.steps_filter is not None or len(r.files) != 1:
        return None, "made for some steps or several files"
    if Path(r.files[0].path).name != shown(trace_path.name) or not r.files[0].current(trace_path):
        return None, f"made from another file than this {trace_path.name}, or from an earlier version of it"
    return r, None
