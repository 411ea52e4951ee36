"""Typed result objects shared by the analyses, the diagnosis, every renderer
(console, JSON, JUnit, TUI) and the comparison verbs.

All times are microseconds (``*_us``), sizes bytes, bandwidths GB/s (1e9 B/s).
``to_dict`` gives the versioned JSON schema documented in docs/json-schema.md.
"""

# Annotations are objects, not text (no ``from __future__ import annotations``): the rank-summary
# decoder built at every start would compile each text one (analysis/rankresult.py: 231 in all, ~25 M
# instructions). So a class comes after the classes its fields name.

import json
from dataclasses import dataclass, field
from typing import Literal, get_args

from fsdpdoctor.results.serial import _field_names, dumps_indented, plain
from fsdpdoctor.results.signals import Signals  # Analysis.signals' type: from_dict resolves it here

SCHEMA_VERSION = "1.0"

CollectiveKind = Literal["all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier", "p2p",
                         "other"]
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = get_args(CollectiveKind)
Phase = Literal["forward", "backward", "optimizer", "other"]
PHASES: tuple[Phase, ...] = get_args(Phase)
from fsdpdoctor.severity import SEVERITIES, SEVERITY_RANK, Severity  # noqa: E402,F401 - the one scale, named here


@dataclass(slots=True)
class Collective:
    """One collective call on one rank, as issued on the host and executed (kernel or gloo span).

    Slotted: a many-rank reduce holds one per call of every rank (a third of the memory of a dict each)."""

    rank: int
    index: int                  # issue order on this rank (0-based, whole trace)
    step: int | None            # ProfilerStep number, None outside steps
    kind: CollectiveKind
    raw_name: str               # what the trace called it (collective name / op / kernel)
    phase: Phase
    start_us: float             # execution start (kernel / gloo worker span)
    end_us: float
    issue_us: float | None = None      # host issue time (c10d op start)
    exposed_us: float = 0.0            # its share of the rank's exposed communication (time not covered by
                                       # compute; calls running at the same time split it): adds up over calls
    hidden_us: float = 0.0             # part of its own execution under compute
    comm_share_us: float = 0.0         # its share of the rank's communication time (same split as exposed_us)
    nelems: int | None = None
    dtype: str | None = None
    size_bytes: int | None = None      # message size per rank (nccl-tests "size")
    group_size: int | None = None
    process_group: str | None = None
    seq: int | None = None             # the process group's sequence number (``Seq``), where recorded
    busbw_gbps: float | None = None
    algbw_gbps: float | None = None
    fsdp_context: str | None = None    # innermost FSDP/DDP annotation at issue
    prefetch: str | None = None        # "prefetch-pre", "prefetch-post", "prefetch", "on-demand"
    source: str | None = None          # user's source line ("train.py(120): step")
    issuer: str | None = None          # whose work issued it (analysis/issuers.py): "gradient buckets", ...

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(slots=True)
class KindTime:
    """Communication time of one collective kind in one step (or averaged)."""

    count: int = 0
    busy_us: float = 0.0        # union of execution intervals
    exposed_us: float = 0.0
    overlapped_us: float = 0.0
    size_bytes: int = 0


@dataclass(slots=True)
class StepBreakdown:
    """Where one step's wall time went on one rank.

    compute_us + optimizer_us + exposed_comm_us + data_loading_us + idle_us == duration_us;
    overlapped_comm_us is the part of communication hidden under compute (inside compute/optimizer).
    """

    rank: int
    step: int | None
    start_us: float
    duration_us: float
    compute_us: float = 0.0
    optimizer_us: float = 0.0
    exposed_comm_us: float = 0.0
    overlapped_comm_us: float = 0.0
    data_loading_us: float = 0.0
    idle_us: float = 0.0
    comm_us: float = 0.0                                  # union of all communication
    comm_by_kind: dict[str, KindTime] = field(default_factory=dict)
    exposed_by_phase: dict[str, float] = field(default_factory=dict)
    data_loader_us: float = 0.0       # total DataLoader __next__ time (exposed or not)
    host_syncs: int = 0
    host_sync_us: float = 0.0
    sleep_us: float = 0.0             # time.sleep frames on the main thread (with stacks)
    loader_sleep_us: float = 0.0      # the part of sleep_us under DataLoader __next__ (the loader waits)
    collectives: int = 0

    @property
    def overlap_frac(self) -> float | None:
        return self.overlapped_comm_us / self.comm_us if self.comm_us > 0 else None


@dataclass(slots=True)
class DialectTraits:
    """What a trace dialect can and cannot show; rules ask these, never the dialect's name.

    Filled by the dialect that read the rank (see analysis/dialects once it exists).
    """

    name: str = "gloo-cpu"               # "nccl-gpu" (NCCL/RCCL kernels) or "gloo-cpu" (gloo worker spans)
    device_timeline: bool = False        # kernels on device streams with launch->start: GPU idle is measurable
    async_collectives: bool = False      # collectives can run beside compute (own stream); False: host blocks
    shared_host_cores: bool = True       # ranks compete for the same CPU cores (exposure is contention-prone)
    has_message_sizes: bool = False      # sizes (and dtypes) are recorded per collective


@dataclass(slots=True)
class InputKind:
    """What one rank's file is, decided once at the front door (``trace/kind.py``) with its evidence:
    who wrote it, which device timeline it holds, how its steps are marked and how far its host and
    device clocks agree. ``unknown`` names what cannot be read from it: the figures that depend on
    it are withheld, not shown as zeros."""

    producer: str = "kineto"             # "kineto", "legacy-autograd" (the list export); other writers are refused
    device: str = "none"                 # "cuda", "rocm", "copies-only", "mtia", "xpu", "hpu", "npu",
    #                                      "privateuse1", "missing" (launches, no device events), "empty"
    #                                      (GPUs declared and used, no device event at all), "none"
    steps: str = "none"                  # "profiler-step", "cycles", "none"
    evidence: list[str] = field(default_factory=list)   # what each of the above was read from
    unknown: list[str] = field(default_factory=list)    # what cannot be read, said where the user looks first
    backward_links: int = 0              # host->device links whose device start precedes the launch
    links: int = 0                       # host->device links (launch -> device event) in the trace
    clock_offset_us: float | None = None  # device clock shift applied to the device events (None: none)
    generic: bool = False                # another accelerator's device spans read by their shape (kind.py)

    @property
    def device_known(self) -> bool:
        """Whether device figures can be read from this input (or it ran on the host alone)."""
        return self.device in ("cuda", "rocm", "xpu", "copies-only", "none") or self.generic

    @property
    def device_word(self) -> str:
        """What the texts call the device: "GPU" for a CUDA/ROCm timeline (or none, or a missing one),
        else the accelerator the input ran on ("MTIA", "XPU", "NPU"...)."""
        return "GPU" if self.device in ("cuda", "rocm", "copies-only", "missing", "empty", "none") \
            else self.device.upper()

    def line(self) -> str:
        """One line for the report header."""
        device = _DEVICES.get(self.device) or (f"{self.device.upper()} spans (read generically)" if self.generic
                                               else f"{self.device.upper()} events (not analysed)")
        return f"{_PRODUCERS.get(self.producer, self.producer)}; device {device}; " \
               f"steps: {_STEPS.get(self.steps, self.steps)}"


_PRODUCERS = {"kineto": "torch.profiler (Kineto)", "legacy-autograd": "legacy autograd-profiler export",
              "unknown": "unknown writer"}
_DEVICES = {"cuda": "CUDA kernels", "rocm": "ROCm kernels", "xpu": "XPU kernels", "copies-only": "copies only (no kernel)",
            "missing": "timeline missing", "empty": "declared, no device events", "none": "none (host only)"}
_STEPS = {"profiler-step": "ProfilerStep", "cycles": "profiler cycles", "none": "no step markers"}


@dataclass(slots=True)
class RankSummary:
    """One rank's analysis: its steps, their mean, and the figures the cross-rank reduce reads."""

    rank: int
    file: str
    dialect: str
    steps: list[StepBreakdown]
    mean: StepBreakdown | None          # averaged over analysed steps
    host: str | None = None
    device: str | None = None
    wait_us: float = 0.0                # mean per step wait for slower ranks in the step's worst collective
    is_straggler: bool = False
    cycles: list[tuple[float, float]] = field(default_factory=list)  # profiler cycles (first start, last end), several files
    input_kind: InputKind | None = None  # what this rank's file is (trace/kind.py)


@dataclass(slots=True)
class CollectiveStat:
    """Per (kind, phase) over the analysed ranks and steps.

    ``total_us`` and ``exposed_us`` are the calls' shares of communication time (calls running at the
    same time split it), so over all rows they add up to the ranks' communication, never to more;
    ``*_per_step_us`` are those divided by the rank-steps, comparable with the step breakdown."""

    kind: str
    phase: str
    count: int
    per_step: float
    total_us: float
    exposed_us: float
    mean_us: float                      # mean duration of one call
    size_bytes: int | None
    mean_size_bytes: float | None
    busbw_gbps: float | None            # duration-weighted mean bus bandwidth, where sizes are known
    small_messages: int = 0             # below the latency-bound threshold
    busy_per_step_us: float = 0.0       # total_us per rank and step
    exposed_per_step_us: float = 0.0    # exposed_us per rank and step


@dataclass(slots=True)
class PrefetchStatus:
    """Whether FSDP prefetches its all-gathers, backward and forward, and how many were prefetched."""

    framework: str | None               # "fsdp1", "fsdp2" or None
    backward_mode: str                  # "pre", "post", "none", "n/a", "unknown"
    forward_mode: str                   # "on", "off", "n/a", "unknown"
    backward_all_gathers: int = 0
    backward_prefetched: int = 0
    backward_on_demand: int = 0
    forward_all_gathers: int = 0
    forward_prefetched: int = 0
    prefetch_annotations: int = 0
    empty_prefetch_annotations: int = 0
    explicit_backward: bool = False
    gpu_overlap_confirmed: bool | None = None   # on GPU: prefetched all-gathers overlap compute
    method: str = ""                    # how it was decided
    per_step: list[dict] = field(default_factory=list)


@dataclass(slots=True)
class StragglerReport:
    """The rank the others wait for, if any, by how much, and each rank's mean wait."""

    method: str                         # "wait" (clock-free), "+arrival" when issue times are comparable
    straggler: int | None
    spread_frac: float                  # median over steps of the others' longest wait for it / step time
    last_fraction: float                # share of steps where this rank was the one waited for
    per_step: list[dict] = field(default_factory=list)
    wait_by_rank: dict[int, float] = field(default_factory=dict)
    cause: str | None = None            # "data loading", "compute", "host sync", "sleep", "idle"
    cause_evidence: str | None = None
    # evidence for a verdict, measured in this run (the verdict is the diagnosis')
    steps_last: int = 0                 # steps in which `straggler` was the rank waited for
    steps_total: int = 0                # steps with matched collectives
    chance: float = 1.0                 # chance a healthy rank is last that often (binomial, any of N ranks)
    wait_us: float = 0.0                # others' wait for it: median over the steps it was last (longest wait)
    saving_us: float = 0.0              # what the step would save without it: the next-latest rank's wait (median)
    noise_us: float = 0.0               # the run's own step-to-step jitter of step time (robust sd)
    extra_us: float = 0.0               # the culprit's extra time per step in `cause`
    extra_each_us: list[float] = field(default_factory=list)   # that extra in each step (the others' median)
    cause_source: str | None = None     # the culprit's own user frame holding its extra time
    cause_frames: list[dict] = field(default_factory=list)   # frame, culprit_us, others_us, extra_us
    # "more work" brought by a collective: the kind of the matched call whose message on the culprit is the
    # largest multiple of the others' (uneven all_to_all splits), and that multiple (median over steps)
    exchange_kind: str | None = None
    exchange_ratio: float | None = None
    # where the ranks share one host's cores (the capture's schedstat): the share of a core the culprit's
    # training thread got while it ran beside the others' compute, and while it ran alone (they waited)
    beside_speed: float | None = None
    # process groups smaller than the world (a 2-D mesh): waits and saving taken per rank over the step's
    # collectives (each rank's largest wait), not at one collective (analysis/stragglers.analyze)
    through_groups: bool = False
    alone_speed: float | None = None
    # with the process group of each call known (analysis/groups.py): the groups the culprit made wait
    # ({"ranks", "kinds", "wait_us" per step}), the ranks that share none with it (they wait through the
    # others), and, where the groups could not be told, what could not
    culprit_groups: list[dict] = field(default_factory=list)
    far_ranks: list[int] = field(default_factory=list)
    groups_note: str | None = None


@dataclass(slots=True)
class RankClock:
    """One rank's clock against the reference rank's: t_ref = t - offset_us - drift_ppm * 1e-6 * (t - t0_us)."""

    rank: int
    offset_us: float                    # this rank's clock minus the reference clock, at t0_us
    drift_ppm: float = 0.0              # rate difference (0 unless measurable over the run)
    uncertainty_us: float = 0.0         # standard error of the offset (or half the causal bounds, if narrower)
    n_matched: int = 0                  # matched collectives the estimate rests on
    bound_lo_us: float | None = None    # hard bounds on the offset: no collective ends before every rank issued it
    bound_hi_us: float | None = None


@dataclass   # not slotted: ``of`` keeps its index by rank in the instance's __dict__
class ClockReport:
    """Per-rank clock offsets estimated from matched collectives (analysis/clock.py, docs/clock.md)."""

    reference_rank: int
    t0_us: float                        # reference time the offsets refer to (median matched end time)
    method: str                         # "collective-end"
    ranks: list[RankClock] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # ranks left unaligned, and why

    def of(self, rank: int) -> RankClock | None:
        # by rank, indexed once per length of ``ranks`` (the estimate appends to it): the reduce asks for
        # every rank of every collective, which a search would make quadratic in ranks
        index, key = self.__dict__.get("_index"), (id(self.ranks), len(self.ranks))
        if index is None or index[0] != key:
            by = {}
            for r in self.ranks:
                by.setdefault(r.rank, r)   # the first, as a search finds it
            index = self.__dict__["_index"] = (key, by)
        return index[1].get(rank)


@dataclass(slots=True)
class JobInfo:
    """What the job is: world size, ranks analysed, backend, dialect, wrapping and where that was read."""

    world_size: int | None
    ranks_analyzed: list[int]
    backend: str | None
    dialect: str                        # "gpu" or "cpu"
    wrapping: str                       # "fsdp1", "fsdp2", "ddp", "none", "unknown"
    wrapping_source: str                # "manifest" or "trace"
    wrapping_details: dict = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    has_stacks: bool = False
    manifest: dict | None = None
    samples_per_step: int | float | None = None  # as the manifest gave it (a saved --json re-reads the same)
    tokens_per_step: int | float | None = None
    traits: DialectTraits = field(default_factory=DialectTraits)
    input_kind: InputKind | None = None   # rank 0's (the first analysed) kind; each rank's in ranks[]
    # the training framework the loop runs in, whose terms the fixes are given in (diagnose/settings.py):
    # "plain", "hf-trainer", "lightning", "accelerate"; and what said so ("manifest", "trace frames: ...",
    # "assumed: ...")
    framework: str = "plain"
    framework_source: str = "assumed"


@dataclass(slots=True)
class Evidence:
    """One fact a finding rests on, with the rank, step, time and source it was read from."""

    text: str
    rank: int | None = None
    step: int | None = None
    time_us: float | None = None
    source: str | None = None


@dataclass(slots=True)
class Setting:
    """One setting a fix changes, in the job's framework's terms (diagnose/settings.py): a rule names the
    generic setting and its value, the rendering says where that framework takes it and how it is written."""

    name: str                           # generic: "ddp.find_unused_parameters", "loader.num_workers", ...
    value: bool | int | float | str | None
    where: str = ""                     # what takes it: "TrainingArguments", "DDPStrategy", "DataLoader", ...
    spelled: str | None = None          # its name there; None where the framework has no spelling for it
    code: str = ""                      # what to write
    now: bool | int | float | str | None = None   # the job's value, where the manifest says it
    side_effect: str | None = None      # what the change costs (CPU, memory, overlap...)
    sized: str | None = None            # what the value was sized from (the host's cores), or why it is not


@dataclass(slots=True)
class Finding:
    """One diagnosis: what is wrong, how sure, what fixing it would save per step, the evidence and the fix."""

    id: str                             # rule id, e.g. "fsdp1-no-backward-prefetch"
    title: str
    severity: Severity
    confidence: float                   # 0..1
    impact_us: float                    # per step, what fixing it would save (estimate)
    impact_frac: float                  # impact_us / mean step time
    summary: str
    fix: str
    evidence: list[Evidence] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    source: str | None = None
    # root cause first: ids of findings this one explains (shown under it, not as peers) ...
    consequences: list[str] = field(default_factory=list)
    # ... and, on a consequence, the id of the finding that explains it
    caused_by: str | None = None
    # the prediction's own error: the saving's impact_confidence interval [lo, hi] per step, the step noise it
    # rests on combined with its rule's calibrated error, widened by the window's contention
    # (diagnose/prediction.py); lo below 0: the fix may cost time. None where the window is too short
    impact_interval_us: list[float] | None = None
    # the fix as data: the settings it changes, in the terms of ``framework`` (the job's: JobInfo.framework)
    settings: list[Setting] = field(default_factory=list)
    framework: str | None = None
    # the step noise alone: the t-interval of the per-step values the saving rests on (what severity is judged by)
    impact_noise_interval_us: list[float] | None = None
    # set where the profiled window was starved past the contention calibrated: the reason no saving is given
    # (impact_us then orders the findings, it is not a prediction)
    impact_withheld: str | None = None


@dataclass(slots=True)
class RankDataQuality:
    """What the loader dropped from one rank's file, and why (trace/quality.py)."""

    rank: int
    file: str
    events_read: int                    # events in the file (complete events and metadata)
    dropped: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)    # "negative time or duration": 3, ...
    by_kind: dict[str, int] = field(default_factory=dict)      # "communication", "cpu_op", "unnamed"...
    dropped_communication: int = 0
    communication_events: int = 0       # communication events kept
    dropped_unnamed: int = 0            # dropped events whose name (hence kind) is unknown
    step_share_covered: float | None = None   # share of step time under dropped events with known times
    unlocated: int = 0                  # dropped events whose time is unknown (bad ts or dur)
    notes: list[str] = field(default_factory=list)   # document fields ignored (distributedInfo...)


@dataclass(slots=True)
class DataQuality:
    """Everything the loader could not trust, over all ranks and the manifest."""

    dropped_events: int = 0
    ranks: list[RankDataQuality] = field(default_factory=list)   # only ranks with something dropped or noted
    manifest: list[str] = field(default_factory=list)            # manifest fields ignored, and why
    notes: list[str] = field(default_factory=list)               # run-level (files skipped, duplicates)
    # where the figures were read from when not from the traces (per-rank summaries): nothing left out
    sources: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.dropped_events or self.ranks or self.manifest or self.notes)


@dataclass(slots=True)
class PeriodicStall:
    """A step that is longer every ``period`` steps on one rank (analysis/periodic.py)."""

    rank: int                           # the rank that does the periodic work
    period: int
    offset: int                         # stalled steps: step number % period == offset
    stalled_steps: list[int]
    excess_us: float                    # mean extra time of a stalled step over the others' median
    cost_per_step_us: float             # that excess averaged over every step
    source: str                         # "step series" (the whole run) or "profiled steps"
    owner_evidence: str                 # why that rank
    median_step_us: float
    ranks_showing: list[int] = field(default_factory=list)   # ranks whose steps show the period
    frame: str | None = None            # the user frame holding the stall (profiled steps, with stacks)
    frame_extra_us: float | None = None
    occurrence_cost_us: list[float] = field(default_factory=list)   # each stalled step's share of cost_per_step_us
    every_rank: bool = False            # every rank does the work in the same steps (none waits for another)


@dataclass(slots=True)
class Contention:
    """How starved the profiled window was: the share of it each rank's training thread spent runnable but
    waiting for a CPU (the capture's schedstat over the recorded steps), the host's load and cores. A
    prediction rests on steps timed at this contention; its interval widens with it (diagnose/noise.py)."""

    wait_share: float | None            # the largest over the ranks; None: not recorded
    by_rank: dict[int, float] = field(default_factory=dict)
    # every thread of the rank's process (loader, gloo, pin-memory threads): run-queue time over their on-CPU
    # plus run-queue time, the largest over the ranks
    process_wait_share: float | None = None
    load: list[float] | None = None     # 1-minute load average, least and most at the windows' ends
    cpus: int | None = None             # cores the ranks may run on (affinity)
    source: str = "not recorded"        # "schedstat" or "not recorded"
    text: str = "host load not recorded"


@dataclass(slots=True)
class Analysis:
    """The whole result of ``analyze``: what every renderer shows."""

    source: str
    job: JobInfo
    ranks: list[RankSummary]
    mean: StepBreakdown | None                 # over ranks and steps
    collectives: list[CollectiveStat]
    prefetch: PrefetchStatus | None
    straggler: StragglerReport | None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)    # what we could not determine, and why
    collective_events: list[Collective] = field(default_factory=list)
    signals: "Signals | None" = None
    clock: ClockReport | None = None           # per-rank clock offsets (None with one rank)
    data_quality: DataQuality = field(default_factory=DataQuality)
    periodic: PeriodicStall | None = None      # a stall every N steps on one rank
    contention: Contention | None = None       # how starved the profiled window was (analysis/contention.py)
    schema_version: str = SCHEMA_VERSION

    def to_dict(self, include_events: bool = False) -> dict:
        """What ``dataclasses.asdict`` gives, less the per-call collectives unless asked for: they are
        not built to be dropped (a run holds thousands), and nothing is deep-copied to be written."""
        return {name: plain(getattr(self, name)) for name in _field_names(Analysis)
                if include_events or name != "collective_events"}

    def to_json(self, include_events: bool = False) -> str:
        """The versioned ``--json`` document (docs/json-schema.md); the manifest only with the events."""
        d = self.to_dict(include_events=include_events)
        if not include_events:
            d["job"].pop("manifest", None)
        return dumps_indented(d)

    @classmethod
    def from_dict(cls, d: dict) -> "Analysis":
        """Rebuild the typed result from ``to_dict``/``--json`` output (missing keys take their defaults)."""
        import msgspec

        version = str(d.get("schema_version", ""))
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(f"schema_version {version!r} is not {SCHEMA_VERSION.split('.')[0]}.x")
        return msgspec.convert(d, cls, strict=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Analysis":
        return cls.from_dict(json.loads(text))

    # pandas views (results/frames.py; pandas is imported only when one is asked for)
    def steps_df(self):
        """rank x step x component: ``rank, step, component, us, share, step_us``."""
        from fsdpdoctor.results.frames import steps_df
        return steps_df(self)

    def collectives_df(self, events: bool = False):
        from fsdpdoctor.results.frames import collectives_df
        return collectives_df(self, events=events)

    def ranks_df(self):
        from fsdpdoctor.results.frames import ranks_df
        return ranks_df(self)

    def findings_df(self):
        from fsdpdoctor.results.frames import findings_df
        return findings_df(self)
