"""`analyze --compare-hta` against the installed HTA (traceinsight, HTA's current release).

HTA is an optional extra for users (`pip install 'fsdpdoctor[hta]'`) and a test dependency (`[test]`
installs traceinsight); the comparisons on public traces skip only where those traces are absent. The overlap figures they compare are
also pinned, HTA-free, in tests/test_public_traces.py::test_overlap_within_3pp_of_hta.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("hta", reason="needs the [hta] extra (traceinsight)")

import fsdpdoctor  # noqa: E402
from fsdpdoctor.report import hta_compare as hc  # noqa: E402
from shared_data import PUBLIC  # noqa: E402

_HERE = Path(__file__).resolve()
# GPU traces with NCCL kernels and compute kernels on each rank
NAMES = ["ddp_a100_rank0", "v100_trace_diff_test", "recsys_2_of_128_ranks"]


def folder(name: str) -> Path:
    if PUBLIC is None or not (PUBLIC / name).is_dir():
        pytest.skip(f"public trace {name} is absent")
    return PUBLIC / name


@pytest.mark.parametrize("name", NAMES)
def test_overlap_within_3pp_of_installed_hta(name):
    path = folder(name)
    a = fsdpdoctor.analyze(path)
    files = hc._trace_files(path)
    base = hc.run_hta(files)  # HTA's own run is most of this test's time: once per setting
    rows = hc.comparison_rows(path, a, base)
    assert rows
    for row in rows:
        assert row["hta"] is not None, row
        # on the steps HTA looks at, the two definitions agree (docs/overlap-vs-hta.md)
        assert row["ours_hta_steps"] == pytest.approx(row["hta"], abs=3.0), row
    if hc.supports_last_step():
        # HTA >= 0.6 can keep the last step: then it measures what our headline figure measures
        rows = hc.comparison_rows(path, a, base, hc.run_hta(files, include_last_step=True))
        for row in rows:
            assert row["ours"] == pytest.approx(row["hta_all"], abs=3.0), row


def test_release_is_reported():
    rel = hc.hta_release()
    assert rel is not None and rel[0] in ("traceinsight", "HolisticTraceAnalysis")
