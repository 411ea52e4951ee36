"""The house's size guards over every module of fsdpdoctor: no module over MAX_LINES lines, no function
over McCabe MAX_COMPLEXITY (measured as flake8 measures it, with the `mccabe` package). A function that
grows past the bound is split into named steps, each saying what it holds, not chopped."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fsdpdoctor"
MAX_COMPLEXITY = 15
MAX_LINES = 600


def _modules() -> list[tuple[str, str]]:
    return [(f.relative_to(ROOT).as_posix(), f.read_text(encoding="utf-8")) for f in sorted(PKG.rglob("*.py"))]


def _complexities() -> dict[tuple[str, str], int]:
    """(module path, function) -> McCabe complexity; methods are named Class.method, and a nested
    function counts towards the function that holds it (as flake8's C901 counts)."""
    mccabe = pytest.importorskip("mccabe", reason="needs the [test] extra (mccabe)")
    out = {}
    for rel, src in _modules():
        visitor = mccabe.PathGraphingAstVisitor()
        visitor.preorder(compile(src, rel, "exec", ast.PyCF_ONLY_AST), visitor)
        for graph in visitor.graphs.values():
            out[(rel, graph.entity)] = graph.complexity()
    return out


def test_no_function_over_the_complexity_bound():
    over = {key: c for key, c in _complexities().items() if c > MAX_COMPLEXITY}
    new = sorted(f"{rel}: {name} (McCabe {c})" for (rel, name), c in over.items())
    assert not new, (f"over McCabe {MAX_COMPLEXITY}: split into named steps, each with a docstring saying why: "
                     + "; ".join(new))


def test_no_module_over_the_line_bound():
    long = sorted(f"{rel} ({n} lines)" for rel, src in _modules() if (n := len(src.splitlines())) > MAX_LINES)
    assert not long, f"over {MAX_LINES} lines: split by what the parts hold: " + "; ".join(long)
