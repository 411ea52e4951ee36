"""A mixture-of-experts job (reference_jobs/moe.py): tokens go to their expert's rank and back with
all_to_all, the dense layers under DDP. Balanced routing is healthy; a router that sends rank 1's
expert 3x the tokens of rank 0's makes rank 1 a straggler of more work, and the others wait for it
in the exchange that brings the tokens back."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from conftest import requires_torch
from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
needs = pytest.mark.skipif(not (TRACES / "moe_routing_skew" / "rank0.json.gz").exists(), reason="traces/ absent")

# per step the job exchanges token counts, dispatches and combines in the forward, and sends the
# gradients of combine and dispatch back in the backward; DDP's dense gradients fit one bucket
A2A_PER_STEP = {"forward": 3, "backward": 2}


def _events_by_rank_step(a) -> dict:
    by = defaultdict(list)
    for c in a.collective_events:
        by[(c.rank, c.step)].append(c)
    return by


def _dispatch_ratio(a, slow: int) -> float:
    """Elements the slow rank receives in the dispatch (the second forward all-to-all of a step, after the
    token counts) over what the others receive: the routing's skew, read from the trace."""
    got = defaultdict(float)
    for (rank, _), cs in _events_by_rank_step(a).items():
        forward = [c for c in cs if c.kind == "all_to_all" and c.phase == "forward"]
        got[rank] += forward[1].size_bytes
    others = [v for r, v in got.items() if r != slow]
    return got[slow] / (sum(others) / len(others))


@needs
@pytest.mark.parametrize("run", ["moe_balanced", "moe_routing_skew"])
def test_all_to_all_is_communication_of_its_own_kind(run):
    a = open_analysis(TRACES / run, diagnose=False)
    by = _events_by_rank_step(a)
    assert by and all(s is not None for (_, s) in by)
    for (rank, step), cs in by.items():
        kinds = Counter((c.kind, c.phase) for c in cs)
        assert kinds == {("all_to_all", "forward"): 3, ("all_to_all", "backward"): 2,
                         ("all_reduce", "backward"): 1}, (rank, step, kinds)
        # the first exchange of a step is the token counts: one int64 per rank (the host op names it "long int")
        counts = cs[0]
        assert counts.kind == "all_to_all" and counts.dtype == "long int" and counts.size_bytes == 8 * a.job.world_size
    rows = {(r.kind, r.phase): r for r in a.collectives}
    assert set(rows) == {("all_to_all", "forward"), ("all_to_all", "backward"), ("all_reduce", "backward")}
    for phase, n in A2A_PER_STEP.items():
        assert rows[("all_to_all", phase)].per_step == pytest.approx(n)
    # the step breakdown and the table agree: all_to_all's exposed time is in the step's exposed comm
    m = a.mean
    a2a = m.comm_by_kind["all_to_all"]
    table = sum(r.exposed_per_step_us for (k, _), r in rows.items() if k == "all_to_all")
    assert a2a.exposed_us == pytest.approx(table, rel=0.02)
    assert a2a.exposed_us <= m.exposed_comm_us + 1e-6
    assert m.exposed_comm_us == pytest.approx(sum(r.exposed_per_step_us for r in rows.values()), rel=0.02)


@needs
def test_balanced_routing_is_healthy():
    a = open_analysis(TRACES / "moe_balanced")
    assert not [f for f in a.findings if f.severity in ("error", "warning")], [(f.id, f.title) for f in a.findings]
    assert 0.9 < _dispatch_ratio(a, 1) < 1.1


@needs
def test_routing_skew_is_a_straggler_of_more_work():
    a = open_analysis(TRACES / "moe_routing_skew")
    check_routing_skew(a, json.loads((TRACES / "moe_routing_skew" / "manifest.json").read_text()))


def check_routing_skew(a, manifest: dict) -> None:
    p = manifest["scenario"]["params"]
    slow, skew = p["slow_rank"], p["expert_skew"]
    # the router's skew is in the trace: the slow rank receives `skew` times the tokens (the bias that
    # steers the routing keeps each step within a few percent of its target)
    assert skew * 0.9 < _dispatch_ratio(a, slow) < skew * 1.1
    s = a.straggler
    # the slow rank is the one waited for in most steps; on a loaded host one step may go to the other
    # rank (seen in a fresh-clone CI run: the first profiled step, 3 of 4), which the report then says
    assert s.straggler == slow and s.cause == "more work" and s.steps_last > s.steps_total / 2
    f = next((f for f in a.findings if f.id == "straggler"), None)
    # balancing brings the step to the balanced time, half the excess at two ranks (issue 28): a warning,
    # unless the recording says the host's cores were so contended that the moved half would run at least
    # half as fast beside the other rank (k = alone / beside speed >= N - its saving E (1 - k/N) shrinks
    # towards nothing, and the finding with it: seen once in a fresh-clone CI run), or unless its own steps
    # spread too much for 4 of them to clear the warning band: then it says how many more would decide it
    # (diagnose/noise.py; seen in a quiet fresh-clone CI run: 52.9 ms at info, cores at k = 1.498)
    contended = bool(s.alone_speed and s.beside_speed and s.alone_speed / s.beside_speed >= 1.5)
    undecided = f is not None and f.impact_us > 0 and "would decide it" in f.summary
    if f is None or f.severity not in ("warning", "error"):
        assert contended or undecided, (s.alone_speed, s.beside_speed, f and (f.severity, f.impact_us, f.summary))
    else:
        assert f.ranks == [slow] and "(more work)" in f.title
    assert s.exchange_kind == "all_to_all" and skew * 0.9 < s.exchange_ratio < skew * 1.1
    waiter = next(r for r in a.ranks if r.rank != slow)
    # the others wait in the exchange: never longer than they spend in all-to-alls, and at least the
    # largest part of the slow rank's extra compute (its expert's backward is two thirds of it; 0.58-0.64
    # of it in five quiet runs here). Where the recording shows the cores contended (k = alone / beside
    # speed >= 1.5), the slow rank's compute is timed partly beside the waiter, slower by up to k, and the
    # extra it shows is inflated by up to k (seen in a quiet fresh-clone CI run beside another torchrun job:
    # wait 98 ms, extra 203 ms, k = 1.75)
    k = s.alone_speed / s.beside_speed if contended else 1.0
    assert s.wait_us <= waiter.mean.comm_by_kind["all_to_all"].exposed_us
    assert s.wait_us >= 0.5 * s.extra_us / k, (s.wait_us, s.extra_us, k)


@requires_torch
@pytest.mark.slow
def test_a_fresh_routing_skew_run_names_its_straggler(tmp_path, monkeypatch):
    """Record moe_routing_skew with torchrun (2 ranks, gloo) and judge it as the bundled run is judged:
    every bound comes from the trace (received tokens, the waiter's all-to-all time, the slow rank's
    extra compute), none from how fast this machine is."""
    from fsdpdoctor.cli import main

    monkeypatch.setenv("FSDPDOCTOR_NO_SUMMARY", "1")  # no background summary process beside the ranks

    out = tmp_path / "run"
    for _attempt in range(2):  # gloo jobs occasionally abort at exit (see test_capture.torchrun)
        rc = main(["reference", "run", "moe_routing_skew", "--nproc", "2", "--out", str(out),
                   "--wait", "1", "--warmup", "1", "--active", "4"])
        if rc == 0:
            break
    assert rc == 0
    a = open_analysis(out)
    check_routing_skew(a, json.loads((out / "manifest.json").read_text()))


def _calls(sizes_by_rank: dict[int, list[int]], kind: str, steps: int = 4):
    from synthetic import collectives

    out = []
    for rank, sizes in sizes_by_rank.items():
        for k, size in enumerate(sizes):
            for c in collectives(1, steps, kind, "forward", size_bytes=size):
                c.rank, c.index = rank, k
                out.append(c)
    return out


def test_an_uneven_exchange_is_found_by_its_sizes_alone():
    """The exchange that hands a rank its extra work is read from the matched calls' sizes: gradient
    collectives are the same size everywhere, uneven all_to_all splits are not; the call's kind is not
    what decides."""
    from fsdpdoctor.analysis.stragglers import uneven_exchange

    assert uneven_exchange(_calls({0: [4096, 4096], 1: [4096, 4096]}, "all_reduce"), 1) is None
    # rank 1 receives 3x in the first call of every step, the second call is even
    kind, ratio = uneven_exchange(_calls({0: [1000, 2048], 1: [3000, 2048]}, "all_to_all"), 1)
    assert kind == "all_to_all" and ratio == pytest.approx(3.0)
    # the rank that gets less is handed nothing extra
    assert uneven_exchange(_calls({0: [1000, 2048], 1: [3000, 2048]}, "all_to_all"), 0) is None
    # the same skew, whatever the kind is called: sizes decide
    assert uneven_exchange(_calls({0: [1000], 1: [3000]}, "other"), 1) == ("other", pytest.approx(3.0))


@needs
def test_the_routing_skew_names_the_exchange_not_the_batches():
    """More work that arrives through the all_to_all is fixed in the routing, not by batching by length
    (seq_length_skew's more work comes from its own batches and keeps that fix)."""
    a = open_analysis(TRACES / "moe_routing_skew")
    s, f = a.straggler, next(f for f in a.findings if f.id == "straggler")
    assert s.exchange_kind == "all_to_all" and 2.7 < s.exchange_ratio < 3.3
    assert "all_to_all calls hand it" in f.fix and "load-balancing" in f.fix and "length" not in f.fix
    seq = open_analysis(TRACES / "seq_length_skew").straggler
    assert seq.cause == "more work" and seq.exchange_kind is None
