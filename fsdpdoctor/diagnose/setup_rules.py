"""Setup faults: how the job was launched and wired, diagnosed before anything they cause.

A setup fault lists in ``consequences`` the ids of the findings it explains (the diagnosis shows
those under it, not as peers): only findings whose time the fault's mechanism accounts for, that
would go away with the fix.
"""

from __future__ import annotations

from fsdpdoctor.diagnose.facts import NO_BACKEND as _NO_BACKEND, cuda_gloo as _cuda_gloo
from fsdpdoctor.diagnose.facts import cuda_over_gloo, dominant_idle_cause
from fsdpdoctor.diagnose.facts import idle_waits_on_straggler
from fsdpdoctor.diagnose.facts import setups as _setups, straggler_in_own_frames, straggler_wait_mean_us
from fsdpdoctor.diagnose.framework import RuleContext, rule
from fsdpdoctor.results import Evidence, Finding
from fsdpdoctor.units import ms, pct

# what a collective backend that cannot overlap makes the communication rules report: the same
# exposed time, gone with the backend's fix. Prefetch and bucket settings are not among them (they
# survive a change of backend and stay roots of their own), nor many small collectives (on NCCL each
# still pays its latency: coalescing fixes them, not the backend), nor a straggler whose lateness lies
# in its own frames (see comm_consequences).
COMM_CONSEQUENCES = ["exposed-comm-high", "low-overlap", "low-bus-bandwidth"]
PREFETCH_IDS = ["fsdp-forward-prefetch-off", "fsdp1-no-backward-prefetch", "fsdp1-backward-post",
                "fsdp2-backward-prefetch-ineffective"]


def comm_consequences(ctx: RuleContext) -> list[str]:
    """What a backend fault explains: the communication findings, and a straggler only when its lateness
    is not in frames of its own (a sleep, compute, I/O or logging only it runs survive any backend)."""
    return COMM_CONSEQUENCES + ([] if straggler_in_own_frames(ctx) else ["straggler"])


def _finding(ctx: RuleContext, *args, consequences: list[str] | None = None, **kw) -> Finding:
    f = ctx.finding(*args, **kw)
    f.consequences = list(consequences or [])
    return f


@rule(ids=("cpu-staged-collectives",))
def cpu_staged_collectives(ctx: RuleContext) -> list[Finding]:
    setups = [s for s in _setups(ctx) if _cuda_gloo(s)]
    if not cuda_over_gloo(ctx):
        return []
    manifest_gloo = not setups
    m = ctx.a.mean
    # NCCL would run these collectives on their own stream beside compute: what is exposed now, or the
    # GPU idle while the host blocks in them (gloo spans are host time), is the most it could give back
    idles = ctx.a.signals.gpu_idle if ctx.a.signals else []
    blocked = sum(g.by_cause.get("collective_wait", 0.0) for g in idles) / len(idles) if idles else 0.0
    # the other ranks' wait for a straggler late in its own frames shows as exposed communication (and as
    # the host blocked in a collective) whatever the backend: a backend fix gives none of it back
    waiting = straggler_wait_mean_us(ctx) if straggler_in_own_frames(ctx) else 0.0
    impact = max(max(m.exposed_comm_us if m else 0.0, blocked) - waiting, 0.0)
    waits_here = dominant_idle_cause(ctx) == "collective_wait" and not idle_waits_on_straggler(ctx)
    extra = ["gpu-idle"] if waits_here else []
    ev = [Evidence(f"rank {s.rank}: backend {s.backend or '?'}"
                   + (f", process groups {', '.join(s.pg_backends)}" if s.pg_backends else "")
                   + f", {s.device_kernels} device kernels, {s.gloo_spans} gloo spans", rank=s.rank)
          for s in setups[:8]]
    if manifest_gloo and not setups:
        ev.append(Evidence(f"manifest/trace backend: {ctx.a.job.backend}; the trace has device kernels"))
    if waiting:
        ev.append(Evidence(f"{ms(waiting)} per step of the exposed communication is waiting for the straggler "
                           "(late in its own frames): left out, a backend change does not remove it",
                           time_us=waiting))
    return [_finding(
        ctx, "cpu-staged-collectives", "Collectives on GPU tensors run over gloo (staged through host memory)",
        impact,
        "The job computes on the GPU but its process group uses gloo for CUDA tensors: every collective copies "
        "the tensor to host memory, reduces it on the CPU and copies it back, blocking the launching thread. "
        "Nothing overlaps and the bandwidth is the host's; the communication findings below follow from "
        "this (prefetch settings and a rank late in its own work do not, and stay findings of their own).",
        "dist.init_process_group(backend=\"nccl\")  (or \"cpu:gloo,cuda:nccl\" to keep gloo for CPU tensors); "
        "one GPU per rank: torch.cuda.set_device(local_rank). NCCL refuses two ranks on one GPU: give each rank "
        "its own device",
        confidence=0.9, evidence=ev, severity=ctx.severity(impact, floor="warning"),
        ranks=[s.rank for s in setups] or None, consequences=comm_consequences(ctx) + extra)]


@rule(ids=("ranks-never-communicate",))
def ranks_never_communicate(ctx: RuleContext) -> list[Finding]:
    setups = _setups(ctx)
    ws = ctx.a.job.world_size
    if not setups or not ws or ws <= 1:
        return []
    training = [s for s in setups if s.has_backward]
    if not training:
        return []  # no backward in the analysed steps (inference, or a trace fragment): nothing to synchronise
    no_pg = all(s.backend in _NO_BACKEND and not s.pg_backends for s in setups) and (
        (ctx.a.job.backend or None) in _NO_BACKEND)
    wrapped = [s.wrapper for s in setups if s.wrapper]
    # nothing at all, or (with no wrapper to do it) only barriers and broadcasts of the initial state:
    # those leave the replicas apart. Point-to-point or all-to-all traffic is model/pipeline
    # parallelism, where one replica needs no gradient reduction: not claimed.
    kinds = {k for s in setups for k in s.collective_kinds}
    silent = sum(s.collectives for s in setups) == 0 or (not wrapped and kinds <= {"broadcast", "barrier"})
    # communication of any kind (NCCL, or another library's kernels: DeepEP, NVSHMEM...) with no process
    # group is still communication: only silence is claimed
    if not silent:
        return []
    # a wrapper that never synchronised in the window may be accumulating under no_sync(): less sure
    unsure = silent and not no_pg and bool(wrapped)
    any_coll = sum(s.collectives for s in setups)
    why = ("no process group was initialised (backend undefined)" if no_pg else
           ("not one collective ran in the analysed steps" if not any_coll else
            f"its {any_coll} collective(s) are only {' and '.join(sorted(kinds))}: they reduce no gradients")
           + ("" if wrapped else " and no DDP/FSDP wrapper is in the trace"))
    return [_finding(
        ctx, "ranks-never-communicate", f"{ws} processes train, but their ranks never communicate", 0.0,
        f"The job runs with world size {ws} and computes a backward pass, yet {why}: gradients are never "
        "synchronised, so every process trains its own model replica on its own data (and, if each saves a "
        "checkpoint, only one of the diverged replicas survives)."
        + (f" ({wrapped[0]} is in the trace: unless every profiled step is a no_sync() accumulation "
           "micro-step, its collectives never ran.)" if unsure else ""),
        "dist.init_process_group(backend=\"nccl\") in every process, then wrap the model: "
        "DDP(model, device_ids=[local_rank]) or fully_shard(model); with Accelerate, launch with "
        "`accelerate launch --multi_gpu` (or pass the config file) and call accelerator.prepare(model, "
        "optimizer, loader)",
        confidence=0.5 if unsure else 0.85, severity="warning" if unsure else "error",
        evidence=[Evidence(f"rank {s.rank}: backend {s.backend or 'none'}, {s.collectives} collectives, "
                           f"wrapper {s.wrapper or 'none'}", rank=s.rank) for s in setups[:8]]
        + [Evidence(f"world size {ws} (distributedInfo / manifest)")],
        consequences=[])]


@rule(ids=("wrapper-world-size-1",), parts={"wrapper-world-size-1": "compute_us"})
def wrapper_world_size_1(ctx: RuleContext) -> list[Finding]:
    job = ctx.a.job
    if job.world_size != 1 or job.wrapping not in ("ddp", "fsdp1", "fsdp2"):
        return []
    m = ctx.a.mean
    d = ctx.a.signals.ddp if ctx.a.signals and job.wrapping == "ddp" else None
    own = d.own_host_us_steps if d is not None else []
    name = {"ddp": "DDP", "fsdp1": "FSDP", "fsdp2": "FSDP2 (fully_shard)"}[job.wrapping]
    ev = [Evidence(f"world size 1, wrapping {job.wrapping} ({job.wrapping_source})")]
    if m and m.comm_us:
        ev.append(Evidence(f"{name} collectives: {ms(m.comm_us)} per step ({pct(ctx.frac(m.comm_us))})"))
    if own:
        # what dropping the wrapper removes: DDP's own host work on the step's path (signals.ddp_counts)
        impact = sum(own) / len(own)
        ev.append(Evidence(
            f"DDP's own host work {ms(impact)} per step: its forward less the module's, the reducer's gradient "
            "hooks and bucket copies, its collectives' host calls"
            + (", while the device idles" if ctx.a.signals.gpu_idle else "")
            + "; the profiler's per-frame cost set aside",
            time_us=impact))
    else:
        # what the wrapper costs alone where its host work is not measured: its collectives (on one rank
        # they reduce nothing)
        impact = m.exposed_comm_us if m else 0.0
    return [_finding(
        ctx, "wrapper-world-size-1", f"{name} at world size 1: nothing to overlap, prefetch cannot be judged",
        impact,
        f"The model is wrapped in {name} but the job has one rank: collectives reduce or gather nothing, so "
        "communication overlap and FSDP prefetch cannot be observed here (the prefetch status says so). "
        "Timings of this run do not predict a multi-GPU run.",
        "Profile with the world size you train at (torchrun --nproc-per-node N); for single-GPU training drop "
        "the wrapper" + (f" (its own host work is {ms(impact)} per step here)" if own and impact >= 1.0 else
                         f" (it costs {ms(impact)} per step here)" if impact >= 1.0 else ""),
        confidence=0.95, severity="info", evidence=ev, samples=own or None,
        consequences=PREFETCH_IDS + ["exposed-comm-high", "low-overlap", "low-bus-bandwidth"])]


@rule(ids=("mixed-backends",))
def mixed_backends(ctx: RuleContext) -> list[Finding]:
    setups = _setups(ctx)
    backends = {s.rank: (s.backend or "").lower() for s in setups if s.backend not in _NO_BACKEND}
    # only the default (world) group: subgroups differ between ranks by design (meshes, HSDP)
    pgs = {s.rank: (s.default_pg_backend,) for s in setups if s.default_pg_backend}
    if len(set(backends.values())) <= 1 and len(set(pgs.values())) <= 1:
        return []
    groups: dict[str, list[int]] = {}
    for r, b in sorted(backends.items()):
        groups.setdefault(b + (f" ({', '.join(pgs.get(r, ()))})" if r in pgs else ""), []).append(r)
    for r, p in sorted(pgs.items()):
        if r not in backends:
            groups.setdefault(f"? ({', '.join(p)})", []).append(r)
    return [_finding(
        ctx, "mixed-backends", "Ranks use different collective backends", 0.0,
        "Ranks of one job initialised their process groups with different backends; collectives between "
        "them cannot match, and a job that runs anyway is not the job you think (ranks from different "
        "launches in one folder?).",
        "Initialise every rank with the same backend: dist.init_process_group(backend=\"nccl\") everywhere "
        "(set it explicitly instead of relying on defaults or environment variables)",
        confidence=0.8, severity="error",
        evidence=[Evidence(f"{b}: ranks {', '.join(map(str, rs))}") for b, rs in groups.items()],
        consequences=comm_consequences(ctx))]
