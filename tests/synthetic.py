"""One builder of synthetic ``Analysis`` objects for the rules' unit tests.

``analysis()`` is a healthy run: ``ranks`` ranks, ``steps`` steps of ``step_ms`` each, all compute,
on the CPU/gloo traits; every keyword sets what a rule reads (the breakdown, prefetch, straggler,
signals, collectives, job fields). ``run(rule, a)`` runs one rule as the registry does: with only
its declared thresholds, and refusing an id it did not declare.
"""

from __future__ import annotations

from dataclasses import replace

from fsdpdoctor.diagnose.framework import Rule, RuleContext
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import (
    Analysis, Collective, DialectTraits, Finding, JobInfo, KindTime, RankSummary, Signals, StepBreakdown,
    StragglerReport,
)

GPU = DialectTraits(name="nccl-gpu", device_timeline=True, async_collectives=True, shared_host_cores=False,
                    has_message_sizes=True)
CPU = DialectTraits()


def analysis(*, ranks: int = 2, steps: int = 4, step_ms: float = 100.0, traits: DialectTraits = CPU,
             wrapping: str = "ddp", wrapping_source: str = "trace", wrapping_details: dict | None = None,
             backend: str = "gloo", manifest: dict | None = None, prefetch=None,
             straggler: StragglerReport | None = None, signals: Signals | None = None,
             collective_events: list[Collective] | None = None, **mean) -> Analysis:
    """A run whose every rank and step has the mean breakdown ``mean`` (fields of StepBreakdown, in us;
    compute takes what the others leave of the step)."""
    step_us = step_ms * 1e3
    rest = sum(v for k, v in mean.items() if k in ("optimizer_us", "exposed_comm_us", "data_loading_us", "idle_us"))
    base = StepBreakdown(rank=-1, step=None, start_us=0.0, duration_us=step_us,
                         compute_us=mean.pop("compute_us", step_us - rest), **mean)
    summaries = []
    for r in range(ranks):
        per_step = [replace(base, rank=r, step=s + 1, start_us=s * step_us) for s in range(steps)]
        summaries.append(RankSummary(rank=r, file=f"rank{r}.json", dialect=traits.name, steps=per_step,
                                     mean=replace(base, rank=r)))
    job = JobInfo(world_size=ranks, ranks_analyzed=list(range(ranks)), backend=backend,
                  dialect="gpu" if traits.device_timeline else "cpu", wrapping=wrapping,
                  wrapping_source=wrapping_source, wrapping_details=wrapping_details or {},
                  steps=list(range(1, steps + 1)), manifest=manifest, traits=traits)
    return Analysis(source="synthetic", job=job, ranks=summaries, mean=base, collectives=[], prefetch=prefetch,
                    straggler=straggler, signals=signals or Signals(), collective_events=collective_events or [])


def collectives(a_ranks: int, a_steps: int, kind: str, phase: str, *, per_step: int = 1, dur_us: float = 1000.0,
                exposed_us: float = 0.0, size_bytes: int | None = None, busbw_gbps: float | None = None,
                nelems: int | None = None) -> list[Collective]:
    """``per_step`` collectives of one kind and phase on every rank and step."""
    out = []
    for r in range(a_ranks):
        for s in range(1, a_steps + 1):
            for k in range(per_step):
                out.append(Collective(rank=r, index=k, step=s, kind=kind, raw_name=kind, phase=phase,
                                      start_us=0.0, end_us=dur_us, exposed_us=exposed_us, size_bytes=size_bytes,
                                      busbw_gbps=busbw_gbps, nelems=nelems))
    return out


def comm(kind: str, exposed_us: float, busy_us: float | None = None) -> dict:
    """The breakdown fields of communication of one kind, ``exposed_us`` of it exposed."""
    busy = busy_us if busy_us is not None else exposed_us
    return dict(exposed_comm_us=exposed_us, comm_us=busy, overlapped_comm_us=busy - exposed_us,
                comm_by_kind={kind: KindTime(count=1, busy_us=busy, exposed_us=exposed_us,
                                             overlapped_us=busy - exposed_us)},
                exposed_by_phase={"backward": exposed_us})


def straggler_report(*, rank: int = 1, steps: int = 4, wait_us: float = 30e3, noise_us: float = 1e3,
                     cause: str | None = "sleep", extra_us: float | None = None, own_frame: str | None = None,
                     kind: str = "all_reduce", phase: str = "backward") -> StragglerReport:
    """Rank ``rank`` last in every step, the others waiting ``wait_us`` for it."""
    extra = wait_us if extra_us is None else extra_us
    frames = ([{"frame": own_frame, "culprit_us": extra, "others_us": 0.0, "extra_us": extra}]
              if own_frame else [])
    per_step = [{"step": s, "straggler": rank, "imbalance_us": wait_us, "imbalance_frac": 0.0,
                 "collective_index": 0, "arrival_lead_us": None, "kind": kind, "phase": phase,
                 "mean_wait_us": wait_us / 2, "saving_us": wait_us} for s in range(1, steps + 1)]
    return StragglerReport(method="wait", straggler=rank, spread_frac=0.0, last_fraction=1.0, per_step=per_step,
                           wait_by_rank={r: (0.0 if r == rank else wait_us) for r in (0, 1)},
                           cause=cause, cause_evidence=f"rank {rank} spends more on {cause}",
                           steps_last=steps, steps_total=steps, chance=2 * 0.5 ** steps, wait_us=wait_us,
                           saving_us=wait_us, noise_us=noise_us, extra_us=extra, cause_source=own_frame,
                           cause_frames=frames)


def run(rule: Rule, a: Analysis, thresholds: dict[str, float] | None = None) -> list[Finding]:
    """One rule, as the registry runs it (declared thresholds only, declared ids only)."""
    return rule.run(RuleContext(a, resolve(thresholds)))


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]
