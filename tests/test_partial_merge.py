"""The cross-rank reduce as partial results that merge (analysis/partial.py): any grouping of a run's
ranks, reduced group by group and merged in any order, gives the `analyze --json` document of the
one-process reduce, byte for byte (hypothesis draws the groups and the merge order)."""

from __future__ import annotations

import importlib.util
import pickle
import random
from pathlib import Path

import msgspec
import pytest
from bundled import TRACES  # the committed traces, in a pristine copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpdoctor.analysis import invariants, rankresult
from fsdpdoctor.analysis import partial as partial_mod
from fsdpdoctor.analysis.map_reduce import reduce
from fsdpdoctor.diagnose import diagnose
from fsdpdoctor.pipeline import rank_results
from fsdpdoctor.report import json_report

REPO = Path(__file__).resolve().parents[1]
SYNTH_RANKS = 24   # three hosts of 8 ranks


def _copies(results: list[rankresult.RankResult]) -> list[rankresult.RankResult]:
    """Fresh results (the reduce writes onto the summaries it is given)."""
    return [rankresult.decode(rankresult.encode(r)) for r in results]


def _document(run, partial=None) -> bytes:
    source, manifest, results = run
    a = reduce(_copies(results), source=source, manifest=manifest, partial=partial)
    a.findings = diagnose(a)
    invariants.enforce(a)
    return json_report.document(a)


def _bench_ranks():
    spec = importlib.util.spec_from_file_location("bench_ranks", REPO / "benchmarks" / "bench_ranks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """(source, manifest, results) of three bundled runs and of 24 ranks synthesised from one real rank
    as benchmarks/bench_ranks.py makes them (clock offsets, jitter, a rank that arrives late)."""
    out = {}
    for name in ("straggler", "weak_4rank", "hsdp_token_skew"):
        manifest, results, _ = rank_results(TRACES / name)
        out[name] = (TRACES / name, manifest, results)
    _, (one, *_), _ = rank_results(TRACES / "straggler", ranks=[0])
    folder = tmp_path_factory.mktemp("synth")
    _bench_ranks().make_ranks(msgspec.msgpack.decode(rankresult.encode(one)), folder, SYNTH_RANKS)
    manifest, results, _ = rank_results(folder)
    assert len(results) == SYNTH_RANKS
    out["synthesised"] = (folder, manifest, results)
    return out


@pytest.fixture(scope="module")
def whole(runs) -> dict:
    """Each run's document from the one-process reduce."""
    return {name: _document(run) for name, run in runs.items()}


def _merged_in_random_tree(results, rng: random.Random) -> partial_mod.CrossRankPartial:
    """Split the ranks into random groups, reduce each alone, merge random pairs (either side first)
    until one partial is left."""
    ranks = list(results)
    rng.shuffle(ranks)
    cuts = sorted(rng.sample(range(1, len(ranks)), rng.randint(0, len(ranks) - 1))) if len(ranks) > 1 else []
    groups = [ranks[a:b] for a, b in zip([0, *cuts], [*cuts, len(ranks)])]
    # each group's partial as a worker sends it back (pickled), or as the reducing process builds it
    pool = [pickle.loads(pickle.dumps(partial_mod.of_results(g))) if rng.random() < 0.5
            else partial_mod.of_results(g, compact=False) for g in groups]
    while len(pool) > 1:
        a = pool.pop(rng.randrange(len(pool)))
        b = pool.pop(rng.randrange(len(pool)))
        pool.append(partial_mod.merge(a, b) if rng.random() < 0.5 else partial_mod.merge(b, a))
    return pool[0]


# hsdp_token_skew: a 2-D mesh (process groups smaller than the world), the straggler read per group
@pytest.mark.parametrize("name", ["straggler", "weak_4rank", "hsdp_token_skew", "synthesised"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_any_grouping_and_merge_order_gives_the_same_document(runs, whole, name, seed):
    results = runs[name][2]
    merged = _merged_in_random_tree(_copies(results), random.Random(seed))
    assert merged.ranks == sorted(r.rank for r in results)
    assert _document(runs[name], partial=merged) == whole[name]


def test_synthesised_run_names_the_late_rank(runs):
    """The merged reduce still finds what bench_ranks.py plants: the rank in the middle arrives late."""
    source, manifest, results = runs["synthesised"]
    a = reduce(_copies(results), source=source, manifest=manifest,
               partial=_merged_in_random_tree(_copies(results), random.Random(7)))
    assert a.straggler is not None and a.straggler.straggler == SYNTH_RANKS // 2
    assert a.clock is not None and len(a.clock.ranks) == SYNTH_RANKS


def test_a_rank_in_two_groups_is_refused(runs):
    _, _, results = runs["weak_4rank"]
    a = partial_mod.of_results(results[:3])
    b = partial_mod.of_results(results[2:])
    with pytest.raises(ValueError, match="rank 2 is in both"):
        partial_mod.merge(a, b)


def test_sums_do_not_depend_on_the_order_of_their_terms(runs):
    """The Collectives table from a merged partial: the same in either merge order, and its counts
    and bytes those of the calls themselves."""
    _, _, results = runs["weak_4rank"]
    ab = partial_mod.merge(partial_mod.of_results(results[:1]), partial_mod.of_results(results[1:]))
    ba = partial_mod.merge(partial_mod.of_results(results[1:]), partial_mod.of_results(results[:1]))
    assert ab.sums == ba.sums and ab.collective_stats(8) == ba.collective_stats(8)
    calls = [c for r in results for c in r.collectives]
    assert sum(s.count for s in ab.sums.values()) == len(calls)
    assert sum(s.size_bytes for s in ab.sums.values()) == sum(c.size_bytes or 0 for c in calls)
