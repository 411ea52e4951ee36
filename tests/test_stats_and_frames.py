"""Small helpers the per-rank analysis leans on: order statistics without numpy.ma, float membership,
and which frames are the user's (installed packages, found by listing site-packages)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from fsdpdoctor.analysis import context
from fsdpdoctor.analysis.stats import median, member
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

finite = st.floats(-1e12, 1e12, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=60))
def test_median_is_numpys(values):
    assert median(values) == float(np.median(values))


def test_median_of_nothing_or_nan_is_nan():
    assert math.isnan(median([])) and math.isnan(median([1.0, float("nan"), 2.0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40).map(float), max_size=50), st.lists(st.integers(0, 40).map(float), max_size=20))
def test_member_is_isin(values, test):
    v = np.asarray(values, dtype=float)
    assert np.array_equal(member(v, np.asarray(test, dtype=float)), np.isin(v, test))


def test_the_analysis_never_imports_numpy_ma():
    # np.median / np.unique / float np.isin import numpy.ma on first use: 15-25 ms of every process
    runs = ["traces/cuda/fsdp2_default", "traces/straggler"]
    public = Path(context.__file__).resolve().parents[2].parent / "shared" / "traces-public"
    # a public GPU trace takes paths the recordings here do not (kernels launched in record_param_comms)
    runs += [str(p) for p in (public / "v100_trace_diff_test", public / "ddp_a100_rank0") if p.is_dir()]
    code = ("import sys; from fsdpdoctor.pipeline import open_analysis; "
            + "".join(f"open_analysis({r!r}, use_summaries=False); " for r in runs)
            + "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=context.__file__.rsplit("/fsdpdoctor/", 1)[0])
    assert out.stdout.strip() == "False"


def test_what_is_installed_here_does_not_decide_what_is_user_code(tmp_path, monkeypatch):
    """The verdict is the frame's path and the list of known libraries: a package installed where the
    analysis runs (or not) changes nothing (issue 46: without torchmetrics installed, host-sync blamed
    torchmetrics/aggregation.py as the user's line)."""
    frames = ["somelib/core.py(3): run", "torchmetrics/aggregation.py(77): update", "myproj/model.py(12): forward",
              "lightning_utilities/core/apply_func.py(40): apply", "train.py(96): step",
              "/usr/lib/python3.11/site-packages/somelib/core.py(3): run", "threading.py(320): wait"]
    seen = [context.is_user_frame(f) for f in frames]
    site = tmp_path / "site-packages"
    (site / "somelib").mkdir(parents=True)
    (site / "myproj").mkdir()
    monkeypatch.setattr(sys, "path", [str(site)])
    assert [context.is_user_frame(f) for f in frames] == seen == [True, False, True, False, True, False, False]


def _enclosing_by_test(ctx, rows, track, t):
    """The definition: of the rows on ``track`` holding ``t``, the latest-starting, first in ``rows``."""
    sel = rows[(ctx.t.track[rows] == track) & (ctx.t.ts[rows] <= t) & (ctx.end[rows] >= t)]
    return int(sel[np.argmax(ctx.t.ts[sel])]) if len(sel) else None


def test_enclosing_by_its_index_is_the_definition():
    """The per-track index of a large row set answers exactly as a test of every row, on a real trace
    with Python stacks (nested frames, ops on several threads) and at row starts and ends."""

    from fsdpdoctor.analysis.context import RankContext
    from fsdpdoctor.analysis.dialects import detect
    from fsdpdoctor.trace.loader import load_file
    from fsdpdoctor.trace.table import CPU_OP, PYFUNC

    t = load_file(BUNDLED / "straggler" / "rank1.json.gz")
    ctx = RankContext(t, detect(t))
    rng = np.random.default_rng(3)
    frames = t.rows_named(lambda n: True, cat=PYFUNC)           # sorted by start
    ops = np.nonzero(np.isin(t.cat, (CPU_OP, PYFUNC)))[0]        # in file order, many equal starts
    assert len(frames) > 1000 and len(ops) > 1000
    for rows in (frames, ops, rng.permutation(ops)):
        times = np.concatenate([t.ts[rows], ctx.end[rows], rng.uniform(t.ts.min(), ctx.end.max(), 300)])
        for q in rng.choice(len(times), 600):
            r = int(rows[q % len(rows)])
            track = int(t.track[r]) if q % 5 else int(rng.integers(0, len(t.tracks) + 1))
            assert ctx.enclosing(rows, track, float(times[q])) == _enclosing_by_test(ctx, rows, track, float(times[q]))


def test_enclosing_by_its_index_breaks_ties_as_the_definition(tmp_path):
    """Many rows starting at the same instant on the same thread (coarse clocks do that)."""
    import json

    from fsdpdoctor.analysis.context import RankContext
    from fsdpdoctor.analysis.dialects import detect
    from fsdpdoctor.trace.loader import load_file

    rng = np.random.default_rng(5)
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 9}", "pid": 1, "tid": int(rng.integers(1, 3)),
           "ts": float(rng.integers(0, 40)), "dur": float(rng.integers(0, 15)), "args": {}} for i in range(600)]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = load_file(p)
    ctx = RankContext(t, detect(t))
    ordered = np.arange(len(t.ts))
    for rows in (ordered, rng.permutation(ordered)):
        for track in range(len(t.tracks) + 1):
            for q in np.arange(-1.0, 56.0, 0.5):
                assert ctx.enclosing(rows, track, float(q)) == _enclosing_by_test(ctx, rows, track, float(q))


def test_rows_of_names_by_index_or_by_test_are_the_definition():
    """Rows of a few names come from the per-name index, of many names from a test of every row:
    both are the rows with those names (and categories), sorted by start, ties in file order."""

    from fsdpdoctor.trace.loader import load_file
    from fsdpdoctor.trace.table import CPU_OP, PYFUNC

    t = load_file(BUNDLED / "straggler" / "rank1.json.gz")
    rng = np.random.default_rng(7)
    for size in (1, 3, 40, 64, 65, 300):
        for cat in (None, CPU_OP, (CPU_OP, PYFUNC)):
            ids = rng.choice(len(t.names), size, replace=False).astype(np.int32)
            mask = np.isin(t.name_id, ids)
            if cat is not None:
                mask &= np.isin(t.cat, np.atleast_1d(np.asarray(cat, dtype=np.int8)))
            rows = np.nonzero(mask)[0]
            want = rows[np.argsort(t.ts[rows], kind="stable")]
            assert np.array_equal(t._rows_of_ids(ids, cat), want), (size, cat)


def test_known_t_quantiles_are_the_computed_ones():
    """diagnose.stats keeps the quantiles of the default levels as numbers: they must be what the
    bisection computes (the same float here; another CPU's pow may differ in the last bit), for an int
    and an integral float df alike."""
    from fsdpdoctor.diagnose import stats

    for p, known in stats._KNOWN.items():
        for df, q in enumerate(known, start=1):
            stats.t_quantile.cache_clear()
            saved, stats._KNOWN = stats._KNOWN, {}
            try:
                computed = stats.t_quantile(p, df)
            finally:
                stats._KNOWN = saved
            stats.t_quantile.cache_clear()
            assert math.isclose(q, computed, rel_tol=1e-12) and q == stats.t_quantile(p, float(df)), (p, df)
    stats.t_quantile.cache_clear()
    assert stats.t_quantile(0.5 + 0.90 / 2, 7) == stats._KNOWN[0.95][6]
