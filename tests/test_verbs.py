"""What every verb shares: listed statically, its text fits the terminal (80 columns when
COLUMNS=80, piped) without splitting a word, its --json carries schema_version, and its terminal
UI refuses to start without a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpdoctor import cli
from fsdpdoctor.cli import main
from conftest import error_lines
from bundled import TRACES  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]


def test_every_verb_module_is_listed_and_nothing_else():
    """Adding a verb is one module plus one line: a module that is not in the table, or a line
    whose module is gone, fails here (and the import of cli fails on the latter)."""
    helpers = {"__init__", "base", "common"}
    modules = {p.stem for p in (ROOT / "fsdpdoctor" / "commands").glob("*.py")} - helpers
    listed = {name for name, _ in cli.VERBS}
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



def _loaded_by(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after the command line ``argv`` (beyond a bare one's)."""
    code = ("import sys; base = set(sys.modules); from fsdpdoctor.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(set(sys.modules) - base)), file=sys.stderr)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=True)
    return set(p.stderr.splitlines()[-1].split())


def test_help_and_a_wrong_flag_load_no_verb_they_do_not_name():
    """`--help` loads no verb's module (their lines of help are in cli.VERBS); a verb's wrong flag loads
    that verb's module and the flag helpers, not numpy, the analysis or the options' dataclasses."""
    top = _loaded_by(["--help"])
    assert not any(m.startswith("fsdpdoctor.commands.") for m in top), top
    wrong = _loaded_by(["analyze", "traces/straggler", "--bogus"])
    ours = {m for m in wrong if m.startswith("fsdpdoctor.commands.")}
    assert ours == {"fsdpdoctor.commands.analyze", "fsdpdoctor.commands.base", "fsdpdoctor.commands.common"}
    assert not wrong & {"numpy", "msgspec", "fsdpdoctor.options", "fsdpdoctor.pipeline", "dataclasses"}


def test_analyzing_one_rank_loads_no_capture_and_no_process_pool():
    """A trace not written by capture() (no step series beside it) loads none of the capture package (its
    hooks and watchdog), and one rank read in this process none of multiprocessing."""
    loaded = _loaded_by(["analyze", str(TRACES / "straggler" / "rank0.json.gz"), "--json", "--no-progress"])
    assert "fsdpdoctor.pipeline" in loaded and not any(m.startswith("fsdpdoctor.capture") for m in loaded)
    assert not loaded & {"multiprocessing", "concurrent.futures"}

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
