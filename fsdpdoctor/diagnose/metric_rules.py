"""Metric sync: collectives the training step issues for its bookkeeping, not for the model.

A metrics library that syncs its state every step (torchmetrics' ``dist_sync_on_step=True``: a barrier
and one or two all-gathers per state) or user code that gathers a value outside the model's forward,
backward and optimizer update (a loss or accuracy averaged for a progress bar) adds small blocking
collectives to every step. Their issuer (analysis/issuers.py) says whose they are; no bucket size or
wrapping reaches them, only syncing less often or in one collective does.
"""

from __future__ import annotations

import re
from collections import defaultdict

from fsdpdoctor.diagnose.framework import RuleContext, rank_steps, rule
from fsdpdoctor.results import Collective, Evidence, Finding, Setting
from fsdpdoctor.units import ms, pct, size

_METRIC_MODULE = re.compile(r"(?i)metric")
# a training framework's own sync of logged values (Lightning's self.log(..., sync_dist=True))
_FRAMEWORK_SYNC = re.compile(r"(?i)sync|log|metric")
# where the model's work is: collectives issued there belong to the model, not to its bookkeeping
_MODEL_PHASES = ("backward", "optimizer")


def bookkeeping_issuer(c: Collective, small_bytes: float) -> bool:
    """A collective of the step's bookkeeping: a metrics library's, a metric module's, a framework's sync of
    logged values, or the user's own small call (a value, not a model's gradients or parameters averaged by
    hand) outside any module's forward, the autograd engine's work and the optimizer step."""
    who = c.issuer or ""
    if who.startswith("metrics ("):
        return True
    if who.startswith("module "):
        return bool(_METRIC_MODULE.search(who))
    if who.startswith("framework ("):
        return bool(_FRAMEWORK_SYNC.search(who.split(": ", 1)[-1]))
    return (who.startswith("user code ") and c.phase not in _MODEL_PHASES
            and c.size_bytes is not None and c.size_bytes < small_bytes)


def own_cost_per_step(ctx: RuleContext, calls: list[Collective]) -> dict:
    """Per step, what the calls cost every rank: each call matched across the ranks by its order among the
    rank's calls of that step, at the least of the ranks' exposed time in it. The rest of an early rank's
    time in it is waiting for a later rank, which removing the call would move to the next collective,
    not save. {step: cost}; a step whose ranks issued different calls is counted at the least of the
    ranks' sums."""
    by = defaultdict(list)
    for c in calls:
        by[(c.step, c.rank)].append(c)
    ranks = [r.rank for r in ctx.a.ranks] or [0]
    out = {}
    for st in sorted({s for s, _ in by}, key=lambda s: (s is None, s or 0)):
        if st is None:
            continue
        lists = [sorted(by.get((st, r), []), key=lambda c: c.index) for r in ranks]
        if len({len(x) for x in lists}) == 1 and all(len({c.kind for c in cs}) == 1 for cs in zip(*lists)):
            out[st] = sum(min(c.exposed_us for c in cs) for cs in zip(*lists))
        else:
            out[st] = min(sum(c.exposed_us for c in x) for x in lists)
    return out


# torchmetrics entry points by what syncs there: compute() (sync_on_compute=True, the default) or forward()
# with dist_sync_on_step=True (metric.py's forward helpers)
_COMPUTE = ("compute", "wrapped_func", "_compute_and_reduce", "sync", "sync_context", "_sync_dist")
_FORWARD = ("forward", "_forward_full_state_update", "_forward_reduce_state_update", "__call__", "_call_impl")


_LIGHTNING_WHY = ("(every value logged with sync_dist=True on_step, each of log_dict's too, costs a barrier and an "
                  "all-reduce every step)")


def sync_settings(who: str, framework: str | None) -> list[Setting]:
    """The generic setting the fix changes (diagnose/settings.py), where the issuer is the one the job's
    framework spells it for: Lightning's sync of logged values in a Lightning job, torchmetrics synced in
    forward() (dist_sync_on_step) in a plain loop. None for compute() every step: the fix there is calling it
    less often, not a setting."""
    func = who.split(": ", 1)[-1].rstrip(")") if ": " in who else ""
    if framework == "lightning" and who.startswith("framework (lightning"):
        return [Setting("log.sync_dist", False, now=True)]
    if framework in (None, "plain") and who.startswith("metrics (torchmetrics") and func in _FORWARD:
        return [Setting("log.sync_dist", False, now=True)]
    return []


def issuer_fix(who: str) -> str:
    """The fix in the issuer's own terms (analysis/issuers.py labels): torchmetrics' arguments for a metric
    synced at compute() or at forward(), Lightning's self.log arguments for its sync of logged values
    (lightning/fabric/utilities/distributed.py: a barrier and an all-reduce per value logged with
    sync_dist=True on_step), batching for the user's own calls."""
    func = who.split(": ", 1)[-1].rstrip(")") if ": " in who else ""
    if who.startswith("metrics (torchmetrics"):
        if func in _FORWARD:
            return ("torchmetrics: construct the metrics with dist_sync_on_step=False (the default): forward() then "
                    "returns the batch's value from this rank's state alone, and compute() syncs the epoch's state "
                    "once at the epoch's end; MetricCollection(..., compute_groups=True) syncs the states metrics "
                    "share (accuracy, precision, recall) once")
        return ("torchmetrics: update() every step and call compute() once, at the epoch's end (then reset()); for a "
                "per-step value use the batch value metric(preds, target) returns (computed from this rank's batch, "
                "no sync with dist_sync_on_step=False), or construct the metric with sync_on_compute=False for a "
                "rank-local compute(); MetricCollection(..., compute_groups=True) syncs shared states once")
    if who.startswith("metrics ("):
        return ("compute and sync the metric once, at the epoch's end, not every step; a per-step value from this "
                "rank's batch needs no sync")
    if who.startswith("framework (lightning") or who.startswith("framework (pytorch_lightning"):
        return ("Lightning: self.log(name, value, on_step=False, on_epoch=True, sync_dist=True) syncs the value once, "
                f"at the epoch's end {_LIGHTNING_WHY}; keep a per-step value rank-local (sync_dist=False, the "
                "default), or log a torchmetrics object, self.log(name, metric), which syncs at the epoch's end")
    if who.startswith("framework ("):
        return ("log per-step values from this rank alone and sync them once at the epoch's end (the framework's "
                "sync of logged values runs a collective per value)")
    where = who.split(" ", 2)[-1] if who.startswith("user code ") else who
    return (f"sync these values less often (at the end of an epoch or every N steps, from locally accumulated sums) "
            f"or gather them in one collective (torch.cat the values, one all_reduce or all_gather, then split) at "
            f"{where}")


@rule(ids=("metric-sync",), thresholds=("metric_sync_frac", "small_message_bytes"),
      parts={"metric-sync": "exposed_comm_us"})
def metric_sync(ctx: RuleContext) -> list[Finding]:
    calls = [c for c in ctx.a.collective_events
             if c.step is not None and bookkeeping_issuer(c, ctx.th["small_message_bytes"])]
    if not calls or len(ctx.a.ranks) < 2:
        return []
    cost = own_cost_per_step(ctx, calls)
    steps = sorted({s.step for r in ctx.a.ranks for s in r.steps if s.step is not None})
    if not cost or not steps:
        return []
    impact = sum(cost.values()) / len(steps)
    if ctx.frac(impact) < ctx.th["metric_sync_frac"]:
        return []
    nrs = rank_steps(ctx)
    groups: dict[str, list[Collective]] = defaultdict(list)
    for c in calls:
        groups[c.issuer].append(c)
    order = sorted(groups.items(), key=lambda kv: -sum(c.exposed_us for c in kv[1]))
    kinds = defaultdict(int)
    for c in calls:
        kinds[c.kind] += 1
    by_kind = ", ".join(f"{n / nrs:.0f} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    exposed = sum(c.exposed_us for c in calls) / nrs
    named = all(who.startswith("metrics (") for who in groups)
    summary = (f"{len(calls) / nrs:.0f} collectives per step ({by_kind}) sync the step's metrics or logged values, "
               f"issued by {', '.join(who for who, _ in order[:3])}: they block every rank {ms(exposed)} per step, of "
               f"which {ms(impact)} ({pct(ctx.frac(impact))} of the step) is their own time (the least of the ranks' "
               f"time in each call; the rest is waiting for a later rank, which would move to the next collective). "
               "No bucket size or wrapping reaches them: they are issued outside the model's forward, backward and "
               "optimizer step.")
    settings = sync_settings(order[0][0], ctx.a.job.framework)
    fixes = list(dict.fromkeys(issuer_fix(who) for who, _ in order[:2]))
    if settings and order[0][0].startswith("framework ("):
        # the setting's code says what to write; the rule's words add why, and the other way
        why = _LIGHTNING_WHY[1:-1]
        fixes[0] = (f"{why[0].upper()}{why[1:]}; or log a torchmetrics object, self.log(name, metric), which syncs "
                    "at the epoch's end")
    sizes = sorted(c.size_bytes for c in calls if c.size_bytes)
    ev = [Evidence(f"{who}: {len(cs) / nrs:.0f} per step, {ms(sum(c.exposed_us for c in cs) / nrs)} exposed"
                   + (f", e.g. {cs[0].kind} at {cs[0].source}" if cs[0].source else f", e.g. {cs[0].kind}"),
                   time_us=sum(c.exposed_us for c in cs) / nrs) for who, cs in order[:4]]
    if sizes:
        ev.append(Evidence(f"median message {size(sizes[len(sizes) // 2])}: latency, not bandwidth"))
    # the syncs are exposed communication: where they hold most of it, the exposed communication (and its
    # small messages) is theirs, folded under this finding (as a straggler's wait is under the straggler)
    m = ctx.a.mean
    conseq = (["exposed-comm-high", "low-overlap", "latency-bound-collectives"]
              if m and m.exposed_comm_us > 0 and exposed >= 0.5 * m.exposed_comm_us else [])
    if conseq:
        summary += (f" They hold {pct(min(exposed / m.exposed_comm_us, 1.0))} of the step's exposed communication: "
                    "it is exposed because of them.")
    return [ctx.finding(
        "metric-sync", f"Metric sync every step: {len(calls) / nrs:.0f} collectives, {pct(ctx.frac(impact))} of the step",
        impact, summary, "; ".join(fixes), confidence=0.8 if named else 0.6, evidence=ev, consequences=conseq,
        source=next((c.source for c in calls if c.source), None),
        settings=settings,
        samples=[cost.get(s, 0.0) for s in steps])]   # each step's cost (0 in a step without a sync)
