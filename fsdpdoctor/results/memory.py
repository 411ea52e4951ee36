"""Memory per rank (``fsdpdoctor memory``): the configuration asked about, the prediction for it and
for the other strategies, and each rank's measured allocator peak. Predicted by ``analysis/memory.py``,
assembled by ``analysis/memory_run.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9


GiB = float(2**30)


@dataclass(frozen=True)
class ActivationSpec:
    """A transformer's shape, for the Korthikanti et al. (2022) activation estimate."""

    layers: int
    hidden: int
    seq: int
    micro_batch: int
    heads: int | None = None  # default hidden // 128
    checkpointing: bool = False


@dataclass(frozen=True)
class ActivationEstimate:
    per_layer_bytes: int
    total_bytes: int
    heads: int
    formula: str
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryConfig:
    parameters: int
    dtype: str = "fp32"                 # training dtype of weights and gradients
    optimizer: str = "adamw"
    mixed_precision: bool = False       # fp32 master weights + fp32 states, 16-bit working copy
    strategy: str = "ddp"
    world_size: int = 1
    gpus_per_node: int | None = None    # HYBRID_SHARD shard group
    cpu_offload: bool = False
    optimizer_state_dtype: str = "fp32"  # "fp32" or "param" (torch.optim keeps states in the param dtype)
    trainable_parameters: int | None = None  # grads/optimizer states only for these (default: all)
    largest_unit_params: int | None = None   # biggest FSDP unit, for the transient unsharded peak
    activations: ActivationSpec | None = None


@dataclass(frozen=True)
class BytesPerParam:
    weights: float
    gradients: float
    optimizer_states: float
    master_weights: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.master_weights


@dataclass(frozen=True)
class HostMemory:
    """Bytes per rank kept in host (CPU) memory by CPU offload."""

    weights: int = 0
    gradients: int = 0
    optimizer_states: int = 0
    master_weights: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.master_weights


@dataclass(frozen=True)
class MemoryEstimate:
    config: MemoryConfig
    strategy_label: str
    shard_degree: int                 # ranks each sharded piece is split across
    bytes_per_param: BytesPerParam    # unsharded accounting, per parameter
    per_rank_bytes_per_param: BytesPerParam  # what one rank keeps on device, per model parameter
    weights: int                      # device bytes per rank
    gradients: int
    optimizer_states: int
    master_weights: int
    host: HostMemory
    peak_transient: int | None        # None: unknown (largest unit not given) or not applicable
    transient_applicable: bool
    activations: ActivationEstimate | None
    explanation: list[str]
    not_included: list[str]

    @property
    def model_state(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.master_weights

    @property
    def total(self) -> int:
        """Device bytes per rank: model state + known transient + activation estimate."""
        return self.model_state + (self.peak_transient or 0) + (self.activations.total_bytes if self.activations else 0)


@dataclass(frozen=True)
class StrategyRow:
    strategy: str
    label: str
    cpu_offload: bool
    shard_degree: int
    model_state: int
    peak_transient: int | None
    total: int
    host: int
    current: bool


@dataclass(frozen=True)
class DevicePeak:
    device_type: str     # "cpu", "cuda" or "type<N>"
    device_id: int
    peak_allocated: int  # max "Total Allocated" over the [memory] events
    start_allocated: int  # level before the first event (Total Allocated - Bytes)
    end_allocated: int
    peak_reserved: int | None
    events: int


@dataclass
class MemoryReport:
    estimate: MemoryEstimate
    strategies: list[StrategyRow]
    sentences: list[str]                    # how the other strategies would change it, in words
    measured: list[dict] = field(default_factory=list)   # per rank: its peak beside the prediction
    notes: list[str] = field(default_factory=list)
    run_folder: Path | None = None
    device_bytes: int | None = None         # one device's memory: --gpu-memory, or the manifest's device name
    device_source: str | None = None        # where device_bytes comes from, in words

    @property
    def fits(self) -> bool | None:
        """Whether the predicted per-rank device total fits one device (None: its memory unknown)."""
        return None if not self.device_bytes else self.estimate.total <= self.device_bytes
