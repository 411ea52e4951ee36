"""The slowdown detector behind automatic windows (fsdpdoctor/capture/slowdown.py), on simulated step
series: no timing here (the start latency of a real window is measured in benchmarks/bench_auto_windows.py)."""

import math
import random

import pytest

from fsdpdoctor.capture.slowdown import MAX_NEED, MIN_NEED, SlowdownRule, persistence
from fsdpdoctor.capture.windows import POLL_S, lead_steps


def healthy(seed: int, n: int = 2000, base: float = 0.05, sigma: float = 0.15, drift: float = 0.5) -> list[float]:
    """A loaded machine's healthy steps: log-normal noise, a slow drift (+50 % over the run), one step
    in fifty a 1.5-4x hiccup (scheduler, GC), and now and then two or three slow steps in a row."""
    rnd = random.Random(seed)
    out, burst = [], 0
    for i in range(n):
        d = base * (1 + drift * i / n) * math.exp(rnd.gauss(0, sigma))
        if rnd.random() < 0.02:
            d *= rnd.uniform(1.5, 4.0)
        if burst == 0 and rnd.random() < 0.004:
            burst = rnd.randint(2, 3)
        if burst:
            d *= rnd.uniform(1.3, 2.5)
            burst -= 1
        out.append(d)
    return out


def decisions(series: list[float], poll: int = 10) -> list[int]:
    """Steps at which the rule decided, fed as the coordinator feeds it (the steps since its last poll)."""
    rule, found = SlowdownRule(), []
    for k in range(0, len(series), poll):
        chunk = series[k:k + poll]
        for i in range(len(chunk)):  # one step at a time: the decision's step is exact
            if rule.feed(k + i, chunk[i:i + 1]):
                found.append(k + i)
                rule.reset()
    return found


@pytest.mark.parametrize("seed", range(3))
def test_no_window_in_2000_noisy_drifting_healthy_steps(seed):
    assert decisions(healthy(seed)) == []


@pytest.mark.parametrize("factor,sigma", [(2.0, 0.15), (2.0, 0.3), (2.6, 0.3)])
@pytest.mark.parametrize("seed", range(3))
def test_a_sustained_slowdown_of_one_rank_is_decided_within_20_steps(seed, factor, sigma):
    # rank 1 slows from step 700: every rank's step (they wait for it) takes factor x as long
    series = [d * (factor if i >= 700 else 1) for i, d in enumerate(healthy(100 + seed, 1000, sigma=sigma))]
    found = decisions(series)
    assert found and 700 <= found[0] < 720, found


def test_the_limit_stays_below_twice_the_median_however_noisy_the_baseline():
    rnd = random.Random(7)
    rule = SlowdownRule()
    rule.feed(0, [0.05 * math.exp(rnd.gauss(0, 0.6)) for _ in range(300)])
    assert rule.limit <= 1.5 * rule.median + 1e-12


def test_persistence_follows_the_noise():
    quiet = SlowdownRule()
    quiet.feed(0, [0.05] * 600)
    hiccups = SlowdownRule()  # a 3x step one in seven
    hiccups.feed(0, [0.15 if i % 7 == 0 else 0.05 for i in range(600)])
    assert quiet.need == MIN_NEED < hiccups.need <= MAX_NEED
    assert persistence(0.001, 1.0) == MIN_NEED and persistence(0.2, 3.0) == MAX_NEED


def test_isolated_hiccups_open_nothing_and_a_change_names_itself():
    rnd, rule = random.Random(0), SlowdownRule()
    noisy = [0.05 * (1 + abs(rnd.gauss(0, 0.02))) if i % 7 else 0.15 for i in range(2000)]
    assert all(rule.feed(k, noisy[k:k + 10]) is None for k in range(0, 2000, 10))
    reason = None
    for k in range(2000, 2000 + 2 * MAX_NEED - 1):
        reason = reason or rule.feed(k, [0.15])
    # the slow steps it names may begin with the hiccup before the change
    assert reason and "-20" in reason.split(":")[0] and "x the median of the 256 healthy steps" in reason


def test_a_slow_baseline_does_not_delay_the_window():
    # the lead is counted in steps of the time they take now: 139 ms steps (13.9x of 10 ms) start the
    # window about a second after the decision, not 100 steps (14 s) later
    for step_s in (0.01, 0.05, 0.139, 0.3):
        assert lead_steps(step_s) * step_s <= 1.5 * POLL_S + 4 * step_s
    assert lead_steps(0.139) < 15
