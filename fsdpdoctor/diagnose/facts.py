"""Facts several rules share, computed once per diagnosis from the whole threshold table.

Whether a straggler finding applies decides what the communication rules may claim; what idles the
GPU decides which root the gpu-idle finding belongs to; whether CUDA tensors go through gloo decides
whether the GPU waits on a setup fault. Each fact is a function of the context alone, so a rule
asks for it instead of importing the rule that reports it.
"""

from __future__ import annotations

from fsdpdoctor.diagnose.framework import RuleContext
from fsdpdoctor.results import IDLE_CAUSES, GpuIdle, RankSetup

# ------------------------------------------------------------------ stragglers


def own_work_frame(s) -> dict | None:
    """The culprit's frame holding work of its own: at least half of the others' wait for it, in a frame the
    other ranks spend at most half as long in (a sleep, an eval or a checkpoint only it runs). Extra time
    spread over frames every rank runs is the same work done slower (busier cores, a slower device)."""
    top = s.cause_frames[0] if s.cause_frames else None
    if top and top["extra_us"] >= 0.5 * s.wait_us and top["others_us"] <= 0.5 * top["culprit_us"]:
        return top
    return None


# The straggler's measured causes, in two sets that answer two questions:
# - its own time (evidence independent of the arrival order: ops or work only it has that much of, not the
#   same work done slower): its sleep, its loader, its host syncs, and more work in its steps (a longer
#   sequence, more routed tokens: counted from its ops and input sizes, equal on ranks given equal work);
# - outside the backend (no backend or wrapper fix removes it): those, and idle time of its own.
_OWN_TIME_CAUSES = ("sleep", "data loading", "host sync", "more work")
_NOT_BACKEND_CAUSES = _OWN_TIME_CAUSES + ("idle",)


def own_work(s) -> bool:
    """The culprit's own work holds at least half of the others' wait: a frame only it spends that long in
    (``own_work_frame``), or a measured cause of its own time (its sleep, loader, host syncs or more work: the
    excess over the median of the other ranks, ``extra_us``). Either is evidence independent of the arrival
    order."""
    return own_work_frame(s) is not None or (
        (s.cause or "") in _OWN_TIME_CAUSES and s.wait_us > 0 and s.extra_us >= 0.5 * s.wait_us)


def straggler_verdict(ctx: RuleContext) -> float:
    """The confidence that the report's rank is a straggler, 0.0 when the evidence does not hold.

    All measured in this run: the same rank is last in most steps (``straggler_consistency``) and the
    others' wait for it is material (``straggler_min_frac`` of the step). Then either the wait stands
    ``straggler_noise_z`` robust standard deviations above the run's step-to-step noise, or two independent
    lines of evidence agree: a consistency unlikely by chance (``straggler_chance``) and the culprit's own
    work holding the wait (``own_work``: a frame, or its sleep, loader, host syncs or more work), with the wait at least
    above one standard deviation of noise.
    Confidence grows as the consistency gets unlikely by chance and as the culprit's extra time accounts
    for the wait.
    """
    return ctx.cached("straggler_verdict", lambda: _straggler_verdict(ctx))


def _straggler_verdict(ctx: RuleContext) -> float:
    s, th = ctx.a.straggler, ctx.table
    if not s or s.straggler is None or not s.steps_total:
        return 0.0
    if s.last_fraction < th["straggler_consistency"] or ctx.frac(s.wait_us) < th["straggler_min_frac"]:
        return 0.0
    if not imbalance_beyond_noise(s, th["straggler_noise_z"]):
        return 0.0
    if s.noise_us > 0:
        above_noise = s.wait_us >= th["straggler_noise_z"] * s.noise_us
        corroborated = (s.chance <= th["straggler_chance"] and own_work(s) and s.wait_us >= s.noise_us)
        if not (above_noise or corroborated):
            return 0.0
    elif ctx.frac(s.wait_us) < th["severity_error_frac"]:
        return 0.0  # one step: no noise estimate, so only a wait of a quarter of the step is trusted
    explained = min(s.extra_us / s.wait_us, 1.0) if s.wait_us > 0 else 0.0
    return round(0.5 + 0.3 * (1.0 - s.chance) + 0.2 * explained, 2)


def imbalance_beyond_noise(s, z: float) -> bool:
    """Whether the culprit's extra time in its cause is an imbalance beyond noise: the mean of its per-step
    excess over the other ranks at least ``z`` standard errors above zero, and at least the run's step-to-step
    noise (``noise_us``). Ranks doing the same work (a loader stall on every rank, tiny buckets on every rank)
    differ step by step both ways, and the latest of them in a few steps is chance, its wait the largest of
    many small ones; a rank with more to do (a sleep, a longer batch, a slow collate) is behind in every step
    by a like amount. Fewer than two steps: not testable, left to the other tests."""
    e = s.extra_each_us
    if len(e) < 2:
        return True
    mean = sum(e) / len(e)
    sd = (sum((x - mean) ** 2 for x in e) / (len(e) - 1)) ** 0.5
    return mean > 0 and mean >= s.noise_us and (sd == 0 or mean >= z * sd / len(e) ** 0.5)


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


def straggler_wait_mean_us(ctx: RuleContext) -> float:
    """The wait for the straggler per step averaged over all ranks (itself waiting ~0): on the basis of
    the run's mean breakdown, whose exposed communication holds it."""
    s = ctx.a.straggler
    if not straggler_verdict(ctx) or not s.wait_by_rank:
        return 0.0
    return sum(s.wait_by_rank.values()) / len(s.wait_by_rank)


def straggler_in_own_frames(ctx: RuleContext) -> bool:
    """The straggler's lateness lies in its own work (a sleep, compute, I/O or logging frame only it runs,
    more work in its steps, or a measured cause other than 'the same work, slower'): no backend or
    wrapper fix removes it."""
    s = ctx.a.straggler
    if not straggler_verdict(ctx):
        return False
    return own_work_frame(s) is not None or (s.cause or "") in _NOT_BACKEND_CAUSES


# ------------------------------------------------------------------ what idles the GPU
FIXABLE_IDLE = ("launch", "host_sync", "collective_wait", "host_compute", "profiler", "data_loading")


def mean_idle(idles: list[GpuIdle]) -> dict[str, float]:
    n = len(idles)
    out = {c: sum(g.by_cause.get(c, 0.0) for g in idles) / n for c in IDLE_CAUSES}
    out["_idle"] = sum(g.idle_us for g in idles) / n
    return out


def host_bound(ctx: RuleContext, idles: list[GpuIdle]) -> bool:
    """Most kernels started right after their launch: the queue was empty, the host is the bottleneck."""
    fr = [g.queue_empty_frac for g in idles if g.queue_empty_frac is not None]
    return bool(fr) and sum(fr) / len(fr) >= ctx.table["launch_queue_empty_frac"]


def idle_verdict(ctx: RuleContext) -> tuple[dict[str, float], bool, str] | None:
    """(mean idle by cause, host-bound?, dominant fixable cause) when a gpu-idle finding applies."""
    return ctx.cached("idle_verdict", lambda: _idle_verdict(ctx))


def _idle_verdict(ctx: RuleContext) -> tuple[dict[str, float], bool, str] | None:
    idles = ctx.a.signals.gpu_idle if ctx.a.signals else []
    if not ctx.traits.device_timeline or not idles or not ctx.step_us:
        return None
    m = mean_idle(idles)
    bound = host_bound(ctx, idles)
    fixable = sum(m[c] for c in FIXABLE_IDLE)
    cause = max(FIXABLE_IDLE, key=lambda c: m[c])
    # Idle with a full queue (kernels waiting long after launch) is the GPU waiting on itself (stream
    # dependencies, events missing from a filtered trace), not the host: no host-side fix applies.
    # Loading stalls the GPU whatever the queue looked like the rest of the step.
    if ctx.frac(fixable) < ctx.table["gpu_idle_frac"] or not (bound or cause == "data_loading"):
        return None
    return m, bound, cause


def idle_waits_on_straggler(ctx: RuleContext) -> bool:
    """The GPU idles mostly while its host blocks in collectives, and at least half of that blocking is
    the wait for a rank late in its own work: the straggler's cost, whatever the backend."""
    v = idle_verdict(ctx)
    return (v is not None and v[2] == "collective_wait" and straggler_in_own_frames(ctx)
            and straggler_wait_mean_us(ctx) >= 0.5 * v[0]["collective_wait"])


def dominant_idle_cause(ctx: RuleContext) -> str | None:
    """The cause of most GPU idle time when a gpu-idle finding applies (input-bound lists it as consequence)."""
    v = idle_verdict(ctx)
    return v[2] if v else None


# ------------------------------------------------------------------ host syncs
def reported_syncs(ctx: RuleContext) -> list[tuple[str | None, list, float, float]]:
    """The host syncs the host-sync rule reports: (source line, its HostSync records, calls per rank and
    step, device idle after them per step) for each source line called at least ``host_sync_per_step``
    times a step. The idle (the bubble, mean over the ranks; 0 without a device timeline: nothing waits)
    is host-sync's saving, which its fix (no sync in the step) removes and gpu-idle's does not."""
    return ctx.cached("reported_syncs", lambda: _reported_syncs(ctx))


def _reported_syncs(ctx: RuleContext) -> list[tuple[str | None, list, float, float]]:
    syncs = ctx.a.signals.host_syncs if ctx.a.signals else []
    nsteps = max(len(ctx.a.job.steps), 1)
    device = ctx.traits.device_timeline
    by_src: dict[str | None, list] = {}
    for h in syncs:
        by_src.setdefault(h.source, []).append(h)
    out = []
    for src, hs in by_src.items():
        nranks = max(len({h.rank for h in hs}), 1)
        per_rank_step = sum(h.count for h in hs) / nsteps / nranks
        if per_rank_step >= ctx.table["host_sync_per_step"]:
            out.append((src, hs, per_rank_step, sum(h.bubble_us for h in hs) / nsteps / nranks if device else 0.0))
    return out


def reported_sync_idle_us(ctx: RuleContext) -> float:
    """Device idle per step after the host syncs that host-sync reports (its saving, all sources together)."""
    return sum(idle for *_, idle in reported_syncs(ctx))


def device_work(ctx: RuleContext) -> str:
    """What the device timeline runs, in a finding's words: "copies" where it holds copies and no kernel
    (a staging or read-back loop), else "kernels"."""
    kind = ctx.a.job.input_kind
    return "copies" if kind is not None and kind.device == "copies-only" else "kernels"


# ------------------------------------------------------------------ setup
NO_BACKEND = (None, "", "undefined", "none")


def setups(ctx: RuleContext) -> list[RankSetup]:
    return ctx.a.signals.setup if ctx.a.signals else []


def cuda_gloo(s: RankSetup) -> bool:
    """CUDA tensors go through gloo: on a GPU job the default process group is gloo (or maps cuda to
    gloo), or collectives run as gloo worker spans and no process group uses NCCL. A side group on gloo
    beside an NCCL default group (for CPU objects, a common pattern) is not a fault."""
    if not s.device_kernels:
        return False
    backend = (s.backend or "").lower()
    return (backend == "gloo" or "cuda:gloo" in (s.default_pg_backend or "")
            or (s.gloo_spans > 0 and not any(device_library(b) for b in s.pg_backends)
                and not device_library(backend)))


def device_library(backend: str) -> bool:
    """A backend that moves device tensors with the device's own library: NCCL/RCCL, or a backend
    string mapping a device other than the CPU to a library other than gloo (``mtia:hccl``)."""
    b = (backend or "").lower()
    if "nccl" in b or "rccl" in b:
        return True
    pairs = [p.split(":", 1) for p in b.split(",") if ":" in p]
    return any(dev.strip() != "cpu" and lib.strip() != "gloo" for dev, lib in pairs)


def cuda_over_gloo(ctx: RuleContext) -> bool:
    """The setup fault cpu-staged-collectives applies (gpu-idle names it as the cause of collective waits)."""
    return any(cuda_gloo(s) for s in setups(ctx)) or (
        str(ctx.a.job.backend or "").lower() == "gloo" and ctx.traits.device_timeline)


# ------------------------------------------------------------------ what CPU offload costs
def offload_cost(ctx: RuleContext) -> tuple[float, float, float, bool] | None:
    """(cost per step, exposed copies, optimizer on the host, offloading?) of CPU offload when it reaches
    ``offload_exposed_frac`` of the step (offload-exposed fires), else None. A rule that calls it declares
    that threshold. Offloading shows as the wrapper's configuration or as copies FSDP itself launches (its
    parameters or gradients moved between host and device); then the optimizer stepping CPU tensors while the GPU idles is the offload's
    too (the fix, no offload, steps the parameters on the device), beside the copies under no kernel."""
    return ctx.cached("offload_cost", lambda: _offload_cost(ctx))


def _offload_cost(ctx: RuleContext) -> tuple[float, float, float, bool] | None:
    infos = ctx.a.signals.offload if ctx.a.signals else []
    if not infos or not ctx.traits.device_timeline or not ctx.step_us:
        return None
    n = len(infos)
    exposed = sum(o.exposed_us for o in infos) / n
    offloading = any(o.offload_configured or o.fsdp_copies_per_step > 0 for o in infos)
    idles = ctx.a.signals.gpu_idle or []
    opt_host = sum(g.optimizer_host_us for g in idles) / len(idles) if idles and offloading else 0.0
    if ctx.frac(exposed + opt_host) < ctx.th["offload_exposed_frac"]:
        return None
    return exposed + opt_host, exposed, opt_host, offloading
