"""A predicted saving's own error: the interval printed beside ``impact_us``.

A rule's saving rests on per-step values (diagnose/noise.py gives their t-interval: the step noise). How far
such a prediction falls from what applying the fix measures is more than that noise: the model's own error,
measured on the calibration's fault/fix pairs (docs/impact.md; the table ``PREDICTION_ERRORS`` of
diagnose/thresholds.py, a share of the step per rule), and what contention moves when the profiled window was
starved (the ranks waited for a CPU a share w of it: analysis/contention.py), which the calibration beside CPU
hogs measured (``prediction_wait_k``). The interval combines them:

    half-width^2 = noise^2 + (z step error)^2,   error^2 = error_frac(rule)^2 + (k w)^2

with z the normal quantile of the level. Past the contention calibrated (``prediction_wait_calibrated``) no
number is given, only the reason: re-profile on an idle host.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from collections.abc import Mapping

from fsdpdoctor.diagnose.thresholds import ERROR_BY_RULE, defaults


def error_frac(rule: str, wait: float, table: Mapping[str, float] | None = None) -> float:
    """The prediction error of ``rule`` (a share of the step) at contention ``wait``."""
    t = table or defaults()
    base = (ERROR_BY_RULE.get(rule) or ERROR_BY_RULE["*"]).error_frac
    return math.hypot(base, t["prediction_wait_k"] * max(wait, 0.0))


def interval_for(rule: str, impact_us: float, noise_half_us: float, step_us: float, wait: float | None,
                 level: float, table: Mapping[str, float] | None = None) -> tuple[float, float]:
    """The ``level`` interval of a predicted saving: its step noise and its rule's calibrated error combined,
    the error widened by the window's contention (``wait``: None, not recorded, counts as none)."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    hw = math.hypot(noise_half_us, z * step_us * error_frac(rule, wait or 0.0, table))
    return impact_us - hw, min(impact_us + hw, step_us) if step_us > 0 else impact_us + hw


def withheld(wait: float | None, table: Mapping[str, float] | None = None) -> str | None:
    """Why no saving is given where the profiled window was starved past what the calibration covers."""
    t = table or defaults()
    if wait is None or wait <= t["prediction_wait_calibrated"]:
        return None
    return (f"no saving predicted: the ranks waited for a CPU {wait:.0%} of the profiled window, beyond the "
            f"{t['prediction_wait_calibrated']:.0%} up to which predictions were calibrated beside CPU hogs "
            "(docs/impact.md); re-profile on an idle host")
