"""Communication rules: exposed communication, small messages, low bus bandwidth."""

from __future__ import annotations

from fsdpdoctor.diagnose.ddp_rules import default_buckets_fix
from fsdpdoctor.diagnose.facts import straggler_wait_us
from fsdpdoctor.diagnose.framework import RuleContext, rank_steps, rule, sync_confidence
from fsdpdoctor.diagnose.metric_rules import issuer_fix
from fsdpdoctor.diagnose.noise import per_step, per_step_calls
from fsdpdoctor.results import Evidence, Finding
from fsdpdoctor.units import ms, pct, size


# what the low-bus-bandwidth finding suggests (NCCL's own: diagnose/rules.CUDA_ONLY rewrites it on another device)
LOW_BUSBW_FIX = ("Check NCCL_ALGO/NCCL_PROTO defaults, NIC/NVLink topology (nvidia-smi topo -m), and run nccl-tests at "
                 "this size; rule out stragglers first")

@rule(ids=("exposed-comm-high", "low-overlap"),
      thresholds=("exposed_comm_frac", "exposed_comm_frac_sync", "overlap_low_frac"),
      parts={"exposed-comm-high": "exposed_comm_us", "low-overlap": "exposed_comm_us"})
def exposed_comm(ctx: RuleContext) -> list[Finding]:
    m = ctx.a.mean
    if not m or m.comm_us <= 0 or m.compute_us + m.optimizer_us <= 0:
        return []  # with no compute events recorded, exposed cannot be told from overlapped
    out = []
    total = ctx.frac(m.exposed_comm_us)
    # where collectives block the host and ranks share cores (CPU/gloo), healthy runs expose far more
    # communication by design: the bar is what the noise study measured there, not a GPU rule of thumb
    sync = not ctx.traits.async_collectives
    limit = ctx.th["exposed_comm_frac_sync"] if sync else ctx.th["exposed_comm_frac"]
    if total < limit:
        return out
    # time spent waiting for a straggler is the straggler's finding (it claims this one), not the network's
    waiting = min(straggler_wait_us(ctx), m.exposed_comm_us)
    exposed = m.exposed_comm_us - waiting
    kinds = sorted(m.comm_by_kind.items(), key=lambda kv: -kv[1].exposed_us)
    top = ", ".join(f"{k} {ms(v.exposed_us)}" for k, v in kinds[:3] if v.exposed_us > 0)
    phases = ", ".join(f"{k} {ms(v)}" for k, v in sorted(m.exposed_by_phase.items(), key=lambda kv: -kv[1]) if v > 0)
    fix = _comm_fix(ctx, kinds[0][0])
    summary = (f"{ms(m.exposed_comm_us)} per step of communication ({pct(total)} of the step) is not hidden by "
               f"compute (by kind: {top}; by phase: {phases})")
    if waiting:
        # with more than two ranks the waiters wait for every rank that arrives after them, not only the last
        whom = "ranks that arrive later (the straggler and others)" if len(ctx.a.ranks) > 2 else "the straggler"
        summary += f"; {ms(waiting)} of it is waiting for {whom}, {ms(exposed)} is left for a fix."
    else:
        summary += "."
    if sync:
        summary += (f" Collectives here block the host and the ranks share CPU cores, so healthy runs expose "
                    f"up to {pct(ctx.th['exposed_comm_frac_sync'])} (noise study); this is above it.")
    # synchronised norms' exchanges are a chosen accuracy trade (as in the small-collectives finding): where
    # they hold most of the exposed time it is reported with its cost and the norms' fix, not gated
    nrs = rank_steps(ctx)
    chosen = sum(c.exposed_us for c in ctx.a.collective_events if (c.issuer or "").startswith(_CHOSEN)) / nrs
    if chosen >= 0.5 * m.exposed_comm_us:
        summary += (f" {ms(chosen)} of it is synchronised norms' statistics and DDP's buffer broadcast, exchanged "
                    "by design.")
    out.append(ctx.finding(
        "exposed-comm-high", f"Exposed communication is {pct(total)} of the step", exposed, summary, fix,
        confidence=sync_confidence(ctx, 0.85), consequences=["low-overlap"],  # the same time, seen as overlap
        severity="info" if chosen >= 0.5 * m.exposed_comm_us else None,
        samples=per_step(ctx.a, lambda st: st.exposed_comm_us),
        evidence=[Evidence(f"communication {ms(m.comm_us)} per step, overlapped {ms(m.overlapped_comm_us)} "
                           f"({pct(m.overlap_frac)})")] +
                 [Evidence(f"rank {r.rank}: exposed {ms(r.mean.exposed_comm_us)} per step", rank=r.rank,
                           time_us=r.mean.exposed_comm_us) for r in ctx.a.ranks if r.mean][:8]))
    if (ctx.traits.async_collectives and m.overlap_frac is not None
            and m.overlap_frac < ctx.th["overlap_low_frac"]):
        out.append(ctx.finding(
            "low-overlap", f"Only {pct(m.overlap_frac)} of communication overlaps compute", exposed,
            "Most collective kernels run while no compute kernel runs.",
            "Issue collectives earlier (prefetch, DDP buckets during backward) and keep compute on other streams",
            confidence=0.7, severity="info", samples=per_step(ctx.a, lambda st: st.exposed_comm_us),
            evidence=[Evidence(f"overlap {pct(m.overlap_frac)} (threshold {pct(ctx.th['overlap_low_frac'])})")]))
    return out


def _comm_fix(ctx: RuleContext, kind: str) -> str:
    """What to change for the kind that exposes most, from what this job has set (never what is set). Where
    that kind's calls are mostly another issuer's than the wrapper's (a metrics library's gathers, synchronised
    norms' exchanges: analysis/issuers.py), the fix is that issuer's: no bucket or unit size reaches them."""
    groups = _by_issuer([c for c in ctx.a.collective_events if c.kind == kind])
    if groups and groups[0][0].startswith(_OWN_FIX):
        return _latency_fix_by_issuer(ctx, groups, rank_steps(ctx))
    w, p = ctx.wrap, ctx.a.prefetch
    if kind == "all_reduce":
        cap = w.get("bucket_cap_mb")
        parts = []
        if cap is not None and not 10 <= float(cap) <= 50:
            parts.append(default_buckets_fix(cap))
        parts += ["accumulate gradients over micro-steps under no_sync() to all-reduce less often",
                  "all-reduce in bf16 (register_comm_hook(None, bf16_compress_hook))",
                  "a larger per-rank batch (more compute per all-reduce)"]
        return "; ".join(parts)
    if kind in ("all_gather", "reduce_scatter"):
        parts = []
        if p and p.framework == "fsdp1":
            if p.backward_mode in ("none", "post"):
                parts.append(f"backward_prefetch=BackwardPrefetch.BACKWARD_PRE  # now "
                             f"{w.get('backward_prefetch', 'BACKWARD_POST' if p.backward_mode == 'post' else None)}")
            if p.forward_mode == "off" and w.get("forward_prefetch") is not True:
                parts.append("forward_prefetch=True  # now False")
        elif p and p.framework == "fsdp2" and p.backward_mode == "none":
            parts.append("let FSDP2 prefetch the previous block in backward (no self-listing "
                         "set_modules_to_backward_prefetch)")
        mp = w.get("mixed_precision")
        if kind == "reduce_scatter" and ctx.a.job.wrapping_source == "manifest" and not mp:
            parts.append("reduce in bf16: MixedPrecision(reduce_dtype=torch.bfloat16)  # now full precision")
        parts += ["fewer, larger FSDP units (wrap bigger blocks)", "a larger per-rank batch (more compute per gather)"]
        if kind == "all_gather":
            parts.append("reshard_after_forward=False for the last blocks if memory allows")
        return "; ".join(parts)
    if kind == "all_to_all":
        return "Balance the all-to-all splits and overlap them with the dense compute (pipelining)"
    return "Overlap communication with compute or reduce its volume"


@rule(ids=("latency-bound-collectives", "low-bus-bandwidth"),
      thresholds=("small_message_bytes", "latency_bound_per_step", "low_busbw_gbps"),
      parts={"latency-bound-collectives": "exposed_comm_us", "low-bus-bandwidth": "exposed_comm_us"})
def message_sizes(ctx: RuleContext) -> list[Finding]:
    out = []
    nrs = rank_steps(ctx)
    small = [c for c in ctx.a.collective_events if c.size_bytes and c.size_bytes < ctx.th["small_message_bytes"]]
    if len(small) / nrs >= ctx.th["latency_bound_per_step"]:
        exposed = sum(c.exposed_us for c in small) / nrs
        kinds = sorted({c.kind for c in small})
        groups = _by_issuer(small)
        # synchronised norms exchange statistics by design (a chosen accuracy trade, like activation
        # recomputation): reported with their cost, not gated, when they hold most of the exposed time
        chosen = sum(c.exposed_us for who, cs in groups if who.startswith(_CHOSEN) for c in cs) / nrs
        by = "; ".join(f"{who} {len(cs) / nrs:.0f} ({ms(sum(c.exposed_us for c in cs) / nrs)} exposed)"
                       for who, cs in groups[:4])
        out.append(ctx.finding(
            "latency-bound-collectives", f"{len(small) / nrs:.0f} small collectives per step", exposed,
            f"{len(small) / nrs:.0f} collectives per step move less than {size(ctx.th['small_message_bytes'])} "
            f"each ({', '.join(kinds)}); their cost is latency, not bandwidth."
            + (f" Issued by: {by}." if any(who != _UNKNOWN for who, _ in groups) else ""),
            _latency_fix_by_issuer(ctx, groups, nrs), confidence=0.7,
            samples=per_step_calls(ctx.a, small, lambda c: c.exposed_us),
            severity="info" if exposed > 0 and chosen >= 0.5 * exposed else None,
            evidence=[Evidence(f"median size {size(sorted(c.size_bytes for c in small)[len(small) // 2])}, "
                               f"exposed {ms(exposed)} per step", time_us=exposed)]
                     + [Evidence(f"{who}: {len(cs) / nrs:.0f} per step, e.g. {cs[0].kind} {size(cs[0].size_bytes)}",
                                 time_us=sum(c.exposed_us for c in cs) / nrs) for who, cs in groups[:4]]))
    if ctx.traits.async_collectives and ctx.traits.has_message_sizes:
        big = [c for c in ctx.a.collective_events if c.busbw_gbps is not None and c.size_bytes
               and c.size_bytes >= 16e6]
        slow = [c for c in big if c.busbw_gbps < ctx.th["low_busbw_gbps"]]
        if big and len(slow) * 2 >= len(big):
            mean_bw = sum(c.busbw_gbps for c in slow) / len(slow)
            exposed = sum(c.exposed_us for c in slow) / nrs
            out.append(ctx.finding(
                "low-bus-bandwidth", f"Large collectives reach only {mean_bw:.1f} GB/s bus bandwidth", exposed,
                f"{len(slow)} of {len(big)} collectives of 16 MB or more ran below "
                f"{ctx.th['low_busbw_gbps']:.0f} GB/s (nccl-tests bus bandwidth). A kernel's time includes waiting "
                "for the slowest peer, so a straggler or late arrival also lowers this figure.",
                LOW_BUSBW_FIX, confidence=0.5,
                samples=per_step_calls(ctx.a, slow, lambda c: c.exposed_us),
                evidence=[Evidence(f"{c.kind} {size(c.size_bytes)} in {ms(c.duration_us, 2)}: "
                                   f"{c.busbw_gbps:.1f} GB/s", rank=c.rank, step=c.step, time_us=c.duration_us)
                          for c in slow[:5]]))
    return out


_UNKNOWN = "issuer unknown"
_CHOSEN = ("norm statistics", "DDP buffer broadcast")
# issuers with a fix of their own (_issuer_fix), which no wrapper setting reaches
_OWN_FIX = _CHOSEN + ("metrics", "framework (", "clip_grad_norm_", "optimizer-state sharding", "user code ")
_MERGE_ONLY = ("gradient buckets", "fsdp", _UNKNOWN)   # issuers whose fix is fewer, larger calls (_latency_fix)   # what a model with synchronised BatchNorm issues


def _by_issuer(colls: list) -> list[tuple[str, list]]:
    """Collectives grouped by who issued them (``Collective.issuer``), most exposed first."""
    groups: dict[str, list] = {}
    for c in colls:
        groups.setdefault(c.issuer or _UNKNOWN, []).append(c)
    return sorted(groups.items(), key=lambda kv: -sum(c.exposed_us for c in kv[1]))


def _issuer_fix(ctx: RuleContext, who: str, calls: list | None = None) -> str:
    """The change that reaches the collectives of one issuer (analysis/issuers.py labels); ``calls``: the
    issuer's collectives, which say whether an unnamed issuer could be DDP's gradient buckets at all."""
    if who.startswith("norm statistics"):
        return ("fewer synchronised norm layers (SyncBatchNorm only where a rank's batch is too small for its own "
                "statistics) or plain BatchNorm with a larger per-rank batch: each exchange waits for the layer "
                "before it, so no bucket size merges them")
    if who == "DDP buffer broadcast":
        return "DDP(model, broadcast_buffers=False) where the buffers stay equal on every rank (or sync them less often)"
    if who.startswith("metrics") or who.startswith("framework ("):
        return issuer_fix(who)
    if who == "clip_grad_norm_":
        return "clip with one norm reduction per step (FSDP: model.clip_grad_norm_ once; foreach=True), or clip less often"
    if who == "optimizer-state sharding":
        return ("ZeroRedundancyOptimizer(..., parameters_as_bucket_view=True): each rank broadcasts its updated "
                "shard as one bucket, not parameter by parameter")
    if who.startswith("user code "):
        return (f"coalesce the calls at {who[len('user code '):]} into one collective "
                "(torch.cat then split, or all_reduce_coalesced)")
    if calls and not _could_be_buckets(ctx, calls):
        kinds = "/".join(sorted({c.kind for c in calls}))
        phases = "/".join(sorted({c.phase for c in calls}))
        whose = (f"the trace does not say who issues the {kinds} calls in {phases} (record with with_stack=True to "
                 "name them); they" if who == _UNKNOWN else f"the {kinds} calls of {who} in {phases}")
        return (f"{whose} are not DDP's gradient buckets (those are all-reduces in backward), so no bucket_cap_mb "
                "merges them: issue them less often or coalesce them where they are issued")
    return _latency_fix(ctx)   # gradient buckets, FSDP units, or an issuer the trace does not name


def _could_be_buckets(ctx: RuleContext, calls: list) -> bool:
    """Whether unnamed calls could be the wrapper's own: under DDP only all-reduces in backward (or in no
    phase the trace tells) are gradient buckets; under FSDP, or an unknown wrapper, any may be."""
    if ctx.a.job.wrapping != "ddp":
        return True
    return all(c.kind == "all_reduce" and c.phase in ("backward", "other") for c in calls)


def _latency_fix_by_issuer(ctx: RuleContext, groups: list[tuple[str, list]], nrs: int = 1) -> str:
    """The fixes of the issuers that hold most of the small collectives' exposed time (at most three). Where the
    fix merges calls (buckets, units), an issuer with at most one call per step has nothing to merge (DDP's one
    bucket of a small model): no fix from it."""
    several = [(who, cs) for who, cs in groups if who not in _MERGE_ONLY or len(cs) / nrs >= 2] or groups
    total = sum(c.exposed_us for _, cs in several for c in cs)
    fixes, covered = [], 0.0
    for who, cs in several:
        fix = _issuer_fix(ctx, who, cs)
        if fix not in fixes:
            fixes.append(fix)
        covered += sum(c.exposed_us for c in cs)
        if len(fixes) == 3 or covered >= 0.8 * total:
            break
    return "; ".join(fixes)


def _latency_fix(ctx: RuleContext) -> str:
    cap = ctx.wrap.get("bucket_cap_mb")
    if ctx.a.job.wrapping == "ddp":
        return (f"DDP(model, bucket_cap_mb={max(25, 2 * float(cap)):g})  # now {cap}" if cap is not None else
                "DDP(model, bucket_cap_mb=25 or more)") + "; coalesce scalar all-reduces (torch._foreach / one tensor)"
    if ctx.a.job.wrapping in ("fsdp1", "fsdp2"):
        return "Wrap larger FSDP units (several blocks per unit) so each all-gather/reduce-scatter moves more"
    return "Coalesce them: bucket small tensors into one collective (all_reduce_coalesced, flatten then split)"
