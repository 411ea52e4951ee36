"""DDP rules: gradient buckets, find_unused_parameters, accumulation without no_sync()."""

from __future__ import annotations

from fsdpdoctor.diagnose.framework import RuleContext, rank_steps, rule, sync_confidence, wrap_site
from fsdpdoctor.results import Evidence, Finding
from fsdpdoctor.units import ms, pct, size


DDP_DEFAULT_BUCKET_MB = 25   # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25), in MiB
MIB = 1 << 20


def _grad_dtype_bytes(ctx: RuleContext) -> int:
    dtype = ((ctx.a.job.manifest or {}).get("model") or {}).get("param_dtype") or "float32"
    return 2 if any(k in str(dtype) for k in ("16", "half")) else 8 if "64" in str(dtype) else 4


@rule(ids=("ddp-single-bucket", "ddp-tiny-buckets", "ddp-find-unused-unneeded", "grad-accum-without-no-sync"),
      thresholds=("ddp_single_bucket_overlap", "small_message_bytes", "ddp_tiny_buckets_per_backward",
                  "ddp_tiny_bucket_bytes"),
      parts={"ddp-single-bucket": "exposed_comm_us"})
def ddp_rules(ctx: RuleContext) -> list[Finding]:
    d = ctx.a.signals.ddp if ctx.a.signals else None
    if d is None:
        return []
    out = []
    cap = ctx.wrap.get("bucket_cap_mb")
    params = (ctx.a.job.manifest or {}).get("model", {}).get("parameters") if ctx.a.job.manifest else None
    ar = [c for c in ctx.a.collective_events if c.kind == "all_reduce" and c.phase in ("backward", "other")]
    grad_ar = [c for c in ar if (c.nelems or 0) > 1024 or c.nelems is None]  # not the find_unused bitmap
    nrs = rank_steps(ctx)
    backwards = max(d.backwards_with_allreduce_per_step, 1.0)
    per_backward = len(grad_ar) / nrs / backwards
    exposed_ar = sum(c.exposed_us for c in grad_ar) / nrs
    # one bucket is a claim about gradient all-reduces overlapping backward: it needs gradient all-reduces
    # in the trace, and peers to reduce with (at world size 1 there is nothing to overlap: wrapper-world-size-1)
    if grad_ar and ctx.a.job.world_size != 1 and per_backward <= 1.01 and (d.overlap_frac or 0.0) < ctx.th["ddp_single_bucket_overlap"]:
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
                confidence=sync_confidence(ctx, 0.9), evidence=ev, floor=floor, source=wrap_site(ctx)))
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
            confidence=0.85, floor="warning", source=wrap_site(ctx),
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
                                else ""), confidence=0.85, floor="warning", source=wrap_site(ctx),
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
