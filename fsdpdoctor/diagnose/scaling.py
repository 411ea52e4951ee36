"""Judging a scaling report: the ``low-scaling-efficiency`` finding, its cause and fix.

``fsdpdoctor.analysis.scaling`` measures (throughput, efficiency, waterfall); this
module turns the measurement into findings with the shared threshold table.
"""

from __future__ import annotations

from fsdpdoctor.analysis.scaling import measure_scaling, part_label
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import Analysis, DialectTraits, Evidence, Finding
from fsdpdoctor.results.scaling import COMPUTE, DATA, IDLE, RESIDUAL, WAIT, ScalingReport, Waterfall

FINDING_ID = "low-scaling-efficiency"


def scaling_report(analyses: list[Analysis], *, world_sizes: list[int] | None = None,
                   samples_per_rank: float | None = None, tokens_per_rank: float | None = None,
                   thresholds: dict[str, float] | None = None) -> ScalingReport:
    """Measure runs of one job at several world sizes and judge the result (see ``measure_scaling``)."""
    th = resolve(thresholds)
    report = measure_scaling(analyses, world_sizes=world_sizes, samples_per_rank=samples_per_rank,
                             tokens_per_rank=tokens_per_rank)
    report.findings = [f for w in report.waterfalls if (f := _finding(w, th, report.traits)) is not None]
    return report


_FIXES = {
    "all_reduce": ("Exposed all-reduce grew with the world size. Overlap it with backward: keep DDP's default "
                   "buckets (bucket_cap_mb 25) or tune them so the first buckets start early, avoid "
                   "find_unused_parameters, use gradient_as_bucket_view=True, send bf16/fp16 gradients "
                   "(comm hook), and give each rank more work per step (larger per-rank batch or gradient "
                   "accumulation with no_sync) so communication is amortised."),
    "all_gather": ("Exposed all-gather grew with the world size: enable FSDP prefetching (FSDP1 "
                   "backward_prefetch=BACKWARD_PRE, forward_prefetch; FSDP2 default implicit prefetch), wrap "
                   "bigger units, or use hybrid sharding (HSDP) to keep all-gathers within a node."),
    "reduce_scatter": ("Exposed reduce-scatter grew with the world size: let it overlap the next unit's backward "
                       "(do not wrap too coarsely), reduce in bf16 (MixedPrecision reduce_dtype), or use hybrid "
                       "sharding (HSDP) so most traffic stays inside a node."),
}


def _fix(key: str, traits: DialectTraits) -> str:
    if key.startswith("comm:"):
        kind = key[5:]
        return _FIXES.get(kind, f"Exposed {kind} grew with the world size: overlap it with compute, batch small "
                                "calls together, or issue it less often.")
    if key == WAIT:
        return ("Ranks wait for a slower one (straggler): run `fsdpdoctor analyze` on the larger run to see which "
                "rank and why (data loading, host syncs, uneven batches, a slower node); balance the work or fix "
                "that rank.")
    if key == DATA:
        return ("Data loading got slower per step: give the DataLoader workers (num_workers, persistent_workers, "
                "pin_memory, prefetch_factor) and make sure the ranks do not contend for the same storage/CPUs.")
    if key == COMPUTE:
        base = "Compute per step got slower: CPU contention or smaller per-rank work. "
        if traits.shared_host_cores:
            return base + ("The ranks share the host's cores: set torch.set_num_threads / OMP_NUM_THREADS to "
                           "cores per rank, pin ranks to cores, or scale across hosts rather than within one.")
        return base + ("Kernels ran slower at the larger size: with strong scaling each rank's batch shrinks and "
                       "kernels underuse the device (raise the per-rank batch); check CPU threads per rank, NUMA "
                       "binding and host-side launch overhead.")
    if key == IDLE:
        return ("Idle time grew: host-side overhead (Python, launches, logging) or waits outside collectives; "
                "look at the idle gaps of the larger run with `fsdpdoctor tui`.")
    return "The larger run is slower for reasons the breakdown does not separate; compare the runs' timelines."


def _finding(w: Waterfall, th: dict[str, float], traits: DialectTraits) -> Finding | None:
    if w.efficiency >= th["scaling_efficiency_low"]:
        return None
    top = w.biggest
    key = top.key if top else RESIDUAL
    label = part_label(key)
    impact = max(w.increase_us, 0.0)
    lost = w.lost_efficiency
    cause = (f"the biggest part is {label}: +{top.delta_us / 1e3:.1f} ms per step "
             f"({100 * top.efficiency_points:.1f} points)" if top else "no single part explains it")
    ev = [Evidence(f"{p.label}: {p.delta_us / 1e3:+.1f} ms per step ({p.base_us / 1e3:.1f} ms at "
                   f"{w.base_world_size} -> {p.run_us / 1e3:.1f} ms at {w.world_size} ranks), "
                   f"{100 * p.efficiency_points:+.1f} efficiency points")
          for p in w.parts if abs(p.delta_us) > 0.005 * w.step_us]
    ev.insert(0, Evidence(f"step {w.ideal_step_us / 1e3:.1f} ms ideal -> {w.step_us / 1e3:.1f} ms measured at "
                          f"{w.world_size} ranks ({w.source}); base {w.base_world_size} ranks ({w.base_source})"))
    return Finding(
        id=FINDING_ID,
        title=f"Scaling efficiency {100 * w.efficiency:.0f}% from {w.base_world_size} to {w.world_size} ranks",
        severity="error" if w.efficiency < 0.5 else "warning",
        confidence=0.6 if traits.shared_host_cores else 0.8,
        impact_us=impact, impact_frac=impact / w.step_us if w.step_us else 0.0,
        summary=(f"At {w.world_size} ranks the job reaches {100 * w.efficiency:.0f}% of linear scaling "
                 f"(threshold {100 * th['scaling_efficiency_low']:.0f}%): each step takes "
                 f"{w.step_us / 1e3:.1f} ms instead of {w.ideal_step_us / 1e3:.1f} ms, losing "
                 f"{100 * lost:.0f} points of efficiency; {cause}."),
        fix=_fix(key, traits), evidence=ev, ranks=[], source=None)
