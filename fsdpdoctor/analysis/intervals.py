"""Interval algebra on sorted, disjoint interval sets.

An interval set is a float64 array of shape (n, 2), rows [start, end), sorted
and non-overlapping. Overlap and exposure are computed on unions, never by
summing durations: two overlapping kernels count once.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty((0, 2), dtype=np.float64)
# (searches are the array method: np.searchsorted adds ~0.5 us a call through its Python wrapper, and
# `analyze` asks ~1,500 single points on v100)


def as_set(starts, ends) -> np.ndarray:
    """Union of arbitrary intervals -> canonical interval set."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if starts.size == 0:
        return EMPTY
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where the start is past everything seen so far
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > run_end[:-1]
    idx = np.nonzero(new_block)[0]
    out = np.empty((idx.size, 2), dtype=np.float64)
    out[:, 0] = s[idx]
    out[:, 1] = np.maximum.reduceat(e, idx) if idx.size else e
    # reduceat over blocks gives each block's max end
    return out


def union(*sets: np.ndarray) -> np.ndarray:
    sets = [s for s in sets if len(s)]
    if not sets:
        return EMPTY
    allv = np.concatenate(sets)
    return as_set(allv[:, 0], allv[:, 1])


def total(a: np.ndarray) -> float:
    return float(np.sum(a[:, 1] - a[:, 0])) if len(a) else 0.0


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection of two interval sets (two-pointer sweep, vectorised per block)."""
    if not len(a) or not len(b):
        return EMPTY
    # for each interval of a, the range of b intervals that may overlap it
    lo = b[:, 1].searchsorted(a[:, 0], side="right")
    hi = b[:, 0].searchsorted(a[:, 1], side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY
    ai = np.repeat(np.arange(len(a)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    bi = np.repeat(lo, counts) + offsets
    s = np.maximum(a[ai, 0], b[bi, 0])
    e = np.minimum(a[ai, 1], b[bi, 1])
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1) if keep.any() else EMPTY


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a minus b."""
    if not len(a) or not len(b):
        return a
    if len(a) == 1:  # one window minus a set (idle time of a step): the gaps of b inside it
        return _gaps_within(b, float(a[0, 0]), float(a[0, 1]))
    return _complement_within(b, a)


def _gaps_within(b: np.ndarray, start: float, end: float) -> np.ndarray:
    """[start, end) minus the set b, from the rows of b that reach into it (a few searches, no sweep)."""
    i = b[:, 1].searchsorted(start, side="right")
    j = b[:, 0].searchsorted(end, side="left")
    if i >= j:
        return np.array([[start, end]], dtype=np.float64) if end > start else EMPTY
    inner = b[i:j]
    s = np.concatenate(([start], inner[:, 1]))
    e = np.concatenate((inner[:, 0], [end]))
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1) if keep.any() else EMPTY


def _complement_within(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    # points of a not covered by b = a ∩ complement(b)
    lo = min(a[0, 0], b[0, 0]) - 1.0
    hi = max(a[-1, 1], b[-1, 1]) + 1.0
    gaps_s = np.concatenate([[lo], b[:, 1]])
    gaps_e = np.concatenate([b[:, 0], [hi]])
    comp = np.stack([gaps_s, gaps_e], axis=1)
    comp = comp[comp[:, 1] > comp[:, 0]]
    return intersect(a, comp)


def clip(a: np.ndarray, start: float, end: float) -> np.ndarray:
    """The part of set a inside [start, end): its rows that reach into the window, ends cut to it."""
    if not len(a) or end <= start:
        return EMPTY
    i = a[:, 1].searchsorted(start, side="right")
    j = a[:, 0].searchsorted(end, side="left")
    if i >= j:
        return EMPTY
    out = a[i:j].copy()
    out[0, 0] = max(out[0, 0], start)
    out[-1, 1] = min(out[-1, 1], end)
    keep = out[:, 1] > out[:, 0]
    return out if keep.all() else out[keep]


def contains(s: np.ndarray, x):
    """Whether the point ``x`` (a number, or each of an array) lies in the set ``s``, ends included."""
    x = np.asarray(x, dtype=np.float64)
    if not len(s):
        return np.zeros(x.shape, dtype=bool)
    k = s[:, 0].searchsorted(x, side="right") - 1
    return (k >= 0) & (s[np.maximum(k, 0), 1] >= x)


def overlap_each(starts: np.ndarray, ends: np.ndarray, s: np.ndarray) -> np.ndarray:
    """For each interval [starts[i], ends[i]), the length covered by set ``s``."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    out = np.zeros(starts.size)
    if not len(s) or starts.size == 0:
        return out
    # prefix sums of covered length let each query be answered in O(log n)
    cum = np.concatenate([[0.0], np.cumsum(s[:, 1] - s[:, 0])])

    def covered_before(x):
        k = s[:, 0].searchsorted(x, side="right")  # intervals starting at or before x
        full = cum[np.maximum(k - 1, 0)]
        part = np.where(k > 0, np.clip(x - s[np.maximum(k - 1, 0), 0], 0, None), 0.0)
        part = np.minimum(part, np.where(k > 0, s[np.maximum(k - 1, 0), 1] - s[np.maximum(k - 1, 0), 0], 0.0))
        return np.where(k > 0, full + part, 0.0)

    out = covered_before(ends) - covered_before(starts)
    return np.maximum(out, 0.0)


def share_density(starts, ends, within: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fair shares of overlapping intervals: at each instant covered by ``n`` of the intervals (and by
    the set ``within``, when given), each of them is credited ``1/n`` of that instant. Returned as
    (breakpoints, cumulative credit per interval) for ``share_each``: the shares of all intervals add
    up to the union of the intervals (inside ``within``), so tables built from them add up to the step."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if starts.size == 0:
        return np.zeros(1), np.zeros(1)
    pts = [starts, ends] + ([within.ravel()] if within is not None and len(within) else [])
    b = np.sort(np.concatenate(pts))  # distinct breakpoints, without np.unique (it imports numpy.ma: 15-25 ms)
    b = b[np.concatenate(([True], b[1:] != b[:-1]))]
    if b.size < 2:
        return b[:1], np.zeros(1)
    left = b[:-1]
    active = ((np.sort(starts)).searchsorted(left, side="right")
              - (np.sort(ends)).searchsorted(left, side="right"))
    weight = np.where(active > 0, 1.0 / np.maximum(active, 1), 0.0)
    if within is not None:
        weight = weight * contains_open(within, (left + b[1:]) / 2)
    cum = np.concatenate([[0.0], np.cumsum(weight * np.diff(b))])
    return b, cum


def share_each(density: tuple[np.ndarray, np.ndarray], starts, ends,
               lo: float = -np.inf, hi: float = np.inf) -> np.ndarray:
    """Each interval's share (``share_density``) of the time it spends inside [lo, hi)."""
    b, cum = density
    s = np.clip(np.asarray(starts, dtype=np.float64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.float64), lo, hi)
    if b.size < 2:
        return np.zeros(s.shape)
    return np.maximum(np.interp(e, b, cum) - np.interp(s, b, cum), 0.0)


def contains_open(s: np.ndarray, x) -> np.ndarray:
    """Whether each point of ``x`` lies inside a row [start, end) of the set ``s``."""
    x = np.asarray(x, dtype=np.float64)
    if not len(s):
        return np.zeros(x.shape, dtype=bool)
    k = s[:, 0].searchsorted(x, side="right") - 1
    return (k >= 0) & (s[np.maximum(k, 0), 1] > x)
