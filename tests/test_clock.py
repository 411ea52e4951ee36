"""Clock alignment from matched collectives (fsdpdoctor/analysis/clock.py): a known shift of one rank's
clock is recovered within the stated uncertainty, and cross-rank timing uses the aligned clock."""

from __future__ import annotations

import pytest

import fsdpdoctor
from fsdpdoctor.analysis.clock import aligned_lead, estimate, to_reference
from fsdpdoctor.results import ClockReport, Collective, RankClock

from trace_edit import rewrite_times

SHIFT_US = 2_345_678.9      # as if rank 1 ran on a host whose clock is 2.3 s ahead


@pytest.fixture(scope="module")
def runs(traces_dir, tmp_path_factory):
    shifted = rewrite_times(traces_dir / "straggler", tmp_path_factory.mktemp("clk") / "straggler",
                            shift_us=SHIFT_US, ranks={1})
    return (fsdpdoctor.analyze(traces_dir / "straggler"), fsdpdoctor.analyze(shifted))


def test_known_shift_is_recovered_within_the_uncertainty(runs):
    orig, shifted = runs
    o, s = orig.clock.of(1), shifted.clock.of(1)
    assert s.n_matched >= 4 and s.uncertainty_us > 0
    # both ranks ran on one host (one clock), so the recorded offset is the shift alone
    assert abs(s.offset_us - SHIFT_US) <= 2 * s.uncertainty_us
    # the estimator moves with the clock: the same run shifted gives the same estimate plus the shift
    assert s.offset_us - o.offset_us == pytest.approx(SHIFT_US, abs=1e-3)
    assert s.uncertainty_us == pytest.approx(o.uncertainty_us, abs=1e-3)
    assert s.bound_lo_us <= s.offset_us <= s.bound_hi_us
    assert shifted.clock.of(0).offset_us == 0.0 and shifted.clock.reference_rank == 0


def test_straggler_arrival_uses_the_aligned_clock(runs):
    orig, shifted = runs
    assert shifted.straggler.straggler == orig.straggler.straggler == 1
    assert any(p["arrival_lead_us"] for p in orig.straggler.per_step)
    for a, b in zip(orig.straggler.per_step, shifted.straggler.per_step):
        if a["arrival_lead_us"] is None:
            continue
        # without alignment the lead would be off by the 2.3 s shift
        assert b["arrival_lead_us"] == pytest.approx(a["arrival_lead_us"], abs=1.0)
        assert b["arrival_lead_us"] < SHIFT_US / 4


def test_shift_appears_in_json(runs):
    _, shifted = runs
    import json

    d = json.loads(shifted.to_json())
    r1 = next(r for r in d["clock"]["ranks"] if r["rank"] == 1)
    assert r1["offset_us"] == pytest.approx(shifted.clock.of(1).offset_us)
    assert {"offset_us", "drift_ppm", "uncertainty_us", "n_matched"} <= set(r1)


def _coll(rank, index, start, end, issue=None, kind="all_reduce", step=1):
    return Collective(rank=rank, index=index, step=step, kind=kind, raw_name=kind, phase="backward",
                      start_us=start, end_us=end, issue_us=issue)


def test_drift_is_fitted_when_the_run_shows_it():
    # rank 1's clock runs 200 ppm fast and is 5 ms ahead; 40 collectives over 10 s, ±20 us jitter
    colls = []
    for k in range(40):
        t = 1e6 + k * 250_000.0
        jitter = (k * 37 % 7 - 3) * 6.0
        colls.append(_coll(0, k, t - 500, t))
        t1 = t + 5000 + 200e-6 * (t - 1e6) + jitter
        colls.append(_coll(1, k, t1 - 300, t1))
    rep = estimate(colls, [0, 1])
    rc = rep.of(1)
    assert rc.drift_ppm == pytest.approx(200, abs=10)
    expected = 5000 + 200e-6 * (rep.t0_us - 1e6)
    assert abs(rc.offset_us - expected) <= max(3 * rc.uncertainty_us, 5.0)
    # mapping back puts rank 1's ends on rank 0's
    assert to_reference(rep, 1, colls[21].end_us) == pytest.approx(colls[20].end_us, abs=40)


def test_no_drift_from_a_short_run():
    colls = [c for k in range(3) for c in (_coll(0, k, k * 1e3, k * 1e3 + 500),
                                            _coll(1, k, k * 1e3 + 100, k * 1e3 + 510))]
    assert estimate(colls, [0, 1]).of(1).drift_ppm == 0.0


def test_broadcast_and_p2p_do_not_vote():
    colls = [_coll(0, 0, 0, 100, kind="broadcast"), _coll(1, 0, 0, 5000, kind="broadcast")]
    assert estimate(colls, [0, 1]) is None


def test_a_lead_below_the_uncertainty_is_not_reported():
    clock = ClockReport(reference_rank=0, t0_us=0.0, method="collective-end",
                        ranks=[RankClock(0, 0.0), RankClock(1, 1000.0, uncertainty_us=50.0)])
    near = [_coll(0, 0, 0, 10, issue=100.0), _coll(1, 0, 0, 10, issue=1130.0)]    # 30 us apart once aligned
    far = [_coll(0, 0, 0, 10, issue=100.0), _coll(1, 0, 0, 10, issue=1400.0)]     # 300 us apart
    assert aligned_lead(near, clock, same_clock=False) is None
    assert aligned_lead(far, clock, same_clock=False) == pytest.approx(300.0)
    # no estimate and different hosts: no cross-rank timing at all
    assert aligned_lead(far, None, same_clock=False) is None


def test_pairs_that_are_not_one_collective_are_outvoted():
    # 5 pairs agree on an offset of 1000 us; 2 (another process group) would say 50 ms
    colls = []
    for k in range(7):
        t = k * 100_000.0
        wrong = k in (2, 5)
        colls.append(_coll(0, k, t, t + 2000))
        o = 50_000 if wrong else 1000
        colls.append(_coll(1, k, t + o + 500, t + o + 2000 + (k % 3) * 10))
    rc = estimate(colls, [0, 1]).of(1)
    assert rc.n_matched == 5
    assert abs(rc.offset_us - 1000) <= max(2 * rc.uncertainty_us, 20)


def test_no_majority_means_no_estimate_and_a_note():
    colls = []
    for k in range(4):
        t = k * 100_000.0
        o = 1000 if k < 2 else 60_000
        colls.append(_coll(0, k, t, t + 2000))
        colls.append(_coll(1, k, t + o + 500, t + o + 2000))
    rep = estimate(colls, [0, 1])
    assert rep.of(1) is None and any("rank 1" in n for n in rep.notes)
    # and cross-rank issue times are then not compared across hosts
    assert aligned_lead([colls[0], colls[1]], rep, same_clock=False) is None
