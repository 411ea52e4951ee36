"""The measured saving's interval on a machine whose load drifts, and the A/A check that it covers.

Used by benchmarks/calibrate.py. Why this interval (the recorded runs of three full calibrations, 19:06,
01:16 and 04:45 UTC, are the evidence; ``python benchmarks/calibrate.py --aa JSON...`` redoes it):

- Within one launch, fault and fix run in adjacent blocks whose order alternates (ABBA), and M rests on the
  block differences of each adjacent pair. Their lag-1 autocorrelation averages -0.15 over the 44 launches
  of 5 pairs, what independent values give at that size (-1/5): ABBA pairing cancels the slow drift, so the
  pairs are close to independent. What undercovered was the percentile bootstrap itself: over 4-5 values
  it behaves like a normal interval with the variance shrunk by (n-1)/n, which covers about 78 % at a
  nominal 90 % even for independent normal values. The interval here is Student's t over the differences.
- Dependence is still allowed for: the sample size is the effective one under a lag-1 autocorrelation
  ``r`` of the differences in run order (n (1 - r) / (1 + r), r taken as 0 when negative), so a drift
  that ABBA does not cancel widens the interval instead of passing for evidence.
- Several launches (``--until-decided`` rounds): a launch can shift the difference as a whole (process
  placement, a neighbour's job), which pairs within it cannot show; where the launch means scatter more
  than the pairs predict, the launch is the unit (t over the launch means, launches - 1 degrees of freedom).
- Sequential looks: ``--until-decided`` looks at M after each round and stops once it decides; each look at
  level 1 - (1 - L) / K (Bonferroni over at most K rounds) keeps the chance that any look's interval
  misses the true saving at most 1 - L, whichever look stops.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path


def t_quantile(p: float, df: float) -> float:
    # imported when used: the record stage runs on a GPU machine without fsdpdoctor's dependencies
    from fsdpdoctor.diagnose.stats import t_quantile as tq

    return tq(p, df)


def lag1(xs: list[float], rounds: list[int] | None = None) -> float:
    """Lag-1 autocorrelation of ``xs`` in run order, within each round about the round's own mean (a new
    launch is a new start; a shift between launches is the launch rule's to judge, in ``drift_interval``)."""
    num = den = 0.0
    i = 0
    for n in rounds or [len(xs)]:
        part = xs[i:i + n]
        m = statistics.fmean(part)
        den += sum((x - m) ** 2 for x in part)
        num += sum((part[j] - m) * (part[j + 1] - m) for j in range(n - 1))
        i += n
    return num / den if den else 0.0


def drift_interval(diffs: list[float], level: float, rounds: list[int] | None = None) -> tuple[float, float] | None:
    """Student-t ``level`` interval of the mean of ``diffs`` (in run order; ``rounds``: the number of them
    each launch gave), its sample size the effective one under their lag-1 autocorrelation, the launch the
    unit where launch means scatter more than that (module docstring). None with fewer than 2 values."""
    n = len(diffs)
    if n < 2:
        return None
    rounds = rounds or [n]
    m = statistics.fmean(diffs)
    r = min(max(lag1(diffs, rounds), 0.0), 0.9)
    n_eff = n * (1 - r) / (1 + r)
    se, df = statistics.stdev(diffs) / math.sqrt(n_eff), max(n_eff - 1, 1.0)
    if len(rounds) >= 2:
        means, i = [], 0
        for k in rounds:
            means.append(statistics.fmean(diffs[i:i + k]))
            i += k
        se_launch = statistics.stdev(means) / math.sqrt(len(means))
        if se_launch > se:
            se, df = se_launch, len(means) - 1
    h = t_quantile(0.5 + level / 2, df) * se
    return m - h, m + h


def look_level(level: float, looks: int) -> float:
    """Bonferroni: the level of each of ``looks`` looks that keeps all of them together at ``level``."""
    return 1 - (1 - level) / max(looks, 1)


def abba(i: int) -> tuple[str, str]:
    """The order of the i-th pair of runs: fault first, then fix first, alternately (ABBA), so that a
    steady drift does not always land on the same variant."""
    return ("fault", "fix") if i % 2 == 0 else ("fix", "fault")


# --------------------------------------------------------------------------- A/A check on recorded runs
# What ``aa_rates`` gave on the three recorded full runs (render puts it in the method paragraph).
AA_NOTE = ("A/A check (`calibrate.py --aa` on three recorded full runs: "
           "34 launches, 176 pseudo-A/A pairs of adjacent blocks of one variant, so the true saving is 0 with the "
           "machine's real drift): a 90 % interval should exclude 0 in at most 10 % of them; the bootstrap "
           "excluded it in 7 of 34 (21 %), this interval in 0 of 34 (at 80 %: 9 of 34 against 2 of 34, "
           "at 50 %: 16 against 12)")
def bootstrap_mean(xs: list[float], level: float, n: int = 10000, seed: int = 0) -> tuple[float, float] | None:
    """The old rule: percentile bootstrap interval of the mean of ``xs`` (None with fewer than 2 values)."""
    if len(xs) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(n))
    a = (1 - level) / 2
    return means[int(a * (n - 1))], means[int((1 - a) * (n - 1))]


def aa_pairs(fault: list[float], fix: list[float], abba_order: bool) -> list[tuple[float, float]]:
    """Pairs of blocks of one variant, nearest in time, from one launch's blocks (each variant's list in run
    order): two runs of the same thing, so any difference between them is drift and noise (truth 0).
    ABBA order (fault, fix, fix, fault, fault, ...): the adjacent same-variant blocks; plain alternation
    (fault, fix, fault, ...): consecutive blocks of a variant, one block of the other between them."""
    out = []  # (time of the earlier block, earlier, later)
    for series, at in ((fault, [0, 3] if abba_order else [0, 2]), (fix, [1, 2] if abba_order else [1, 3])):
        # block i of a variant runs at 4 (i // 2) + at[i % 2] (ABBA: fault 0, 3, 4, 7, 8; fix 1, 2, 5, 6, 9)
        t = [4 * (i // 2) + at[i % 2] for i in range(len(series))]
        js = range(0, len(series) - 1) if not abba_order else range(len(series) - 1)
        used = set()
        for j in js:  # pair the blocks of this variant nearest in time, each block once
            if j in used or j + 1 in used or t[j + 1] - t[j] > 2:
                continue
            used |= {j, j + 1}
            out.append((t[j], series[j], series[j + 1]))
    return [(a, b) for _, a, b in sorted(out)]


def aa_rates(paths: list[Path], level: float = 0.9, per_launch: int = 5) -> dict:
    """How often an interval of a saving that is 0 by construction excludes 0, old rule against new, over the
    pseudo-A/A comparisons built from recorded full runs (``aa_pairs`` of every launch of every pair timed in
    alternating blocks). ``counterbalanced``: the A/A difference takes the pair's earlier block first and
    later first alternately, as the ABBA runs do; ``fixed order``: always the earlier block first, as runs
    in one fixed order would. Launches of a pair with several rounds are pooled, with their rounds."""
    cases = []
    for p in paths:
        for r in json.loads(Path(p).read_text())["pairs"]:
            if "error" in r or r.get("mode", "alternate") != "alternate" or len(r.get("fault_step_us", [])) < 2:
                continue
            abba_order = r.get("mode") is not None  # runs before pairs.py's ABBA order (21:15 UTC) kept no mode
            F, X = r["fault_step_us"], r["fix_step_us"]
            k = per_launch if len(F) % per_launch == 0 else len(F)
            pairs, rounds = [], []
            for i in range(0, len(F), k):
                pp = aa_pairs(F[i:i + k], X[i:i + k], abba_order)
                pairs += pp
                rounds.append(len(pp))
            cases.append((f"{Path(p).parent.name}/{Path(p).name}:{r['pair']}", pairs, rounds))
    rates = {}
    for label, sign in (("counterbalanced", lambda j: 1 if j % 2 == 0 else -1), ("fixed order", lambda j: 1)):
        old = new = 0
        for _, pairs, rounds in cases:
            d = [sign(j) * (a - b) for j, (a, b) in enumerate(pairs)]
            ivo, ivn = bootstrap_mean(d, level, n=2000), drift_interval(d, level, rounds)
            old += ivo is not None and not ivo[0] <= 0 <= ivo[1]
            new += ivn is not None and not ivn[0] <= 0 <= ivn[1]
        rates[label] = {"old": old, "new": new}
    return {"cases": len(cases), "pairs": sum(len(c[1]) for c in cases), "level": level, "rates": rates}
