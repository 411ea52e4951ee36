"""FSDP prefetch rules: backward and forward prefetch settings that leave all-gathers exposed.

A prefetch setting is a configuration of its own: it survives a fix of the backend or of a straggler,
so no other finding folds these under itself.
"""

from __future__ import annotations

from fsdpdoctor.diagnose.facts import straggler_wait_in
from fsdpdoctor.diagnose.framework import (
    RuleContext, first_source, rank_steps, rule, sync_confidence, wrap_site,
)
from fsdpdoctor.diagnose.noise import per_step, per_step_calls
from fsdpdoctor.results import Evidence, Finding, Setting
from fsdpdoctor.units import ms, pct, size

# the share of a step's compute a prefetched all-gather can hide under: backward holds about two thirds of
# forward + backward (two matmuls per weight, against one), forward the other third
COMPUTE_SHARE = {"backward": 2 / 3, "forward": 1 / 3}


def hideable(ctx: RuleContext, calls: list, phase: str, deduct_us: float = 0.0) -> tuple[float, list[float], str]:
    """What a prefetch can hide of these exposed all-gathers, per step: (saving, per-step values, prose).

    A prefetched all-gather hides only under compute that exists beside it and only where it can run
    beside that compute, on its own stream: per step the least of the exposed gathers and the compute of
    their phase. On a CPU rank (gloo) FSDP issues a prefetched all-gather synchronously, as it does an
    on-demand one (FSDP1 calls dist.all_gather on CPU tensors; FSDP2's unshard_async_op is False): the
    prefetch moves the blocking gather earlier and hides nothing, so the saving predicted there is nil, the
    prose says the fix is not expected to save time there, and what it would save on a GPU."""
    share = COMPUTE_SHARE[phase]
    exposed = per_step_calls(ctx.a, calls, lambda c: c.exposed_us)
    compute = per_step(ctx.a, lambda st: st.compute_us)
    scale = max(1.0 - deduct_us / (sum(exposed) / len(exposed)), 0.0) if exposed and sum(exposed) > 0 else 1.0
    bound = [min(e * scale, share * c) for e, c in zip(exposed, compute)]
    gpu_us = sum(bound) / len(bound) if bound else 0.0
    exposed_us = sum(exposed) / len(exposed) * scale if exposed else 0.0
    if ctx.traits.async_collectives:
        note = (f" A prefetch hides them only under the {phase} compute beside them: "
                f"{ms(gpu_us)} per step of the {ms(exposed_us)} exposed." if gpu_us < exposed_us - 1.0 else "")
        return gpu_us, bound, note
    return 0.0, [0.0] * len(bound), (
        f" On this CPU/gloo run the fix is not expected to save time: FSDP issues a prefetched all-gather "
        f"synchronously on a CPU rank, as it does an on-demand one, so a prefetch moves the blocking gather "
        f"earlier and hides none of it (on the fault/fix pairs of docs/impact.md no prefetch fix saved measurable "
        f"time, and BACKWARD_POST -> BACKWARD_PRE made the step 2-4 ms slower, in three interleaved runs); its "
        f"cost, one more unsharded unit in memory, stays. On a GPU, with the "
        f"all-gather on its own stream, it would hide up to {ms(gpu_us)} per step: the least of the exposed "
        f"gathers ({ms(exposed_us)}) and the {phase} compute to hide under.")


def unit_cost(ctx: RuleContext) -> str:
    """The fix's memory cost: one more unsharded FSDP unit held while the next one is gathered."""
    nbytes = ((ctx.a.job.manifest or {}).get("model") or {}).get("param_bytes")
    units = ctx.wrap.get("units")
    if nbytes and units:
        return f"  # cost: one more unsharded unit in memory, about {size(nbytes / units)} ({units} units)"
    return "  # cost: one more unsharded unit in memory"


def _backward_pre(ctx: RuleContext, now: str | None) -> Setting:
    return Setting("fsdp.backward_prefetch", "BACKWARD_PRE", now=now,
                   side_effect=unit_cost(ctx).removeprefix("  # cost: "))


@rule(ids=("fsdp1-no-backward-prefetch", "fsdp1-backward-post"),
      parts={"fsdp1-no-backward-prefetch": "exposed_comm_us", "fsdp1-backward-post": "exposed_comm_us"})
def fsdp1_backward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp1" or p.backward_mode not in ("none", "post"):
        return []
    bwd_ag = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    nsteps = rank_steps(ctx)
    exposed = sum(c.exposed_us for c in bwd_ag) / nsteps
    saving, samples, note = hideable(ctx, bwd_ag, "backward")
    configured = (ctx.wrap.get("backward_prefetch", "unknown (no manifest)") if ctx.a.job.wrapping_source == "manifest"
                  else "unknown (no manifest)")
    ev = [Evidence(f"{p.backward_prefetched} of {p.backward_all_gathers} backward all-gathers were issued by a "
                   f"prefetch ({p.backward_on_demand} on demand in _pre_backward_hook)"),
          Evidence(f"configured backward_prefetch: {configured}"),
          Evidence(f"backward all-gathers expose {ms(exposed)} per step", time_us=exposed)]
    src = wrap_site(ctx) or first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward")
    now = f"  # now {configured}" if ctx.a.job.wrapping_source == "manifest" else ""
    if p.backward_mode == "none":
        return [ctx.finding(
            "fsdp1-no-backward-prefetch", "FSDP backward prefetch is off", saving,
            f"Every backward all-gather is issued on demand when its unit's gradient is needed, so "
            f"{ctx.device_word} waits for each gather before the unit's backward." + note,
            "" if now else "from torch.distributed.fsdp import BackwardPrefetch",
            settings=[_backward_pre(ctx, configured if now else None)],
            # off is not FSDP's default (BACKWARD_PRE): a configuration that is wrong, a warning where it costs
            confidence=sync_confidence(ctx, 0.95), evidence=ev, source=src,
            floor="warning" if saving > 0 else "info", samples=samples)]
    return [ctx.finding(
        "fsdp1-backward-post", "FSDP backward prefetch is BACKWARD_POST", saving,
        "BACKWARD_POST issues the next all-gather only after the current unit's gradient is computed, in the "
        "post-backward hook, right before its reduce-scatter; BACKWARD_PRE issues it before the gradient "
        "computation and overlaps more, at the cost of one more unsharded unit in memory." + note,
        "", settings=[_backward_pre(ctx, configured if now else None)],
        # away from FSDP's default (BACKWARD_PRE) toward less overlap: a warning where it costs; an error only
        # from its measured cost (it is also a memory trade-off, so never more without one)
        confidence=sync_confidence(ctx, 0.9), evidence=ev, source=src,
        floor="warning" if saving > 0 else "info", samples=samples)]


@rule(ids=("fsdp-forward-prefetch-off",), thresholds=("forward_exposed_frac",),
      parts={"fsdp-forward-prefetch-off": "exposed_comm_us"})
def forward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.forward_mode != "off":
        return []
    if p.framework == "fsdp2" and not ctx.traits.device_timeline:
        # FSDP2 overlaps forward all-gathers implicitly on a separate CUDA stream; a CPU trace cannot
        # show whether that works, so only explicit lists could be judged here
        return []
    fwd = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "forward"]
    nsteps = rank_steps(ctx)
    if ctx.wrap.get("units") == 1 or len(fwd) <= nsteps:
        return []   # one unit: no previous unit to prefetch under (fsdp-single-unit says what to wrap)
    # waiting for a straggler in the first forward gather is the straggler's cost, not prefetch's
    waited = straggler_wait_in(ctx, "all_gather", "forward")
    exposed = max(sum(c.exposed_us for c in fwd) / nsteps - waited, 0.0)
    if ctx.frac(exposed) < ctx.th["forward_exposed_frac"]:
        return []
    if p.framework == "fsdp1" and ctx.wrap.get("forward_prefetch") is True:
        return []  # already set: the trace disagrees with the manifest; prefetch status says so
    saving, samples, note = hideable(ctx, fwd, "forward", deduct_us=waited)
    fsdp1 = p.framework == "fsdp1"
    fix = ("" if fsdp1 else
           "for i, block in enumerate(blocks[:-1]): block.set_modules_to_forward_prefetch([blocks[i + 1]])"
           + unit_cost(ctx))
    settings = [Setting("fsdp.forward_prefetch", True, now=ctx.wrap.get("forward_prefetch"),
                        side_effect=unit_cost(ctx).removeprefix("  # cost: "))] if fsdp1 else []
    return [ctx.finding(
        "fsdp-forward-prefetch-off", "Forward all-gathers are exposed and not prefetched", saving,
        f"{len(fwd) // nsteps} forward all-gathers per step are issued on demand and expose {ms(exposed)} "
        f"({pct(ctx.frac(exposed))} of the step)." + note,
        fix, settings=settings, confidence=sync_confidence(ctx, 0.8), samples=samples,
        evidence=[Evidence(f"{p.forward_prefetched} of {p.forward_all_gathers} forward all-gathers prefetched"),
                  Evidence(f"exposed forward all-gather time {ms(exposed)} per step", time_us=exposed)],
        # forward_prefetch=False is FSDP's default: never more than its measured saving says, and where
        # collectives block the host a prefetch only moves the wait, so the saving here is nil
        severity=None if ctx.traits.async_collectives else "info",
        source=wrap_site(ctx) or first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "forward"))]


@rule(ids=("fsdp2-backward-prefetch-ineffective",), parts={"fsdp2-backward-prefetch-ineffective": "exposed_comm_us"})
def fsdp2_backward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp2" or p.backward_mode in ("n/a", "unknown"):
        return []
    bwd_ag = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    nsteps = rank_steps(ctx)
    exposed = sum(c.exposed_us for c in bwd_ag) / nsteps
    saving, samples, note = hideable(ctx, bwd_ag, "backward")
    lists = ctx.wrap.get("backward_prefetch") or {}
    self_ref = [m or "<root module>" for m, targets in lists.items() if m in (targets or [])]
    ev = [Evidence(f"{p.backward_on_demand} of {p.backward_all_gathers} backward all-gathers issued on demand under "
                   f"FSDP::pre_backward; {p.backward_prefetched} under FSDP::backward_prefetch"),
          Evidence(f"{p.empty_prefetch_annotations} of {p.prefetch_annotations} prefetch annotations gathered nothing")]
    if p.backward_mode == "none":
        if self_ref:
            ev.append(Evidence(f"set_modules_to_backward_prefetch lists a module itself: {', '.join(self_ref[:4])}"))
        fix = ("Remove the self-referencing set_modules_to_backward_prefetch calls "
               f"({', '.join(self_ref[:3])}) to get the default prefetch of the previous block, or list it "
               "explicitly: blocks[i].set_modules_to_backward_prefetch([blocks[i - 1]])" if self_ref else
               "Let FSDP2 prefetch: do not override set_modules_to_backward_prefetch, or give each block the "
               "previous one: blocks[i].set_modules_to_backward_prefetch([blocks[i - 1]])")
        return [ctx.finding(
            "fsdp2-backward-prefetch-ineffective", "FSDP2 backward prefetch does not take effect", saving,
            "FSDP2 normally all-gathers the previous block during a block's backward (like BACKWARD_PRE); here "
            "the backward all-gathers are issued on demand, so each block waits for its own gather."
            + note, fix + unit_cost(ctx), confidence=sync_confidence(ctx, 0.9), evidence=ev + [
                Evidence(f"backward all-gathers expose {ms(exposed)} per step", time_us=exposed)],
            floor="warning" if saving > 0 else "info", samples=samples,
            source=first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward"))]
    if p.gpu_overlap_confirmed is False:
        ev.append(Evidence("prefetched all-gather kernels do not overlap backward compute kernels"))
        return [ctx.finding(
            "fsdp2-backward-prefetch-ineffective", "FSDP2 prefetched all-gathers do not overlap compute", saving,
            "All-gathers are issued by prefetch, but on the device they still run while no compute runs: something "
            "serialises the streams (a sync, a too-late prefetch, or CPU-bound launch).",
            "Check for host syncs in backward and CPU launch overhead; consider reshard_after_forward=False for "
            "the last blocks", confidence=0.6, evidence=ev, samples=samples)]
    return []


@rule(ids=("fsdp2-explicit-prefetch-noop",))
def fsdp2_explicit_noop(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp2" or ctx.a.job.wrapping_source != "manifest":
        return []
    out = []
    bwd = ctx.wrap.get("backward_prefetch") or {}
    empty = [m for m, targets in bwd.items() if targets == []]
    if empty and p.backward_prefetched > 0:
        out.append(ctx.finding(
            "fsdp2-explicit-prefetch-noop", "set_modules_to_backward_prefetch([]) does nothing", 0.0,
            f"{len(empty)} module(s) were given an empty backward prefetch list, presumably to turn prefetch off, "
            f"but FSDP2 treats an empty list as 'use the default' (default_prefetch = "
            f"len(_states_to_backward_prefetch) == 0): {p.backward_prefetched} of {p.backward_all_gathers} "
            "backward all-gathers are still prefetched.",
            "Drop the empty lists. To disable backward prefetch for a module, list the module itself: "
            "m.set_modules_to_backward_prefetch([m]); to change depth, list the modules to gather.",
            # the code does not do what it says: a wrong configuration, whatever it costs
            confidence=0.9, floor="warning", source=wrap_site(ctx),
            evidence=[Evidence(f"manifest: backward_prefetch lists set to [] for {', '.join(empty[:5])}"),
                      Evidence(f"trace: {p.backward_prefetched} backward all-gathers under "
                               "FSDP::backward_prefetch (implicit, nested in FSDP::pre_backward)")]))
    fwd = ctx.wrap.get("forward_prefetch") or {}
    if any(fwd.values()) and p.forward_all_gathers and p.forward_prefetched == 0:
        out.append(ctx.finding(
            "fsdp2-explicit-prefetch-noop", "Explicit forward prefetch lists gather nothing", 0.0,
            "set_modules_to_forward_prefetch was called, but no forward all-gather ran under "
            "FSDP::forward_prefetch: the listed modules were already unsharded or the lists are wrong.",
            "List the *next* blocks: blocks[i].set_modules_to_forward_prefetch([blocks[i + 1]])",
            confidence=0.7, floor="warning", source=wrap_site(ctx),
            evidence=[Evidence(f"manifest: forward_prefetch set for {len(fwd)} module(s)")]))
    return out
