"""What every verb shares: listed statically, its text fits the terminal (80 columns when
COLUMNS=80, piped) without splitting a word, its --json carries schema_version, and its terminal
UI refuses to start without a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import shutil
from pathlib import Path

import pytest

from fsdpdoctor import cli
from fsdpdoctor.cli import main
from conftest import error_lines
from bundled import TRACES  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
BOX = re.compile(r"^[\s\u2500-\u257f]+$")  # box-drawing lines of tables and panels


def test_every_verb_module_is_listed_and_nothing_else():
    """Adding a verb is one module plus one line: a module that is not in the table, or a line
    whose module is gone, fails here (and the import of cli fails on the latter)."""
    helpers = {"__init__", "base", "common"}
    modules = {p.stem for p in (ROOT / "fsdpdoctor" / "commands").glob("*.py")} - helpers
    listed = {v.__name__.rsplit(".", 1)[1] for v in cli.VERBS}
    assert listed == modules
    sub = next(a for a in cli.build_parser()._actions if a.dest == "verb")
    assert set(sub.choices) >= listed


def test_shared_flags_are_declared_once_in_the_base():
    """--json, --tui, --rank, --steps, --threshold, --config, --jobs, --dask, --no-summaries,
    --no-progress and --window come from commands/base.py; a verb that declares one itself fails here."""
    shared = ("--json", "--tui", "--rank", "--steps", "--threshold", "--config", "--jobs", "--dask",
              "--no-summaries", "--no-progress", "--window")
    declared = re.compile(r"add_argument\(\s*\"(--[a-z-]+)\"")
    own = {p.name: sorted(set(declared.findall(p.read_text())) & set(shared))
           for p in (ROOT / "fsdpdoctor" / "commands").glob("*.py") if p.name != "base.py"}
    # the --steps of `reference run` and `trigger` is a number of steps to run or profile, not a selection
    for counts in ("reference.py", "trigger.py"):
        own[counts] = [f for f in own.get(counts, []) if f != "--steps"]
    assert not any(own.values()), {k: v for k, v in own.items() if v}


# (argv, needs) per verb: the bundled traces; "{tmp}" is a fresh folder
TEXT_VERBS = {
    "analyze": ["analyze", "traces/straggler", "--no-progress"],
    "analyze-verbose": ["analyze", "traces/fsdp1_backward_post", "--no-progress", "-v"],
    "check": ["check", "traces/straggler", "--no-progress", "--max-idle", "1%", "--baseline", "traces/ddp_default"],
    "check-list-thresholds": ["check", "--list-thresholds"],
    "diff": ["diff", "traces/ddp_default", "traces/ddp_one_bucket"],
    "export": ["export", "traces/straggler", "--no-ops", "--no-progress", "--perfetto", "{tmp}/a-long-file-name.json"],
    "summarize": ["summarize", "traces/ddp_default", "--out", "{tmp}/summaries", "--no-progress"],
    "scaling": ["scaling", "traces/scaling_1proc", "traces/scaling_2proc"],
    "memory-run": ["memory", "traces/scaling_2proc"],
    "memory-model": ["memory", "--params", "7B", "--world-size", "8", "--strategy", "zero2", "--cpu-offload",
                     "--layers", "32", "--hidden", "4096", "--seq", "2048", "--micro-batch", "1",
                     "--largest-unit-params", "200M"],
    "reference-list": ["reference", "list"],
    "trigger": ["trigger", "{tmp}/run", "--steps", "3"],
    "hang-order": ["hang", "traces/hang_collective_order", "--no-trend"],
    "hang-dead": ["hang", "traces/hang_dead_rank", "--no-trend"],
    "hang-loader": ["hang", "traces/hang_loader"],
    "hang-raises": ["hang", "traces/hang_rank_raises", "--no-trend"],
    "hang-killed": ["hang", "traces/hang_killed_rank", "--no-trend"],
}


def _text(verb: str, columns: int, tmp: Path, monkeypatch, capsys) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    # in a folder of its own (what the verbs write goes there), with the bundled traces at a short
    # relative path as a user would type it
    monkeypatch.chdir(tmp)
    if not (tmp / "traces").exists():
        (tmp / "traces").symlink_to(TRACES)
    shutil.rmtree(tmp / "run", ignore_errors=True)   # a run folder of a job to come (trigger), fresh each
    (tmp / "run").mkdir()                           # time: a second request while one waits is refused
    argv = [a.replace("{tmp}/", "") for a in TEXT_VERBS[verb]]
    rc = main(argv)
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    return out.out.splitlines()


def _words(lines: list[str]) -> set[str]:
    return {w for line in lines for w in line.split() if not BOX.match(w)}


@pytest.mark.parametrize("verb", sorted(TEXT_VERBS))
def test_text_fits_80_columns_without_splitting_words(verb, tmp_path, monkeypatch, capsys):
    narrow = _text(verb, 80, tmp_path, monkeypatch, capsys)
    assert narrow, "no output"
    too_wide = [line for line in narrow if len(line.rstrip()) > 80]
    assert not too_wide, too_wide[:3]
    # the same text laid out without a width limit: every word of the 80-column text is one of
    # its words (a word cut in two leaves pieces that are not), or a cut marked with an ellipsis
    wide = _words(_text(verb, 1000, tmp_path, monkeypatch, capsys))
    split = [w for w in _words(narrow) - wide
             if not (w.endswith("…") and any(x.startswith(w[:-1]) for x in wide))]
    assert not split, split[:10]


JSON_VERBS = {
    "analyze": ["analyze", "traces/straggler", "--json", "--no-progress"],
    "check": ["check", "traces/straggler", "--json", "--no-progress"],
    "diff": ["diff", "traces/ddp_default", "traces/ddp_one_bucket", "--json"],
    "scaling": ["scaling", "traces/scaling_1proc", "traces/scaling_2proc", "--json"],
    "memory": ["memory", "--params", "7B", "--json"],
    "hang": ["hang", "traces/hang_dead_rank", "--no-trend", "--json"],
}


@pytest.mark.parametrize("verb", sorted(JSON_VERBS))
def test_every_json_carries_schema_version(verb, monkeypatch, capsys):
    from fsdpdoctor.results import SCHEMA_VERSION

    monkeypatch.chdir(TRACES.parent)  # traces/ there is the pristine copy
    assert main(JSON_VERBS[verb]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == SCHEMA_VERSION


def test_list_thresholds_needs_no_path_and_check_without_one_is_one_line(capsys):
    from fsdpdoctor.diagnose.thresholds import THRESHOLDS

    assert main(["check", "--list-thresholds"]) == 0
    out = capsys.readouterr().out
    assert all(t.name in out for t in THRESHOLDS)
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PATH" in err


# ------------------------------------------------------------------ the TUI without a terminal
TUI_VERBS = {
    "tui": ["tui", "traces/straggler"],
    "analyze-tui": ["analyze", "traces/straggler", "--tui"],
    "hang-tui": ["hang", "traces/hang_loader", "--tui"],
    "scaling-tui": ["scaling", "traces/scaling_1proc", "traces/scaling_2proc", "--tui"],
}


def _run(argv: list[str], stdin, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    # a TUI that starts anyway never exits here (stdin at end of file): the timeout fails the test
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", *argv], cwd=TRACES.parent, env=env, stdin=stdin,
                          stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=600)  # a guard against a hang, not a speed bound: scaling loads two runs first


@pytest.mark.parametrize("verb", sorted(TUI_VERBS))
def test_tui_refuses_without_a_terminal(verb):
    """As in a CI job: stdin from /dev/null, stdout into a pipe. One line, exit 2, no escape codes."""
    p = _run(TUI_VERBS[verb], subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and "\x1b" not in p.stderr
    assert error_lines(p.stderr) == ["fsdpdoctor: error: the TUI needs a terminal; stdin and stdout are not one"]


@pytest.mark.skipif(os.name != "posix", reason="pseudo-terminals")
def test_tui_refuses_a_pipe_even_with_a_terminal_for_keys():
    """`fsdpdoctor tui X | cat` on a terminal: keys could be read, but the screen would pour into the pipe."""
    import pty

    leader, follower = pty.openpty()
    try:
        p = _run(TUI_VERBS["tui"], follower)
    finally:
        os.close(leader)
        os.close(follower)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "fsdpdoctor: error: the TUI needs a terminal; stdout is not one\n"
