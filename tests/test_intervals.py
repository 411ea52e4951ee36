"""Property tests of fsdpdoctor.analysis.intervals against a brute-force integer-grid model.

Intervals have integer endpoints in [0, 60); a set is modelled as the set of unit cells
[k, k+1) it covers, so union/intersection/difference are plain Python set operations.
"""

from __future__ import annotations

import numpy as np
import pytest

from fsdpdoctor.analysis import intervals as iv

# hypothesis is in the [test] extra: a missing install fails here instead of skipping these properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GRID = 60
pair = st.tuples(st.integers(0, GRID), st.integers(0, GRID))
raw = st.lists(pair, max_size=12)


def cells(pairs) -> set[int]:
    out = set()
    for s, e in pairs:
        out.update(range(s, e))
    return out


def cells_of_set(a: np.ndarray) -> set[int]:
    out = set()
    for s, e in a:
        assert float(s).is_integer() and float(e).is_integer()
        out.update(range(int(s), int(e)))
    return out


def canonical(a: np.ndarray) -> None:
    """Sorted, disjoint, non-touching, non-empty rows, shape (n, 2)."""
    assert a.ndim == 2 and a.shape[1] == 2
    assert np.all(a[:, 1] > a[:, 0])
    assert np.all(a[1:, 0] > a[:-1, 1])


def make(pairs) -> np.ndarray:
    return iv.as_set([s for s, _ in pairs], [e for _, e in pairs])


@settings(max_examples=300, deadline=None)
@given(raw)
def test_as_set_is_canonical_union(pairs):
    a = make(pairs)
    canonical(a) if len(a) else None
    assert cells_of_set(a) == cells(pairs)
    assert iv.total(a) == len(cells(pairs))


@settings(max_examples=300, deadline=None)
@given(raw, raw, raw)
def test_union(p, q, r):
    u = iv.union(make(p), make(q), make(r))
    if len(u):
        canonical(u)
    assert cells_of_set(u) == cells(p) | cells(q) | cells(r)


@settings(max_examples=300, deadline=None)
@given(raw, raw)
def test_intersect(p, q):
    x = iv.intersect(make(p), make(q))
    assert cells_of_set(x) == cells(p) & cells(q)
    assert iv.total(x) == len(cells(p) & cells(q))
    # rows are sorted and disjoint (may touch: intersection of canonical sets never does)
    if len(x):
        canonical(x)


@settings(max_examples=300, deadline=None)
@given(raw, raw)
def test_subtract(p, q):
    d = iv.subtract(make(p), make(q))
    assert cells_of_set(d) == cells(p) - cells(q)
    assert iv.total(d) == len(cells(p) - cells(q))


@settings(max_examples=200, deadline=None)
@given(raw, raw)
def test_overlap_plus_exposed_is_total(p, q):
    comm, comp = make(p), make(q)
    over = iv.total(iv.intersect(comm, comp))
    exposed = iv.total(iv.subtract(comm, comp))
    assert over + exposed == iv.total(comm)


@settings(max_examples=300, deadline=None)
@given(raw, st.lists(pair, min_size=1, max_size=10))
def test_overlap_each(p, queries):
    s = make(p)
    starts = np.array([min(a, b) for a, b in queries], dtype=float)
    ends = np.array([max(a, b) for a, b in queries], dtype=float)
    got = iv.overlap_each(starts, ends, s)
    covered = cells(p)
    want = [len(covered & set(range(int(a), int(b)))) for a, b in zip(starts, ends)]
    assert got.tolist() == pytest.approx(want)


@settings(max_examples=200, deadline=None)
@given(raw, st.integers(0, GRID), st.integers(0, GRID))
def test_clip(p, lo, hi):
    c = iv.clip(make(p), lo, hi)
    assert cells_of_set(c) == cells(p) & set(range(lo, hi))


@settings(max_examples=200, deadline=None)
@given(raw, st.lists(st.integers(-1, 2 * GRID + 1).map(lambda v: v / 2), max_size=20))
def test_contains(p, points):
    """A point lies in the set when some canonical row holds it, both ends included; a number asks for
    one answer, an array for one per point."""
    a = make(p)
    want = [any(s <= x <= e for s, e in a) for x in points]
    assert iv.contains(a, np.array(points)).tolist() == want
    assert [bool(iv.contains(a, x)) for x in points] == want


def test_empty_inputs():
    e = iv.EMPTY
    assert iv.total(e) == 0.0
    assert len(iv.intersect(e, make([(0, 5)]))) == 0
    assert len(iv.subtract(e, make([(0, 5)]))) == 0
    assert cells_of_set(iv.subtract(make([(0, 5)]), e)) == set(range(5))
    assert len(iv.union()) == 0
    assert iv.overlap_each(np.array([0.0]), np.array([3.0]), e).tolist() == [0.0]


def test_float_endpoints_random_seeds():
    """Fractional endpoints (as in real traces): compare against a fine grid (1/8 us)."""
    rng = np.random.default_rng(12345)
    for _ in range(200):
        def rand_pairs():
            n = int(rng.integers(0, 10))
            s = rng.integers(0, 400, n) / 8.0
            return list(zip(s, s + rng.integers(0, 80, n) / 8.0))
        p, q = rand_pairs(), rand_pairs()
        grid = lambda ps: {k for a, b in ps for k in range(int(a * 8), int(b * 8))}  # noqa: E731
        assert iv.total(iv.intersect(make(p), make(q))) * 8 == pytest.approx(len(grid(p) & grid(q)))
        assert iv.total(iv.subtract(make(p), make(q))) * 8 == pytest.approx(len(grid(p) - grid(q)))
        assert iv.total(iv.union(make(p), make(q))) * 8 == pytest.approx(len(grid(p) | grid(q)))
