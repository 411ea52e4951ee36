"""Did the fix deliver? (``diff``, ``check --baseline``): every finding the new run no longer has, or has
with a smaller cost, with the saving ``analyze BASE`` printed for its fix (the same number and interval, read
from BASE's finding, never recomputed from NEW) beside the measured change of the step and its interval:
"fsdp1-no-backward-prefetch gone: analyze BASE predicted -37.0 ms [-45.0, -29.0], measured -33.0 ms
[-41.0, -25.0]: delivered". A finding that shrank (a partial fix) is held to that same prediction and says
what it still costs in NEW.

One step time holds every fix applied between the runs, so the outcome is judged on their predictions
summed (roots only: a consequence's cost is inside its root's, ``caused_by``), against the step's change:

* delivered: the predicted change lies in the step change's interval, or the measured change is within
  ``fix_saving_tolerance`` of the prediction (the calibration tolerance of docs/impact.md), or the two
  intervals overlap with the prediction's as tight as that tolerance, and the step's interval does not also
  reach zero;
* not-delivered: the step did not get detectably faster, and the prediction is outside its interval;
* less-than-predicted / more-than-predicted: faster beyond noise, but the prediction is outside the
  interval and beyond the tolerance;
* undecided: the interval holds both zero and the prediction, or there is no interval and the point
  estimate is off.

A machine that changed between the runs moves the step too; the comparison's verdict says so, and the
outcome text repeats it when the verdict is not the job's.
"""

from __future__ import annotations

from fsdpdoctor.results import Analysis
from fsdpdoctor.results.comparison import Estimate, FindingChange, FixOutcome


def _ms(us: float) -> str:
    return f"{us / 1e3:+.1f} ms"


def _judge(pred: float, step: Estimate, tolerance: float, pred_iv: tuple[float, float] | None = None) -> str:
    """``pred_iv``: the prediction's own interval; where it is as tight as the tolerance, overlapping the
    step change's interval counts as agreeing (a wider one would agree with anything near it)."""
    d, lo, hi = step.diff, step.lo, step.hi
    close = pred < 0 and abs(d - pred) <= tolerance * abs(pred)
    if lo is None or hi is None:
        return "delivered" if close else "undecided"
    inside = lo <= pred <= hi or (
        pred_iv is not None and pred_iv[0] <= hi and lo <= pred_iv[1]
        and (pred_iv[1] - pred_iv[0]) / 2 <= tolerance * abs(pred))
    if lo <= 0 <= hi:
        # the step did not change beyond noise: a prediction it cannot tell from zero is undecided
        return "undecided" if inside or close or pred >= 0 else "not-delivered"
    if hi < 0:  # faster beyond noise
        if inside or close:
            return "delivered"
        return "less-than-predicted" if d > pred else "more-than-predicted"
    return "not-delivered"  # slower beyond noise


_SAY = {"delivered": "delivered", "less-than-predicted": "delivered less than predicted",
        "more-than-predicted": "the step got faster than predicted",
        "not-delivered": "the fix did not deliver: the step did not get faster",
        "undecided": "undecided: the step's noise cannot tell this saving from none"}


def _iv_text(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f" [{lo / 1e3:+.1f}, {hi / 1e3:+.1f}]"


def _printed(f: FindingChange) -> tuple[float, float | None, float | None]:
    """The step change analyze BASE predicted for the finding's fix, with its interval: -impact, [-hi, -lo]."""
    iv = f.base_impact_interval_us
    if not iv:
        return -f.base_impact_us, None, None
    return -f.base_impact_us, -iv[1], -iv[0]


def _total(preds: list[tuple[float, float | None, float | None]]) -> tuple[float, float | None, float | None]:
    """Roots' predictions summed; their intervals' half-widths in quadrature (the findings' errors are their
    own), None where any root printed no interval."""
    total = sum(p for p, _, _ in preds)
    if any(lo is None for _, lo, _ in preds):
        return total, None, None
    lo_w = sum((p - lo) ** 2 for p, lo, _ in preds) ** 0.5
    hi_w = sum((hi - p) ** 2 for p, _, hi in preds) ** 0.5
    return total, total - lo_w, total + hi_w


def _own(f: FindingChange, root: bool, cause: str | None) -> str:
    """What analyze BASE said of this finding's saving: its number and interval, why it gave none, or that
    the saving is inside its cause's."""
    if not root:
        return f"predicted: within {cause}'s"
    if f.base_impact_withheld:
        return f"analyze BASE gave no number ({f.base_impact_withheld})"
    p, lo, hi = _printed(f)
    return f"analyze BASE predicted {_ms(p)}{_iv_text(lo, hi)}"


def fix_outcomes(base: Analysis, findings: list[FindingChange], step: Estimate, tolerance: float,
                 machine_note: str | None = None) -> list[FixOutcome]:
    """One outcome per finding gone or smaller (status "gone", or "better" beyond noise with a smaller cost)."""
    caused = {f.id: f.caused_by for f in base.findings}
    # gone, or smaller beyond noise (its share of the step fell significantly) and with a smaller cost
    fixed = [f for f in findings if f.base_impact_us is not None
             and (f.status == "gone" or (f.status == "better" and f.significant and f.new_impact_us is not None
                                         and f.new_impact_us < f.base_impact_us))]
    if not fixed:
        return []
    roots = [f for f in fixed if caused.get(f.id) not in {g.id for g in fixed}]
    # a root analyze BASE gave no number for (a starved capture) promises nothing to hold the step to
    priced = [f for f in roots if not f.base_impact_withheld]
    total, t_lo, t_hi = _total([_printed(f) for f in priced])
    outcome = (_judge(total, step, tolerance, None if t_lo is None else (t_lo, t_hi)) if priced
               else "undecided")
    together = [f.id for f in fixed]
    measured = (f"measured {_ms(step.diff)}{_iv_text(step.lo, step.hi)} ({100 * step.level:.0f}% CI)"
                if step.lo is not None else f"measured {_ms(step.diff)} (too few steps for an interval)")
    out = []
    for f in fixed:
        p, lo, hi = _printed(f)
        own = _own(f, f in roots, caused.get(f.id))
        root = f in priced
        still = (f" (still {f.new_impact_us / 1e3:.1f} ms in NEW)" if f.status == "better" and f.new_impact_us
                 else "")
        shared = "" if len(priced) < 2 else f", all {len(priced)} together {_ms(total)}{_iv_text(t_lo, t_hi)}"
        say = _SAY[outcome] if priced else "nothing was predicted to hold it to"
        text = f"{f.id} {f.status}{still}: {own}{shared}, {measured}: {say}"
        if machine_note:
            text += f" ({machine_note})"
        out.append(FixOutcome(
            id=f.id, status=f.status, predicted_us=p if root else None,
            caused_by=None if f in roots else caused.get(f.id), together=together, predicted_total_us=total,
            measured_us=step.diff, measured_lo_us=step.lo, measured_hi_us=step.hi, level=step.level,
            outcome=outcome, text=text, predicted_lo_us=lo if root else None, predicted_hi_us=hi if root else None,
            remaining_us=f.new_impact_us if f.status == "better" else None))
    return out
