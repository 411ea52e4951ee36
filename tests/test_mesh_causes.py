"""A straggler through a 2-D mesh (FSDP2 HSDP on (2, 2)): calls matched within the process group each ran in
(analysis/groups.py), the culprit told from the ranks that are late only because they waited for it, and the
finding saying which groups wait where; the recorded reference job (reference_jobs/hsdp_tokens.py) with one
rank holding twice the tokens, and its balanced twin."""

from __future__ import annotations

import pytest

from bundled import TRACES  # the committed traces, in a pristine copy
from fsdpdoctor.analysis import groups, stragglers
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.results import Collective, RankSummary, StepBreakdown

needs = pytest.mark.skipif(not (TRACES / "hsdp_token_skew" / "rank0.json.gz").exists(), reason="traces/ absent")

# (2, 2) mesh as init_device_mesh names its groups: replicate {0, 2} "1", {1, 3} "2"; shard {0, 1} "3", {2, 3} "4"
GROUPS = {"0": [0, 1, 2, 3], "1": [0, 2], "2": [1, 3], "3": [0, 1], "4": [2, 3]}
SHARD = {0: "3", 1: "3", 2: "4", 3: "4"}
REPLICATE = {0: "1", 1: "2", 2: "1", 3: "2"}


def _rank(r: int, steps: int) -> RankSummary:
    # step times with some jitter (the noise estimate is not zero)
    bds = [StepBreakdown(rank=r, step=s, start_us=s * 1e6, duration_us=1e6 + 50.0 * (s % 2)) for s in range(steps)]
    return RankSummary(rank=r, file=f"rank{r}", dialect="cpu", steps=bds, mean=bds[0])


def _mesh_run(late: dict[int, dict[str, float]], steps: int = 4) -> tuple[list[Collective], list[RankSummary]]:
    """Per step an all-gather in the shard groups then an all-reduce in the replicate groups; ``late``: the
    wait of each rank in each (its duration past 1 ms)."""
    colls = []
    for r in range(4):
        for st in range(steps):
            for k, (kind, pg) in enumerate((("all_gather", SHARD[r]), ("all_reduce", REPLICATE[r]))):
                t0 = st * 1e6 + k * 2e5
                colls.append(Collective(rank=r, index=2 * st + k, step=st, kind=kind, raw_name=kind, phase="backward",
                                        start_us=t0, end_us=t0 + 1e3 + late[r][kind] + st * 10.0, process_group=pg))
    return colls, [_rank(r, steps) for r in range(4)]


def test_named_groups_find_the_rank_the_others_wait_for_not_its_peers():
    # rank 1 computes 200 ms longer: its shard peer 0 waits 200 ms at the all-gather, its replicate peer 3
    # at the all-reduce; rank 3, late by that wait, then makes its shard peer 2 wait (transitively) at the
    # next all-gather; rank 0 makes rank 2 wait at the all-reduce. Ranks 0 and 3 each cause about what they
    # waited, rank 1 causes and never waits.
    late = {0: {"all_gather": 200e3, "all_reduce": 0.0}, 1: {"all_gather": 0.0, "all_reduce": 0.0},
            2: {"all_gather": 190e3, "all_reduce": 195e3}, 3: {"all_gather": 0.0, "all_reduce": 200e3}}
    colls, ranks = _mesh_run(late)
    rep = stragglers.analyze(colls, ranks, same_clock=False, sub_groups=True, group_ranks=GROUPS)
    assert rep.method == "wait per process group" and rep.straggler == 1 and rep.steps_last == 4
    assert {tuple(g["ranks"]): g["kinds"] for g in rep.culprit_groups} == {(0, 1): ["all_gather"],
                                                                          (1, 3): ["all_reduce"]}
    assert rep.far_ranks == [2] and rep.groups_note is None
    assert rep.wait_us == pytest.approx(200e3, rel=1e-3)       # the longest wait in one call
    assert rep.saving_us == pytest.approx(200e3, rel=1e-3)     # the least of the others' waits over the step


def test_without_named_groups_the_report_says_what_it_could_not_tell():
    late = {0: {"all_gather": 150e3, "all_reduce": 0.0}, 1: {"all_gather": 0.0, "all_reduce": 0.0},
            2: {"all_gather": 0.0, "all_reduce": 148e3}, 3: {"all_gather": 0.0, "all_reduce": 150e3}}
    colls, ranks = _mesh_run(late)
    for c in colls:
        c.process_group = None
    rep = stragglers.analyze(colls, ranks, same_clock=False, sub_groups=True, group_ranks=GROUPS)
    assert rep.straggler == 1 and rep.method.startswith("wait") and rep.method != "wait per process group"
    assert rep.culprit_groups == [] and "which process group" in rep.groups_note


def test_hsdp_roles_from_the_descriptions_or_the_order_of_creation():
    info = {"pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
                          {"pg_name": "2", "pg_desc": "mesh_replicate", "pg_size": 2, "ranks": [1, 3]},
                          {"pg_name": "3", "pg_desc": "mesh_shard", "pg_size": 2, "ranks": [0, 1]}]}
    assert groups.hsdp_roles(info, 4) == {"replicate": "2", "shard": "3"}
    assert groups.pg_ranks(info) == {"0": [0, 1, 2, 3], "2": [1, 3], "3": [0, 1]}
    for p in info["pg_config"][1:]:
        p["pg_desc"] = "undefined"
    assert groups.hsdp_roles(info, 4) == {"replicate": "2", "shard": "3"}   # dims created first to last
    assert groups.hsdp_roles(info, 8) == {}                                  # not a 2-D mesh of this world
    c = Collective(rank=1, index=0, step=0, kind="reduce_scatter", raw_name="rs", phase="backward", start_us=0.0,
                   end_us=1.0, issuer="fsdp")
    mine = Collective(rank=1, index=1, step=0, kind="all_reduce", raw_name="ar", phase="other", start_us=2.0,
                      end_us=3.0, issuer="user code train.py(3): log")
    groups.annotate([c, mine], groups.hsdp_roles(info, 4))
    assert c.process_group == "3" and mine.process_group is None   # only FSDP2's own calls are placed


@needs
def test_hsdp_token_skew_is_a_straggler_with_more_work_read_through_its_groups():
    a = open_analysis(TRACES / "hsdp_token_skew")
    f = next(f for f in a.findings if f.id == "straggler")
    assert f.ranks == [1] and "(more work)" in f.title and f.severity in ("warning", "error")
    assert "token" in f.fix and "same work" not in f.summary
    assert "group [0, 1]" in f.summary and "group [1, 3]" in f.summary and "Rank 2 shares no group" in f.summary
    s = a.straggler
    assert s.method == "wait per process group" and s.far_ranks == [2]
    ratio = float(s.cause_evidence.split(" hold ")[1].split("x")[0])
    assert 1.8 <= ratio <= 2.2   # the job gives rank 1 twice the tokens


@needs
def test_hsdp_balanced_has_no_straggler_finding():
    a = open_analysis(TRACES / "hsdp_balanced")
    assert "straggler" not in {f.id for f in a.findings}
    assert a.straggler is None or a.straggler.cause != "more work"


def test_more_work_that_explains_less_than_half_is_not_called_the_same_work():
    # rank 1's steps hold twice the input elements but it computes 5x as long (its cores shared): the excess
    # explains less than half of the extra compute, yet its steps do not hold the same work
    from fsdpdoctor.analysis.rankresult import WorkCounts
    from fsdpdoctor.diagnose.host_rules import HOLDS_MORE
    from fsdpdoctor.results import StragglerReport

    def rank(r: int, compute_us: float) -> RankSummary:
        b = StepBreakdown(rank=r, step=0, start_us=0.0, duration_us=1e6, compute_us=compute_us)
        return RankSummary(rank=r, file="", dialect="cpu", steps=[b], mean=b)

    rep = StragglerReport(method="wait", straggler=1, spread_frac=0.3, last_fraction=1.0, wait_us=3e5)
    work = {0: WorkCounts(ops=100, input_elems=1000.0), 1: WorkCounts(ops=100, input_elems=2000.0)}
    stragglers.attribute_cause(rep, [rank(0, 1e5), rank(1, 5e5)], work)
    assert rep.cause == "compute" and "same work" not in rep.cause_evidence
    assert "hold 2.0x the input elements" in rep.cause_evidence and HOLDS_MORE in rep.cause_evidence
    same = StragglerReport(method="wait", straggler=1, spread_frac=0.3, last_fraction=1.0, wait_us=3e5)
    stragglers.attribute_cause(same, [rank(0, 1e5), rank(1, 5e5)], {0: work[0], 1: work[0]})
    assert "the same work as theirs" in same.cause_evidence
