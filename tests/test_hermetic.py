"""The tests run in a venv with only ``pip install -e .`` and pytest, pytest-xdist and hypothesis: a
test of an optional part skips, naming the extra, where that part is not installed. This guard reads
every module of tests/ (AST) and names any that imports an optional package when it is imported
(at its top level, or in a class body) outside a ``try`` that catches the ImportError: such a module
errors at collection, with every test in it, instead of skipping. Import optional packages inside the
test, or with ``pytest.importorskip(NAME, reason="needs the [EXTRA] extra (NAME)")``."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# top-level package -> the extra (pyproject.toml) that installs it
OPTIONAL = {
    "torch": "capture", "torchvision": "capture",
    "hta": "hta",
    "pandas": "pandas",
    "transformers": "hf", "accelerate": "hf",
    "lightning": "lightning", "pytorch_lightning": "lightning", "lightning_fabric": "lightning",
    "distributed": "dask", "dask": "dask",
    "isal": "fast",
    "torchmetrics": "test", "pytest_textual_snapshot": "test", "pytest_asyncio": "test", "mccabe": "test",
    "plotly": "test", "networkx": "test", "yaml": "test", "psutil": "test",
}
_CATCHES = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _guarded(node: ast.Try) -> bool:
    for h in node.handlers:
        if h.type is None:
            return True
        names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(n, ast.Name) and n.id in _CATCHES for n in names):
            return True
    return False


def _imported_on_import(body: list[ast.stmt]):
    """(line, top-level package) of every import run when the module is imported, not under a guard."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Try):
            if not _guarded(node):
                yield from _imported_on_import(node.body)
            yield from _imported_on_import(node.orelse + node.finalbody)
        elif isinstance(node, ast.If):
            test = node.test
            if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                continue
            yield from _imported_on_import(node.body + node.orelse)
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            yield from _imported_on_import(node.body)


def unguarded(source: str, name: str = "<test>") -> list[str]:
    tree = ast.parse(source, name)
    return [f"{name}:{line}: imports {pkg} (the [{OPTIONAL[pkg]}] extra) unguarded"
            for line, pkg in _imported_on_import(tree.body) if pkg in OPTIONAL]


def _imported_by_pytest() -> list[Path]:
    """The test modules, conftest files and the helpers beside them (tests/data holds the scripts of
    recorded jobs, run by torchrun, never imported)."""
    return sorted({*TESTS.glob("*.py"), *TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py")} - set(
        TESTS.joinpath("data").rglob("*.py")))


def test_no_test_module_imports_an_optional_package_unguarded():
    found = [msg for f in _imported_by_pytest()
             for msg in unguarded(f.read_text(encoding="utf-8"), str(f.relative_to(TESTS.parent)))]
    assert not found, "; ".join(found)


def test_the_guard_finds_what_it_looks_for():
    src = """
import os
import pandas as pd
from torch.utils.data import DataLoader
try:
    import distributed
except ImportError:
    distributed = None
try:
    import hta
finally:
    pass
if TYPE_CHECKING:
    import transformers
class T:
    import lightning
def f():
    import accelerate
"""
    assert [m.split(": ", 1)[0] for m in unguarded(src)] == ["<test>:3", "<test>:4", "<test>:10", "<test>:16"]
