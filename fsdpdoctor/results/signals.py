"""The per-rank signals behind the host-side and device-idle findings, as ``Analysis.signals`` holds them:
host syncs, the data loader, DDP's structure, the device's idle time by cause, the setup read from the
trace, activation recompute and CPU offload.

All times are microseconds (``*_us``)."""

# Annotations are objects, not text: see results/analysis.py.

from dataclasses import dataclass, field


@dataclass(slots=True)
class HostSync:
    """A host-device synchronisation inside a step (``.item()``, ``cudaStreamSynchronize``...)."""

    rank: int
    name: str
    count: int
    total_us: float
    steps: list[int]
    source: str | None = None
    # GPU: device idle from each sync's end to the next device activity, at most as long as it blocked
    bubble_us: float = 0.0


@dataclass(slots=True)
class DataLoaderInfo:
    """One rank's DataLoader: its iterator, calls per step, and the share of the step it stalls."""

    rank: int
    iterator: str                    # "_SingleProcessDataLoaderIter" / "_MultiProcessingDataLoaderIter"
    calls_per_step: float
    mean_call_us: float
    stall_frac: float                # DataLoader time / step time
    exposed_frac: float              # data loading not hidden under compute / step time
    slow_frame: str | None = None    # user frame under __next__ with the most time (e.g. dataset __getitem__)
    slow_frame_us: float = 0.0
    # steps in which the worker processes start again (a new iterator each epoch: persistent_workers=False),
    # and the mean time one start holds on this rank (fork, the old workers' shutdown, the first batch's wait)
    worker_start_steps: list[int] = field(default_factory=list)
    worker_start_each_us: list[float] = field(default_factory=list)   # per start, as worker_start_steps
    worker_start_us: float = 0.0


@dataclass(slots=True)
class DdpInfo:
    """DDP structure seen in the trace (per step means on the analysed ranks)."""

    allreduces_per_step: float
    bucket_sizes_bytes: list[int]
    forwards_per_step: float
    backwards_per_step: float
    backwards_with_allreduce_per_step: float
    search_unused_per_step: float
    after_backward_frac: float       # share of all-reduce busy time after the last backward compute
    overlap_frac: float | None
    search_unused_us_per_step: float = 0.0
    grads_accumulated_per_step: float = 0.0   # AccumulateGrad calls: parameters that got a gradient
    bucket_copies_per_step: float = 0.0       # copy_bucket_to_grad calls: parameters in buckets
    bucket_nelems: list[int] = field(default_factory=list)
    # DDP's _DDPSink around the forward's outputs and its backward: host work only unused-parameter
    # detection (find_unused_parameters=True, or static_graph's first step) adds
    sink_us_per_step: float = 0.0
    # per analysed step (mean over the ranks), net of the profiler's per-frame cost: DDP's own host work
    # (its forward less the module's, the reducer's ops, its collectives' host calls, _DDPSink)
    own_host_us_steps: list[float] = field(default_factory=list)
    # what find_unused_parameters=True adds on the host besides the search: the outputs wrapped in _DDPSink
    # and rebuilt, _DDPSink's backward (each kind of call at its median)
    unused_host_us_per_step: float = 0.0


IDLE_CAUSES = ("launch", "host_sync", "data_loading", "collective_wait", "host_compute", "profiler", "other")


@dataclass(slots=True)
class GpuIdleStep:
    """One step of one rank on a device timeline: when no kernel, memcpy or memset runs on any stream."""

    step: int | None
    duration_us: float
    busy_us: float                        # union of all device activity (kernels, memcpy, memset)
    idle_us: float                        # duration_us - busy_us
    by_cause: dict[str, float] = field(default_factory=dict)   # IDLE_CAUSES -> idle time; sums to idle_us


@dataclass(slots=True)
class GpuIdle:
    """GPU idle time of one rank, attributed to what the host was doing meanwhile (see analysis/gpu_idle.py)."""

    rank: int
    steps: list[GpuIdleStep]
    idle_us: float                        # mean per step
    idle_frac: float                      # idle / step time
    by_cause: dict[str, float]            # mean per step
    kernels: int = 0                      # device events with a launch record in the analysed steps
    queue_delay_median_us: float | None = None   # kernel start - end of its launch call, 0 if before (median)
    queue_empty_frac: float | None = None        # share of kernels that started at most QUEUE_EMPTY_US after launch
    sources: dict[str, list[list]] = field(default_factory=dict)  # cause -> [[user frame, us per step], ...]
    stack_events_per_step: float = 0.0   # Python-frame events recorded per step (with_stack)
    optimizer_host_us: float = 0.0       # of host_compute: inside Optimizer.step (an optimizer on CPU tensors)
    with_stack: bool = False
    record_shapes: bool | None = None
    graph_captures: int = 0               # CUDA-graph stream captures in the analysed steps
    capture_idle_us: float = 0.0          # mean per step of the idle inside a capture (kernels recorded, not run)
    startup_idle_us: float = 0.0          # mean per step of the idle inside one-time start-up calls (not savable)
    startup_calls: list[str] = field(default_factory=list)  # the longest of them, "cudaFree 9012.3 ms"
    startup_steps: list[int] = field(default_factory=list)  # the steps that hold it (the cold start)


@dataclass(slots=True)
class RankSetup:
    """How one rank was set up, as far as its trace and the manifest say (analysis/setup.py)."""

    rank: int
    world_size: int | None
    backend: str | None                   # distributedInfo.backend ("nccl", "gloo", "undefined"...)
    pg_backends: list[str] = field(default_factory=list)   # pg_config backend_config, e.g. "cuda:gloo"
    default_pg_backend: str | None = None # backend_config of the default (world) process group
    device_kernels: int = 0               # compute/comm kernels on device streams
    gloo_spans: int = 0                   # gloo:* worker spans (collectives staged through host memory)
    collectives: int = 0                  # collectives in the analysed steps
    collective_kinds: list[str] = field(default_factory=list)   # kinds seen (COLLECTIVE_KINDS)
    has_backward: bool = False            # autograd backward ran in the analysed steps
    wrapper: str | None = None            # "ddp", "fsdp1", "fsdp2" seen in the trace, else None
    smallest_group: int | None = None     # the smallest pg_size in distributedInfo.pg_config (a 2-D mesh's)
    groups: dict[str, list[int]] = field(default_factory=dict)   # pg_name -> its ranks (pg_config)


@dataclass(slots=True)
class RecomputeInfo:
    """Activation checkpointing: forward work re-run inside backward (analysis/recompute.py)."""

    rank: int
    method: str                           # which marker found the regions
    regions_per_step: float
    recompute_us: float                   # mean per step: device time launched from recompute regions
    recompute_frac: float                 # of the step
    compute_frac: float | None            # of compute time (device busy)


@dataclass(slots=True)
class OffloadInfo:
    """Host<->device copies (CPU offload, pinned/pageable transfers) of one rank (analysis/recompute.py)."""

    rank: int
    h2d_us: float                         # mean per step, union of HtoD copies
    d2h_us: float
    exposed_us: float                     # copy time not under any compute kernel
    copies_per_step: float
    offload_configured: bool = False      # the manifest says FSDP CPUOffload / offload_params
    by_phase: dict[str, float] = field(default_factory=dict)   # exposed copy time by host phase
    fsdp_copies_per_step: float = 0.0     # copies launched inside FSDP's own scopes (offload seen in the trace)


@dataclass(slots=True)
class ProfilerCost:
    """The profiler's own cost per profiled step, measured by the job (analysis/profiler_cost.py): the
    profiled steps' median against the unprofiled steps' median in the capture's step series."""

    added_us: float             # per step, mean over ranks, >= 0
    profiled_step_us: float
    bare_step_us: float
    bare_steps: int             # unprofiled steps the median rests on (the fewest of any rank)
    ranks: int


@dataclass(slots=True)
class Signals:
    """Structural facts the diagnosis rules read, beyond the time breakdown."""

    host_syncs: list[HostSync] = field(default_factory=list)
    dataloader: list[DataLoaderInfo] = field(default_factory=list)
    ddp: DdpInfo | None = None
    sleep_sources: dict[int, str] = field(default_factory=dict)   # rank -> user line calling time.sleep
    gpu_idle: list[GpuIdle] = field(default_factory=list)          # device-timeline traces only
    setup: list[RankSetup] = field(default_factory=list)
    recompute: list[RecomputeInfo] = field(default_factory=list)   # ranks with activation checkpointing
    offload: list[OffloadInfo] = field(default_factory=list)       # device-timeline ranks with H2D/D2H copies
    profiler_cost: ProfilerCost | None = None   # measured from the run's step series, where it can be
