"""The examples README.md and docs/*.md show are what the tool gives today (no stale figure).

- A ```console block starts with ``$ fsdpdoctor ARGS``; the lines under it are an excerpt of what that
  command prints at 80 columns, on the bundled traces: runs of lines separated by ``...`` lines, each
  run found whole, in order, in the output.
- In a ```python block, a comment line ``# <a Python literal>`` under an expression is the value of
  that expression: the block is run, statement by statement, and each such value compared.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from bundled import TRACES

from fsdpdoctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(console|python)\n(.*?)^```", re.S | re.M)


def _blocks(kind: str) -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            if m.group(1) == kind:
                out.append((page.relative_to(ROOT).as_posix(), text[:m.start()].count("\n") + 1, m.group(2)))
    return out


def _ids(blocks):
    return [f"{page}:{line}" for page, line, _ in blocks]


CONSOLE = _blocks("console")
PYTHON = [b for b in _blocks("python") if re.search(r"^# [\[\(\{'\"\d-]", b[2], re.M)]


def test_the_readme_shows_examples_of_both_kinds():
    """The checks below have something to check: the README's loop and notebook examples."""
    assert [p for p, _, _ in CONSOLE].count("README.md") >= 2
    assert [p for p, _, _ in PYTHON].count("README.md") >= 1


def _runs(shown: list[str]) -> list[list[str]]:
    runs, cur = [], []
    for ln in shown:
        if ln.strip() == "...":
            runs, cur = (runs + [cur] if cur else runs), []
        else:
            cur.append(ln.rstrip())
    return runs + [cur] if cur else runs


def _found_in_order(runs: list[list[str]], out: list[str]) -> list[str] | None:
    """The first run not found whole after the previous one, or None."""
    at = 0
    for run in runs:
        hit = next((i for i in range(at, len(out) - len(run) + 1) if out[i:i + len(run)] == run), None)
        if hit is None:
            return run
        at = hit + len(run)
    return None


@pytest.mark.parametrize("page,line,block", CONSOLE, ids=_ids(CONSOLE))
def test_console_example_is_what_the_command_prints(page, line, block, tmp_path, monkeypatch, capsys):
    first, *shown = block.rstrip("\n").splitlines()
    assert first.startswith("$ fsdpdoctor "), f"{page}:{line}: a console example starts with $ fsdpdoctor"
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").symlink_to(TRACES)   # the bundled traces at the path the example types
    rc = main(first.split()[2:])
    out = [ln.rstrip() for ln in capsys.readouterr().out.splitlines()]
    assert rc in (0, 1)
    missing = _found_in_order(_runs(shown), out)
    assert missing is None, (f"{page}:{line}: not in the output of `{first[2:]}`:", missing, "\n".join(out))


def _statements_with_values(source: str):
    """(statement source, the literal shown under it or None) for each top-level statement."""
    lines = source.splitlines()
    for node in ast.parse(source).body:
        code = "\n".join(lines[node.lineno - 1:node.end_lineno])
        below = lines[node.end_lineno] if node.end_lineno < len(lines) else ""
        shown = None
        if isinstance(node, ast.Expr) and below.startswith("# "):
            try:
                shown = ast.literal_eval(below[2:])
            except (ValueError, SyntaxError):
                shown = None
        yield code, shown


@pytest.mark.parametrize("page,line,block", PYTHON, ids=_ids(PYTHON))
def test_python_example_values_are_what_it_returns(page, line, block, tmp_path, monkeypatch):
    if re.search(r"_df\(", block):
        pytest.importorskip("pandas", reason="the DataFrame views need the [pandas] extra")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").symlink_to(TRACES)
    ns: dict = {}
    checked = 0
    for code, shown in _statements_with_values(block):
        if shown is None:
            exec(compile(code, page, "exec"), ns)
            continue
        got = eval(compile(code, page, "eval"), ns)
        assert got == shown, f"{page}:{line}: {code} gives {got!r}, the page shows {shown!r}"
        checked += 1
    assert checked
