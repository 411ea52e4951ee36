"""DDP rules: gradient buckets, find_unused_parameters, accumulation without no_sync()."""

from __future__ import annotations

import math

from fsdpdoctor.diagnose.framework import RuleContext, rank_steps, rule, sync_confidence, wrap_site
from fsdpdoctor.diagnose.noise import per_step, per_step_calls
from fsdpdoctor.diagnose.settings import spell
from fsdpdoctor.results import Evidence, Finding, Setting
from fsdpdoctor.units import ms, pct, size


DDP_DEFAULT_BUCKET_MB = 25   # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=None): 25 MiB, in MiB
MIB = 1 << 20
FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
# The 1 MiB first bucket is DDP's only while bucket_cap_mb is left unset: a value passed, even 25, caps the first
# bucket too (torch 2.13, _BucketCapacityConfig). Measured here with _get_ddp_logging_data()'s
# rebuilt_bucket_sizes: 2.3 MB of gradients give two buckets (1.06 + 1.22 MB) with the argument unset and one
# with bucket_cap_mb=25. So the fix that restores the default buckets drops the argument, never sets it to 25.
DEFAULT_BUCKETS_FIX = "DDP(model)  # bucket_cap_mb unset"
TARGET_BUCKETS = 4           # what the fix below aims at for a model whose gradients fit one default bucket
BACKWARD_SHARE = 2 / 3       # backward's share of forward + backward compute (two matmuls per weight to one)
# Where the ranks fill the host's cores (CPU/gloo: one compute thread per core), a collective that overlaps
# compute is not free: gloo's thread runs on the core of the rank's compute thread, and two runnable threads
# share a core about evenly, so the overlapped collective time still costs the step about half of itself.
# A collective on its own stream (GPU) costs its overlapped time nothing here. Measured on the fault/fix
# pairs (docs/impact.md): grad-accum saved 27-30 ms where exposed + half the overlapped predicts 30.5-30.7,
# exposed alone 20-22, the whole duration 39-41. This prices a collective removed; moving one under compute
# is no saving on shared cores (bucket_model).
SHARED_CORE_COST = 0.5


def overlap_cost(ctx: RuleContext) -> float:
    """The share of a collective's overlapped time that the step still pays (see SHARED_CORE_COST)."""
    return SHARED_CORE_COST if ctx.traits.shared_host_cores else 0.0


SMALLER_BUCKETS = ("more buckets, each all-reduce paying its fixed latency; the first can start while backward "
                   "still runs")
LARGER_BUCKETS = "fewer, larger buckets: each starts later in backward, so less of it overlaps"


def default_buckets_fix(cap) -> str:
    """The fix back to DDP's default buckets from the cap set now (``cap``: the manifest's bucket_cap_mb)."""
    if cap is None:
        return DEFAULT_BUCKETS_FIX
    now = f"{cap:g}" if isinstance(cap, (int, float)) else cap
    return f"{DEFAULT_BUCKETS_FIX}, now {now}"


def bucket_sizes(grad_bytes: float, cap_bytes: float | None) -> list[float]:
    """The buckets DDP forms for ``grad_bytes`` of gradients under a cap (``None``: bucket_cap_mb unset): the
    first holds at most 1 MiB where the cap is unset (dist._DEFAULT_FIRST_BUCKET_BYTES, so that reduction
    starts early), at most the cap where one is passed; the rest at most the cap each. A byte model: DDP closes
    a bucket at the parameter that reaches its cap, so real buckets run over by up to one parameter."""
    if grad_bytes <= 0:
        return [0.0]
    first_cap = FIRST_BUCKET_BYTES if cap_bytes is None else cap_bytes
    cap_bytes = DDP_DEFAULT_BUCKET_MB * MIB if cap_bytes is None else cap_bytes
    first = min(first_cap, grad_bytes)
    rest = grad_bytes - first
    n = math.ceil(rest / cap_bytes) if rest > 0 else 0
    return [first] + [cap_bytes] * max(n - 1, 0) + ([rest - cap_bytes * (n - 1)] if n else [])


def bucket_model(ctx: RuleContext, grad_ar: list, sizes: list[float]) -> tuple[float, list[float], str]:
    """The bucket model (one model, two callers: ddp-single-bucket and ``whatif --set bucket_cap_mb``), for a
    run whose gradients are all-reduced in one bucket after backward. What the fix's buckets save per step: the last bucket can start only after backward ends, so at most
    the gradients of the other buckets hide, and only under the backward compute there is.

    That needs the all-reduce to run beside backward on resources of its own (its own stream on a GPU).
    Where the ranks fill the host's cores (CPU/gloo), a bucket reduced during backward runs only by taking
    a core from backward's compute, so nothing is promised there: on the conv-net pair of docs/impact.md the
    default buckets made the step 1.7-4.6 ms slower in three interleaved runs (intervals [-6.4, 2.6],
    [-8.0, -1.3], [-6.6, 0.6]), and the fix's own capture
    showed more exposed all-reduce, not less (the overlapped reduction ran slower beside compute).
    Per step: (saving, per-step values, evidence prose)."""
    exposed = per_step_calls(ctx.a, grad_ar, lambda c: c.exposed_us)
    compute = per_step(ctx.a, lambda st: st.compute_us)
    buckets = len(sizes)
    part = 1.0 - sizes[-1] / sum(sizes) if sum(sizes) else 0.0
    vals = [min(e * part, BACKWARD_SHARE * c) for e, c in zip(exposed, compute)]
    hidden = sum(vals) / len(vals) if vals else 0.0
    mean_exposed = sum(exposed) / len(exposed) if exposed else 0.0
    why = (f"the last of {buckets} buckets ({pct(1 - part)} of the gradients) can start only after backward ends, "
           "and the rest hides only under the backward compute there is")
    if ctx.traits.shared_host_cores:
        return 0.0, [0.0] * len(vals), (
            f"no saving predicted on this CPU/gloo run: the ranks share the host's cores, so a bucket reduced "
            f"during backward takes a core from backward's compute (docs/impact.md: on such a run the fix made "
            f"the step 1.7-4.6 ms slower in three interleaved runs); with the all-reduce on its own stream (GPU) "
            f"it would hide up to {ms(hidden)} of the {ms(mean_exposed)} exposed: {why}")
    return hidden, vals, f"predicted saving {ms(hidden)} of the {ms(mean_exposed)} exposed: {why}"


def _grad_dtype_bytes(ctx: RuleContext) -> int:
    dtype = ((ctx.a.job.manifest or {}).get("model") or {}).get("param_dtype") or "float32"
    return 2 if any(k in str(dtype) for k in ("16", "half")) else 8 if "64" in str(dtype) else 4


def backward_allreduces(ctx: RuleContext) -> list:
    return [c for c in ctx.a.collective_events if c.kind == "all_reduce" and c.phase in ("backward", "other")]


def gradient_allreduces(ctx: RuleContext) -> list:
    """The gradient all-reduces (not find_unused_parameters' bitmap, 1024 elements at most)."""
    return [c for c in backward_allreduces(ctx) if (c.nelems or 0) > 1024 or c.nelems is None]


def no_sync_model(ctx: RuleContext, grad_ar: list) -> tuple[float, list[float], float]:
    """The no_sync model (one model, two callers: grad-accum-without-no-sync and ``whatif --set no_sync=true``):
    no_sync() removes the all-reduces of all but the last micro-step: their exposed time, and the share of
    their overlapped time that still costs the step where gloo shares the cores (overlap_cost).
    (saving per step, per-step values, the overlapped share counted)."""
    d = ctx.a.signals.ddp
    extra = (d.backwards_with_allreduce_per_step - 1) / d.backwards_with_allreduce_per_step
    share = overlap_cost(ctx)

    def removed(c) -> float:
        return (c.exposed_us + share * max(c.duration_us - c.exposed_us, 0.0)) * extra

    samples = per_step_calls(ctx.a, grad_ar, removed)
    return sum(removed(c) for c in grad_ar) / rank_steps(ctx), samples, share


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
    ar = backward_allreduces(ctx)
    grad_ar = gradient_allreduces(ctx)
    nrs = rank_steps(ctx)
    backwards = max(d.backwards_with_allreduce_per_step, 1.0)
    per_backward = len(grad_ar) / nrs / backwards
    exposed_ar = sum(c.exposed_us for c in grad_ar) / nrs
    # one bucket is a claim about gradient all-reduces overlapping backward: it needs gradient all-reduces
    # in the trace, and peers to reduce with (at world size 1 there is nothing to overlap: wrapper-world-size-1)
    if (grad_ar and ctx.a.job.world_size != 1 and per_backward <= 1.01
            and (d.overlap_frac or 0.0) < ctx.th["ddp_single_bucket_overlap"]):
        biggest = max((c.nelems or 0 for c in grad_ar), default=0)
        ev = [Evidence(f"{per_backward:.0f} gradient all-reduce per backward pass, overlap {pct(d.overlap_frac)}"),
              Evidence(f"exposed all-reduce {ms(exposed_ar)} per step", time_us=exposed_ar)]
        if biggest and params:
            ev.append(Evidence(f"the bucket holds {biggest:,} of {params:,} parameters"))
        if cap is not None:
            ev.append(Evidence(f"manifest: bucket_cap_mb={cap}"))
        grad_bytes = biggest * _grad_dtype_bytes(ctx)
        raised = isinstance(cap, (int, float)) and cap > DDP_DEFAULT_BUCKET_MB
        # where the ranks share the host's cores (CPU/gloo) a bucket reduced during backward takes a core from
        # backward's compute: the fix is not expected to save time there, so it is at most info
        shared = ctx.traits.shared_host_cores
        floor = "warning" if raised and not shared else "info"
        new_cap = None
        settings = [Setting("ddp.bucket_cap_mb", None, now=cap, side_effect=SMALLER_BUCKETS)]
        if raised or not grad_bytes:
            # a cap raised above the default is the cause: the known-wrong setting gets a warning floor
            fix = ("None is DDP's default (25 MB, the first bucket 1 MB)" if raised else
                   "None is DDP's default; do not raise it above the model's gradient size")
        elif grad_bytes < ctx.th["small_message_bytes"]:
            fix = None  # every gradient fits one latency-bound message: more buckets add latency, not overlap
        else:
            # the default cap already holds every gradient (a small model): only a smaller cap splits it;
            # aim at about four buckets, the first of which can start while backward still runs
            target = float(f"{max(grad_bytes / TARGET_BUCKETS / MIB, 0.1):.2g}")
            new_cap = target
            settings = [Setting("ddp.bucket_cap_mb", target, now=cap if cap is not None else "the default",
                                side_effect=SMALLER_BUCKETS)]
            fix = (f"All {size(grad_bytes)} of gradients fit one bucket, so the all-reduce waits for the whole "
                   "backward")
        if fix is not None:
            sizes = bucket_sizes(grad_bytes, None if new_cap is None else new_cap * MIB)
            saving, samples, note = bucket_model(ctx, grad_ar, sizes)
            ev.append(Evidence(note, time_us=saving))
            out.append(ctx.finding(
                "ddp-single-bucket", "DDP all-reduces all gradients in one bucket after backward", saving,
                "With a single bucket the all-reduce can start only when the last gradient is ready, so none of it "
                f"overlaps backward compute. With the fix's {len(sizes)} bucket{'s' if len(sizes) > 1 else ''} all "
                f"but the last ({size(sizes[-1])} of {size(grad_bytes)}) could run beside backward: "
                + (f"about {ms(saving)} per step." if not shared else
                 "that needs a core or stream of its own: on this CPU/gloo run the ranks share the host's cores, so "
                 "the fix is not expected to save time here (docs/impact.md)."), fix, settings=settings,
                confidence=sync_confidence(ctx, 0.9), evidence=ev,
                floor=floor, source=wrap_site(ctx), samples=samples))
    mean_nelems = (sum(c.nelems or 0 for c in grad_ar) / len(grad_ar)) if grad_ar else 0
    db = 4 if (ctx.a.job.manifest or {}).get("model", {}).get("param_dtype", "float32") in ("float32", None) else 2
    mean_bytes = mean_nelems * db
    if (per_backward >= ctx.th["ddp_tiny_buckets_per_backward"] and mean_bytes
            and mean_bytes < ctx.th["ddp_tiny_bucket_bytes"]):
        busy = sum(c.duration_us for c in grad_ar) / nrs
        out.append(ctx.finding(
            "ddp-tiny-buckets", f"DDP uses {per_backward:.0f} tiny buckets per backward", exposed_ar,
            f"Gradients are all-reduced in {per_backward:.0f} buckets of {size(mean_bytes)} on average; each "
            f"all-reduce pays a fixed latency, {ms(busy)} of all-reduce per step in total.",
            "None is DDP's default (25 MB, the first bucket 1 MB)",
            settings=[Setting("ddp.bucket_cap_mb", None, now=cap, side_effect=LARGER_BUCKETS)],
            confidence=0.85, floor="warning", source=wrap_site(ctx),
            samples=per_step_calls(ctx.a, grad_ar, lambda c: c.exposed_us),
            evidence=[Evidence(f"{per_backward:.0f} all-reduces per backward, mean {size(mean_bytes)} "
                               f"(assuming {db}-byte gradients)"),
                      Evidence(f"exposed all-reduce {ms(exposed_ar)} per step", time_us=exposed_ar)]))
    find_unused = d.search_unused_per_step > 0 or bool(ctx.wrap.get("find_unused_parameters"))
    if find_unused and d.bucket_copies_per_step and d.grads_accumulated_per_step >= d.bucket_copies_per_step * max(
            d.backwards_per_step, 1) - 0.5:
        out += _find_unused(ctx, d, ar, nrs)
    if d.forwards_per_step >= 2 and d.backwards_with_allreduce_per_step >= 2:
        cost, samples, share = no_sync_model(ctx, grad_ar)
        out.append(ctx.finding(
            "grad-accum-without-no-sync", "Gradients are all-reduced on every accumulation micro-step", cost,
            f"{d.forwards_per_step:.0f} forward/backward passes per optimizer step and "
            f"{d.backwards_with_allreduce_per_step:.0f} of them all-reduce gradients; only the last needs to.",
            "", settings=[Setting("grad_accum.no_sync", round(d.forwards_per_step))],
            confidence=0.9, floor="warning", samples=samples,
            evidence=[Evidence(f"{d.backwards_with_allreduce_per_step:.0f} backward passes with all-reduce per step"),
                      Evidence(f"{d.allreduces_per_step:.0f} all-reduces per step"),
                      Evidence(f"predicted saving {ms(cost)}: the exposed time of the all-reduces no_sync() removes"
                               + (f", plus {pct(share)} of their time under backward (gloo's reduction shares the "
                                  "cores with the compute it overlaps)" if share else ""), time_us=cost)]))
    return out


def _find_unused(ctx: RuleContext, d, ar: list, nrs: int) -> list[Finding]:
    """find_unused_parameters=True where the trace's counts say every parameter got a gradient.

    The counts cannot say which parameter got one: an auxiliary head that never gets a gradient hides
    behind another parameter's second accumulation, and turning the flag off would crash DDP. So the
    "unneeded" verdict with its fix needs the capture's per-parameter record (manifest grad_presence):
    every parameter received a gradient in every profiled step. A parameter that missed one means the flag
    is needed (no finding); without the record the finding is an info note saying what could not be seen."""
    bitmap = [c for c in ar if c.nelems is not None and c.nelems <= 1024]
    # what the flag adds to the step on the host: the graph search after forward, the outputs flattened,
    # wrapped in _DDPSink and rebuilt, _DDPSink's backward (signals.ddp_counts, each kind of call at its
    # median, the profiler's per-frame cost set aside), and the bitmap's all-reduce. The per-step values hold
    # the parts measured per step (the bitmap, the search); the rest is added to their mean, and the values
    # are scaled to it (diagnose/noise.py): their spread, not a constant, decides the severity
    # (an older summary without unused_host_us_per_step: _DDPSink's calls alone, sink_us_per_step)
    host = d.unused_host_us_per_step or d.sink_us_per_step
    bits = _bitmap_cost(ctx, bitmap)
    samples = [v + d.search_unused_us_per_step for v in bits]
    cost = (sum(samples) / len(samples) if samples else d.search_unused_us_per_step) + host
    ev = [Evidence(f"{d.search_unused_per_step:.0f} search_unused_parameters per step, "
                   f"{ms(d.search_unused_us_per_step, 2)}"),
          Evidence(f"the outputs wrapped in _DDPSink and rebuilt after forward, and _DDPSink's backward: "
                   f"{ms(host, 2)} per step", time_us=host),
          Evidence(f"{d.grads_accumulated_per_step:.0f} AccumulateGrad per step for "
                   f"{d.bucket_copies_per_step:.0f} bucketed parameters"),
          Evidence(f"{len(bitmap) / nrs:.0f} extra small all-reduce per step (used-parameter bitmap), "
                   f"{ms(sum(bits) / len(bits) if bits else 0.0, 2)} past the collectives queued before it")]
    gp = (ctx.a.job.manifest or {}).get("grad_presence") or {}
    now = True if ctx.wrap.get("find_unused_parameters") else None
    if gp.get("steps") and gp.get("without_grad") == 0:
        ev.append(Evidence(f"manifest: all {gp.get('parameters')} parameters received a gradient in each of the "
                           f"{gp['steps']} profiled steps (rank {gp.get('rank')})"))
        return [ctx.finding(
            "ddp-find-unused-unneeded", "find_unused_parameters=True but every parameter gets a gradient", cost,
            "DDP traverses the autograd graph after each forward and all-reduces a used-parameter bitmap, yet "
            "every parameter received a gradient in every profiled step.",
            "Or, if the set of used parameters never changes: "
            + spell(Setting("ddp.static_graph", True), ctx.a.job.framework).code,
            settings=[Setting("ddp.find_unused_parameters", False, now=now)],
            confidence=0.85, floor="warning", source=wrap_site(ctx), evidence=ev, samples=samples)]
    if gp.get("steps"):
        return []  # a parameter missed a gradient: the flag is needed, nothing to report
    ev.append(Evidence("no per-parameter record of gradients (the manifest's grad_presence, written by "
                       "fsdpdoctor's capture): the trace counts gradient accumulations, not which parameter got one"))
    return [ctx.finding(
        "ddp-find-unused-unneeded", "find_unused_parameters=True: whether it is needed could not be seen", cost,
        "DDP traverses the autograd graph after each forward and all-reduces a used-parameter bitmap. The trace "
        "counts as many gradient accumulations as bucketed parameters, but cannot show that each parameter got "
        "one: a parameter that never gets a gradient (an auxiliary head left out of the loss) needs the flag, "
        "and turning it off would crash DDP.",
        "Record with fsdpdoctor.capture(model=ddp_model, ...): its manifest says per parameter whether it "
        "received a gradient. If every one does in every step: {code}",
        settings=[Setting("ddp.find_unused_parameters", False, now=now)],
        confidence=0.5, severity="info", source=wrap_site(ctx), evidence=ev, samples=samples)]


def _bitmap_cost(ctx: RuleContext, bitmap: list) -> list[float]:
    """Per step, what the used-parameter bitmap all-reduces cost: each call's own time on the rank that
    arrived last (the least over the ranks). Its own time is what runs past the rank's collectives issued
    before it: gloo runs a process group's calls in order, so a bitmap issued behind the gradient all-reduce
    waits in the queue for it, a wait the step pays without the bitmap too. An early rank's time in it is
    its wait for the others, which would move to the next collective without the bitmap, not a cost of it."""
    before: dict = {}
    for c in ctx.a.collective_events:
        before.setdefault((c.step, c.rank), []).append(c)
    by: dict = {}
    for c in bitmap:
        queued = max((o.end_us for o in before.get((c.step, c.rank), ())
                      if o is not c and o.index < c.index), default=c.start_us)
        by.setdefault((c.step, c.rank), []).append(max(c.end_us - max(c.start_us, queued), 0.0))
    steps = sorted({s.step for r in ctx.a.ranks for s in r.steps}, key=lambda s: (s is None, s or 0))
    ranks = [r.rank for r in ctx.a.ranks]
    out = []
    for st in steps:
        lists = [by.get((st, r), []) for r in ranks]
        n = min((len(x) for x in lists), default=0)
        out.append(sum(min(x[k] for x in lists) for k in range(n)))
    return out
