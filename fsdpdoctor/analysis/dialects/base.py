"""What a trace dialect must provide, and the records it hands to the rest of the analysis.

A dialect is how one kind of trace shows communication: NCCL/RCCL kernels on device
streams, gloo spans on worker threads... Everything that differs between them lives
behind this protocol; the analyses downstream only see step windows, collective
records, timelines and ``DialectTraits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from fsdpdoctor.results import Collective, DialectTraits

if TYPE_CHECKING:
    from fsdpdoctor.analysis.context import RankContext
    from fsdpdoctor.trace.table import RankTrace


@dataclass(slots=True)
class StepWindow:
    """One profiler step's span on this rank's clock (us)."""

    step: int | None
    start: float
    end: float


@dataclass(slots=True)
class Timelines:
    """A rank's compute, optimizer and communication as interval sets, communication by kind and phase."""

    compute: np.ndarray      # all compute (incl. optimizer)
    optimizer: np.ndarray    # optimizer part of compute
    comm: np.ndarray
    comm_by_kind: dict       # kind -> (interval set, start times, sizes)
    comm_by_phase: dict      # phase -> interval set


@dataclass(slots=True)
class CollectiveRecord:
    """One collective as a dialect found it: the public ``Collective`` plus what only
    the per-rank analysis needs (where it was issued, which kernel ran it)."""

    coll: Collective
    issue_track: int | None = None       # host thread that issued it (None: issue not in the trace)
    launch_known: bool = True            # False: a device kernel launched before the trace began
    kernel: str | None = None            # device kernel name (device dialects)
    stream: int | None = None            # track the kernel ran on
    described: bool = True               # the trace says what it is (metadata or an enclosing op)


class Dialect(Protocol):
    """One trace dialect. Register an instance in ``fsdpdoctor.analysis.dialects.DIALECTS``."""

    name: str                            # e.g. "nccl-gpu"; also ``DialectTraits.name``
    family: Literal["gpu", "cpu"]        # what ``JobInfo.dialect`` reports (JSON schema)
    traits: DialectTraits
    note: str | None                     # said once per job when it has collectives

    def matches(self, trace: RankTrace) -> bool:
        """This dialect reads ``trace`` (dialects are tried in registry order)."""

    def step_windows(self, ctx: RankContext) -> list[StepWindow]:
        """The analysed step windows (host ``ProfilerStep`` spans, adjusted to where the work runs)."""

    def collectives(self, ctx: RankContext) -> list[CollectiveRecord]:
        """Every collective on the rank, in issue order, with kind, times and sizes."""

    def timelines(self, ctx: RankContext, records: list[CollectiveRecord]) -> Timelines:
        """Compute, optimizer and communication interval sets the breakdown slices per step."""


def host_step_windows(ctx: RankContext) -> list[StepWindow]:
    """``ProfilerStep#N`` spans on the host, in time order; the whole trace when there is none (each
    profiler cycle on its own: the time between cycles was not recorded)."""
    t = ctx.t
    rows = ctx.step_rows
    if len(rows) == 0:
        if t.cycles:
            return [StepWindow(None, a, b) for a, b in t.cycles]
        return [StepWindow(None, float(t.ts.min()), float((t.ts + t.dur).max()))]
    rows = rows[np.argsort(t.ts[rows])]
    return [StepWindow(int(t.name(r).split("#")[1]), float(t.ts[r]), float(t.ts[r] + t.dur[r])) for r in rows]


def cycle_index(ctx: RankContext, times) -> np.ndarray:
    """The profiler cycle (``RankTrace.cycles``) each time falls in; all 0 for a one-file trace."""
    times = np.asarray(times, dtype=np.float64)
    cycles = ctx.t.cycles
    if not cycles:
        return np.zeros(times.shape, dtype=np.int64)
    starts = np.array([a for a, _ in cycles])
    return np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)


def comm_by_kind_and_phase(collectives: list[Collective]) -> tuple[dict, dict]:
    from fsdpdoctor.analysis import intervals as iv
    from fsdpdoctor.results import COLLECTIVE_KINDS, PHASES

    by_kind, by_phase = {}, {}
    for kind in COLLECTIVE_KINDS:
        ks = [c for c in collectives if c.kind == kind]
        if ks:
            by_kind[kind] = (iv.as_set([c.start_us for c in ks], [c.end_us for c in ks]),
                             np.array([c.start_us for c in ks]), np.array([c.size_bytes or 0 for c in ks]))
    for phase in PHASES:
        ps = [c for c in collectives if c.phase == phase]
        if ps:
            by_phase[phase] = iv.as_set([c.start_us for c in ps], [c.end_us for c in ps])
    return by_kind, by_phase
