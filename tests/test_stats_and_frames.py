"""Small helpers the per-rank analysis leans on: order statistics without numpy.ma, float membership,
and which frames are the user's (installed packages, found by listing site-packages)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
from hypothesis import given, settings, strategies as st

from fsdpdoctor.analysis import context
from fsdpdoctor.analysis.stats import median, member

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
    code = ("import sys; from fsdpdoctor.session import analyze_path; "
            "analyze_path('traces/cuda/fsdp2_default', use_summaries=False); "
            "analyze_path('traces/straggler', use_summaries=False); print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=context.__file__.rsplit("/fsdpdoctor/", 1)[0])
    assert out.stdout.strip() == "False"


def test_installed_packages_are_libraries_and_editable_projects_are_not(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "somelib").mkdir(parents=True)
    (site / "somelib-1.0.dist-info").mkdir()
    (site / "fastext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (site / "single_module.py").write_text("")
    (site / "__editable___myproj_0_1_finder.py").write_text("")   # an editable install: only a finder
    (site / "__editable__.myproj-0.1.pth").write_text("")
    (site / "README").write_text("")
    monkeypatch.setattr(sys, "path", [str(site)])
    context._installed_libraries.cache_clear()
    try:
        libs = context._installed_libraries()
        assert {"somelib", "fastext", "single_module"} <= libs
        assert not {"myproj", "README", "__editable___myproj_0_1_finder"} & libs
        assert not context.is_user_frame("somelib/core.py(3): run")
        assert not context.is_user_frame("fastext/x.py(3): run")
        assert context.is_user_frame("myproj/model.py(12): forward")
    finally:
        context._installed_libraries.cache_clear()
