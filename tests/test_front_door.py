"""One front door (``pipeline.open_analysis``): a saved ``--json`` opens wherever a trace does (analyze,
check, diff, export, tui, the notebook), it reads back to the same document, the tables come from the
same pipeline as the analysis, and the invariants are checked once per trace analysis."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

import fsdpdoctor
from fsdpdoctor import pipeline
from fsdpdoctor.cli import main
from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES  # the committed traces, in a pristine copy



def _cli(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([*argv, "--no-progress"] if argv[0] in ("analyze", "check", "export") else list(argv))
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, str]:
    """traces/straggler's ``analyze --json`` written to a file, and the document itself."""
    rc, doc = _cli("analyze", str(TRACES / "straggler"), "--json")
    assert rc == 0
    path = tmp_path_factory.mktemp("saved") / "straggler.json"
    path.write_text(doc)
    return path, doc


@pytest.mark.parametrize("run", ["straggler", "ddp_default", "cuda/fsdp2_default"])
def test_a_saved_json_reads_back_to_the_same_document(run, tmp_path):
    rc, doc = _cli("analyze", str(TRACES / run), "--json")
    assert rc == 0
    saved = tmp_path / "a.json"
    saved.write_text(doc)
    rc, again = _cli("analyze", str(saved), "--json")
    assert rc == 0
    assert again == doc


def test_analyze_and_check_accept_a_saved_json(saved):
    path, doc = saved
    rc, text = _cli("analyze", str(path))
    assert rc == 0 and "Rank 1 is a straggler" in text
    rc, text = _cli("check", str(path), "--json")
    got = json.loads(text)
    assert rc == 1 and got["passed"] is False and "straggler" in got["failing"]   # the saved findings gate
    rc, text = _cli("check", str(path), "--baseline", str(path), "--json")
    assert json.loads(text)["baseline"]["regressed"] is False                    # same run: no regression


def test_diff_and_export_accept_a_saved_json(saved, tmp_path):
    path, _ = saved
    rc, text = _cli("diff", str(path), str(TRACES / "straggler"), "--json")
    assert rc == 0 and json.loads(text)["regressed"] is False
    out = tmp_path / "p.json"
    rc, text = _cli("export", str(path), "--perfetto", str(out))
    assert rc == 0 and out.is_file() and "2 rank(s)" in text


def test_the_notebook_and_the_selection_on_a_saved_json(saved):
    path, doc = saved
    a = fsdpdoctor.analyze(path)
    assert a.to_json() == open_analysis(TRACES / "straggler").to_json()
    one = open_analysis(path, ranks=[1], steps={3, 4})
    assert [r.rank for r in one.ranks] == [1] and [s.step for s in one.ranks[0].steps] == [3, 4]


def test_the_tui_opens_a_saved_json(saved):
    pytest.importorskip("textual")
    import asyncio

    from fsdpdoctor.tui.app import FsdpDoctorApp

    async def go():
        app = FsdpDoctorApp(saved[0])
        async with app.run_test(size=(80, 24)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            return app.error, app.analysis

    error, a = asyncio.run(go())
    assert error is None and [r.rank for r in a.ranks] == [0, 1]


def test_tables_come_from_the_same_pipeline(saved):
    """export's tables: every rank read (no summaries), in rank order, beside the same analysis."""
    a, tables = open_analysis(TRACES / "straggler", tables=True, workers=2)
    assert [t.rank for t in tables] == [r.rank for r in a.ranks] == [0, 1]
    assert all(t.n_events > 0 for t in tables)
    assert a.to_json() == open_analysis(TRACES / "straggler", workers=1, use_summaries=False).to_json()
    b, none = open_analysis(saved[0], tables=True)    # a saved JSON has no tables
    assert none == [] and b.to_json() == a.to_json()


def test_the_invariants_hold_on_every_trace_analysis(monkeypatch, saved):
    """The front door checks the reduced, diagnosed job once (analysis/invariants.py), whatever opens it."""
    seen = []
    real = pipeline.invariants.enforce

    def spy(a):
        seen.append((a.source, len(a.findings)))
        return real(a)

    monkeypatch.setattr(pipeline.invariants, "enforce", spy)
    a = open_analysis(TRACES / "straggler", workers=1)
    assert seen == [(str(TRACES / "straggler"), len(a.findings))] and a.findings
    rc, _ = _cli("analyze", str(TRACES / "ddp_default"), "--json")
    assert rc == 0 and len(seen) == 2                 # the verbs come through the same door
