"""Each rank's clock against a reference rank's, from matched collectives.

Per-rank traces carry unrelated clocks when the ranks run on different hosts. A
synchronising collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier)
cannot complete on any rank before the last rank joins, and once it joins every rank
is released together: matched collectives *end* almost together on every rank. So
for each matched collective ``end_r - end_ref`` estimates rank r's clock offset, plus
noise (scheduling of the waiting thread, the last chunk of a ring). We take the
median of those estimates (robust to the few that a descheduled thread delays by
milliseconds) and its standard error ``1.2533 * 1.4826 * MAD / sqrt(n)`` (the median's
asymptotic efficiency on normal noise times the MAD's consistency constant).

Causality also bounds the offset: no rank ends a collective before every rank has
started it, so each matched pair confines the offset to
``[start_r - end_ref, end_r - start_ref]`` (the same reasoning as NTP's round-trip
bounds). A pair whose interval excludes the others' common range was not one
collective (different process groups, diverged order): we keep the largest set of
pairs whose intervals share a point (Marzullo's algorithm, as NTP does) and give no
estimate unless that set is a majority of the pairs. The estimate is kept inside the
common range, and the uncertainty is at most half its width.

Drift (clock rate difference) is fitted only when the run is long enough to show it:
at least ``MIN_DRIFT_POINTS`` matched collectives and a slope whose t-interval
excludes zero; otherwise it is 0. Collectives are matched by (step, issue order within
the step on each rank) and must be of the same kind; broadcasts and point-to-point
transfers are left out because their root/sender may finish before the others.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from fsdpdoctor.analysis.stats import median
from fsdpdoctor.results import ClockReport, Collective, RankClock

SYNCHRONISING = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
MIN_DRIFT_POINTS = 8            # a slope from fewer points is mostly noise
_MEDIAN_SE = 1.2533 * 1.4826   # SE(median) = 1.2533 sigma / sqrt(n); sigma = 1.4826 MAD


def matched_ends(colls: list[Collective], ref: int, rank: int) -> list[tuple[Collective, Collective]]:
    """(reference rank's call, this rank's call) pairs of the same synchronising collective."""
    groups: dict[tuple[int, object], list[Collective]] = defaultdict(list)
    for c in colls:
        if c.rank in (ref, rank):
            groups[(c.rank, c.step)].append(c)
    pairs = []
    for step in {s for (_, s) in groups}:
        a = sorted(groups.get((ref, step), []), key=lambda c: c.index)
        b = sorted(groups.get((rank, step), []), key=lambda c: c.index)
        for x, y in zip(a, b):
            if x.kind != y.kind:
                break  # issue order diverged: later pairs would match different collectives
            if x.kind in SYNCHRONISING:
                pairs.append((x, y))
    return pairs


def consistent(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Mask of the largest set of intervals [lo, hi] that share a point (Marzullo's algorithm)."""
    edges = sorted([(v, 0) for v in lo] + [(v, 1) for v in hi])   # opens sort before closes at a tie
    best, best_at, open_now = 0, None, 0
    for value, kind in edges:
        open_now += 1 if kind == 0 else -1
        if kind == 0 and open_now > best:
            best, best_at = open_now, value
    if best_at is None:
        return np.zeros(len(lo), bool)
    return (lo <= best_at) & (best_at <= hi)


def _fit_drift(t: np.ndarray, d: np.ndarray, t0: float) -> float:
    """Slope of d against t (us per us), 0 unless the run is long enough and the slope is clear."""
    n = len(d)
    if n < MIN_DRIFT_POINTS or float(t.max() - t.min()) <= 0:
        return 0.0
    mad = float(median(np.abs(d - median(d))))
    keep = np.abs(d - median(d)) <= 3 * 1.4826 * mad if mad > 0 else np.ones(n, bool)
    if keep.sum() < MIN_DRIFT_POINTS:
        return 0.0
    tt, dd = t[keep] - t0, d[keep]
    slope, icpt = np.polyfit(tt, dd, 1)
    resid = dd - (slope * tt + icpt)
    sxx = float(np.sum((tt - tt.mean()) ** 2))
    se = math.sqrt(float(np.sum(resid ** 2)) / max(len(dd) - 2, 1) / sxx) if sxx > 0 else math.inf
    return float(slope) if abs(slope) > 2.0 * se else 0.0   # ~95% two-sided for the sizes this needs


def _estimate_rank(pairs: list[tuple[Collective, Collective]], rank: int) -> RankClock | None:
    if not pairs:
        return None
    t = np.array([x.end_us for x, _ in pairs])
    d = np.array([y.end_us - x.end_us for x, y in pairs])
    t0 = float(median(t))
    drift = _fit_drift(t, d, t0)
    trend = drift * (t - t0)
    # each pair's causal interval for the offset at t0: [start_r - end_ref, end_r - start_ref] less the drift
    lo = np.array([y.start_us - x.end_us for x, y in pairs]) - trend
    hi = np.array([y.end_us - x.start_us for x, y in pairs]) - trend
    keep = consistent(lo, hi)
    n = int(keep.sum())
    if len(pairs) > 1 and 2 * n <= len(pairs):
        return None     # no majority agrees on one offset: the matches are not the same collectives
    resid = (d - trend)[keep]
    off = float(median(resid))
    mad = float(median(np.abs(resid - off)))
    se = _MEDIAN_SE * mad / math.sqrt(n) if n > 1 else math.inf
    b_lo, b_hi = float(lo[keep].max()), float(hi[keep].min())
    off = min(max(off, b_lo), b_hi)
    se = min(se, (b_hi - b_lo) / 2)
    return RankClock(rank=rank, offset_us=off, drift_ppm=drift * 1e6, uncertainty_us=float(se), n_matched=n,
                     bound_lo_us=b_lo, bound_hi_us=b_hi)


def estimate(colls: list[Collective], ranks: list[int]) -> ClockReport | None:
    """Offsets of every rank's clock from the lowest rank's; None with fewer than two ranks.

    A rank without an estimate is absent from ``ranks`` and explained in ``notes``."""
    if len(ranks) < 2 or not colls:
        return None
    ref = min(ranks)
    rep = _reference([c for c in colls if c.rank == ref], ref)
    if rep is None:
        return None
    # each rank's calls, in the order given: a rank is matched against the reference's calls and its
    # own (linear in ranks), fed to matched_ends in their original relative order
    by_rank: dict[int, list] = defaultdict(list)
    for c in colls:
        by_rank[c.rank].append(c)
    return _estimate_all(rep, by_rank, ranks)


def estimate_by_rank(by_rank: dict[int, list], ranks: list[int]) -> ClockReport | None:
    """``estimate`` from each rank's calls in its issue order (a merged partial result's rows)."""
    if len(ranks) < 2 or not any(by_rank.values()):
        return None
    ref = min(ranks)
    rep = _reference(by_rank.get(ref, []), ref)
    return _estimate_all(rep, by_rank, ranks) if rep is not None else None


def _reference(ref_calls: list, ref: int) -> ClockReport | None:
    ref_ends = sorted(c.end_us for c in ref_calls if c.kind in SYNCHRONISING)
    if not ref_ends:
        return None
    return ClockReport(reference_rank=ref, t0_us=float(median(ref_ends)), method="collective-end",
                       ranks=[RankClock(rank=ref, offset_us=0.0, n_matched=len(ref_ends))])


def _estimate_all(rep: ClockReport, by_rank: dict[int, list], ranks: list[int]) -> ClockReport | None:
    ref = rep.reference_rank
    for r in sorted(ranks):
        if r == ref:
            continue
        pairs = matched_ends(by_rank.get(ref, []) + by_rank.get(r, []), ref, r)
        rc = _estimate_rank(pairs, r)
        if rc is not None:
            rep.ranks.append(rc)
        else:
            rep.notes.append(f"rank {r}: no clock estimate: " + (
                "no synchronising collective matched with the reference rank" if not pairs else
                f"the {len(pairs)} matched collectives do not agree on one offset (no majority of their causal "
                "intervals overlaps: different process groups or a diverged order?)"))
    return rep if len(rep.ranks) > 1 or rep.notes else None


def to_reference(clock: ClockReport | None, rank: int, t: float) -> float:
    """A time on ``rank``'s clock, on the reference rank's clock (unchanged when the rank has no estimate)."""
    rc = clock.of(rank) if clock else None
    if rc is None:
        return t
    return t - rc.offset_us - rc.drift_ppm * 1e-6 * (t - clock.t0_us)


def uncertainty(clock: ClockReport | None, rank: int) -> float:
    rc = clock.of(rank) if clock else None
    return rc.uncertainty_us if rc else 0.0


def aligned_lead(cs: list[Collective], clock: ClockReport | None, same_clock: bool) -> float | None:
    """How much earlier the first rank issued this collective than the last, on one clock.

    None when the issue times are unknown, when the clocks are neither shared nor
    estimated, or when the lead is not larger than the clocks' combined uncertainty.
    """
    if not all(c.issue_us is not None for c in cs):
        return None
    rcs = [clock.of(c.rank) for c in cs] if clock is not None else None   # one look-up per call (thousands of ranks)
    if rcs is None or not all(rcs):   # a RankClock is always true
        if not same_clock:
            return None
        issue = [c.issue_us for c in cs]
        return float(max(issue) - min(issue))
    t0 = clock.t0_us
    issue = [c.issue_us - rc.offset_us - rc.drift_ppm * 1e-6 * (c.issue_us - t0) for c, rc in zip(cs, rcs)]  # to_reference
    first, last = int(np.argmin(issue)), int(np.argmax(issue))
    lead = float(issue[last] - issue[first])
    u = math.hypot(rcs[first].uncertainty_us, rcs[last].uncertainty_us)
    return lead if lead > u else None
