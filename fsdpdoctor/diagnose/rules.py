"""Rules: metrics -> findings with evidence, an impact estimate and a fix.

Each rule is a function ``(RuleContext) -> list[Finding]`` registered in
``RULES``. Impact is the time per step that fixing the problem would save at
most (usually the exposed time it causes). Severity is one scale for every
rule: the saving as a share of the step, weighted by the confidence of the
diagnosis, against the bands of the threshold table (``severity_*_frac``); a
rule may raise it to a floor of at most "warning" (a configuration that is
wrong, not merely non-default), never to "error" without the measured cost.

Root cause first: a finding lists in ``consequences`` the ids of findings it
explains; ``diagnose`` folds those under it (``caused_by``), caps them at
"info" so only the root gates ``check``, and keeps them right after their root.
Fixes name this job's configuration when the manifest gives it, and never
suggest what is already set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.units import ms, pct, size
from fsdpdoctor.results import Analysis, DialectTraits, Evidence, Finding


@dataclass
class RuleContext:
    a: Analysis
    th: dict[str, float]

    @property
    def step_us(self) -> float:
        return self.a.mean.duration_us if self.a.mean else 0.0

    @property
    def traits(self) -> DialectTraits:
        return self.a.job.traits

    @property
    def wrap(self) -> dict:
        return self.a.job.wrapping_details or {}

    def frac(self, us: float) -> float:
        return us / self.step_us if self.step_us else 0.0

    @property
    def device_word(self) -> str:
        """What computes: "the GPU" only where the trace has a device timeline."""
        return "the GPU" if self.traits.device_timeline else "compute"

    def severity(self, impact_us: float, floor: str = "info", confidence: float = 1.0) -> str:
        """One scale for every rule: the saving a fix brings (share of the step) times the confidence.

        ``floor`` raises it for a configuration known to be wrong, but never above "warning": an
        error needs the measured cost.
        """
        return severity_for(self.frac(impact_us) * max(min(confidence, 1.0), 0.0), self.th, floor)

    def finding(self, id: str, title: str, impact_us: float, summary: str, fix: str, *, confidence: float,
                evidence: list[Evidence], severity: str | None = None, ranks=None, source=None,
                floor: str = "info", consequences: Iterable[str] = ()) -> Finding:
        return Finding(id=id, title=title,
                       severity=severity or self.severity(impact_us, floor=floor, confidence=confidence),
                       confidence=confidence, impact_us=impact_us, impact_frac=self.frac(impact_us),
                       summary=summary, fix=fix, evidence=evidence,
                       ranks=list(ranks or self.a.job.ranks_analyzed), source=source,
                       consequences=list(consequences))


SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


def severity_for(weighted_frac: float, th: dict[str, float], floor: str = "info") -> str:
    sev = ("error" if weighted_frac >= th["severity_error_frac"] else
           "warning" if weighted_frac >= th["severity_warning_frac"] else "info")
    floor = floor if SEVERITY_RANK.get(floor, 0) <= SEVERITY_RANK["warning"] else "warning"
    return sev if SEVERITY_RANK[sev] >= SEVERITY_RANK.get(floor, 0) else floor


RuleFn = Callable[[RuleContext], list[Finding]]
RULES: list[tuple[str, RuleFn]] = []


def rule(*ids: str):
    def deco(fn: RuleFn) -> RuleFn:
        RULES.append((",".join(ids), fn))
        return fn
    return deco


def _first_source(a: Analysis, pred) -> str | None:
    return next((c.source for c in a.collective_events if pred(c) and c.source), None)


def _gpu_note(ctx: RuleContext) -> str:
    return ("" if ctx.traits.async_collectives else
            " Here every FSDP collective blocks the host (CPU/gloo), so the saving shows only where collectives "
            "run on their own stream (GPU/NCCL), the prefetched all-gather under the previous unit's compute.")


def _sync_confidence(ctx: RuleContext, confidence: float) -> float:
    """Where collectives block the host, an overlap fix cannot be measured here: halve the confidence."""
    return confidence if ctx.traits.async_collectives else confidence * 0.5


def _wrap_site(ctx: RuleContext) -> str | None:
    """Where the model is wrapped, when the manifest recorded it."""
    w = ctx.wrap
    return w.get("call_site") or w.get("source") or w.get("wrapped_at")


# ------------------------------------------------------------------ FSDP prefetch
@rule("fsdp1-no-backward-prefetch", "fsdp1-backward-post")
def fsdp1_backward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp1" or p.backward_mode not in ("none", "post"):
        return []
    bwd_ag = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    nsteps = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    exposed = sum(c.exposed_us for c in bwd_ag) / nsteps
    configured = ctx.wrap.get("backward_prefetch", "unknown (no manifest)") if ctx.a.job.wrapping_source == "manifest" else "unknown (no manifest)"
    ev = [Evidence(f"{p.backward_prefetched} of {p.backward_all_gathers} backward all-gathers were issued by a "
                   f"prefetch ({p.backward_on_demand} on demand in _pre_backward_hook)"),
          Evidence(f"configured backward_prefetch: {configured}"),
          Evidence(f"backward all-gathers expose {ms(exposed)} per step", time_us=exposed)]
    src = _wrap_site(ctx) or _first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward")
    now = f"  # now {configured}" if ctx.a.job.wrapping_source == "manifest" else ""
    if p.backward_mode == "none":
        return [ctx.finding(
            "fsdp1-no-backward-prefetch", "FSDP backward prefetch is off", exposed,
            f"Every backward all-gather is issued on demand when its unit's gradient is needed, so "
            f"{ctx.device_word} waits for each gather before the unit's backward." + _gpu_note(ctx),
            "FSDP(model, ..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)" + (now or
            "  # from torch.distributed.fsdp import BackwardPrefetch"),
            # off is not FSDP's default (BACKWARD_PRE): a configuration that is wrong, at least a warning
            confidence=_sync_confidence(ctx, 0.95), evidence=ev, source=src, floor="warning")]
    return [ctx.finding(
        "fsdp1-backward-post", "FSDP backward prefetch is BACKWARD_POST", exposed,
        "BACKWARD_POST issues the next all-gather only after the current unit's gradient is computed, in the "
        "post-backward hook, right before its reduce-scatter; BACKWARD_PRE issues it before the gradient "
        "computation and overlaps more, at the cost of one more unsharded unit in memory." + _gpu_note(ctx),
        "FSDP(model, ..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)" + now,
        # away from FSDP's default (BACKWARD_PRE) toward less overlap: at least a warning; an error only
        # from its measured cost (it is also a memory trade-off, so never more without one)
        confidence=_sync_confidence(ctx, 0.9), evidence=ev, source=src, floor="warning")]


@rule("fsdp-forward-prefetch-off")
def forward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.forward_mode != "off":
        return []
    if p.framework == "fsdp2" and not ctx.traits.device_timeline:
        # FSDP2 overlaps forward all-gathers implicitly on a separate CUDA stream; a CPU trace cannot
        # show whether that works, so only explicit lists could be judged here
        return []
    fwd = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "forward"]
    nsteps = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    # waiting for a straggler in the first forward gather is the straggler's cost, not prefetch's
    exposed = max(sum(c.exposed_us for c in fwd) / nsteps - straggler_wait_in(ctx, "all_gather", "forward"), 0.0)
    if ctx.frac(exposed) < ctx.th["forward_exposed_frac"]:
        return []
    if p.framework == "fsdp1" and ctx.wrap.get("forward_prefetch") is True:
        return []  # already set: the trace disagrees with the manifest; prefetch status says so
    fix = ("FSDP(model, ..., forward_prefetch=True)" + ("  # now False" if ctx.wrap.get("forward_prefetch") is False
                                                       else "") if p.framework == "fsdp1" else
           "for i, block in enumerate(blocks[:-1]): block.set_modules_to_forward_prefetch([blocks[i + 1]])")
    return [ctx.finding(
        "fsdp-forward-prefetch-off", "Forward all-gathers are exposed and not prefetched", exposed,
        f"{len(fwd) // nsteps} forward all-gathers per step are issued on demand and expose {ms(exposed)} "
        f"({pct(ctx.frac(exposed))} of the step)." + _gpu_note(ctx),
        fix, confidence=_sync_confidence(ctx, 0.8),
        evidence=[Evidence(f"{p.forward_prefetched} of {p.forward_all_gathers} forward all-gathers prefetched"),
                  Evidence(f"exposed forward all-gather time {ms(exposed)} per step", time_us=exposed)],
        # forward_prefetch=False is FSDP's default: never more than its measured saving says, and where
        # collectives block the host a prefetch only moves the wait, so the saving here is nil
        severity=None if ctx.traits.async_collectives else "info",
        source=_wrap_site(ctx) or _first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "forward"))]


@rule("fsdp2-backward-prefetch-ineffective")
def fsdp2_backward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp2" or p.backward_mode in ("n/a", "unknown"):
        return []
    bwd_ag = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    nsteps = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    exposed = sum(c.exposed_us for c in bwd_ag) / nsteps
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
            "fsdp2-backward-prefetch-ineffective", "FSDP2 backward prefetch does not take effect", exposed,
            "FSDP2 normally all-gathers the previous block during a block's backward (like BACKWARD_PRE); here "
            "the backward all-gathers are issued on demand, so each block waits for its own gather."
            + _gpu_note(ctx), fix, confidence=_sync_confidence(ctx, 0.9), evidence=ev, floor="warning",
            source=_first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward"))]
    if p.gpu_overlap_confirmed is False:
        ev.append(Evidence("prefetched all-gather kernels do not overlap backward compute kernels"))
        return [ctx.finding(
            "fsdp2-backward-prefetch-ineffective", "FSDP2 prefetched all-gathers do not overlap compute", exposed,
            "All-gathers are issued by prefetch, but on the device they still run while no compute runs: something "
            "serialises the streams (a sync, a too-late prefetch, or CPU-bound launch).",
            "Check for host syncs in backward and CPU launch overhead; consider reshard_after_forward=False for "
            "the last blocks", confidence=0.6, evidence=ev)]
    return []


@rule("fsdp2-explicit-prefetch-noop")
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
            confidence=0.9, floor="warning", source=_wrap_site(ctx),
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
            confidence=0.7, floor="warning", source=_wrap_site(ctx),
            evidence=[Evidence(f"manifest: forward_prefetch set for {len(fwd)} module(s)")]))
    return out


# ------------------------------------------------------------------ communication
@rule("exposed-comm-high", "low-overlap")
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
        summary += f"; {ms(waiting)} of it is waiting for the straggler, {ms(exposed)} is left for a fix."
    else:
        summary += "."
    if sync:
        summary += (f" Collectives here block the host and the ranks share CPU cores, so healthy runs expose "
                    f"up to {pct(ctx.th['exposed_comm_frac_sync'])} (noise study); this is above it.")
    out.append(ctx.finding(
        "exposed-comm-high", f"Exposed communication is {pct(total)} of the step", exposed, summary, fix,
        confidence=_sync_confidence(ctx, 0.85), consequences=["low-overlap"],  # the same time, seen as overlap
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
            confidence=0.7, severity="info",
            evidence=[Evidence(f"overlap {pct(m.overlap_frac)} (threshold {pct(ctx.th['overlap_low_frac'])})")]))
    return out


def _comm_fix(ctx: RuleContext, kind: str) -> str:
    """What to change for the kind that exposes most, from what this job has set (never what is set)."""
    w, p = ctx.wrap, ctx.a.prefetch
    if kind == "all_reduce":
        cap = w.get("bucket_cap_mb")
        parts = []
        if cap is not None and not 10 <= float(cap) <= 50:
            parts.append(f"DDP(model, bucket_cap_mb=25)  # now {cap}")
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


@rule("latency-bound-collectives", "low-bus-bandwidth")
def message_sizes(ctx: RuleContext) -> list[Finding]:
    out = []
    nrs = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    small = [c for c in ctx.a.collective_events if c.size_bytes and c.size_bytes < ctx.th["small_message_bytes"]]
    if len(small) / nrs >= ctx.th["latency_bound_per_step"]:
        exposed = sum(c.exposed_us for c in small) / nrs
        kinds = sorted({c.kind for c in small})
        out.append(ctx.finding(
            "latency-bound-collectives", f"{len(small) / nrs:.0f} small collectives per step", exposed,
            f"{len(small) / nrs:.0f} collectives per step move less than {size(ctx.th['small_message_bytes'])} "
            f"each ({', '.join(kinds)}); their cost is latency, not bandwidth.",
            _latency_fix(ctx), confidence=0.7,
            evidence=[Evidence(f"median size {size(sorted(c.size_bytes for c in small)[len(small) // 2])}, "
                               f"exposed {ms(exposed)} per step", time_us=exposed)]))
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
                "Check NCCL_ALGO/NCCL_PROTO defaults, NIC/NVLink topology (nvidia-smi topo -m), and run "
                "nccl-tests at this size; rule out stragglers first", confidence=0.5,
                evidence=[Evidence(f"{c.kind} {size(c.size_bytes)} in {ms(c.duration_us, 2)}: "
                                   f"{c.busbw_gbps:.1f} GB/s", rank=c.rank, step=c.step, time_us=c.duration_us)
                          for c in slow[:5]]))
    return out


def _latency_fix(ctx: RuleContext) -> str:
    cap = ctx.wrap.get("bucket_cap_mb")
    if ctx.a.job.wrapping == "ddp":
        return (f"DDP(model, bucket_cap_mb={max(25, 2 * float(cap)):g})  # now {cap}" if cap is not None else
                "DDP(model, bucket_cap_mb=25 or more)") + "; coalesce scalar all-reduces (torch._foreach / one tensor)"
    if ctx.a.job.wrapping in ("fsdp1", "fsdp2"):
        return "Wrap larger FSDP units (several blocks per unit) so each all-gather/reduce-scatter moves more"
    return "Coalesce them: bucket small tensors into one collective (all_reduce_coalesced, flatten then split)"


# ------------------------------------------------------------------ DDP
DDP_DEFAULT_BUCKET_MB = 25   # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25), in MiB
MIB = 1 << 20


def _grad_dtype_bytes(ctx: RuleContext) -> int:
    dtype = ((ctx.a.job.manifest or {}).get("model") or {}).get("param_dtype") or "float32"
    return 2 if any(k in str(dtype) for k in ("16", "half")) else 8 if "64" in str(dtype) else 4


@rule("ddp-single-bucket", "ddp-tiny-buckets", "ddp-find-unused-unneeded", "grad-accum-without-no-sync")
def ddp_rules(ctx: RuleContext) -> list[Finding]:
    d = ctx.a.signals.ddp if ctx.a.signals else None
    if d is None:
        return []
    out = []
    cap = ctx.wrap.get("bucket_cap_mb")
    params = (ctx.a.job.manifest or {}).get("model", {}).get("parameters") if ctx.a.job.manifest else None
    ar = [c for c in ctx.a.collective_events if c.kind == "all_reduce" and c.phase in ("backward", "other")]
    grad_ar = [c for c in ar if (c.nelems or 0) > 1024 or c.nelems is None]  # not the find_unused bitmap
    nrs = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    backwards = max(d.backwards_with_allreduce_per_step, 1.0)
    per_backward = len(grad_ar) / nrs / backwards
    exposed_ar = sum(c.exposed_us for c in grad_ar) / nrs
    if per_backward <= 1.01 and (d.overlap_frac or 0.0) < ctx.th["ddp_single_bucket_overlap"]:
        biggest = max((c.nelems or 0 for c in grad_ar), default=0)
        ev = [Evidence(f"{per_backward:.0f} gradient all-reduce per backward pass, overlap {pct(d.overlap_frac)}"),
              Evidence(f"exposed all-reduce {ms(exposed_ar)} per step", time_us=exposed_ar)]
        if biggest and params:
            ev.append(Evidence(f"the bucket holds {biggest:,} of {params:,} parameters"))
        if cap is not None:
            ev.append(Evidence(f"manifest: bucket_cap_mb={cap}"))
        grad_bytes = biggest * _grad_dtype_bytes(ctx)
        raised = isinstance(cap, (int, float)) and cap > DDP_DEFAULT_BUCKET_MB
        if raised or not grad_bytes:
            # a cap raised above the default is the cause: the known-wrong setting gets a warning floor
            fix = (f"DDP(model, bucket_cap_mb={DDP_DEFAULT_BUCKET_MB})  # now {cap}" if raised else
                   f"DDP(model, bucket_cap_mb={DDP_DEFAULT_BUCKET_MB}) (the default); do not raise it above the "
                   "model's gradient size")
            floor = "warning" if raised else "info"
        elif grad_bytes < ctx.th["small_message_bytes"]:
            fix = None  # every gradient fits one latency-bound message: more buckets add latency, not overlap
        else:
            # the default cap already holds every gradient (a small model): only a smaller cap splits it;
            # aim at about four buckets, the first of which can start while backward still runs
            target = float(f"{max(grad_bytes / 4 / MIB, 0.1):.2g}")
            fix = (f"DDP(model, bucket_cap_mb={target:g})  # now {cap if cap is not None else 'the default'}: all "
                   f"{size(grad_bytes)} of gradients fit one bucket, so the all-reduce waits for the whole backward")
            floor = "info"
        if fix is not None:
            out.append(ctx.finding(
                "ddp-single-bucket", "DDP all-reduces all gradients in one bucket after backward", exposed_ar,
                "With a single bucket the all-reduce can start only when the last gradient is ready, so none of it "
                "overlaps backward compute.", fix,
                confidence=_sync_confidence(ctx, 0.9), evidence=ev, floor=floor, source=_wrap_site(ctx)))
    mean_nelems = (sum(c.nelems or 0 for c in grad_ar) / len(grad_ar)) if grad_ar else 0
    db = 4 if (ctx.a.job.manifest or {}).get("model", {}).get("param_dtype", "float32") in ("float32", None) else 2
    mean_bytes = mean_nelems * db
    if per_backward >= ctx.th["ddp_tiny_buckets_per_backward"] and mean_bytes and mean_bytes < ctx.th["ddp_tiny_bucket_bytes"]:
        busy = sum(c.duration_us for c in grad_ar) / nrs
        out.append(ctx.finding(
            "ddp-tiny-buckets", f"DDP uses {per_backward:.0f} tiny buckets per backward", exposed_ar,
            f"Gradients are all-reduced in {per_backward:.0f} buckets of {size(mean_bytes)} on average; each "
            f"all-reduce pays a fixed latency, {ms(busy)} of all-reduce per step in total.",
            f"DDP(model, bucket_cap_mb=25)  # now {cap}" if cap is not None else "DDP(model, bucket_cap_mb=25)",
            confidence=0.85, floor="warning", source=_wrap_site(ctx),
            evidence=[Evidence(f"{per_backward:.0f} all-reduces per backward, mean {size(mean_bytes)} "
                               f"(assuming {db}-byte gradients)"),
                      Evidence(f"exposed all-reduce {ms(exposed_ar)} per step", time_us=exposed_ar)]))
    find_unused = d.search_unused_per_step > 0 or bool(ctx.wrap.get("find_unused_parameters"))
    if find_unused and d.bucket_copies_per_step and d.grads_accumulated_per_step >= d.bucket_copies_per_step * max(
            d.backwards_per_step, 1) - 0.5:
        bitmap = [c for c in ar if c.nelems is not None and c.nelems <= 1024]
        cost = d.search_unused_us_per_step + sum(c.duration_us for c in bitmap) / nrs
        out.append(ctx.finding(
            "ddp-find-unused-unneeded", "find_unused_parameters=True but every parameter gets a gradient", cost,
            "DDP traverses the autograd graph after each forward and all-reduces a used-parameter bitmap, yet "
            "every parameter received a gradient in every backward pass.",
            "DDP(model, find_unused_parameters=False)  (or static_graph=True if the set of used parameters "
            "never changes)" + ("  # now find_unused_parameters=True" if ctx.wrap.get("find_unused_parameters")
                                else ""), confidence=0.85, floor="warning", source=_wrap_site(ctx),
            evidence=[Evidence(f"{d.search_unused_per_step:.0f} search_unused_parameters per step, "
                               f"{ms(d.search_unused_us_per_step, 2)}"),
                      Evidence(f"{d.grads_accumulated_per_step:.0f} AccumulateGrad per step for "
                               f"{d.bucket_copies_per_step:.0f} bucketed parameters"),
                      Evidence(f"{len(bitmap) / nrs:.0f} extra small all-reduce per step (used-parameter bitmap)")]))
    if d.forwards_per_step >= 2 and d.backwards_with_allreduce_per_step >= 2:
        extra = (d.backwards_with_allreduce_per_step - 1) / d.backwards_with_allreduce_per_step
        cost = sum(c.duration_us for c in grad_ar) / nrs * extra
        out.append(ctx.finding(
            "grad-accum-without-no-sync", "Gradients are all-reduced on every accumulation micro-step", cost,
            f"{d.forwards_per_step:.0f} forward/backward passes per optimizer step and "
            f"{d.backwards_with_allreduce_per_step:.0f} of them all-reduce gradients; only the last needs to.",
            "with model.no_sync(): loss.backward()  # for all but the last micro-step",
            confidence=0.9, floor="warning",
            evidence=[Evidence(f"{d.backwards_with_allreduce_per_step:.0f} backward passes with all-reduce per step"),
                      Evidence(f"{d.allreduces_per_step:.0f} all-reduces per step")]))
    return out


# ------------------------------------------------------------------ input, stragglers, syncs
@rule("input-bound")
def input_bound(ctx: RuleContext) -> list[Finding]:
    loaders = ctx.a.signals.dataloader if ctx.a.signals else []
    m = ctx.a.mean
    if not loaders or not m:
        return []
    f = ctx.frac(m.data_loading_us)
    if f < ctx.th["input_bound_frac"]:
        return []
    high = f >= ctx.th["input_bound_high_frac"]
    worst = max(loaders, key=lambda d: d.exposed_frac)
    single = worst.iterator.startswith("_SingleProcess")
    fix = ("DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True)  # now num_workers=0"
           if single else "DataLoader(..., num_workers=<more>, prefetch_factor=4, pin_memory=True); "
                          "and speed up the dataset (cache decoded samples" +
                          (", decode/augment on the GPU)" if ctx.traits.device_timeline else ")"))
    ev = [Evidence(f"rank {d.rank}: DataLoader __next__ {pct(d.stall_frac)} of step, {ms(d.mean_call_us)} per call, "
                   f"{d.calls_per_step:.0f} call(s) per step", rank=d.rank) for d in loaders[:8]]
    if worst.slow_frame:
        ev.append(Evidence(f"slowest frame under __next__: {worst.slow_frame} ({ms(worst.slow_frame_us)} per step)",
                           source=worst.slow_frame))
    found = ctx.finding(
        "input-bound", f"{'Highly' if high else 'Moderately'} input-bound: data loading is {pct(f)} of the step",
        m.data_loading_us,
        f"The training loop waits {ms(m.data_loading_us)} per step for the next batch "
        f"({'single-process loading in the training process' if single else 'the worker processes do not keep up'}).",
        fix, confidence=0.9, evidence=ev, source=worst.slow_frame, floor="warning")
    from fsdpdoctor.diagnose.gpu_rules import dominant_idle_cause
    if dominant_idle_cause(ctx) == "data_loading":
        found.consequences.append("gpu-idle")  # the GPU idles because it waits for the batch
    return [found]


@rule("straggler")
def straggler(ctx: RuleContext) -> list[Finding]:
    s = ctx.a.straggler
    verdict = straggler_verdict(ctx)
    if not verdict:
        return []
    r = s.straggler
    impact = s.saving_us or s.wait_us  # with more than 2 ranks the step ends when the next-latest arrives
    cause = s.cause or "unknown"
    own_work = _own_work_frame(s)
    frame = (s.cause_source if own_work else None) or (_sleep_source(ctx, r) if cause == "sleep" else None)
    if cause == "compute" and not own_work:
        cause = "slower at the same work"
    where = f" in {frame}" if frame else ""
    fixes = {"data loading": "Give rank {r} a faster input pipeline (num_workers, local data, no slow storage)",
             "sleep": "Remove the sleep/wait on rank {r}{where} (a barrier, checkpoint or logging call on one rank?)",
             "host sync": "Remove the host syncs on rank {r}{where} (.item(), .cpu(), print of tensors)",
             "compute": "Rank {r} computes {extra} more per step{where}: give every rank the same work (rank-"
                        "specific code, uneven shapes -> bucket by length)",
             "slower at the same work": "Rank {r} runs the same code {extra} per step slower than the others: " + (
                 "check its device (clocks, thermal, other processes on it)" if ctx.traits.device_timeline else
                 "check that no other process takes its cores (pin ranks to cores, fewer jobs per host)"),
             "idle": "Rank {r} is idle outside ops: look for Python work, logging or I/O only it does"}
    ev = [Evidence(f"rank {r} was the last to arrive in {s.steps_last} of {s.steps_total} steps; a healthy rank "
                   f"is last that often by chance with probability {s.chance:.2f} ({len(ctx.a.ranks)} ranks)",
                   rank=r),
          Evidence(f"the others wait {ms(s.wait_us)} per step for it (median), {s.wait_us / s.noise_us:.1f}x this "
                   f"run's step-to-step noise of {ms(s.noise_us)}" if s.noise_us else
                   f"the others wait {ms(s.wait_us)} per step for it (median; one step: no noise estimate)",
                   rank=r, time_us=s.wait_us)]
    if s.cause_evidence:
        ev.append(Evidence(s.cause_evidence, rank=r, time_us=s.extra_us))
    for fr in s.cause_frames[:3]:
        ev.append(Evidence(f"{fr['frame']}: {ms(fr['culprit_us'])} per step on rank {r}, "
                           f"{ms(fr['others_us'])} on the others", rank=r, source=fr["frame"]))
    ev += [Evidence(f"step {p['step']}: rank {p['straggler']} arrived last; the others waited "
                    f"{ms(p['imbalance_us'])} ({pct(p['imbalance_frac'])} of the step) in collective "
                    f"#{p['collective_index']}", rank=p["straggler"], step=p["step"], time_us=p["imbalance_us"])
           for p in s.per_step[:6]]
    explained = _straggler_explains_comm(ctx)
    conseq = ["exposed-comm-high", "low-overlap", "low-bus-bandwidth"] if explained else []
    if straggler_wait_in(ctx, "all_gather", "forward"):
        conseq.append("fsdp-forward-prefetch-off")  # its exposed forward gathers hold the wait
    summary = (f"Rank {r} was the last to arrive in {s.steps_last} of {s.steps_total} steps and the others wait "
               f"{ms(s.wait_us)} per step for it ({pct(ctx.frac(s.wait_us))} of the step) in their first "
               "collective after the delay.")
    if impact < 0.99 * s.wait_us:
        summary += (f" Without it each step would end when the next-latest rank arrives: {ms(impact)} "
                    f"({pct(ctx.frac(impact))}) shorter.")
    if explained:
        summary += (f" That wait is {pct(explained)} of the other ranks' exposed communication: the "
                    "communication is slow because of this rank, not the network.")
    return [ctx.finding(
        "straggler", f"Rank {r} is a straggler ({cause})", impact, summary,
        fixes.get(cause, "Find what rank {r} does differently{where}").format(
            r=r, where=where, extra=ms(s.extra_us)),
        confidence=verdict, evidence=ev, ranks=[r], source=frame, consequences=conseq)]


def _sleep_source(ctx: RuleContext, rank: int) -> str | None:
    return ctx.a.signals.sleep_sources.get(rank) if ctx.a.signals else None


def _own_work_frame(s) -> dict | None:
    """The culprit's frame holding work of its own: at least half of the others' wait for it, in a frame the
    other ranks spend at most half as long in (a sleep, an eval or a checkpoint only it runs). Extra time
    spread over frames every rank runs is the same work done slower (busier cores, a slower device)."""
    top = s.cause_frames[0] if s.cause_frames else None
    if top and top["extra_us"] >= 0.5 * s.wait_us and top["others_us"] <= 0.5 * top["culprit_us"]:
        return top
    return None


def straggler_verdict(ctx: RuleContext) -> float:
    """The confidence that the report's rank is a straggler, 0.0 when the evidence does not hold.

    All measured in this run: the same rank is last in most steps (``straggler_consistency``) and the
    others' wait for it is material (``straggler_min_frac`` of the step). Then either the wait stands
    ``straggler_noise_z`` robust standard deviations above the run's step-to-step noise, or two independent
    lines of evidence agree: a consistency unlikely by chance (``straggler_chance``) and a frame of the
    culprit's own work that holds the wait, with the wait at least above one standard deviation of noise.
    Confidence grows as the consistency gets unlikely by chance and as the culprit's extra time accounts
    for the wait.
    """
    s = ctx.a.straggler
    if not s or s.straggler is None or not s.steps_total:
        return 0.0
    if s.last_fraction < ctx.th["straggler_consistency"] or ctx.frac(s.wait_us) < ctx.th["straggler_min_frac"]:
        return 0.0
    if s.noise_us > 0:
        above_noise = s.wait_us >= ctx.th["straggler_noise_z"] * s.noise_us
        corroborated = (s.chance <= ctx.th["straggler_chance"] and _own_work_frame(s) is not None
                        and s.wait_us >= s.noise_us)
        if not (above_noise or corroborated):
            return 0.0
    elif ctx.frac(s.wait_us) < ctx.th["severity_error_frac"]:
        return 0.0  # one step: no noise estimate, so only a wait of a quarter of the step is trusted
    explained = min(s.extra_us / s.wait_us, 1.0) if s.wait_us > 0 else 0.0
    return round(0.5 + 0.3 * (1.0 - s.chance) + 0.2 * explained, 2)


def _straggler_explains_comm(ctx: RuleContext) -> float:
    """Share of the waiting ranks' exposed communication that is waiting for the straggler (0 if < half)."""
    s = ctx.a.straggler
    waiters = [r.mean.exposed_comm_us for r in ctx.a.ranks if r.rank != s.straggler and r.mean]
    exposed = sum(waiters) / len(waiters) if waiters else 0.0
    share = min(straggler_wait_us(ctx) / exposed, 1.0) if exposed else 0.0
    return share if share >= 0.5 else 0.0


def straggler_wait_in(ctx: RuleContext, kind: str, phase: str | None = None) -> float:
    """Per rank and step, the wait for the straggler that collectives of this kind (and phase) absorb."""
    s = ctx.a.straggler
    if not straggler_verdict(ctx) or not s.steps_total:
        return 0.0
    waits = [p.get("mean_wait_us", 0.0) for p in s.per_step if p["straggler"] == s.straggler
             and p.get("kind") == kind and (phase is None or p.get("phase") == phase)]
    return sum(waits) / s.steps_total


def straggler_wait_us(ctx: RuleContext) -> float:
    """Mean per-step wait of the non-straggler ranks, when a straggler finding applies."""
    s = ctx.a.straggler
    if not straggler_verdict(ctx):
        return 0.0
    others = [w for r, w in s.wait_by_rank.items() if r != s.straggler]
    return sum(others) / len(others) if others else 0.0


@rule("host-sync")
def host_sync(ctx: RuleContext) -> list[Finding]:
    syncs = ctx.a.signals.host_syncs if ctx.a.signals else []
    if not syncs:
        return []
    nsteps = max(len(ctx.a.job.steps), 1)
    by_src: dict[str | None, list] = {}
    for h in syncs:
        by_src.setdefault(h.source, []).append(h)
    out = []
    for src, hs in by_src.items():
        per_rank_step = sum(h.count for h in hs) / nsteps / max(len({h.rank for h in hs}), 1)
        if per_rank_step < ctx.th["host_sync_per_step"]:
            continue
        nranks = max(len({h.rank for h in hs}), 1)
        device = ctx.traits.device_timeline
        # device traces: the bubble after each sync; host-only traces: nothing waits, the finding is structural
        us = sum(h.bubble_us for h in hs) / nsteps / nranks if device else 0.0
        names = list(dict.fromkeys(h.name for h in hs))
        label = ", ".join(".item()" if "local_scalar" in n else n for n in names[:3])
        where = f"your code at {src}" if src else "code outside DDP/FSDP/optimizer internals (no user frame found)"
        cost = ("Each one blocks the host until the queued kernels finish, so the next kernels launch late and "
                "the GPU idles." if device else
                "On this CPU trace nothing waits for it, so it costs nothing measurable here (run on CUDA, each "
                "call would drain the device queue before the next launch).")
        out.append(ctx.finding(
            "host-sync", f"Host sync inside the step: {label}", us,
            f"{per_rank_step:.0f} call(s) per step ({', '.join(names)}) from {where}. {cost}",
            "Keep the value on the device (accumulate tensors, log every N steps with a single .item()), or "
            "use non_blocking copies", confidence=0.8 if src else 0.6, source=src,
            ranks=sorted({h.rank for h in hs}),
            evidence=[Evidence(f"rank {h.rank}: {h.count} x {h.name} in steps {_ranges(h.steps)}, host blocked "
                               f"{ms(h.total_us, 3)}" + (f", device idle after it {ms(h.bubble_us, 3)}"
                                                         if device else ""),
                               rank=h.rank, source=h.source) for h in hs[:6]]
            + ([] if src else [Evidence("no Python stacks in the trace: record with with_stack=True to see "
                                        "the calling line")])))
    return out


def _ranges(steps: list[int]) -> str:
    """[3, 4, 5, 7] -> "3-5, 7"."""
    out, run = [], []
    for s in sorted(steps):
        if run and s == run[-1] + 1:
            run.append(s)
        else:
            if run:
                out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [s]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def diagnose(analysis: Analysis, thresholds: dict[str, float] | None = None) -> list[Finding]:
    register_all()
    ctx = RuleContext(analysis, resolve(thresholds))
    findings: list[Finding] = []
    for _, fn in RULES:
        findings.extend(fn(ctx))
    # the per-rank flag in the JSON says what the finding says
    slow = {r for f in findings if f.id == "straggler" for r in f.ranks}
    for r in analysis.ranks:
        r.is_straggler = r.rank in slow
    return fold_consequences(findings)


def _cost_order(f: Finding) -> tuple:
    # severity first; among equals the finding that explains more (a setup fault) claims first
    return (-SEVERITY_RANK.get(f.severity, 0), -len(f.consequences), -f.impact_us, f.id)


def fold_consequences(findings: list[Finding]) -> list[Finding]:
    """Root cause first: fold the findings a root names in ``consequences`` under it.

    Roots claim in order of severity, then how much they explain, then impact (a setup fault
    before a straggler), a finding
    is claimed once (so no cycles), a claimed finding's own effects move up under the new root
    (one level: root, then all its effects), and a finding claimed before its turn claims nothing.
    A consequence gets ``caused_by`` and is capped at "info", so only its root gates ``check``.
    Returned order: roots by cost (most costly first), each followed by its consequences.
    """
    by_id: dict[str, list[Finding]] = {}
    for f in findings:
        by_id.setdefault(f.id, []).append(f)
    # a rule may name its own root cause (caused_by) instead of the root naming it: turn that into
    # the root's claim, and drop a named cause that did not fire
    for f in findings:
        if f.caused_by:
            for root in by_id.get(f.caused_by, []):
                if f.id not in root.consequences:
                    root.consequences.append(f.id)
            f.caused_by = None
    children: dict[int, list[Finding]] = {}
    for root in sorted(findings, key=_cost_order):
        if root.caused_by:
            root.consequences = []
            continue
        claimed = []
        for cid in dict.fromkeys(root.consequences):
            for g in by_id.get(cid, []):
                if g is root or g.caused_by:
                    continue
                g.caused_by = root.id
                g.severity = "info"
                g.consequences = []
                claimed.append(g)
                # an effect that had claimed effects of its own hands them up: one level under the root
                for h in children.pop(id(g), []):
                    h.caused_by = root.id
                    claimed.append(h)
        root.consequences = list(dict.fromkeys(g.id for g in claimed))
        children[id(root)] = sorted(claimed, key=_cost_order)
    out: list[Finding] = []
    for root in sorted((f for f in findings if not f.caused_by), key=lambda f: (-f.impact_us, -SEVERITY_RANK.get(
            f.severity, 0), f.id)):
        out.append(root)
        out.extend(children.get(id(root), []))
    return out


# rule modules beside this one register on import (setup faults, device-timeline rules); imported
# when the rules are first needed, so that they can import this module without a cycle
RULE_MODULES = ("fsdpdoctor.diagnose.setup_rules", "fsdpdoctor.diagnose.gpu_rules")


def register_all() -> None:
    import importlib

    for name in RULE_MODULES:
        importlib.import_module(name)


def __getattr__(name: str):
    if name == "RULE_IDS":  # every registered rule id, the other modules' too
        register_all()
        return [i for ids, _ in RULES for i in ids.split(",")]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
