"""The scaling TUI (`fsdpdoctor scaling RUN_A RUN_B --tui`), driven with the pilot, plus SVG snapshots.

Everything runs on the bundled pair traces/scaling_1proc and traces/scaling_2proc; the
expected figures are the ScalingReport computed here with the library, so the tests
check that the UI shows the report, not particular numbers. A third "run" (the 2-process
analysis declared as 4 ranks) gives several comparisons for the navigation tests.

Update snapshots after an intended UI change with
``pytest tests/test_tui_scaling.py --snapshot-update``.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import pytest
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

pytest.importorskip("textual")

from fsdpdoctor.diagnose.scaling import FINDING_ID, scaling_report  # noqa: E402
from fsdpdoctor.cli import main  # noqa: E402
from pilot import check_help_theme_quit, dump, timed  # noqa: E402
from fsdpdoctor.pipeline import open_analysis  # noqa: E402
from fsdpdoctor.tui.palette import Palette  # noqa: E402
from fsdpdoctor.tui.scaling_app import (NEG_GLYPH, POS_GLYPH, RunsTable, ScalingApp,  # noqa: E402
                                        ScalingHelpScreen, WaterfallView)

ROOT = Path(__file__).resolve().parent.parent
RUN1, RUN2 = BUNDLED / "scaling_1proc", BUNDLED / "scaling_2proc"

pytestmark = pytest.mark.skipif(not (RUN1.is_dir() and RUN2.is_dir()),
                                reason="bundled traces/scaling_1proc, traces/scaling_2proc not present")


@cache
def _analysis(folder: Path):
    return open_analysis(folder, diagnose=False)


def real(folder: Path, source: str | None = None):
    """The analysis of a bundled run, labelled relative (as typed on the command line)."""
    a = copy.deepcopy(_analysis(folder))
    a.source = source or f"traces/{folder.name}"
    return a


def pair_report(**kw):
    return scaling_report([real(RUN1), real(RUN2)], **kw)


def three_report(**kw):
    """Three runs: 1, 2 and (the 2-process analysis again, declared as) 4 ranks."""
    return scaling_report([real(RUN1), real(RUN2), real(RUN2, "traces/scaling_2proc_as_4")],
                          world_sizes=[1, 2, 4], **kw)




def part_line(text: str, label: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.lstrip("▊ ").startswith(label + " ")]
    assert len(lines) == 1, (label, text)
    return lines[0]


# -- pilot tests -------------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@timed
async def test_waterfall_rows_are_the_reports_parts(size):
    rep = pair_report()
    w = rep.waterfalls[0]
    app = ScalingApp(rep)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        view = app.query_one(WaterfallView)
        assert app.focused is view
        rows = view.part_rows()
        # one row per part, in the report's order (largest |delta| first, residual last)
        assert [p.key for p, _ in rows] == [p.key for p in w.parts]
        text = dump(app)
        for p in w.parts:
            line = part_line(text, p.label)
            for figure in (f"{p.base_us / 1e3:.1f}", f"{p.run_us / 1e3:.1f}", f"{p.delta_us / 1e3:+.1f}",
                           f"{100 * p.efficiency_points:+.1f}"):
                assert f" {figure} " in line, (figure, line)
        total = part_line(text, "total")
        assert f"{w.increase_us / 1e3:+.1f}" in total and f"{100 * w.lost_efficiency:+.1f}" in total
        assert f"{w.ideal_step_us / 1e3:.1f} ms ideal" in text and f"{w.step_us / 1e3:.1f} ms measured" in text
        # efficiency: the report's, in the waterfall and in the runs table
        assert f"efficiency {100 * w.efficiency:.1f}%" in text
        table = app.query_one(RunsTable)
        assert table.row_count == len(rep.runs)
        assert table.get_cell("0", "eff.").plain == "◆ base"
        assert table.get_cell("1", "eff.").plain == f"{100 * rep.runs[1].efficiency:.1f}%"
        assert [table.get_cell(str(i), "N").plain for i in range(len(rep.runs))] == \
               [str(r.world_size) for r in rep.runs]
        assert table.get_cell("1", "step ms").plain == f"{rep.runs[1].step_us / 1e3:.1f}"
        assert table.get_cell("1", "ideal").plain == f"{rep.runs[1].ideal_step_us / 1e3:.1f}"
        assert table.get_cell("1", "tok/s").plain == f"{rep.runs[1].throughput:,.0f}"
        assert table.get_cell("1", "run").plain == "traces/scaling_2proc"   # whole name at 80 columns too
        # bars: scaled to the largest part, which fills the bar column; one colour per sign
        _, bar_w, _ = view.layout_widths()
        biggest = max(abs(p.delta_us) for p in w.parts)
        for p, cells in rows:
            assert abs(cells - bar_w * abs(p.delta_us) / biggest) <= 1
            assert cells >= (1 if p.delta_us else 0)
        assert max(cells for _, cells in rows) == bar_w
        pal = Palette.of(app)
        rendered = view.render()
        colours = {}
        for span in rendered.spans:
            seg = rendered.plain[span.start:span.end]
            if seg and set(seg) <= {POS_GLYPH, NEG_GLYPH}:
                colours.setdefault(seg[0], set()).add(span.style.color.name.lower())
        assert colours[NEG_GLYPH] == {pal.color("success").lower()}   # compute got faster on 2 ranks
        if any(p.delta_us > 0 for p in w.parts):
            assert colours[POS_GLYPH] == {pal.color("error").lower()}
        assert pal.color("success") != pal.color("error")
        # every bar line is whole: nothing cut off at the right edge
        for p in w.parts:
            assert "…" not in part_line(text, p.label)
        await pilot.press("q")
    assert app.return_code == 0


@timed
async def test_notes_and_no_finding_at_default_threshold():
    rep = pair_report()
    assert rep.findings == [] and rep.notes        # the bundled pair scales super-linearly on CPU
    app = ScalingApp(rep)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = " ".join(dump(app).replace("▊", " ").split())
        assert "no low-scaling-efficiency finding" in text and "80%" in text
        for note in rep.notes:
            assert " ".join(note.split()) in text


@timed
async def test_findings_show_title_summary_fix():
    rep = pair_report(thresholds={"scaling_efficiency_low": 10.0})
    [f] = rep.findings
    assert f.id == FINDING_ID
    app = ScalingApp(rep, thresholds={"scaling_efficiency_low": 10.0})
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        details = app.query_one("#details-text").content
        flat = " ".join(str(details).split())
        for s in (f.title, f.summary, f.fix, f.id):
            assert " ".join(s.split()) in flat
        # below the threshold: the efficiency is drawn in the error colour
        pal = Palette.of(app)
        cell = app.query_one(RunsTable).get_cell("1", "eff.")
        assert cell.style.color.name.lower() == pal.color("text-error").lower()


@timed
async def test_no_absolute_paths_on_screen():
    rep = scaling_report([real(RUN1, str(RUN1)), real(RUN2, str(RUN2))],
                         thresholds={"scaling_efficiency_low": 10.0})
    app = ScalingApp(rep)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert str(ROOT) not in dump(app)
        assert str(ROOT) not in str(app.query_one("#details-text").content)
        assert "scaling_2proc" in dump(app)


@timed
async def test_arrows_and_jk_move_between_comparisons():
    rep = three_report()
    assert [(w.base_world_size, w.world_size) for w in rep.waterfalls] == [(1, 2), (1, 4)]
    app = ScalingApp(rep)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        view = app.query_one(WaterfallView)
        table = app.query_one(RunsTable)
        assert app.current == 0 and view.waterfall is rep.waterfalls[0]
        assert "1 of 2" in dump(app) and "1 → 2 ranks" in dump(app)
        assert table.cursor_row == 1
        await pilot.press("j")
        assert view.waterfall is rep.waterfalls[1] and table.cursor_row == 2
        text = dump(app)
        assert "2 of 2" in text and "1 → 4 ranks" in text
        assert f"efficiency {100 * rep.waterfalls[1].efficiency:.1f}%" in text
        await pilot.press("down")                      # already the last: stays
        assert app.current == 1
        await pilot.press("k")
        assert app.current == 0
        await pilot.press("down", "up")
        assert app.current == 0
        await pilot.press("right")
        assert app.current == 1
        # tab: runs table; its cursor picks the comparison (the base row has none)
        await pilot.press("tab")
        assert app.focused is view.screen.query_one("#details")
        await pilot.press("tab")
        assert app.focused is table
        await pilot.press("up")
        await pilot.pause()
        assert table.cursor_row == 1 and app.current == 0
        await pilot.press("k")
        await pilot.pause()
        assert table.cursor_row == 0 and app.current == 0
        await pilot.press("j", "j")
        await pilot.pause()
        assert app.current == 1 and view.waterfall.world_size == 4
        await pilot.press("shift+tab")
        assert app.focused.id == "details"
        await pilot.press("shift+tab")
        assert app.focused is view


@timed
async def test_help_and_theme_and_quit():
    app = ScalingApp(pair_report())
    async with app.run_test(size=(80, 24)) as pilot:
        await check_help_theme_quit(app, pilot, ScalingHelpScreen, "other comparison")
    assert app.return_code == 0


# -- command line -------------------------------------------------------------------
@pytest.fixture
def no_app(monkeypatch):
    """ScalingApp.run replaced: records the report it was given instead of taking the terminal."""
    import fsdpdoctor.tui.scaling_app as mod

    seen = []

    def fake_run(self):
        seen.append(self)
        return 0

    monkeypatch.setattr(mod.ScalingApp, "run", fake_run)
    # pytest's stdin and stdout are no terminal: the refusal is tested in test_verbs.py
    monkeypatch.setattr("fsdpdoctor.commands.scaling.require_terminal", lambda: None)
    return seen


def test_cli_tui_gets_the_report(no_app, capsys, monkeypatch):
    monkeypatch.chdir(BUNDLED.parent)  # traces/ there is the pristine copy
    assert main(["scaling", "traces/scaling_2proc", "traces/scaling_1proc", "--tui",
                 "--threshold", "scaling_efficiency_low=10"]) == 0
    [app] = no_app
    assert [r.world_size for r in app.report.runs] == [1, 2]
    assert [f.id for f in app.report.findings] == [FINDING_ID] and app.low_efficiency == 10.0
    assert app.report.waterfalls[0].efficiency == pytest.approx(pair_report().waterfalls[0].efficiency)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("argv, message", [
    (["traces/scaling_1proc"], "fsdpdoctor: error: scaling needs at least 2 runs, got 1"),
    (["traces/scaling_1proc", "traces/no_such_run"], "fsdpdoctor: error: traces/no_such_run:"),
    (["traces/scaling_1proc", "traces/scaling_1proc"], "fsdpdoctor: error: all runs have the same world size"),
], ids=["one-run", "missing-folder", "same-size"])
def test_cli_bad_input_fails_before_launch(no_app, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(BUNDLED.parent)  # traces/ there is the pristine copy
    assert main(["scaling", *argv, "--tui"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert no_app == []                                   # the app never opened
    # the same line as the verb without --tui
    assert main(["scaling", *argv]) == 2
    assert capsys.readouterr().err == err


def test_cli_tui_and_json_exclusive(no_app, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["scaling", str(RUN1), str(RUN2), "--tui", "--json"])
    assert exc.value.code == 2 and no_app == []
    assert "not allowed with" in capsys.readouterr().err


# -- snapshots ---------------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot_scaling(snap_compare, size):
    assert snap_compare(ScalingApp(pair_report()), terminal_size=size)


def test_snapshot_scaling_light_findings_second_comparison(snap_compare):
    th = {"scaling_efficiency_low": 0.9}
    app = ScalingApp(three_report(thresholds=th), thresholds=th, light=True)
    assert snap_compare(app, press=["j"], terminal_size=(120, 40))


def test_snapshot_scaling_help(snap_compare):
    assert snap_compare(ScalingApp(pair_report()), press=["question_mark"], terminal_size=(80, 24))
