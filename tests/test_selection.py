"""A --steps or --rank selection that matches nothing is bad input in every verb: one line on stderr,
exit 2, never an empty report or a passing gate (the selection is applied once, in the reduce of the
per-rank results and in the reading of a saved --json)."""

from __future__ import annotations

import pytest

from fsdpdoctor.cli import main


def one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 2, (argv, out.out[-400:])
    assert out.err.count("\n") == 1 and "Traceback" not in out.err, out.err
    return out.err


VERBS = {
    "analyze": lambda run: ["analyze", run],
    "analyze --json": lambda run: ["analyze", run, "--json"],
    "check": lambda run: ["check", run],
    "check --baseline": lambda run: ["check", run, "--baseline", run],
    "diff": lambda run: ["diff", run, run, "--fail-on-regression"],
    "export": lambda run: ["export", run, "--perfetto", "/dev/null"],
    "scaling": lambda run: ["scaling", run, run],
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_steps_matching_nothing(capsys, traces_dir, verb):
    # traces/straggler holds steps 2-5: the gate used to print "passed" (exit 0) on an empty selection
    err = one_error_line(capsys, VERBS[verb](str(traces_dir / "straggler")) + ["--steps", "9-12"])
    assert "--steps 9-12 matches no profiled step" in err and "2-5" in err


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_rank_matching_nothing(capsys, traces_dir, verb):
    err = one_error_line(capsys, VERBS[verb](str(traces_dir / "straggler")) + ["--rank", "7"])
    assert "7" in err


def test_steps_naming_no_step(capsys, traces_dir):
    err = one_error_line(capsys, ["check", str(traces_dir / "straggler"), "--steps", ","])
    assert "names no step" in err


def test_steps_that_partly_match_still_analyse(capsys, traces_dir):
    assert main(["check", str(traces_dir / "straggler"), "--steps", "4-9", "--fail-on", "error", "--json"]) in (0, 1)
    assert '"passed"' in capsys.readouterr().out


def test_saved_json_selection_matching_nothing(capsys, traces_dir, tmp_path):
    assert main(["analyze", str(traces_dir / "straggler"), "--json"]) == 0
    saved = tmp_path / "run.json"
    saved.write_text(capsys.readouterr().out)
    for extra in (["--steps", "9-12"], ["--rank", "7"]):
        err = one_error_line(capsys, ["diff", str(saved), str(traces_dir / "straggler")] + extra)
        assert str(saved) in err
        err = one_error_line(capsys, ["check", str(traces_dir / "straggler"), "--baseline", str(saved)] + extra)


def test_tui_steps_matching_nothing(traces_dir):
    pytest.importorskip("textual")
    import asyncio

    from fsdpdoctor.tui.app import FsdpDoctorApp
    from fsdpdoctor.tui.screens import ErrorScreen

    async def run() -> str | None:
        app = FsdpDoctorApp(traces_dir / "straggler", steps={9, 10})
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(200):
                await pilot.pause(0.05)
                if isinstance(app.screen, ErrorScreen):
                    break
            assert isinstance(app.screen, ErrorScreen)
        return app.error

    assert "matches no profiled step" in (asyncio.run(run()) or "")


def test_steps_matching_only_a_cut_step(capsys, traces_dir, tmp_path):
    # a step the end of profiling cut short is left out of every figure; selecting only it selects nothing
    # (an empty selection must not fall back to "all steps")
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(traces_dir / "straggler", run)
    m = json.loads((run / "manifest.json").read_text())
    m["partial_steps"], m["profiled_steps"] = [5], [2, 3, 4]
    (run / "manifest.json").write_text(json.dumps(m))
    err = one_error_line(capsys, ["check", str(run), "--steps", "5"])
    assert "--steps 5 matches no complete profiled step" in err and "cut short" in err
    assert main(["analyze", str(run), "--steps", "4-5", "--json"]) == 0
    steps = {s["step"] for r in json.loads(capsys.readouterr().out)["ranks"] for s in r["steps"]}
    assert steps == {4}
