"""docs/adding-a-verb.md: its worked example (result, renderer, command, registry line) runs as written."""

from __future__ import annotations

import ast
import json
import re
import sys
import types
from pathlib import Path

from bundled import TRACES
from fsdpdoctor import cli, results

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-verb.md"


def _module(name: str, src: str, monkeypatch) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = str(DOC)
    monkeypatch.setitem(sys.modules, name, mod)
    exec(compile("from __future__ import annotations\n" + src, str(DOC), "exec"), mod.__dict__)
    return mod


def test_worked_example_runs(monkeypatch, capsys):
    result_src, render_src, command_src = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    _module("fsdpdoctor.results.ranks", result_src, monkeypatch)
    # the page applied to this tree (docs/adding-a-verb.md as written) already holds these: replaced
    monkeypatch.setattr(results, "_LAZY", (*(m for m in results._LAZY if m != "ranks"), "ranks"))
    monkeypatch.delitem(results.__dict__, "RanksSeen", raising=False)
    assert results.RanksSeen.__module__ == "fsdpdoctor.results.ranks"  # found through _LAZY
    monkeypatch.delitem(results.__dict__, "RanksSeen")
    _module("fsdpdoctor.report.ranks", render_src, monkeypatch)
    _module("fsdpdoctor.commands.ranks", command_src, monkeypatch)
    line = re.search(r"The registry line, .*?`(\(.*?\)),`", DOC.read_text(), flags=re.S).group(1)
    others = tuple(v for v in cli.VERBS if v[0] != "ranks")
    monkeypatch.setattr(cli, "VERBS", (*others, ast.literal_eval(line)))  # the registry line, as the page gives it
    run = str(TRACES / "straggler")
    assert cli.main(["ranks", run]) == 0
    assert capsys.readouterr().out.strip().endswith("ranks 0, 1 of 2")
    assert cli.main(["ranks", run, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"] == [0, 1] and doc["world_size"] == 2 and "schema_version" in doc
