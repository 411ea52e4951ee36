"""The cross-rank reduce does work linear in ranks: the lines of fsdpdoctor's own code executed by
``analyze --json`` over a folder of rank summaries (the identity checks, the clock estimate, the
stragglers, the rules, the document) at 4x the ranks are at most ~4x those at 1x. Counted, not timed:
an all-pairs join (every rank's calls scanned per rank, a search of the rank clocks per call, every
pair of ranks' windows compared) makes the count grow faster: 6.6x at 24 -> 96 ranks before those
joins were indexed, 3.8x after."""

from __future__ import annotations

import sys

import msgspec
import pytest

from fsdpdoctor.analysis import rankresult
from fsdpdoctor.pipeline import open_analysis, rank_results

RANKS = 24   # large enough that an all-pairs join outweighs the per-run constant work


def _synth_module(repo_root):
    sys.path.insert(0, str(repo_root / "benchmarks"))
    try:
        import bench_ranks
    finally:
        sys.path.pop(0)
    return bench_ranks


def _lines_executed(fn) -> int:
    """Line events in fsdpdoctor's modules while ``fn`` runs."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def glob(frame, event, arg):
        return local if "fsdpdoctor" in frame.f_code.co_filename else None

    sys.settrace(glob)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


@pytest.fixture(scope="module")
def folders(traces_dir, repo_root, tmp_path_factory):
    synth = _synth_module(repo_root)
    _, results, _ = rank_results(traces_dir / "straggler", ranks=[0], use_summaries=False)
    src = msgspec.msgpack.decode(rankresult.encode(results[0]))
    assert len(src["collectives"]) >= 6
    root = tmp_path_factory.mktemp("ranks")
    out = {}
    for n in (RANKS, 4 * RANKS):
        synth.make_ranks(src, root / f"r{n}", n)
        out[n] = root / f"r{n}"
    return out


def test_reduce_work_is_linear_in_ranks(folders):
    docs = {}

    def run(n):
        def go():
            a = open_analysis(folders[n])
            docs[n] = a.to_json()
        return go

    small = _lines_executed(run(RANKS))
    large = _lines_executed(run(4 * RANKS))
    assert large / small <= 4.5, f"{small} lines at {RANKS} ranks, {large} at {4 * RANKS}"
    # the runs are real: every rank analysed, the late rank named as the straggler
    a = open_analysis(folders[4 * RANKS])
    assert len(a.ranks) == 4 * RANKS and a.straggler.straggler == 2 * RANKS
    assert a.clock is not None and len(a.clock.ranks) == 4 * RANKS
