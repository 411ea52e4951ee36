"""Host-side rules: input pipeline stalls, stragglers, host syncs inside the step."""

from __future__ import annotations

import math

from fsdpdoctor.diagnose.facts import (
    device_work, dominant_idle_cause, own_work_frame, reported_syncs, straggler_verdict, straggler_wait_us,
)
from fsdpdoctor.analysis.host import host_cores
from fsdpdoctor.diagnose.framework import RuleContext, rule
from fsdpdoctor.diagnose.loader_restart import restart_finding, worker_restarts
from fsdpdoctor.diagnose.noise import per_step
from fsdpdoctor.diagnose.sizing import host_share, loader_workers, more_cores_words
from fsdpdoctor.results import Evidence, Finding, Setting
from fsdpdoctor.units import ms, pct


@rule(ids=("input-bound",), thresholds=("input_bound_frac", "input_bound_high_frac"))
def input_bound(ctx: RuleContext) -> list[Finding]:
    loaders = ctx.a.signals.dataloader if ctx.a.signals else []
    m = ctx.a.mean
    if not loaders or not m:
        return []
    restart = worker_restarts(ctx)
    if restart is not None:
        return [restart_finding(ctx, loaders, restart)]
    f = ctx.frac(m.data_loading_us)
    if f < ctx.th["input_bound_frac"]:
        return []
    high = f >= ctx.th["input_bound_high_frac"]
    worst = max(loaders, key=lambda d: d.exposed_frac)
    single = worst.iterator.startswith("_SingleProcess")
    settings, fix, workers = loader_fix(ctx, single)
    ev = [Evidence(f"rank {d.rank}: DataLoader __next__ {pct(d.stall_frac)} of step, {ms(d.mean_call_us)} per call, "
                   f"{d.calls_per_step:.0f} call(s) per step", rank=d.rank) for d in loaders[:8]]
    if worst.slow_frame:
        ev.append(Evidence(f"slowest frame under __next__: {worst.slow_frame} ({ms(worst.slow_frame_us)} per step)",
                           source=worst.slow_frame))
    spare = loader_spare(ctx)
    impact, bound_ev = loader_saving(ctx, single, workers, spare)
    ev += bound_ev
    samples = per_step(ctx.a, lambda st: loader_hidden(ctx, st, single, workers, spare))
    # a rank late because its own loader stalls is this finding seen from the others: fixing the loader
    # removes their wait too, so the straggler is its consequence and the wait is its saving
    s = ctx.a.straggler
    loader_straggler = bool(straggler_verdict(ctx)) and s.cause == "data loading"
    if loader_straggler:
        impact = max(impact, s.saving_us or s.wait_us)
        samples = None  # the others' wait is the straggler's per-step evidence; the step noise stands for it
        ev.append(Evidence(f"rank {s.straggler} is late by its own loading: the others wait {ms(s.wait_us)} per "
                           "step for it", rank=s.straggler, time_us=s.wait_us))
    saves = impact >= 0.05e3   # a saving under what the report shows (0.0 ms) is none: no fix is offered for it
    title = (f"{'Highly' if high else 'Moderately'} input-bound: data loading is {pct(f)} of the step" if saves else
             f"Data loading is {pct(f)} of the step, and more loader workers would not shorten it here")
    found = ctx.finding(
        "input-bound", title, impact,
        # "the loop", not "the training loop": inference pipelines load through a DataLoader too
        f"The loop waits {ms(m.data_loading_us)} per step for the next batch "
        f"({'single-process loading in the main process' if single else 'the worker processes do not keep up'}).",
        fix if saves else no_saving_fix(ctx), settings=settings if saves else (), confidence=0.9, evidence=ev,
        source=worst.slow_frame, floor="warning" if saves else "info",
        consequences=["straggler"] if loader_straggler else (), samples=samples)
    if dominant_idle_cause(ctx) == "data_loading":
        found.consequences.append("gpu-idle")  # the GPU idles because it waits for the batch
    return [found]


RULE_WORKERS = 4   # the worker processes per rank the input-bound fix sets


def loader_spare(ctx: RuleContext, stated_cores: int | None = None) -> float | None:
    """Cores per rank that no rank's compute thread holds (analysis/host.py), None where the capture did not
    record the host's cores (then ``loader_hidden`` asks the dialect: CPU/gloo ranks fill the host)."""
    host = host_cores(ctx.a, stated_cores)
    return None if host.spare is None else host.spare / host.ranks_per_host


def loader_hidden(ctx: RuleContext, st, single: bool, workers: int = RULE_WORKERS,
                  spare: float | None = None) -> float:
    """The loader model (one model, two callers: the input-bound rule and ``whatif --set num_workers``): what
    ``workers`` worker processes per rank take off one step's loading (``st``: a step's breakdown or the mean).

    All of it where the host has cores to spare for them (``spare``: cores per rank; None: the dialect says,
    CPU/gloo ranks already fill the host). Where the ranks share every core, only the loader's waiting (a
    sleep under __next__): its computing would move to a worker on the same busy cores, no faster. And the
    workers must keep up: each makes a batch in what the loop took for one, so K of them deliver one every
    L/K, and their computing runs on at most the spare cores at once; where that is longer than what is left
    of the step, the loop still waits the difference (workers beyond the free cores do not help)."""
    load = st.data_loading_us
    if workers <= 0 or load <= 0:
        return 0.0
    if not single:
        return load
    no_spare = ctx.traits.shared_host_cores if spare is None else spare <= 0
    if no_spare:
        hidden = min(st.loader_sleep_us, load) if ctx.a.job.has_stacks else load
        every = load / workers
    else:
        hidden = load
        computing = load - min(st.loader_sleep_us, load)
        every = max(load / workers, computing / min(workers, spare) if spare else 0.0)
    left = st.duration_us - hidden
    return max(hidden - max(every - left, 0.0), 0.0)


def loader_fix(ctx: RuleContext, single: bool) -> tuple[list[Setting], str, int]:
    """The loader settings (diagnose/settings.py writes them in the job's framework), sized to the host
    (diagnose/sizing.py), the rule's own words beside them, and the workers per rank the saving is priced at
    (0: none can help, so nothing is saved)."""
    m = ctx.a.mean
    waiting = m.loader_sleep_us >= 0.5 * m.data_loading_us if ctx.a.job.has_stacks else False
    # each worker makes a batch in what the loop took for one: enough of them deliver one within the rest of the step
    needed = math.ceil(m.data_loading_us / max(m.duration_us - m.data_loading_us, 1e3))
    workers, sized = loader_workers(ctx.a, waiting, needed)
    pin = [Setting("loader.pin_memory", True)] if ctx.traits.device_timeline else []
    if not single and workers > 0:
        return pin + [Setting("loader.num_workers", workers, sized=sized, side_effect=_worker_cost(ctx, workers)),
                      Setting("loader.prefetch_factor", 4)], (
            "At least that many workers per rank; and speed up the dataset (cache decoded samples"
            + (", decode/augment on the GPU)" if ctx.traits.device_timeline else ")")), RULE_WORKERS
    if workers <= 0:
        return [], f"No loader worker can help here ({sized}): {more_cores_words(ctx.a)}", 0
    return [Setting("loader.num_workers", workers, now=0, sized=sized,
                    side_effect=_worker_cost(ctx, workers)),
            Setting("loader.persistent_workers", True)] + pin, "", workers


def no_saving_fix(ctx: RuleContext) -> str:
    """What would help where more workers save nothing on this host."""
    return ("More loader workers would save nothing here: the loading is computing on cores the ranks already "
            f"fill. {more_cores_words(ctx.a).capitalize()}")


def loader_saving(ctx: RuleContext, single: bool, workers: int = RULE_WORKERS,
                  spare: float | None = None) -> tuple[float, list[Evidence]]:
    """The predicted saving of ``workers`` worker processes per rank, and the evidence of its bound."""
    m = ctx.a.mean
    saving = loader_hidden(ctx, m, single, workers, spare)
    if saving >= m.data_loading_us - 1.0:
        if single and ctx.traits.shared_host_cores and not ctx.a.job.has_stacks:
            return saving, [Evidence("no Python stacks: the loader's waiting cannot be told from its computing, "
                                     "so the whole stall is taken as what workers would hide (an upper bound on "
                                     "shared cores)")]
        return saving, []
    no_spare = ctx.traits.shared_host_cores if spare is None else spare <= 0
    waiting = min(m.loader_sleep_us, m.data_loading_us)
    if no_spare and saving >= waiting - 1.0:
        return saving, [Evidence(
            f"saving bounded at {ms(saving)} of the {ms(m.data_loading_us)} stall: the ranks share every core of "
            f"this host, so workers hide only the loader's waiting ({ms(m.loader_sleep_us)} of sleep under "
            f"__next__); its {ms(m.data_loading_us - saving)} of computing would run on the same busy cores",
            time_us=saving)]
    return saving, [Evidence(
        f"saving bounded at {ms(saving)} of the {ms(m.data_loading_us)} stall: {workers} worker"
        f"{'s' if workers != 1 else ''} per rank"
        + ("" if spare is None else f" on {spare:g} spare core{'s' if spare != 1 else ''} per rank")
        + " deliver a batch less often than the step asks for one", time_us=saving)]


def _worker_cost(ctx: RuleContext, workers: int) -> str:
    return (f"{workers} worker process{'es' if workers != 1 else ''} per rank, each with its own copy of the dataset "
            "object (memory), on the host's cores" + (" (which the ranks already share: CPU contention with the "
                                                      "ranks' own threads)" if ctx.traits.shared_host_cores else ""))


@rule(ids=("straggler",), thresholds=("straggler_same_work_shared_ratio",))
def straggler(ctx: RuleContext) -> list[Finding]:
    s = ctx.a.straggler
    verdict = straggler_verdict(ctx)
    if not verdict:
        return []
    r = s.straggler
    cause = s.cause or "unknown"
    own_work = own_work_frame(s)
    # extra work in a frame only this rank runs (the others spend at most a tenth as long in it) is code
    # of its own, not a larger share of the common work: that frame is the place to fix
    if cause == "more work" and own_work and own_work["others_us"] <= 0.1 * own_work["culprit_us"]:
        cause = "compute"
    frame = ((s.cause_source if own_work and cause != "more work" else None)
             or (_sleep_source(ctx, r) if cause == "sleep" else None))
    if cause == "compute" and not own_work:
        # its steps may hold more work that explains less than half of its extra compute (stragglers.py): then
        # it is not the same work, and the fix starts with balancing it
        cause = "more work, computed slower" if HOLDS_MORE in (s.cause_evidence or "") else "slower at the same work"
    impact, saving_ev = _straggler_saving(ctx, cause)
    where = f" in {frame}" if frame else ""
    fixes = {"more work": "Give every rank the same work per step: rank {r}'s steps hold more ({ratio}). Group "
                          "samples of similar length into batches and give each rank the same token budget "
                          "(a length-grouped or bucketing sampler, token-balanced batching); if the data is "
                          "sharded unevenly, shard it evenly",
             "more work through an exchange": "Give every rank the same work per step: rank {r}'s {exchange} calls "
                          "hand it {exchange_ratio} the elements of the other ranks ({ratio} in its steps). Balance "
                          "what the exchange sends to each rank: with mixture-of-experts routing, a load-balancing "
                          "loss or per-expert routing bias, a capacity factor, or experts placed so that each rank's "
                          "load evens out",
             "data loading": "Give rank {r} a faster input pipeline (num_workers, local data, no slow storage)",
             "sleep": "Remove the sleep/wait on rank {r}{where} (a barrier, checkpoint or logging call on one rank?)",
             "host sync": "Remove the host syncs on rank {r}{where} (.item(), .cpu(), print of tensors)",
             "compute": "Rank {r} computes {extra} more per step{where}: give every rank the same work (rank-"
                        "specific code, uneven shapes -> bucket by length)",
             "more work, computed slower": "Give every rank the same work per step: rank {r}'s steps hold more "
                                           "({ratio}); group samples of similar length and give each rank the same "
                                           "token budget. It also computes slower than that excess explains: " + (
                 "check its device (clocks, thermal, other processes on it)" if ctx.traits.device_timeline else
                 "check that no other process takes its cores (pin ranks to cores, fewer jobs per host)"),
             "slower at the same work": "Rank {r} runs the same code {extra} per step slower than the others: " + (
                 "check its device (clocks, thermal, other processes on it)" if ctx.traits.device_timeline else
                 "check that no other process takes its cores (pin ranks to cores, fewer jobs per host)"
                 + _own_workers_words(ctx)),
             "idle": "Rank {r} is idle outside ops: look for Python work, logging or I/O only it does"}
    # wait_us is the longest wait of a step (median over steps): with more than two ranks the others
    # wait between the next-latest rank's wait and that
    upto = "up to " if len(ctx.a.ranks) > 2 else ""
    ev = [Evidence(f"rank {r} was the last to arrive in {s.steps_last} of {s.steps_total} steps; a healthy rank "
                   f"is last that often by chance with probability {s.chance:.2f} ({len(ctx.a.ranks)} ranks)",
                   rank=r),
          Evidence(f"the others wait {upto}{ms(s.wait_us)} per step for it (median), "
                   f"{s.wait_us / s.noise_us:.1f}x this run's step-to-step noise of {ms(s.noise_us)}" if s.noise_us else
                   f"the others wait {upto}{ms(s.wait_us)} per step for it (median; one step: no noise estimate)",
                   rank=r, time_us=s.wait_us)]
    if s.cause_evidence:
        ev.append(Evidence(s.cause_evidence, rank=r, time_us=s.extra_us))
    for fr in s.cause_frames[:3]:
        ev.append(Evidence(f"{fr['frame']}: {ms(fr['culprit_us'])} per step on rank {r}, "
                           f"{ms(fr['others_us'])} on the others", rank=r, source=fr["frame"]))
    ev += [Evidence(f"step {p['step']}: rank {p['straggler']} arrived last; the others waited "
                    f"{ms(p['imbalance_us'])} ({pct(p['imbalance_frac'])} of the step) "
                    + (f"in collective #{p['collective_index']}" if p.get("collective_index") is not None else
                       f"in one call, {ms(p.get('step_wait_us', 0.0))} over the step's calls of their groups"),
                    rank=p["straggler"], step=p["step"], time_us=p["imbalance_us"])
           for p in s.per_step[:6]]
    explained = _straggler_explains_comm(ctx)
    conseq = ["exposed-comm-high", "low-overlap", "low-bus-bandwidth"] if explained else []
    summary = (f"Rank {r} was the last to arrive in {s.steps_last} of {s.steps_total} steps and the others wait "
               f"{upto}{ms(s.wait_us)} per step for it ({pct(ctx.frac(s.wait_us))} of the step) in their first "
               "collective after the delay." if not s.culprit_groups else
               f"Rank {r} was the last to arrive in {s.steps_last} of {s.steps_total} steps. " + mesh_waits(s))
    if s.groups_note:
        ev.append(Evidence(f"not told: {s.groups_note}", rank=r))
    if impact < 0.99 * s.wait_us:
        summary += (f" Balancing its work would shorten each step by about {ms(impact)} ({pct(ctx.frac(impact))}): "
                    "the balanced step still holds its share of the extra work." if cause == "more work" else
                    (f" Its process groups are smaller than the world, so the others wait for it through "
                     f"the groups they share with it and with each other; without it the least of their waits, "
                     f"{ms(impact)} ({pct(ctx.frac(impact))}), would go." if s.through_groups else
                     f" Without it each step would end when the next-latest rank arrives: {ms(impact)} "
                     f"({pct(ctx.frac(impact))}) shorter."))
    ev += saving_ev
    if explained:
        summary += (f" Its lateness holds {pct(explained)} of the other ranks' exposed communication: the "
                    "communication is slow because of this rank, not the network.")
    label = f"waiting on the host: {cause}" if cause in HOST_WAITS else cause
    fix = fixes["more work through an exchange"] if cause == "more work" and s.exchange_kind else \
        fixes.get(cause, "Find what rank {r} does differently{where}")
    severity = None
    if cause == "slower at the same work" and ctx.traits.shared_host_cores:
        ratio = _compute_ratio(ctx, r)
        if ratio < ctx.th["straggler_same_work_shared_ratio"]:
            severity = "info"
            summary += (f" Its compute for the same work is {ratio:.2f}x the others': where ranks share host cores "
                        "another process taking its core does as much (healthy runs beside a CPU hog reach "
                        f"1.42x), so this is the host's load, not the job's, unless it exceeds "
                        f"{ctx.th['straggler_same_work_shared_ratio']:.2f}x.")
    return [ctx.finding(
        "straggler", f"Rank {r} is a straggler ({label})", impact, summary,
        fix.format(r=r, where=where, extra=ms(s.extra_us), ratio=_work_excess(s), exchange=s.exchange_kind,
                   exchange_ratio=f"{s.exchange_ratio or 1.0:.1f}x"),
        confidence=verdict, evidence=ev, ranks=[r], source=frame, consequences=conseq, severity=severity,
        # per step, the wait it causes where it is last and nothing where another rank is
        samples=[p.get("saving_us", p["imbalance_us"]) if p["straggler"] == r else 0.0 for p in s.per_step])]


def _own_workers_words(ctx: RuleContext) -> str:
    """Where the job's own loader worker processes share the cores the ranks compute on, they are the first
    other processes to suspect (more workers than free cores slow a rank's compute)."""
    loaders = ctx.a.signals.dataloader if ctx.a.signals else []
    if not ctx.traits.shared_host_cores or not any(not d.iterator.startswith("_SingleProcess") for d in loaders):
        return ""
    share = host_share(ctx.a)
    where = f" ({share.words()})" if share.known else ""
    return (f"; this job's own DataLoader worker processes run on the host's cores{where}: fewer workers per rank, "
            "or a host with a core free for each, may be what it needs")


def mesh_waits(s) -> str:
    """Who waits for a 2-D mesh's straggler where: the groups it makes wait, read per call from the trace
    (analysis/groups.py), and the ranks that share no group with it."""
    def peers(g) -> str:
        p = [str(x) for x in g["ranks"] if x != s.straggler]
        return f"rank {p[0]} waits" if len(p) == 1 else f"ranks {', '.join(p)} wait"

    parts = [f"{peers(g)} for it in their group {g['ranks']} at {'/'.join(g['kinds'])} ({ms(g['wait_us'])} per "
             "step over those calls)" for g in s.culprit_groups]
    text = "Read per process group from the trace: " + "; ".join(parts) + "."
    if s.far_ranks:
        who = ", ".join(str(x) for x in s.far_ranks)
        many = len(s.far_ranks) > 1
        text += (f" Rank{'s' if many else ''} {who} share{'' if many else 's'} no group with it and wait"
                 f"{'' if many else 's'} for it through the groups of the ranks that do.")
    return text + f" The longest wait in one call is {ms(s.wait_us)} per step (median)."


def _compute_ratio(ctx: RuleContext, r: int) -> float:
    """The rank's compute per step over the median of the other ranks' (compute + optimizer)."""
    mine = next((x.mean for x in ctx.a.ranks if x.rank == r and x.mean), None)
    others = sorted(x.mean.compute_us + x.mean.optimizer_us for x in ctx.a.ranks if x.rank != r and x.mean)
    if mine is None or not others or others[len(others) // 2] <= 0:
        return 1.0
    return (mine.compute_us + mine.optimizer_us) / others[len(others) // 2]


def _straggler_saving(ctx: RuleContext, cause: str) -> tuple[float, list[Evidence]]:
    """What the step saves once the straggler is on time, and the evidence of how that was derived.

    The wait of the others it would no longer cause; with more than two ranks the step ends when the
    next-latest rank arrives (``saving_us``). "More work" is fixed by balancing it: the step comes down to
    the balanced time, the culprit's excess less its share of the balanced work, (N - 1) / N of its excess.
    Where the ranks share a host's cores with other work (``shared_core_speeds``) that share runs beside the
    other ranks' compute, k = (speed alone) / (speed beside them) times as long as the culprit took for it
    alone: the step saves E (1 - k / N)."""
    s, n = ctx.a.straggler, len(ctx.a.ranks)
    saving, ev = (s.saving_us or s.wait_us), []
    if cause == "more work" and n >= 2:
        excess = min(saving, s.extra_us or saving)
        shared = bool(ctx.traits.shared_host_cores and s.alone_speed and s.beside_speed)
        slower = max(s.alone_speed / s.beside_speed, 1.0) if shared else 1.0
        balanced = max(excess * (1.0 - slower / n), 0.0)
        ev.append(Evidence(
            f"with the same work on every rank the step comes down to the balanced time: rank {s.straggler}'s "
            f"{ms(excess)} excess less its 1/{n} share of it spread over the ranks"
            + (f", which there runs beside the other ranks' compute on the cores this host shares: rank "
               f"{s.straggler}'s training thread got {s.alone_speed:.2f} of a core while the others waited and "
               f"{s.beside_speed:.2f} beside them (schedstat over the recorded steps), so that share takes "
               f"{slower:.2f}x as long" if shared else "")
            + f", {ms(balanced)} per step", time_us=balanced))
        saving = balanced
    elif cause in HOST_WAITS and s.extra_us and s.extra_us < saving:
        # the fix removes the wait it names (the sleep, the syncs, the loading): the step saves at most that
        # excess; the rest of the others' wait is the rank's other work running late (its core shared with
        # the host's load) and stays. Measured: a rank sleeping 80 ms while its compute slowed under load
        # had the others wait 107 ms; removing the sleep saved 77 [68, 86] (docs/impact.md)
        ev.append(Evidence(f"saving bounded at rank {s.straggler}'s {ms(s.extra_us)} excess in {cause}, what the "
                           f"fix removes, of the {ms(saving)} the others wait", time_us=s.extra_us))
        saving = s.extra_us
    return saving, ev


# what stragglers.attribute_cause says of a rank whose steps hold more work than explains its extra compute
HOLDS_MORE = "accounts for less than half of its"

# a rank late because its host is busy elsewhere: it waits, it does not compute
HOST_WAITS = ("sleep", "host sync", "idle", "data loading")


def _work_excess(s) -> str:
    """ "2.7x the input elements" from the analysis' evidence of more work."""
    text = s.cause_evidence or ""
    if " hold " in text and " of the other ranks" in text:
        return text.split(" hold ", 1)[1].split(" of the other ranks", 1)[0]
    return "more per step"


def _sleep_source(ctx: RuleContext, rank: int) -> str | None:
    return ctx.a.signals.sleep_sources.get(rank) if ctx.a.signals else None


def _straggler_explains_comm(ctx: RuleContext) -> float:
    """Share of the waiting ranks' exposed communication that this rank's lateness holds (0 if < half):
    what they would stop waiting were it on time. With more than two ranks that is the next-latest
    rank's wait (``saving_us``), not the whole wait: the rest is waiting for the next-latest rank too."""
    s = ctx.a.straggler
    waiters = [r.mean.exposed_comm_us for r in ctx.a.ranks if r.rank != s.straggler and r.mean]
    exposed = sum(waiters) / len(waiters) if waiters else 0.0
    held = min(straggler_wait_us(ctx), s.saving_us or s.wait_us)
    share = min(held / exposed, 1.0) if exposed else 0.0
    return share if share >= 0.5 else 0.0


@rule(ids=("host-sync",), thresholds=("host_sync_per_step",))
def host_sync(ctx: RuleContext) -> list[Finding]:
    out = []
    device = ctx.traits.device_timeline
    # us: on device traces the bubble after each sync; on host-only traces nothing waits (0), the finding
    # is structural (facts.reported_syncs)
    for src, hs, per_rank_step, us in reported_syncs(ctx):
        names = list(dict.fromkeys(h.name for h in hs))
        label = ", ".join(".item()" if "local_scalar" in n else n for n in names[:3])
        where = f"your code at {src}" if src else "code outside DDP/FSDP/optimizer internals (no user frame found)"
        kind = ctx.a.job.input_kind
        work = device_work(ctx)
        cost = (f"Each one blocks the host until the queued {work} finish, so the next {work} launch late and "
                "the GPU idles." if device else
                f"The device time it costs is unknown: {kind.unknown[-1]}." if kind is not None and kind.unknown
                and not kind.device_known else
                "On this CPU trace nothing waits for it, so it costs nothing measurable here (run on CUDA, each "
                "call would drain the device queue before the next launch).")
        out.append(ctx.finding(
            "host-sync", f"Host sync inside the step: {label}", us,
            f"{per_rank_step:.0f} call(s) per step ({', '.join(names)}) from {where}. {cost}",
            "Keep the value on the device (accumulate tensors, log every N steps with a single .item()), or "
            "use non_blocking copies", confidence=0.8 if src else 0.6, source=src,
            ranks=sorted({h.rank for h in hs}),
            evidence=[Evidence(f"rank {h.rank}: {h.count} x {h.name} "
                               + (f"in steps {_ranges(h.steps)}" if h.steps else "in the window (no step markers)")
                               + ", host blocked "
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
