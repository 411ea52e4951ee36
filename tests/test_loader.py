"""Loading rank folders: parallel parsing gives the same tables, errors survive worker processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.loader import load_run

TRACES = Path(__file__).resolve().parents[1] / "traces"


def test_parallel_load_matches_serial():
    a = load_run(TRACES / "fsdp2_default", jobs=1)
    b = load_run(TRACES / "fsdp2_default", jobs=2)
    assert [r.rank for r in a.ranks] == [r.rank for r in b.ranks] == [0, 1]
    for x, y in zip(a.ranks, b.ranks):
        assert x.names == y.names
        for col in ("name_id", "cat", "ts", "dur", "track", "corr"):
            assert np.array_equal(getattr(x, col), getattr(y, col)), col
        assert x.args.keys() == y.args.keys()


def test_error_in_worker_is_an_input_error(tmp_path):
    shutil.copy(TRACES / "ddp_default" / "rank0.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError, match="rank1.json.gz"):
        load_run(tmp_path, jobs=2)


def test_rank_filter_skips_other_files():
    run = load_run(TRACES / "straggler", ranks=[1])
    assert [r.rank for r in run.ranks] == [1]
    with pytest.raises(InputError, match="no trace for rank"):
        load_run(TRACES / "straggler", ranks=[5])
