"""The slowdown detector behind automatic windows (fsdpdoctor/capture/slowdown.py), on simulated step
series and on real runs recorded on a loaded machine (tests/data/auto_windows): no timing here (the
start latency of a real window is measured in benchmarks/bench_auto_windows.py)."""

import gzip
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest

from fsdpdoctor.capture.slowdown import (MAX_NEED, NEED, NOISE_PRIOR, TARGET, SlowdownRule, level_for, own_times,
                                         persistence, replay)
from fsdpdoctor.capture.windows import POLL_S, lead_steps

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "auto_windows"


def recorded(name: str) -> tuple[list[list[int]], list[list[int]]]:
    doc = json.loads(gzip.decompress((RECORDED / f"{name}.json.gz").read_bytes()))
    return [r["end_ns"] for r in doc["ranks"]], [r["cpu_wait_ns"] for r in doc["ranks"]]


def _bench():
    """benchmarks/bench_auto_windows.py: its healthy-series generator and its decision loop, one copy."""
    spec = importlib.util.spec_from_file_location("bench_auto_windows", ROOT / "benchmarks" / "bench_auto_windows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()


def healthy(seed: int, n: int = 2000, sigma: float = 0.15) -> list[float]:
    """A loaded machine's healthy steps: log-normal noise, a slow drift (+50 % over the run), one step
    in fifty a 1.5-4x hiccup (scheduler, GC), and now and then two or three slow steps in a row."""
    return BENCH.healthy(random.Random(seed), n, sigma, hiccups=0.02, bursts=0.004)


decisions = BENCH.decisions   # the steps at which the rule decided, fed as the coordinator feeds it


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


def test_the_level_lies_halfway_between_the_noise_and_2x():
    assert level_for(1.0) == pytest.approx(math.sqrt(2))
    assert level_for(1.5) == pytest.approx(math.sqrt(3)) and level_for(1.5) < TARGET
    assert level_for(1.0, min_rise=2.0) == 3.0   # min_rise stays the floor
    rnd = random.Random(7)
    rule = SlowdownRule()   # very noisy steps: the level rises with the noise but stays below 2x
    rule.feed(0, [0.05 * math.exp(rnd.gauss(0, 0.6)) for _ in range(150)])
    assert rule.level == pytest.approx(level_for(NOISE_PRIOR))
    rule.feed(150, [0.05 * math.exp(rnd.gauss(0, 0.1)) * (1.6 if 400 <= k < 420 else 1) for k in range(150, 900)])
    assert rule.sustained_noise() > 1.4 and rule.level > level_for(1.4) and rule.limit < TARGET * rule.median


def test_persistence_follows_the_noise():
    quiet = SlowdownRule()
    quiet.feed(0, [0.05] * 600)
    hiccups = SlowdownRule()  # a 3x step one in seven
    hiccups.feed(0, [0.15 if i % 7 == 0 else 0.05 for i in range(600)])
    assert quiet.need == NEED < hiccups.need <= MAX_NEED
    assert persistence(0.001, 1.0) == NEED and persistence(0.2, 3.0) == MAX_NEED


def test_a_whole_machine_load_spike_is_taken_out_and_a_lone_rank_is_not():
    # the same 2x longer steps: with the ranks waiting for a CPU for half of them (a load spike), the
    # own time does not change; with no CPU wait (one rank sleeps, the others wait for it) it doubles
    assert own_times([0.1, 0.1], 0.5) == [0.05, 0.05] and own_times([0.1], 0.0) == [0.1]
    assert own_times([0.1], 2.0)[0] > 0   # a glitch never takes out the whole step
    rnd = random.Random(3)
    healthy_steps = [0.05 * math.exp(rnd.gauss(0, 0.05)) for _ in range(400)]
    for share, opens in ((0.5, False), (0.0, True)):
        rule = SlowdownRule()
        rule.feed(0, healthy_steps, 0.0)
        found = [rule.feed(400 + k, [0.1], share) for k in range(40)]
        assert any(found) == opens, (share, found)


def test_a_real_healthy_run_on_a_loaded_machine_opens_no_window():
    # 2,000 steps of reference_jobs/drift.py on 2 ranks while six other engineers loaded the 2 cores:
    # whole steps 2.1x the median for 9 steps (step ~205); the CPU wait of the ranks accounts for it
    ends, waits = recorded("healthy")
    assert len(ends[0]) == 2000
    assert replay(ends, waits, POLL_S) == []
    assert replay(ends, None, POLL_S)   # judged on whole steps, the load spike opens one


def test_a_real_2x_lag_of_one_rank_is_decided_within_20_steps():
    # the same job and machine, rank 1 sleeping one healthy compute time more from step 300 (steps 2x)
    ends, waits = recorded("lag")
    found = replay(ends, waits, POLL_S)
    assert found and 300 <= found[0] < 320, found


def test_isolated_hiccups_open_nothing_and_a_change_names_itself():
    rnd, rule = random.Random(0), SlowdownRule()
    noisy = [0.05 * (1 + abs(rnd.gauss(0, 0.02))) if i % 7 else 0.15 for i in range(2000)]
    assert all(rule.feed(k, noisy[k:k + 10]) is None for k in range(0, 2000, 10))
    reason = None
    for k in range(2000, 2000 + 2 * MAX_NEED - 1):
        reason = reason or rule.feed(k, [0.15], 0.25)
    # the slow steps it names may begin with the hiccup before the change
    assert reason and "the step took 3.0x its median" in reason and f"{rule.need} slow steps decide" in reason
    assert "its own time (less the 25% the ranks waited for a CPU) 2.2x its median" in reason


def test_a_slow_baseline_does_not_delay_the_window():
    # the lead is counted in steps of the time they take now: 139 ms steps (13.9x of 10 ms) start the
    # window about a second after the decision, not 100 steps (14 s) later
    for step_s in (0.01, 0.05, 0.139, 0.3):
        assert lead_steps(step_s) * step_s <= 1.5 * POLL_S + 4 * step_s
    assert lead_steps(0.139) < 15
