"""docs/diff.md's tables of measured pairs are what `diff` gives today: for every row naming two recorded
runs (bundled, traces/ab/ or tests/data/), the step times and interval it shows and its verdict."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bundled import TRACES

from fsdpdoctor.diagnose.compare import compare
from fsdpdoctor.pipeline import open_analysis

ROOT = Path(__file__).resolve().parents[1]
_ROW = re.compile(r"^\| `([\w/]+)` → `([\w/]+)`( \([^|]*\))?(, steps (\d)–(\d) only)? \| ([^|]*) \| ([^|]*) \|$", re.M)


def _run(name: str) -> Path:
    if name.startswith("tests/"):
        return ROOT / name
    return TRACES / "ab" / name if name.startswith("conv1d") else TRACES / name


ROWS = [m.groups() for m in _ROW.finditer((ROOT / "docs" / "diff.md").read_text())]


def test_the_tables_have_rows():
    assert len(ROWS) >= 12


@pytest.mark.parametrize("base,new,_what,_steps,lo,hi,shown,verdict", ROWS, ids=[f"{r[0]}->{r[1]}" for r in ROWS])
def test_row_is_what_diff_gives(base, new, _what, _steps, lo, hi, shown, verdict):
    steps = set(range(int(lo), int(hi) + 1)) if lo else None
    a, b = (open_analysis(_run(x), steps=steps) for x in (base, new))
    c = compare(a, b)
    if "→" in shown.split(";")[0] and "ms" in shown.split(";")[0]:
        assert f"{c.step.base_mean / 1e3:.1f} → {c.step.new_mean / 1e3:.1f} ms" in shown, (shown, c.step)
    ci = re.search(r"CI ([−+-]?[\d.]+)\.\.([−+-]?[\d.]+) ms", shown)
    if ci:   # the interval, to the digits shown
        for text, value in zip(ci.groups(), (c.step.lo, c.step.hi)):
            digits = len(text.split(".")[1]) if "." in text else 0
            assert float(text.replace("−", "-")) == round(value / 1e3, digits), (shown, c.step)
    said = {"no detectable change": "no-detectable-change", "regression": "regression",
            "environment-slower": "environment-slower", "slower-unattributed": "slower-unattributed"}
    word = next(k for k in said if verdict.startswith(k))
    assert c.verdict == said[word], (verdict, c.verdict)
