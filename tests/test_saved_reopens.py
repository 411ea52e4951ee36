"""Every bundled run's saved ``--json`` reopens as what it is: an analysis this program wrote.

A saved document is checked on reading (pipeline._read_saved: invariants.document_problems) for
figures no analysis of ours writes; a figure that is signed by definition but checked as a duration
(the straggler's per-step excess, below 0 in a step where the culprit was quicker) made the saved
analyses of ddp_one_bucket and scaling_2proc unreadable ("edited?")."""

from __future__ import annotations

import pytest

import fsdpdoctor
from fsdpdoctor.errors import InputError
from bundled import TRACES, shared_rank_steps

RUNS = sorted(p.parent for p in TRACES.glob("*/manifest.json")) if TRACES.is_dir() else []


@pytest.mark.skipif(not RUNS, reason="no bundled traces (traces/)")
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_saved_analysis_reopens_with_the_same_findings(run, tmp_path):
    with shared_rank_steps():
        try:
            a = fsdpdoctor.analyze(run)
        except InputError:
            pytest.skip("not an analysable run (a hang recording, a partial run)")
    saved = tmp_path / "a.json"
    saved.write_text(a.to_json())
    b = fsdpdoctor.analyze(saved)
    assert [(f.id, f.severity, f.ranks) for f in b.findings] == [(f.id, f.severity, f.ranks) for f in a.findings]
    if a.straggler is not None:
        assert b.straggler.extra_each_us == a.straggler.extra_each_us
