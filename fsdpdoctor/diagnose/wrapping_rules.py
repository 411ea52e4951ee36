"""Wrapping advice: a model FSDP shards as one unit (FSDP2 ``fully_shard`` on the root only, FSDP1
without an ``auto_wrap_policy``). Units so small that latency dominates are latency-bound-collectives'
(its fix for FSDP jobs is larger units)."""

from __future__ import annotations

from fsdpdoctor.diagnose.framework import RuleContext, rank_steps, rule
from fsdpdoctor.results import Evidence, Finding, Setting
from fsdpdoctor.units import ms, size


def _units(ctx: RuleContext) -> tuple[int | None, str]:
    """(FSDP units, where the count comes from): the manifest's, else the trace's forward all-gathers per
    step (one per unit on every rank)."""
    u = ctx.wrap.get("units")
    if isinstance(u, int) and u > 0:
        return u, "manifest"
    fwd = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "forward"
           and c.issuer == "fsdp"]
    if not fwd:
        return None, "trace"
    return round(len(fwd) / rank_steps(ctx)), "trace"


@rule(ids=("fsdp-single-unit",), parts={"fsdp-single-unit": "exposed_comm_us"})
def single_unit(ctx: RuleContext) -> list[Finding]:
    if ctx.a.job.wrapping not in ("fsdp1", "fsdp2") or (ctx.a.job.world_size or 1) < 2:
        return []
    units, src = _units(ctx)
    if units != 1:
        return []
    fsdp = [s for s in ctx.a.collectives if s.kind in ("all_gather", "reduce_scatter")]
    exposed = sum(s.exposed_per_step_us for s in fsdp)
    world = ctx.a.job.world_size
    model = (ctx.a.job.manifest or {}).get("model") or {}
    pbytes = model.get("param_bytes") if isinstance(model.get("param_bytes"), int) else None
    memory = (f" Every rank holds all {size(pbytes)} of parameters unsharded from the all-gather to the end of "
              f"backward, and as many bytes of gradients before the reduce-scatter (sharded: {size(pbytes / world)} "
              "each): the peak holds the whole unsharded model, only the optimizer state stays sharded." if pbytes else
              " Every rank holds the whole model unsharded at once: only the optimizer state stays sharded.")
    if ctx.traits.async_collectives:
        cost = (f"Its all-gather must finish before the first layer runs and its reduce-scatter starts after the "
                f"last gradient: nothing overlaps them ({ms(exposed)} per step exposed).")
        impact = exposed
    else:
        # gloo runs FSDP's collectives synchronously: more units would not overlap here either
        cost = ("Its all-gather must finish before the first layer runs and its reduce-scatter starts after the "
                "last gradient, so on GPUs nothing can overlap them (here, on gloo, FSDP's collectives block the host "
                "whatever the wrapping, so no time saving is claimed).")
        impact = 0.0
    fsdp2 = ctx.a.job.wrapping == "fsdp2"
    fix = ("for block in model.blocks: fully_shard(block), then fully_shard(model): one unit per repeated block "
           "(transformer layer, residual stage)" if fsdp2 else
           "Block: the repeated block class (transformer layer, residual stage)")
    settings = [] if fsdp2 else [Setting("fsdp.wrap_per_block", "Block")]
    words = "fully_shard on the root only" if ctx.a.job.wrapping == "fsdp2" else "no auto_wrap_policy"
    return [ctx.finding(
        "fsdp-single-unit", f"The whole model is one FSDP unit ({words})", impact,
        f"FSDP shards the model as a single unit ({src}: 1 unit). {cost}{memory}", fix, settings=settings,
        confidence=0.9 if src == "manifest" else 0.7, floor="warning",
        evidence=[Evidence(f"{s.kind} {s.phase}: {s.per_step:.0f} per step, {size(s.mean_size_bytes)} each, "
                           f"{ms(s.exposed_per_step_us)} exposed", time_us=s.exposed_per_step_us) for s in fsdp]
        + ([Evidence(f"parameters: {model.get('parameters')} ({size(pbytes)}) on {world} ranks")] if pbytes else []))]
