"""docs/scorecard.md is what the rules give on the bundled recordings today (no stale figure): the page
`python reference_jobs/scorecard.py --write docs/scorecard.md` writes, compared whole."""

from __future__ import annotations

import sys
from pathlib import Path

from bundled import TRACES

ROOT = Path(__file__).resolve().parents[1]


def test_scorecard_page_is_current(capsys):
    sys.path.insert(0, str(ROOT / "reference_jobs"))
    import scorecard

    class Args:
        traces = str(TRACES)

    code = scorecard._print(Args())
    tables = capsys.readouterr().out
    assert code == 0, tables   # every rule right on every scenario
    page = (ROOT / "docs" / "scorecard.md").read_text()
    assert page == scorecard.page(tables), "stale: python reference_jobs/scorecard.py --write docs/scorecard.md"
