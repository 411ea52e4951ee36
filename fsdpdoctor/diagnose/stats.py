"""Small-sample statistics for comparing two runs (``fsdpdoctor diff``, ``check --baseline``).

The unit of independent observation is the *step*: ranks of one step are coupled by
their collectives (a slow rank makes every other rank wait in the same step), so a
step's value is the mean over its ranks, and the runs are compared on those per-step
values. Profiles hold few steps (3 to 10 is typical), so the interval for the
difference of means is Welch's t-interval (unequal variances, Welch-Satterthwaite
degrees of freedom) rather than a bootstrap: a percentile bootstrap over 3 to 5 values
can only produce a handful of distinct resamples and its intervals are far too narrow
at that size. With one step on a side, the other side's variance stands for both
(pooled t); with one step on both sides nothing can be concluded. Steps of one run are
treated as independent of each other (a warm-up trend violates this: skip warm-up steps
with ``--steps``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fsdpdoctor.results.comparison import Estimate


def _t_cdf_upper_half(x: float, df: float) -> float:
    """P(0 <= T <= x) for Student's t with ``df`` degrees of freedom (Simpson's rule on the density)."""
    if x <= 0:
        return 0.0
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    n = 4000
    t = np.linspace(0.0, x, n + 1)
    f = c * (1 + t * t / df) ** (-(df + 1) / 2)
    h = x / n
    return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))


# t_quantile(p, df) for df 1..40 at the default levels (0.5 + 0.90/2: impact_confidence, 0.5 + 0.95/2:
# diff_confidence), as it computes them: one quantile is 63 integrations, ~31 M instructions of every
# `analyze` (numpy's pow over 252 k points); tests/test_stats_and_frames.py checks these equal the computation.
_DFS = frozenset(range(1, 41))  # an int or an integral float
_KNOWN: dict[float, tuple[float, ...]] = {
    0.95: (
        6.3137515146750545, 2.9199855803537256, 2.353363434801823, 2.131846786326644, 2.0150483733330287,
        1.9431802805153016, 1.8945786050900026, 1.859548037530896, 1.8331129326562436, 1.81246112281167,
        1.795884818704041, 1.7822875556493356, 1.7709333959868534, 1.761310135774893, 1.7530503556925736,
        1.7458836762762457, 1.7396067260750825, 1.7340636066175317, 1.7291328115213802, 1.7247182429207761,
        1.7207429028118821, 1.717144374380231, 1.7138715277470498, 1.7108820799094175, 1.7081407612519195,
        1.7056179197592694, 1.7032884457221318, 1.7011309342659002, 1.6991270265335108, 1.697260886593983,
        1.6955187825458524, 1.6938887483836842, 1.6923603090303683, 1.690924255186875, 1.689572457780232,
        1.6882977141168358, 1.6870936195962574, 1.6859544601667138, 1.6848751217112397, 1.6838510133356581),
    0.975: (
        12.706204736174747, 4.302652729749466, 3.1824463052837046, 2.7764451051977836, 2.570581835636327,
        2.4469118511449697, 2.364624251592777, 2.306004135204164, 2.2621571627982204, 2.228138851986264,
        2.2009851600916353, 2.1788128296672618, 2.1603686564627544, 2.144786687917807, 2.1314495455597777,
        2.119905299221248, 2.1098155778333387, 2.1009220402410262, 2.093024054408332, 2.0859634472658453,
        2.079613844727689, 2.073873067904006, 2.0686576104190513, 2.0638985616280063, 2.059538552753337,
        2.055529438642866, 2.0518305164802966, 2.0484071417951863, 2.04522964213273, 2.042272456301286,
        2.039513446396385, 2.0369333434600527, 2.034515297449385, 2.032244509317758, 2.030107928250281,
        2.028094000980488, 2.026192463029097, 2.024394163911925, 2.0226909200367906, 2.021075390306285),
}


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t, by bisection on its distribution function.

    Kept per (p, df): ~60 integrations of 4,000 points each, asked again and again for the same few
    (level, steps) by the noise gate's search over step counts (40 % of a small run's analysis)."""
    known = _KNOWN.get(p)
    if known is not None and df in _DFS:
        return known[int(df) - 1]
    if df > 1e4:
        df = 1e4  # indistinguishable from the normal here
    target = p - 0.5
    lo, hi = 0.0, 1.0
    while _t_cdf_upper_half(hi, df) < target:
        hi *= 2
        if hi > 1e7:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        if _t_cdf_upper_half(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _half_width(s1: float, s2: float, n1: int, n2: int, level: float, pooled: bool) -> float:
    if pooled:
        s = s1 if n1 >= 2 else s2
        df = max(n1 + n2 - 2, 1)
        return t_quantile(0.5 + level / 2, df) * s * math.sqrt(1 / n1 + 1 / n2)
    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    se2 = v1 + v2
    if se2 == 0:
        return 0.0
    df = se2 * se2 / ((v1 * v1 / (n1 - 1) if v1 else 0.0) + (v2 * v2 / (n2 - 1) if v2 else 0.0))
    return t_quantile(0.5 + level / 2, max(df, 1.0)) * math.sqrt(se2)


def estimate(metric: str, base: list[float], new: list[float], level: float,
             max_more_steps: int = 100_000) -> Estimate:
    """Difference of per-step means (new - base) with a t-interval; how many more steps would resolve it."""
    from fsdpdoctor.results.comparison import Estimate   # only `diff` builds one: `analyze` loads none

    b, n = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    n1, n2 = len(b), len(n)
    bm = float(b.mean()) if n1 else 0.0
    nm = float(n.mean()) if n2 else 0.0
    d = nm - bm
    sd1 = float(b.std(ddof=1)) if n1 >= 2 else None
    sd2 = float(n.std(ddof=1)) if n2 >= 2 else None
    e = Estimate(metric=metric, base_mean=bm, new_mean=nm, diff=d, lo=None, hi=None, n_base=n1, n_new=n2,
                 sd_base=sd1, sd_new=sd2, level=level, method="none")
    if n1 == 0 or n2 == 0:
        return e
    if n1 == n2 and np.array_equal(np.sort(b), np.sort(n)):
        e.lo = e.hi = 0.0
        e.method = "identical"
        return e
    if sd1 is None and sd2 is None:
        return e
    pooled = sd1 is None or sd2 is None
    s1, s2 = (sd1 if sd1 is not None else sd2), (sd2 if sd2 is not None else sd1)
    hw = _half_width(s1, s2, n1, n2, level, pooled)
    e.lo, e.hi = d - hw, d + hw
    e.method = "pooled-t" if pooled else "welch-t"
    if not e.significant and d != 0:
        e.more_steps = _more_steps(abs(d), s1, s2, n1, n2, level, pooled, max_more_steps)
    return e


def half_width_after(e: Estimate, k: int) -> float | None:
    """The half-width ``e``'s interval would have with ``k`` more steps in each run (the same spread)."""
    if e.method not in ("welch-t", "pooled-t"):
        return 0.0 if e.method == "identical" else None
    s1 = e.sd_base if e.sd_base is not None else e.sd_new
    s2 = e.sd_new if e.sd_new is not None else e.sd_base
    return _half_width(s1, s2, e.n_base + k, e.n_new + k, e.level, e.method == "pooled-t")


def log_ratio_interval(base: list[float], new: list[float], level: float) -> tuple[float, float] | None:
    """Interval of log(mean new / mean base) (delta method, Welch degrees of freedom).

    On a log scale a uniform slow-down by a factor k moves every part of the step by the same log k,
    so two parts whose intervals do not overlap did not scale alike. None without a positive mean on
    both sides or without a spread on either side."""
    b, n = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    n1, n2 = len(b), len(n)
    if not n1 or not n2:
        return None
    m1, m2 = float(b.mean()), float(n.mean())
    if m1 <= 0 or m2 <= 0:
        return None
    # relative spread of each side's mean (coefficient of variation of the samples)
    c1 = float(b.std(ddof=1)) / m1 if n1 >= 2 else None
    c2 = float(n.std(ddof=1)) / m2 if n2 >= 2 else None
    if c1 is None and c2 is None:
        return None
    pooled = c1 is None or c2 is None
    hw = _half_width(c1 if c1 is not None else c2, c2 if c2 is not None else c1, n1, n2, level, pooled)
    mid = math.log(m2 / m1)
    return mid - hw, mid + hw


def steps_until(resolved, cap: int = 100_000) -> int | None:
    """Smallest k >= 1 with ``resolved(k)`` (monotone: once true, true for every larger k); None beyond ``cap``."""
    if not resolved(cap):
        return None
    lo, hi = 0, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if resolved(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _more_steps(d: float, s1: float, s2: float, n1: int, n2: int, level: float, pooled: bool,
                cap: int) -> int | None:
    """Smallest k such that k more steps in each run would make an interval of this spread exclude ``d``.

    Assumes the step-to-step spread stays what it is; None when even ``cap`` steps would not do.
    """
    return steps_until(lambda k: _half_width(s1, s2, n1 + k, n2 + k, level, pooled) < d, cap)
