"""The library leaves its caller's interpreter as it found it (issue 46): an analysis in-process turns
no garbage collection off, freezes nothing, changes no threshold, no environment variable, no signal
handler, no warnings filter nor sys-level setting; a reference cycle made before the call is collected
after it. What the command line tunes (the collector off while a verb runs) is its own process's and is
put back for a caller of ``cli.main``."""

from __future__ import annotations

import gc
import os
import signal
import sys
import warnings
import weakref

import pytest

import fsdpdoctor
from bundled import TRACES  # the committed traces, in a pristine copy


def _interpreter() -> dict:
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (OSError, ValueError):
            pass
    return {"gc enabled": gc.isenabled(), "gc thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count(),
            "environment": dict(os.environ), "signals": handlers, "warnings": list(warnings.filters),
            "recursion limit": sys.getrecursionlimit(), "switch interval": sys.getswitchinterval(),
            "stdout": sys.stdout, "stderr": sys.stderr, "path": list(sys.path)}


class _Node:
    pass


def _a_cycle() -> list:
    """Two objects that reference each other, unreachable once made: only the collector frees them;
    the returned list is set when it does."""
    freed = []
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    weakref.finalize(a, freed.append, "a")
    return freed


@pytest.fixture(scope="module", autouse=True)
def _modules_loaded():
    """One analysis first: what the modules it loads do when imported (numpy adds a warnings filter) is
    theirs, once; what is compared is what an analysis does."""
    fsdpdoctor.analyze(TRACES / "ddp_default").to_json()


@pytest.mark.parametrize("how", [{"workers": 1}, {"workers": 2}, {"json": True}])
def test_an_analysis_in_process_leaves_the_interpreter_as_it_was(how):
    gc.collect()
    before = _interpreter()
    freed = _a_cycle()
    if how.get("json"):
        fsdpdoctor.analyze(TRACES / "ddp_default").to_json()
    else:
        a = fsdpdoctor.analyze(TRACES / "straggler", workers=how["workers"], use_summaries=False)
        assert [r.rank for r in a.ranks] == [0, 1] and a.findings
    after = _interpreter()
    for key in before:
        assert after[key] == before[key], key
    assert gc.isenabled()
    gc.collect()   # (the collector may have freed it during the analysis already)
    assert freed == ["a"], "a cycle made before the analysis was not collected after it"


def test_the_command_line_gives_the_collector_back_to_a_caller_of_main(capsys):
    from fsdpdoctor.cli import main

    gc.collect()
    before = _interpreter()
    assert main(["analyze", str(TRACES / "straggler"), "--json"]) == 0
    assert capsys.readouterr().out.startswith("{")
    after = _interpreter()
    for key in before:
        assert after[key] == before[key], key
