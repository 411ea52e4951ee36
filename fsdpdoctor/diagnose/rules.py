"""Rules: metrics -> findings with evidence, an impact estimate and a fix.

Each rule is a function ``(RuleContext) -> list[Finding]`` registered in
``RULES``. Impact is the time per step that fixing the problem would save at
most (usually the exposed time it causes); severity follows impact unless the
rule says otherwise. Fixes name this job's configuration when the manifest
gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    def cpu(self) -> bool:
        return self.a.job.dialect == "cpu"

    @property
    def traits(self) -> DialectTraits:
        return self.a.job.traits

    @property
    def wrap(self) -> dict:
        return self.a.job.wrapping_details or {}

    def frac(self, us: float) -> float:
        return us / self.step_us if self.step_us else 0.0

    def severity(self, impact_us: float, floor: str = "info") -> str:
        f = self.frac(impact_us)
        sev = "error" if f >= self.th["exposed_comm_error_frac"] else "warning" if f >= 0.05 else "info"
        order = ["info", "warning", "error"]
        return sev if order.index(sev) >= order.index(floor) else floor

    def finding(self, id: str, title: str, impact_us: float, summary: str, fix: str, *, confidence: float,
                evidence: list[Evidence], severity: str | None = None, ranks=None, source=None) -> Finding:
        return Finding(id=id, title=title, severity=severity or self.severity(impact_us), confidence=confidence,
                       impact_us=impact_us, impact_frac=self.frac(impact_us), summary=summary, fix=fix,
                       evidence=evidence, ranks=list(ranks or self.a.job.ranks_analyzed), source=source)


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
    return (" On CPU/gloo every FSDP collective is synchronous, so the saving shows on GPU/NCCL, where the "
            "prefetched all-gather runs on its own stream under the previous unit's compute." if ctx.cpu else "")


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
    src = _first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward")
    if p.backward_mode == "none":
        return [ctx.finding(
            "fsdp1-no-backward-prefetch", "FSDP backward prefetch is off", exposed,
            "Every backward all-gather is issued on demand when its unit's gradient is needed, so the GPU waits "
            "for each gather before computing." + _gpu_note(ctx),
            "FSDP(model, ..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)  "
            "# from torch.distributed.fsdp import BackwardPrefetch",
            confidence=0.95, evidence=ev, source=src,
            severity=ctx.severity(exposed, floor="warning"))]
    return [ctx.finding(
        "fsdp1-backward-post", "FSDP backward prefetch is BACKWARD_POST", exposed,
        "BACKWARD_POST issues the next all-gather only after the current unit's gradient is computed, in the "
        "post-backward hook, right before its reduce-scatter; BACKWARD_PRE issues it before the gradient "
        "computation and overlaps more, at the cost of one more unsharded unit in memory." + _gpu_note(ctx),
        "FSDP(model, ..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)",
        confidence=0.9, evidence=ev, source=src, severity=ctx.severity(exposed, floor="info"))]


@rule("fsdp-forward-prefetch-off")
def forward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.forward_mode != "off":
        return []
    if p.framework == "fsdp2" and ctx.cpu:
        # FSDP2 overlaps forward all-gathers implicitly on a separate CUDA stream; a CPU trace cannot
        # show whether that works, so only explicit lists could be judged here
        return []
    fwd = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "forward"]
    nsteps = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    exposed = sum(c.exposed_us for c in fwd) / nsteps
    if ctx.frac(exposed) < ctx.th["forward_exposed_frac"]:
        return []
    fix = ("FSDP(model, ..., forward_prefetch=True)" if p.framework == "fsdp1" else
           "for i, block in enumerate(blocks[:-1]): block.set_modules_to_forward_prefetch([blocks[i + 1]])")
    return [ctx.finding(
        "fsdp-forward-prefetch-off", "Forward all-gathers are exposed and not prefetched", exposed,
        f"{len(fwd) // nsteps} forward all-gathers per step are issued on demand and expose {ms(exposed)} "
        f"({pct(ctx.frac(exposed))} of the step)." + _gpu_note(ctx),
        fix, confidence=0.8 if not ctx.cpu else 0.6,
        evidence=[Evidence(f"{p.forward_prefetched} of {p.forward_all_gathers} forward all-gathers prefetched"),
                  Evidence(f"exposed forward all-gather time {ms(exposed)} per step", time_us=exposed)],
        severity="info" if ctx.cpu else ctx.severity(exposed),
        source=_first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "forward"))]


@rule("fsdp2-backward-prefetch-ineffective")
def fsdp2_backward_prefetch(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp2" or p.backward_mode in ("n/a", "unknown"):
        return []
    bwd_ag = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    nsteps = max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)
    exposed = sum(c.exposed_us for c in bwd_ag) / nsteps
    lists = ctx.wrap.get("backward_prefetch") or {}
    self_ref = [m for m, targets in lists.items() if m in (targets or [])]
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
            + _gpu_note(ctx), fix, confidence=0.9, evidence=ev,
            severity=ctx.severity(exposed, floor="warning"),
            source=_first_source(ctx.a, lambda c: c.kind == "all_gather" and c.phase == "backward"))]
    if p.gpu_overlap_confirmed is False:
        ev.append(Evidence("prefetched all-gather kernels do not overlap backward compute kernels"))
        return [ctx.finding(
            "fsdp2-backward-prefetch-ineffective", "FSDP2 prefetched all-gathers do not overlap compute", exposed,
            "All-gathers are issued by prefetch, but on the GPU they still run while no compute runs: something "
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
            confidence=0.9, severity="info",
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
            confidence=0.7, severity="info",
            evidence=[Evidence(f"manifest: forward_prefetch set for {len(fwd)} module(s)")]))
    return out


# ------------------------------------------------------------------ communication
@rule("exposed-comm-high", "low-overlap")
def exposed_comm(ctx: RuleContext) -> list[Finding]:
    m = ctx.a.mean
    if not m or m.comm_us <= 0 or m.compute_us + m.optimizer_us <= 0:
        return []  # with no compute events recorded, exposed cannot be told from overlapped
    out = []
    # time spent waiting for a straggler is the straggler's finding, not the network's
    waiting = min(straggler_wait_us(ctx), m.exposed_comm_us)
    exposed = m.exposed_comm_us - waiting
    f = ctx.frac(exposed)
    if f >= ctx.th["exposed_comm_frac"]:
        kinds = sorted(m.comm_by_kind.items(), key=lambda kv: -kv[1].exposed_us)
        top = ", ".join(f"{k} {ms(v.exposed_us)}" for k, v in kinds[:3] if v.exposed_us > 0)
        phases = ", ".join(f"{k} {ms(v)}" for k, v in sorted(m.exposed_by_phase.items(), key=lambda kv: -kv[1]) if v > 0)
        worst_kind = kinds[0][0]
        fix = {"all_reduce": "DDP: keep bucket_cap_mb near the default (25) so buckets all-reduce during backward; "
                             "use gradient accumulation with no_sync(); compress gradients (bf16 hooks)",
               "all_gather": "FSDP: enable backward/forward prefetch; use a larger unit per block; "
                             "reshard_after_forward=False for the last blocks if memory allows",
               "reduce_scatter": "FSDP: reduce in bf16 (MixedPrecision(reduce_dtype=torch.bfloat16)); "
                                 "fewer, larger units",
               "all_to_all": "Balance the all-to-all splits and overlap them with the dense compute (pipelining)",
               }.get(worst_kind, "Overlap communication with compute or reduce its volume")
        if ctx.cpu:
            fix += " (CPU/gloo: collectives compete with compute for the same cores; measure on GPU/NCCL)"
        out.append(ctx.finding(
            "exposed-comm-high", f"Exposed communication is {pct(f)} of the step", exposed,
            f"{ms(exposed)} per step of communication is not hidden by compute (by kind: {top}; "
            f"by phase: {phases})" + (f", after removing {ms(waiting)} of waiting for the straggler." if waiting
                                      else "."), fix, confidence=0.85,
            evidence=[Evidence(f"communication {ms(m.comm_us)} per step, overlapped {ms(m.overlapped_comm_us)} "
                               f"({pct(m.overlap_frac)})")] +
                     [Evidence(f"rank {r.rank}: exposed {ms(r.mean.exposed_comm_us)} per step", rank=r.rank,
                               time_us=r.mean.exposed_comm_us) for r in ctx.a.ranks if r.mean][:8]))
    if (not ctx.cpu and m.overlap_frac is not None and m.overlap_frac < ctx.th["overlap_low_frac"]
            and f >= ctx.th["exposed_comm_frac"]):
        out.append(ctx.finding(
            "low-overlap", f"Only {pct(m.overlap_frac)} of communication overlaps compute", m.exposed_comm_us,
            "Most collective kernels run while no compute kernel runs.",
            "Issue collectives earlier (prefetch, DDP buckets during backward) and keep compute on other streams",
            confidence=0.7, severity="info",
            evidence=[Evidence(f"overlap {pct(m.overlap_frac)} (threshold {pct(ctx.th['overlap_low_frac'])})")]))
    return out


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
            "Coalesce them: larger DDP buckets (bucket_cap_mb), larger FSDP units, all_reduce_coalesced / "
            "torch._foreach ops for scalars", confidence=0.7,
            evidence=[Evidence(f"median size {size(sorted(c.size_bytes for c in small)[len(small) // 2])}, "
                               f"exposed {ms(exposed)} per step", time_us=exposed)]))
    if not ctx.cpu:
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
                # its time is already inside the exposed-communication finding: never the headline
                severity="warning" if ctx.frac(exposed) >= 0.05 else "info",
                evidence=[Evidence(f"{c.kind} {size(c.size_bytes)} in {ms(c.duration_us, 2)}: "
                                   f"{c.busbw_gbps:.1f} GB/s", rank=c.rank, step=c.step, time_us=c.duration_us)
                          for c in slow[:5]]))
    return out


# ------------------------------------------------------------------ DDP
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
        out.append(ctx.finding(
            "ddp-single-bucket", "DDP all-reduces all gradients in one bucket after backward", exposed_ar,
            "With a single bucket the all-reduce can start only when the last gradient is ready, so none of it "
            "overlaps backward compute.",
            f"DDP(model, bucket_cap_mb=25)  # now {cap}" if cap is not None else
            "DDP(model, bucket_cap_mb=25) (the default); do not raise it above the model's gradient size",
            confidence=0.9, evidence=ev, severity=ctx.severity(exposed_ar, floor="warning")))
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
            confidence=0.85, severity=ctx.severity(exposed_ar, floor="warning"),
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
            "never changes)", confidence=0.85, severity="warning",
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
            confidence=0.9, severity=ctx.severity(cost, floor="warning"),
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
                          "and speed up the dataset (decode/augment on the GPU, cache)")
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
        fix, confidence=0.9, evidence=ev, source=worst.slow_frame,
        severity="error" if high else "warning")
    from fsdpdoctor.diagnose.gpu_rules import dominant_idle_cause
    if dominant_idle_cause(ctx) == "data_loading":
        found.consequences.append("gpu-idle")  # the GPU idles because it waits for the batch
    return [found]


@rule("straggler")
def straggler(ctx: RuleContext) -> list[Finding]:
    s = ctx.a.straggler
    if not _is_straggler(ctx):
        return []
    waits = [p["imbalance_us"] for p in s.per_step if p["straggler"] == s.straggler]
    impact = sum(waits) / len(waits) if waits else 0.0
    cause = s.cause or "unknown"
    fixes = {"data loading": "Give rank {r} a faster input pipeline (num_workers, local data, no slow storage)",
             "sleep": "Remove the sleep/wait on rank {r} (a barrier, checkpoint or logging call on one rank?)",
             "host sync": "Remove the host syncs on rank {r} (.item(), .cpu(), print of tensors)",
             "compute": "Rank {r} computes slower: check its device (clocks, thermal, other jobs) and input "
                        "shapes (uneven sequence lengths -> bucket by length)",
             "idle": "Rank {r} is idle outside ops: look for Python work, logging or I/O only it does"}
    src = None
    if cause == "sleep":
        src = next((r for r in ctx.a.signals.host_syncs if r.rank == s.straggler and r.source), None)
        src = src.source if src else None
    ev = [Evidence(f"step {p['step']}: rank {p['straggler']} arrived last; the others waited "
                   f"{ms(p['imbalance_us'])} ({pct(p['imbalance_frac'])} of the step) in collective "
                   f"#{p['collective_index']}", rank=p["straggler"], step=p["step"], time_us=p["imbalance_us"])
          for p in s.per_step[:6]]
    if s.cause_evidence:
        ev.append(Evidence(s.cause_evidence, rank=s.straggler))
    sleep_src = _sleep_source(ctx, s.straggler)
    if sleep_src:
        ev.append(Evidence(f"sleep called from {sleep_src}", rank=s.straggler, source=sleep_src))
    return [ctx.finding(
        "straggler", f"Rank {s.straggler} is a straggler ({cause})", impact,
        f"Rank {s.straggler} was the slowest in {pct(s.last_fraction)} of steps; the other ranks wait "
        f"{ms(impact)} per step for it in their first collective after the delay.",
        fixes.get(cause, "Find what rank {r} does differently").format(r=s.straggler),
        confidence=0.8 if s.cause else 0.6, evidence=ev, ranks=[s.straggler], source=sleep_src or src,
        severity=ctx.severity(impact, floor="warning"))]


def _sleep_source(ctx: RuleContext, rank: int) -> str | None:
    return ctx.a.signals.sleep_sources.get(rank) if ctx.a.signals else None


def _is_straggler(ctx: RuleContext) -> bool:
    """The thresholds' verdict on the straggler report (shared by the straggler and exposed-comm rules)."""
    s = ctx.a.straggler
    if not s or s.straggler is None:
        return False
    limit = ctx.th["straggler_frac_cpu"] if ctx.cpu else ctx.th["straggler_frac"]
    return s.spread_frac >= limit and s.last_fraction >= ctx.th["straggler_consistency"]


def straggler_wait_us(ctx: RuleContext) -> float:
    """Mean per-step wait of the non-straggler ranks, when a straggler finding applies."""
    s = ctx.a.straggler
    if not _is_straggler(ctx):
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
        # GPU: the bubble after each sync; CPU: nothing is lost, the finding is structural
        us = 0.0 if ctx.cpu else sum(h.bubble_us for h in hs) / nsteps / nranks
        names = list(dict.fromkeys(h.name for h in hs))
        label = ", ".join(".item()" if "local_scalar" in n else n for n in names[:3])
        out.append(ctx.finding(
            "host-sync", f"Host sync inside the step: {label}", us,
            f"{per_rank_step:.0f} call(s) per step ({', '.join(names)}) from "
            f"{'user code at ' + src if src else 'outside DDP/FSDP/optimizer internals'}. On a GPU each one "
            "blocks the CPU until the queued kernels finish, so the next kernels launch late and the GPU idles."
            + (" (On CPU it costs little; the finding is structural.)" if ctx.cpu else ""),
            "Keep the value on the device (accumulate tensors, log every N steps with a single .item()), or "
            "use non_blocking copies", confidence=0.8 if src else 0.6, source=src,
            severity="warning" if not ctx.cpu and ctx.frac(us) >= 0.01 else "info",
            ranks=sorted({h.rank for h in hs}),
            evidence=[Evidence(f"rank {h.rank}: {h.count} x {h.name} in steps {_ranges(h.steps)}, host blocked "
                               f"{ms(h.total_us, 3)}" + (f", device idle after it {ms(h.bubble_us, 3)}"
                                                         if not ctx.cpu else ""),
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
    ctx = RuleContext(analysis, resolve(thresholds))
    findings: list[Finding] = []
    for _, fn in RULES:
        findings.extend(fn(ctx))
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (-f.impact_us, order.get(f.severity, 3)))
    return findings


# rule modules beside this one register on import (setup faults, device-timeline rules)
from fsdpdoctor.diagnose import gpu_rules, setup_rules  # noqa: E402,F401

RULE_IDS = [i for ids, _ in RULES for i in ids.split(",")]
