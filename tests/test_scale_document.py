"""The ``--json`` document at many ranks (issue 32): a run whose per-rank detail fits the budget gets
today's document byte for byte; past it, the default document keeps the detail of the ranks the
findings name, says where the rest is (``--ranks-detail FILE`` writes the whole document, ``--ranks
all`` prints it), and its findings are the whole document's. A folder of summaries read on a Dask
cluster gives the same document. Sizes and counts, never times."""

from __future__ import annotations

import json
import sys

import msgspec
import pytest

from conftest import error_lines
from fsdpdoctor.analysis import rankresult
from fsdpdoctor.cli import main
from fsdpdoctor.pipeline import open_analysis, rank_results
from fsdpdoctor.report import json_report
from fsdpdoctor.results import Analysis

RANKS = 48


@pytest.fixture(scope="module")
def folder(traces_dir, repo_root, tmp_path_factory):
    """``RANKS`` summaries copied from the bundled straggler run's rank 0, one of them late."""
    sys.path.insert(0, str(repo_root / "benchmarks"))
    try:
        import bench_ranks
    finally:
        sys.path.pop(0)
    _, results, _ = rank_results(traces_dir / "straggler", ranks=[0], use_summaries=False)
    src = msgspec.msgpack.decode(rankresult.encode(results[0]))
    out = tmp_path_factory.mktemp("doc") / "ranks"
    bench_ranks.make_ranks(src, out, RANKS)
    return out


@pytest.fixture(scope="module")
def analysis(folder):
    return open_analysis(folder)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["analyze", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_within_the_budget_keeps_the_whole_document(analysis):
    assert json_report.rank_limit(analysis) >= RANKS   # a few MB hold far more than these ranks' detail
    assert json_report.document(analysis) == json_report.to_json(analysis).encode()


def test_past_the_budget_the_document_keeps_the_named_ranks(analysis, monkeypatch, tmp_path):
    whole = json.loads(json_report.to_json(analysis))
    one = len(json_report.document(analysis)) / RANKS            # about one rank's share of the whole
    monkeypatch.setattr(json_report, "DETAIL_BUDGET_BYTES", int(4 * one))
    limit = json_report.rank_limit(analysis)
    assert 1 <= limit < RANKS
    doc = json.loads(json_report.document(analysis))
    named = json_report.named_ranks(analysis)
    straggler = analysis.straggler.straggler
    assert straggler == RANKS // 2 and straggler in named
    shown = doc["rank_detail"]["ranks_shown"]
    assert shown == [r for r in named if r in {x.rank for x in analysis.ranks}][:limit]
    assert [r["rank"] for r in doc["ranks"]] == sorted(shown)
    assert {c["rank"] for c in doc["clock"]["ranks"]} <= set(shown)
    assert set(map(int, doc["straggler"]["wait_by_rank"])) <= set(shown)
    for rows in ("host_syncs", "dataloader", "setup", "gpu_idle", "recompute", "offload"):
        assert {x["rank"] for x in doc["signals"][rows]} <= set(shown)
    # what the reduce and the rules found is the whole document's
    for key in ("findings", "mean", "collectives", "straggler_verdict", "job"):
        if key == "straggler_verdict":
            assert {k: v for k, v in doc["straggler"].items() if k != "wait_by_rank"} == \
                   {k: v for k, v in whole["straggler"].items() if k != "wait_by_rank"}
        else:
            assert doc[key] == whole[key], key
    assert doc["rank_detail"]["ranks_total"] == RANKS and doc["rank_detail"]["file"] is None
    assert "--ranks-detail FILE" in doc["notes"][-1] and f"of {len(shown)} of {RANKS} ranks" in doc["notes"][-1]
    assert len(doc["ranks"]) * 3 < len(whole["ranks"])
    # a saved compact document reads back (the ranks it holds), with the note that says what is missing
    back = Analysis.from_json(json.dumps(doc))
    assert [r.rank for r in back.ranks] == sorted(shown) and back.findings == analysis.findings


def test_the_flags_write_and_print_the_whole_document(folder, analysis, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(json_report, "DETAIL_BUDGET_BYTES", 1)   # one rank at most
    whole = json.loads(json_report.to_json(analysis))
    detail = tmp_path / "all-ranks.json"
    code, out, _ = _cli(capsys, folder, "--json", "--ranks-detail", detail)
    assert code in (0, 1)
    doc = json.loads(out)
    assert len(doc["ranks"]) == 1 and doc["rank_detail"]["file"] == str(detail)
    assert f"written to {detail}" in doc["notes"][-1]
    assert json.loads(detail.read_bytes()) == whole                         # every rank, through msgspec
    assert len(Analysis.from_json(detail.read_bytes()).ranks) == RANKS      # and readable by analyze
    code, out, _ = _cli(capsys, folder, "--json", "--ranks", "all")
    assert out == json_report.to_json(analysis) + "\n"                      # today's document, byte for byte


def test_the_flags_need_json(folder, capsys):
    code, out, err = _cli(capsys, folder, "--ranks", "all")
    assert code == 2 and len(error_lines(err)) == 1 and "--json" in err and not out


def test_summaries_read_on_dask_give_the_same_document(folder, capsys, dask_address):
    code, plain, _ = _cli(capsys, folder, "--json")
    code_dask, on_dask, _ = _cli(capsys, folder, "--json", "--dask", dask_address)
    assert code == code_dask and on_dask == plain
