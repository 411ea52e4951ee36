"""Severity follows evidence: a finding's saving against the run's own step-to-step noise.

A rule predicts a saving per step from values it measured step by step (an exposed all-gather, a wait
for a late rank, a loader stall). Those per-step values are the evidence; their spread is the noise the
prediction carries. ``per_step`` turns what a rule measured into one value per step (the mean over the
ranks: ranks of one step are coupled by their collectives, so the step is the unit of independent
observation, as in diagnose/stats.py). A rule hands them to ``ctx.finding(..., samples=...)``; a finding
without them rests on the step time's own noise around its estimate.

After the rules (and after ``bound_impacts`` cut what roots explain twice), ``gate_by_noise``:

- gives every finding an interval of its saving, the ``impact_confidence`` t-interval of the mean of
  its per-step values (scaled to the impact as bounded), or says the window is too short for one (one
  step shows no noise: a saving alone then earns at most info);
- keeps a warning or an error only where the interval's lower end earns it: the severity scale read at
  the lower end (a wrong configuration's warning floor needs a lower end above zero); otherwise the
  finding drops, at most to info, and says how many more steps at this spread would decide it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from fsdpdoctor.diagnose.prediction import interval_for, withheld
from fsdpdoctor.diagnose.stats import steps_until, t_quantile
from fsdpdoctor.results import SEVERITY_RANK, Analysis, Evidence, Finding, StepBreakdown

EXPLICIT = "explicit"   # a rule set the severity itself (from structure, not from the saving): kept as set
SAMPLES_KEY = "finding_samples"   # RuleContext cache: id(finding) -> (per-step values of its saving, rule's floor)


def per_step(a: Analysis, value: Callable[[StepBreakdown], float]) -> list[float]:
    """One value per analysed step: ``value`` of each rank's breakdown of that step, averaged over ranks.
    A window of one step gives its ranks' values instead (``one_step_units``)."""
    by_step: dict = {}
    for r in a.ranks:
        for s in r.steps:
            by_step.setdefault(s.step, []).append(float(value(s)))
    if len(by_step) == 1:
        return one_step_units(next(iter(by_step.values())))
    return [sum(v) / len(v) for _, v in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


def one_step_units(by_rank: list[float]) -> list[float]:
    """The samples of a window of one step: its ranks' values. Ranks of one step are coupled by their
    collectives, so their spread is a floor of the noise, not the step-to-step noise itself; one rank's one
    step is one value, no spread at all (``gate_by_noise`` then keeps nothing above info)."""
    return list(by_rank) if len(by_rank) >= 2 else [sum(by_rank) / len(by_rank)] if by_rank else []


def per_step_calls(a: Analysis, calls: Iterable, value: Callable[[object], float]) -> list[float]:
    """One value per analysed step: ``value`` summed over the calls of each rank in that step, averaged over
    the ranks (a rank with no such call in a step counts 0)."""
    steps = sorted({s.step for r in a.ranks for s in r.steps}, key=lambda s: (s is None, s or 0))
    ranks = [r.rank for r in a.ranks] or [0]
    tot: dict = {}
    for c in calls:
        tot[(c.rank, c.step)] = tot.get((c.rank, c.step), 0.0) + float(value(c))
    if len(steps) == 1:
        return one_step_units([tot.get((r, steps[0]), 0.0) for r in ranks])
    return [sum(tot.get((r, s), 0.0) for r in ranks) / len(ranks) for s in steps]


def interval(samples: list[float], level: float) -> tuple[float, float, float, float] | None:
    """(mean, lo, hi, sd) of the ``level`` t-interval of the mean; None under 2 samples."""
    x = np.asarray(samples, dtype=float)
    if len(x) < 2:
        return None
    m, sd = float(x.mean()), float(x.std(ddof=1))
    hw = t_quantile(0.5 + level / 2, len(x) - 1) * sd / math.sqrt(len(x))
    return m, m - hw, m + hw, sd


def _steps_to_decide(mean: float, sd: float, n: int, bar: float, level: float) -> int | None:
    """More steps (same spread) after which the interval's lower end clears ``bar``; None if it never does."""
    if mean <= bar:
        return None
    if sd == 0:
        return 0
    return steps_until(lambda k: mean - t_quantile(0.5 + level / 2, n + k - 1) * sd / math.sqrt(n + k) > bar,
                       cap=10_000)


def _one_step(f: Finding, floor: str) -> None:
    """One step of one rank shows no noise, so no saving in it is shown beyond the noise: a warning or error
    drops to info (a configuration's warning floor too: it needs a saving whose lower end is above zero),
    unless a rule set the severity from structure; the finding says what would decide it."""
    f.evidence.append(Evidence("no interval for this saving: the window holds one step; profile more steps "
                               "(active=5 or more) to judge it against the run's noise"))
    kept = "info"
    if floor == EXPLICIT or SEVERITY_RANK.get(f.severity, 0) <= SEVERITY_RANK[kept]:
        return
    f.summary += (f" {kept.capitalize()}, not {f.severity}: one profiled step shows no step-to-step noise to judge "
                  "its saving against; profile more steps to decide it.")
    f.severity = kept


def predict(f: Finding, noise_half_us: float, step: float, wait: float | None, level: float,
            table: Mapping[str, float]) -> None:
    """The interval printed with the saving: the prediction's own error (diagnose/prediction.py), or, past the
    contention calibrated, no interval and the reason the saving is withheld."""
    f.impact_withheld = withheld(wait, table)
    if f.impact_withheld:
        f.impact_interval_us = None
        return
    lo, hi = interval_for(f.id, f.impact_us, noise_half_us, step, wait, level, table)
    f.impact_interval_us = [lo, hi]


def gate_by_noise(findings: list[Finding], a: Analysis, table: Mapping[str, float],
                  samples_of: Mapping[int, tuple], severity_for) -> None:
    """Give each finding its interval and keep warning/error only where the interval's lower end earns it."""
    step = a.mean.duration_us if a.mean else 0.0
    if step <= 0:
        return
    level = table["impact_confidence"]
    step_series = per_step(a, lambda s: s.duration_us)
    wait = a.contention.wait_share if a.contention else None
    one_step = len({s.step for r in a.ranks for s in r.steps}) == 1   # the samples are its ranks
    for f in findings:
        raw, floor = samples_of.get(id(f), (None, "info"))
        if raw is None and f.impact_us <= 0:
            continue  # nothing predicted (a configuration that costs nothing measurable): no interval to give
        if raw is not None and len(raw) >= 2:
            x = np.asarray(raw, dtype=float)
            if float(x.mean()) > 0:
                x = x * (f.impact_us / float(x.mean()))  # scaled to the impact as bounded
            basis = "its ranks' values in the one step" if one_step else "its per-step values"
        elif len(step_series) >= 2:
            x = f.impact_us + (np.asarray(step_series) - float(np.mean(step_series)))
            basis = "the step time's spread over its ranks" if one_step else "the step time's noise around it"
        else:
            x = np.asarray([f.impact_us])
        iv = interval(list(x), level)
        if iv is None:
            if f.impact_us > 0:
                _one_step(f, floor)
            continue
        mean, lo, hi, sd = iv
        unit = "ranks of one step" if one_step else "steps"
        f.impact_noise_interval_us = [max(lo, 0.0), min(max(hi, 0.0), step)]
        predict(f, (hi - lo) / 2, step, wait, level, table)
        shown = f"{f.impact_noise_interval_us[0] / 1e3:.1f} to {f.impact_noise_interval_us[1] / 1e3:.1f} ms"
        if f.impact_us <= 0 or floor == EXPLICIT or SEVERITY_RANK.get(f.severity, 0) <= SEVERITY_RANK["info"]:
            continue
        w = min(max(f.confidence, 0.0), 1.0)
        earned = severity_for(max(lo, 0.0) / step * w, table)
        # a wrong configuration (the rule's floor) keeps its floor where its cost, however small, is beyond
        # the noise
        floored = SEVERITY_RANK.get(floor, 0) > SEVERITY_RANK["info"]
        kept = earned
        if floored and lo > 0 and SEVERITY_RANK[floor] > SEVERITY_RANK[earned]:
            kept = floor
        if SEVERITY_RANK[kept] >= SEVERITY_RANK[f.severity]:
            continue
        band = table["severity_error_frac" if f.severity == "error" else "severity_warning_frac"]
        bar = 0.0 if floored and f.severity == floor else band * step / w if w > 0 else math.inf
        # the ranks of one step are no series of steps: more steps decide it, how many is not known
        more = None if one_step else _steps_to_decide(mean, sd, len(x), bar, level)
        what = ("nothing (its configuration's warning needs a saving beyond the noise)" if bar == 0.0 else
                f"the {f.severity} band ({band:.0%} of the step{', weighted by the confidence' if w < 1 else ''})")
        decide = (f"about {more} more step{'s' if more != 1 else ''} at this spread would decide it" if more else
                  f"no number of steps would make it {f.severity}: the estimate itself is below that band"
                  if mean <= bar else "profiling more steps (active=5 or more) would decide it" if one_step
                  else "more steps would decide it")
        f.evidence.append(Evidence(
            f"{kept} rather than {f.severity}: the saving's {level:.0%} interval over {len(x)} {unit} "
            f"({basis}) is {shown}, and its lower end does not clear {what}; "
            f"{decide}"))
        noise = "noise over its ranks" if one_step else "step-to-step noise"
        f.summary += (f" {kept.capitalize()}, not {f.severity}: within this run's {noise} its saving may "
                      f"be {'nothing' if bar == 0.0 else f'below the {f.severity} band'} ({level:.0%} interval {shown} over "
                      f"{len(x)} {unit})"
                      + (f"; about {more} more step{'s' if more != 1 else ''} would decide it." if more else "."))
        f.severity = kept
