"""Real 2-rank torchrun jobs that hang: the watchdog dumps, the launcher ends the job, and
`fsdpdoctor hang` names the right rank, the collective and the frame, for every scenario of
reference_jobs/hang_scenarios.py (about 15-20 s each, mostly torch start-up)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import requires_torch
from fsdpdoctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "reference_jobs"))

from hang_scenarios import HANG_SCENARIOS  # noqa: E402
from test_hang import check_verdict  # noqa: E402

pytestmark = [requires_torch, pytest.mark.slow]


@pytest.mark.parametrize("scenario", sorted(HANG_SCENARIOS))
def test_hanging_job(scenario, tmp_path, capsys):
    from record_hangs import run_hang

    exp = HANG_SCENARIOS[scenario]["expected"]
    out = tmp_path / scenario
    for _attempt in range(2):  # a gloo job occasionally fails at start-up on a loaded machine
        res = run_hang(scenario, out, hang_timeout_s=3.0, deadline_s=150)
        if (out / "hang").is_dir():
            break
    assert (out / "hang").is_dir(), res["stderr"][-3000:]
    if HANG_SCENARIOS[scenario]["ends"] == "hang":
        assert res["killed"], "a hanging job ended by itself"
    assert main(["hang", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [r for r in doc["silent"] if r not in exp["silent"]], doc["silent"]

    from fsdpdoctor.commands.hang import build_report

    rep = build_report(str(out))
    check_verdict(rep, exp)
    # the frame is the job's own source file, with its line
    if exp["function"]:
        assert rep.verdicts[0].frame.file.endswith("hang_job.py")
    if scenario == "hang_loader":
        assert rep.trend is not None and rep.trend.lagging_was_straggler
