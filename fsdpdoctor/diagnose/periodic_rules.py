"""Periodic stalls: a rank that does extra work every N steps (analysis/periodic.py)."""

from __future__ import annotations

import re

from fsdpdoctor.diagnose.framework import RuleContext, rule
from fsdpdoctor.diagnose.loader_restart import worker_restarts
from fsdpdoctor.results import Evidence, Finding
from fsdpdoctor.units import ms

_CHECKPOINT = re.compile(r"(?i)save|checkpoint|ckpt|state_dict")
_EVAL = re.compile(r"(?i)eval|valid|test|metric")
_LOG = re.compile(r"(?i)log|print|report|wandb|tensorboard")


def _fix(frame: str | None, period: int, every_rank: bool = False) -> str:
    func = (frame or "").split(": ", 1)[-1]
    if every_rank and _EVAL.search(func):
        # already split across the ranks: what is left is how often, how much, and where it runs
        return (f"evaluate less often (every {period} steps now) or on a smaller held-out subset, or run the "
                "evaluation off the training step (a separate process or job on a saved checkpoint)")
    if _CHECKPOINT.search(func):
        return ("save asynchronously: torch.distributed.checkpoint.async_save(state_dict, ...) (or copy the state "
                "to CPU and write it from a background thread), or checkpoint less often")
    if _EVAL.search(func):
        return ("evaluate on every rank (each rank takes 1/world of the evaluation set, so none waits for "
                "another), or less often")
    if _LOG.search(func):
        return "log less often, or hand the values to a background thread"
    where = f" at {frame}" if frame else ""
    return (f"move the work done every {period} steps{where} off the training step (a background thread), or "
            "split it across the ranks so none waits for another")


@rule(ids=("periodic-stall",), thresholds=("periodic_stall_frac",))
def periodic_stall(ctx: RuleContext) -> list[Finding]:
    p = ctx.a.periodic
    if p is None or p.median_step_us <= 0 or p.cost_per_step_us / p.median_step_us < ctx.th["periodic_stall_frac"]:
        return []
    restart = worker_restarts(ctx)
    if restart is not None and restart.period == p.period:
        return []   # the loader's workers starting again each epoch: input-bound names it, with its fix
    where = f" in {p.frame}" if p.frame else ""
    every = {2: "2nd", 3: "3rd"}.get(p.period, f"{p.period}th")
    steps = ", ".join(map(str, p.stalled_steps[:6])) + (" ..." if len(p.stalled_steps) > 6 else "")
    others = [r for r in p.ranks_showing if r != p.rank]
    who = "every rank" if p.every_rank else f"rank {p.rank}"
    summary = (f"Every {every} step {who} spends {ms(p.excess_us)} more{where} (steps {steps}; from the "
               f"{p.source}): {ms(p.cost_per_step_us)} per step on average over every step, against a median step "
               f"of {ms(p.median_step_us)}.")
    if p.every_rank:
        summary += (" Every rank does this work in the same steps, so none waits for another: it is the job's "
                    "periodic work, not one rank's stall.")
    elif others:
        summary += (f" Rank(s) {', '.join(map(str, others))} wait for it in their next collective, so every rank's "
                    "step pays it.")
    ev = [Evidence(p.owner_evidence, rank=p.rank),
          Evidence(f"stalled steps {ms(p.excess_us)} longer than the others' median {ms(p.median_step_us)}",
                   rank=p.rank, time_us=p.excess_us)]
    if p.frame:
        ev.append(Evidence(f"{p.frame}: {ms(p.frame_extra_us or 0.0)} more in the stalled steps than in the others",
                           rank=p.rank, time_us=p.frame_extra_us))
    title = (("Every rank pauses" if p.every_rank else f"Rank {p.rank} stalls") + f" every {every} step"
             + (f" ({p.frame.split(': ', 1)[-1]})" if p.frame else ""))
    return [ctx.finding("periodic-stall", title, p.cost_per_step_us, summary, _fix(p.frame, p.period, p.every_rank),
                        confidence=0.8 if p.source == "step series" else 0.6,
                        ranks=sorted(p.ranks_showing) if p.every_rank else [p.rank], evidence=ev,
                        source=p.frame, samples=_per_occurrence(ctx, p))]


def _per_occurrence(ctx: RuleContext, p) -> list[float] | None:
    """The cost per step of each occurrence: the step-to-step noise is the wrong yardstick here (the stall
    itself is most of it); its occurrences are the repeated measurements of its cost. None (the framework's
    fallback) under two of them."""
    return list(p.occurrence_cost_us) if len(p.occurrence_cost_us) >= 2 else None
