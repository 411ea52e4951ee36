"""Rules on the device timeline: the GPU waiting for the host, recompute and copy costs.

What idles the GPU is a shared fact (``facts.idle_verdict``): input-bound and cpu-staged-collectives
claim the gpu-idle finding when their mechanism is what the GPU waits for.
"""

from __future__ import annotations

from fsdpdoctor.analysis.gpu_idle import QUEUE_EMPTY_US
from fsdpdoctor.diagnose.facts import FIXABLE_IDLE as FIXABLE, cuda_over_gloo, idle_verdict
from fsdpdoctor.diagnose.facts import device_work, idle_waits_on_straggler, offload_cost, reported_sync_idle_us
from fsdpdoctor.diagnose.framework import RuleContext, rule
from fsdpdoctor.results import Evidence, Finding
from fsdpdoctor.units import ms, pct

CAUSE_LABEL = {
    "launch": "launching kernels (Python and dispatch overhead, no work queued)",
    "host_sync": "host syncs that drain the kernel queue",
    "data_loading": "waiting for the next batch (DataLoader)",
    "collective_wait": "the host blocked in a collective",
    "host_compute": "computing on CPU tensors (torch ops that launch no device work)",
    "profiler": "profiler overhead (with_stack records every Python call)",
    "other": "host work outside torch ops (Python, I/O, sleep) or outside the step",
}
CAUSE_FIX = {
    "launch": "Give the GPU more work per launch: a larger micro-batch (or fewer, larger ops), "
              "torch.compile(model) to fuse kernels, or CUDA graphs (torch.compile(mode=\"reduce-overhead\")) "
              "to replay the step without Python launch cost",
    "host_sync": "Remove the host syncs from the step (.item(), .cpu(), printing tensors, torch.cuda.synchronize()): "
                 "keep values on the device and read them every N steps",
    "data_loading": "DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True) and move the batch with "
                    ".to(device, non_blocking=True)",
    "collective_wait": "Let collectives run asynchronously (NCCL, no Work.wait() in the step); see the communication "
                       "findings",
    "host_compute": "Move the CPU-tensor work at the source lines shown to the device, or out of the step (an "
                    "optimizer over CPU-offloaded parameters: offload less, see offload-exposed; metrics or "
                    "preprocessing: compute them on the GPU or in DataLoader workers)",
    "profiler": "For timing runs profile with with_stack=False (and record_shapes=False): stacks add a fixed cost "
                "to every Python call and inflate host time",
    "other": "Look at what the host does between steps at the source lines shown (logging, checkpoint I/O, sleeps)",
}
# A device timeline of copies only (no kernel: a staging or read-back loop) is idle for the same reasons,
# but what the host launches there is copies, and the fix that gives the device more per call is fewer,
# larger copies, not fused kernels.
COPIES_LAUNCH_LABEL = "issuing copies one call at a time (Python and dispatch overhead, no work queued)"
COPIES_LAUNCH_FIX = ("Move data in fewer, larger copies: read a result back once rather than piece by piece (one "
                     ".cpu() of the whole tensor, or a copy into a pinned buffer with non_blocking=True and one "
                     "synchronize), stage batches whole, and keep values on the device between steps")
SHORT = {"launch": "kernel launch overhead", "host_sync": "host syncs", "data_loading": "data loading",
         "collective_wait": "collective waits", "host_compute": "host compute", "profiler": "profiler overhead",
         "other": "other host work"}


def _words(ctx: RuleContext) -> dict[str, str]:
    """What the device runs, in the finding's words: kernels, or copies where the timeline holds no kernel."""
    if device_work(ctx) == "copies":
        return {"work": "copies", "Work": "Copies", "queue": "copy queue", "short": "copy launch overhead",
                "label": COPIES_LAUNCH_LABEL, "fix": COPIES_LAUNCH_FIX, "none": "No copy"}
    return {"work": "kernels", "Work": "Kernels", "queue": "kernel queue", "short": SHORT["launch"],
            "label": CAUSE_LABEL["launch"], "fix": CAUSE_FIX["launch"], "none": "No kernel"}


def _idle_per_step(idles, causes) -> list[float]:
    """Per step, the idle of these causes, averaged over the ranks (the values the saving rests on)."""
    by: dict = {}
    for g in idles:
        for st in g.steps:
            by.setdefault(st.step, []).append(sum(st.by_cause.get(c, 0.0) for c in causes))
    return [sum(v) / len(v) for _, v in sorted(by.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


@rule(ids=("gpu-idle",), thresholds=("gpu_idle_frac", "input_bound_frac", "offload_exposed_frac"))
def gpu_idle(ctx: RuleContext) -> list[Finding]:
    v = idle_verdict(ctx)
    if v is None:
        return []
    m, bound, cause = v
    idles = ctx.a.signals.gpu_idle
    fixable = sum(m[c] for c in FIXABLE)
    input_bound = cause == "data_loading" and ctx.frac(ctx.a.mean.data_loading_us) >= ctx.th["input_bound_frac"]
    off = offload_cost(ctx)
    offloaded = bool(off and off[2] and not input_bound)
    if offloaded:
        # the optimizer stepping offloaded parameters on the host is offload-exposed's saving, not this one's:
        # the cause named and its fix are the largest of the rest
        m = {**m, "host_compute": max(m["host_compute"] - off[2], 0.0)}
        cause = max(FIXABLE, key=lambda c: m[c])
    w = _words(ctx)
    short, label = {**SHORT, "launch": w["short"]}, {**CAUSE_LABEL, "launch": w["label"]}
    delays = [g.queue_delay_median_us for g in idles if g.queue_delay_median_us is not None]
    empty = [g.queue_empty_frac for g in idles if g.queue_empty_frac is not None]
    split = ", ".join(f"{short[c]} {ms(m[c])}" for c in sorted(m, key=lambda c: -m[c])
                      if c != "_idle" and m[c] >= 0.005 * ctx.step_us)
    ev = [Evidence(f"GPU idle {ms(m['_idle'])} per step ({pct(ctx.frac(m['_idle']))}): {split}",
                   time_us=m["_idle"])]
    if delays:
        ev.append(Evidence(f"{w['queue']}: median {delays[len(delays) // 2]:.0f} us from launch to start; "
                           f"{pct(sum(empty) / len(empty))} of {w['work']} started within "
                           f"{QUEUE_EMPTY_US:.0f} us of their launch (queue empty)"))
    ev += [Evidence(f"rank {g.rank}: idle {pct(g.idle_frac)} of the step, {ms(g.by_cause.get(cause, 0.0))} "
                    f"{short[cause]}", rank=g.rank, time_us=g.idle_us) for g in idles[:8]]
    srcs = _where_the_host_was(ev, idles, cause)
    fix = _fix_for(ctx, m, cause, ctx.th["gpu_idle_frac"], w)
    profiled = [g for g in idles if g.with_stack]
    stack = (f"with_stack=True: about {ms(m['profiler'])} of the idle is the profiler's own cost "
             f"({profiled[0].stack_events_per_step:.0f} Python frames recorded per step)"
             if profiled and cause != "profiler" and m["profiler"] >= 0.01 * ctx.step_us else None)
    impact = m["data_loading"] if input_bound else fixable
    if input_bound:
        ev += [Evidence(stack)] if stack else []
    else:
        impact = _less_profiler(ctx, m, impact, ev, stack)
    # the cause a fix reaches is not always the largest: host work outside torch ops ("other") can hold
    # more of the idle, and then "mostly" would name the wrong one
    largest = max(SHORT, key=lambda c: m.get(c, 0.0))
    mostly = largest == cause or m.get(largest, 0.0) <= m[cause]
    share = f"mostly {short[cause]}" if mostly else f"{pct(m[cause] / m['_idle'])} of it {short[cause]}"
    title = (f"GPU idle {pct(ctx.frac(m['_idle']))} of the step, {share}"
             + (" (host-bound)" if bound and cause != "data_loading" else ""))
    summary = (f"{w['none']} runs on any stream for {ms(m['_idle'])} per step. "
               + (f"Most of it the host was {label[cause]}." if mostly else
                  f"For {ms(m[cause])} of it the host was {label[cause]}; the most of it "
                  f"({ms(m[largest])}) is {label[largest]}, which the fix below does not shorten.")
               + (f" {w['Work']} start right after they are launched: the GPU waits for the host, not the other "
                  "way round." if bound else ""))
    startup = sum(g.startup_idle_us for g in idles) / len(idles)
    if startup > 0 and not input_bound:
        # one-time initialisation (context, cuBLAS handles, module load) is no launch cost: no fix saves it
        impact = max(impact - startup, 0.0)
        calls = next(g.startup_calls for g in idles if g.startup_calls)
        ev.insert(0, Evidence(f"{ms(startup)} of idle per step inside one-time start-up ({', '.join(calls)}): set "
                              "aside, not counted as a saving", time_us=startup))
        if startup >= 0.5 * m[cause]:
            title = f"GPU idle {pct(ctx.frac(m['_idle']))} of the step, mostly one-time start-up"
            summary = (f"{w['none']} runs on any stream for {ms(m['_idle'])} per step; {ms(startup)} of it is one-time "
                       f"initialisation inside single runtime calls ({', '.join(calls)}), orders of magnitude "
                       "longer than the others: context creation, library handles or a module load, which the "
                       f"job pays once. The rest ({ms(impact)} per step) is what a fix could save.")
            fix = ("Warm up before profiling (run a few steps first, e.g. schedule(wait=1, warmup=1, active=3)) so "
                   "the recorded steps are the ones the job repeats")
    captured = [g for g in idles if g.graph_captures]
    if captured and not input_bound:
        # kernels launched inside a stream capture are recorded into a graph, not run: that idle is the
        # capture itself, which no launch fix shortens (the graph exists to remove it on replay)
        capture_idle = sum(g.capture_idle_us for g in idles) / len(idles)
        impact = max(impact - capture_idle, 0.0)
        title = (f"GPU idle {pct(ctx.frac(m['_idle']))} of the step, {pct(ctx.frac(capture_idle))} of the step "
                 "in CUDA-graph capture")
        summary = (f"The host captures CUDA graphs ({sum(g.graph_captures for g in captured)} stream capture(s)): "
                   f"kernels launched during a capture are recorded into the graph, not run, so {ms(capture_idle)} "
                   "per step of idle is the capture itself, not launch overhead. Only the idle outside captures "
                   f"({ms(impact)} per step) counts as a saving.")
        fix = ("Nothing to fix in the capture (it is a one-time cost the graph replays avoid); profile steps that "
               "replay the graphs to judge the job")
        ev.insert(0, Evidence(f"{ms(capture_idle)} of idle per step inside cudaStreamBeginCapture ... "
                              "cudaStreamEndCapture", time_us=capture_idle))
    synced = min(reported_sync_idle_us(ctx), m["host_sync"]) if not input_bound else 0.0
    if synced > 0:
        # the idle after the syncs host-sync reports is that finding's saving (its fix removes the syncs;
        # this one's gives the GPU more per launch): counted there, once
        impact = max(impact - synced, 0.0)
        ev.insert(0, Evidence(f"{ms(synced)} of idle per step after the host syncs reported as host-sync: counted "
                              "there, not here", time_us=synced))
    if offloaded:
        impact = max(impact - off[2], 0.0)
        ev.insert(0, Evidence(f"{ms(off[2])} of the host compute per step is the optimizer stepping CPU-offloaded "
                              "parameters: counted by offload-exposed, not here", time_us=off[2]))
    f = ctx.finding(
        "gpu-idle", title, impact, summary,
        fix, confidence=0.85 if bound else 0.7, evidence=ev, source=srcs[0][0] if srcs else None,
        ranks=[g.rank for g in idles],
        # a step that captures graphs is setup (warm-up runs, then the capture), not a step the job repeats;
        # so is a step that is mostly start-up
        severity="info" if (captured or (startup and startup >= 0.5 * m[cause])) and not input_bound else None,
        samples=_idle_per_step(idles, ("data_loading",) if input_bound else FIXABLE))
    claimed = _claimed_by(ctx, cause, input_bound, offloaded and ctx.frac(f.impact_us) < ctx.th["gpu_idle_frac"])
    if claimed:
        f.caused_by = claimed
    return [f]


def _less_profiler(ctx: RuleContext, m: dict, impact: float, ev: list[Evidence], stack: str | None) -> float:
    """The saving less the profiler's own cost, which the job without the profiler does not pay: measured
    from the run's step series where it can be (profiled against unprofiled steps), else its per-frame
    estimate, said to be a lower bound. ``stack``: the evidence of the per-frame cost, when it is worth a
    line; the fallback says it once, with what it leaves out."""
    pc = ctx.a.signals.profiler_cost
    if pc is not None and pc.added_us > m["profiler"]:
        ev += [Evidence(stack)] if stack else []
        ev.insert(0, Evidence(
            f"the profiler's own cost, {ms(pc.added_us)} per step, is set aside: the profiled steps took "
            f"{ms(pc.profiled_step_us)} against {ms(pc.bare_step_us)} for the run's unprofiled steps (median of "
            f"{pc.bare_steps}, step series); the job without the profiler does not pay it", time_us=pc.added_us))
        return max(impact - min(pc.added_us, impact), 0.0)
    if m["profiler"] > 0:
        ev.append(Evidence(
            (f"{stack}, set aside" if stack else f"the profiler's per-frame cost, {ms(m['profiler'])} per step, is set "
             "aside") + "; its cost per op and runtime call is not measured here (no step series of unprofiled "
            "steps), so the saving may still hold some of it", time_us=m["profiler"]))
    return max(impact - m["profiler"], 0.0)


def _where_the_host_was(ev: list[Evidence], idles, cause: str) -> list[tuple[str, float]]:
    """The source lines the host was at during the cause's idle, longest first; the three longest
    become evidence (the first is the finding's source)."""
    srcs = [s for g in idles for s in g.sources.get(cause, [])]
    srcs.sort(key=lambda s: -s[1])
    for frame, us in srcs[:3]:
        ev.append(Evidence(f"host at {frame} during at least {ms(us)} of idle per step (longest gaps)",
                           source=frame, time_us=us))
    return srcs


def _fix_for(ctx: RuleContext, m: dict, cause: str, finding_frac: float, words: dict[str, str]) -> str:
    """The fix of the cause named, and of the next largest fixable cause when that alone would be a
    finding (``finding_frac`` of the step: the rule's gpu_idle_frac)."""
    fixes = {**CAUSE_FIX, "launch": words["fix"]}
    fix = fixes[cause]
    if cause == "launch" and ctx.a.job.wrapping in ("fsdp1", "fsdp2"):
        # FSDP's hooks do host work per unit (and FSDP2 per parameter) in every forward and backward
        fix += "; with FSDP, fewer and larger units (wrap blocks, not single layers) cut the per-unit hook work"
    second = sorted((c for c in FIXABLE if c != cause), key=lambda c: -m[c])[0]
    if ctx.frac(m[second]) >= finding_frac:
        fix += f"; then for {CAUSE_LABEL[second].split(' (')[0]}: {fixes[second]}"
    return fix


def _claimed_by(ctx: RuleContext, cause: str, input_bound: bool, offload_takes_it: bool) -> str | None:
    """The finding whose mechanism is what the GPU waits for, which then claims this one (None: no other)."""
    if input_bound:
        return "input-bound"
    if offload_takes_it:
        return "offload-exposed"  # what is left once offload-exposed takes its share is no finding
    if cause == "collective_wait":
        if idle_waits_on_straggler(ctx):
            return "straggler"
        if cuda_over_gloo(ctx):
            return "cpu-staged-collectives"  # the host blocks in gloo collectives of CUDA tensors
    return None


@rule(ids=("activation-recompute",), thresholds=("recompute_frac", "recompute_warn_frac"),
      parts={"activation-recompute": "compute_us"})
def activation_recompute(ctx: RuleContext) -> list[Finding]:
    rs = ctx.a.signals.recompute if ctx.a.signals else []
    if not rs or not ctx.step_us:
        return []
    us = sum(r.recompute_us for r in rs) / len(rs)
    if ctx.frac(us) < ctx.th["recompute_frac"]:
        return []
    cf = [r.compute_frac for r in rs if r.compute_frac is not None]
    ev = [Evidence(f"rank {r.rank}: {r.regions_per_step:.0f} recompute region(s) per step, {ms(r.recompute_us)} "
                   f"({pct(r.recompute_frac)} of the step" + (f", {pct(r.compute_frac)} of GPU compute)"
                                                               if r.compute_frac is not None else ")"),
                   rank=r.rank, time_us=r.recompute_us) for r in rs[:8]]
    ev.append(Evidence(f"found by: {rs[0].method}"))
    return [ctx.finding(
        "activation-recompute", f"Activation checkpointing re-runs {pct(ctx.frac(us))} of the step", us,
        f"Checkpointed blocks recompute their forward during backward: {ms(us)} per step"
        + (f" ({pct(sum(cf) / len(cf))} of GPU compute)" if cf else "")
        + ". This buys activation memory with time; it is worth it only while memory is the limit.",
        "If memory allows, checkpoint fewer blocks (wrap every other block, or use selective activation "
        "checkpointing of the cheap ops only); otherwise keep it",
        confidence=0.8, evidence=ev,
        # a deliberate memory/time trade: a warning only past a full extra forward's cost
        severity="warning" if ctx.frac(us) >= ctx.th["recompute_warn_frac"] else "info")]


@rule(ids=("offload-exposed",), thresholds=("offload_exposed_frac",))
def offload_exposed(ctx: RuleContext) -> list[Finding]:
    cost = offload_cost(ctx)
    if cost is None:
        return []
    total, exposed, opt_host, offloading = cost
    infos = ctx.a.signals.offload
    n = len(infos)
    configured = any(o.offload_configured for o in infos)
    phases: dict[str, float] = {}
    for o in infos:
        for p, v in o.by_phase.items():
            phases[p] = phases.get(p, 0.0) + v / n
    where = ", ".join(f"{p} {ms(v)}" for p, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v > 0)
    fix = ("CPU offload moves parameters/gradients over PCIe every step"
           + (" and steps the optimizer on the CPU" if opt_host else "")
           + ": turn it off if the model fits (FSDP CPUOffload(offload_params=False) / no OffloadPolicy), or "
             "offload only the optimizer state; the cost of the fix is the device memory of the parameters, "
             "gradients and optimizer state the host held (see `fsdpdoctor memory`)"
           if offloading else
           "Copy from pinned memory with non_blocking=True (DataLoader(pin_memory=True); tensor.pin_memory()), "
           "keep tensors on the device between steps, and avoid .cpu()/.to('cpu') inside the step")
    ev = [Evidence(f"rank {o.rank}: HtoD {ms(o.h2d_us)}, DtoH {ms(o.d2h_us)}, exposed {ms(o.exposed_us)}, "
                   f"{o.copies_per_step:.0f} copies per step", rank=o.rank, time_us=o.exposed_us)
          for o in infos[:8]]
    if opt_host:
        ev.insert(0, Evidence(f"the optimizer steps CPU tensors for {ms(opt_host)} per step while no kernel runs "
                              "(torch ops inside Optimizer.step that launch no device work; the profiler's "
                              "per-frame cost set aside)", time_us=opt_host))
    what = "Host<->device copies" + (" and the optimizer on the CPU" if opt_host else "")
    return [ctx.finding(
        "offload-exposed", f"{what} leave the GPU idle {pct(ctx.frac(total))} of the step", total,
        f"{ms(exposed)} per step of HtoD/DtoH copies run while no kernel runs"
        + (f", and {ms(opt_host)} the optimizer steps the offloaded parameters on the host" if opt_host else "")
        + (" (CPU offload is configured)" if configured else " (FSDP itself launches copies: CPU offload)"
           if offloading else "") + f"; exposed copies by phase: {where or '-'}.",
        fix, confidence=0.75 if offloading else 0.6, evidence=ev)]
