"""The Textual UI, driven with the pilot, plus SVG snapshots (pytest-textual-snapshot).

Pilot tests use the bundled reference traces under traces/ (skipped when absent).
Findings for the detail/filter tests are built from the real analysis numbers so
they do not depend on the rule set; ``test_real_findings`` uses the rules' own
findings once they produce any.

Update snapshots after an intended UI change with ``pytest tests/test_tui.py --snapshot-update``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from bundled import TRACES, expectations  # the committed traces, in a pristine copy

pytest.importorskip("textual")

from fsdpdoctor.cli import main  # noqa: E402
from pilot import check_help_theme_quit, dump, timed  # noqa: E402
from fsdpdoctor.results import Evidence, Finding  # noqa: E402
from fsdpdoctor.pipeline import open_analysis  # noqa: E402
from fsdpdoctor.tui.app import FsdpDoctorApp, display_name  # noqa: E402
from fsdpdoctor.tui.findings import FindingList, FindingsPane, FixText, matches  # noqa: E402
from fsdpdoctor.tui.screens import ErrorScreen, HelpScreen, LoadingScreen, RankPicker  # noqa: E402
from fsdpdoctor.tui.tables import VimTable  # noqa: E402
from shared_data import PUBLIC_DIR, SHARED  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STRAGGLER = TRACES / "straggler"
RECSYS = PUBLIC_DIR / "recsys_2_of_128_ranks"

needs_straggler = pytest.mark.skipif(not (STRAGGLER / "rank0.json.gz").exists(),
                                     reason="bundled trace traces/straggler not present")


# -- data ------------------------------------------------------------------------
FSDP1 = TRACES / "fsdp1_no_backward_prefetch"     # findings: two infos (no saving on gloo)
NO_FINDINGS = TRACES / "fsdp1_forward_prefetch"   # a healthy run
needs_fsdp1 = pytest.mark.skipif(not (FSDP1 / "rank0.json.gz").exists(), reason="traces/ not present")


@cache
def _analysis(folder: Path, diagnose: bool):
    return open_analysis(folder, diagnose=diagnose)


def real(folder: Path, diagnose: bool = True):
    """The analysis of a bundled trace, labelled relative (as `fsdpdoctor tui traces/x` would be)."""
    import copy

    a = copy.deepcopy(_analysis(folder, diagnose))
    a.source = f"traces/{folder.name}"
    return a


def straggler_analysis(made_up_findings: bool = False):
    """traces/straggler with the rules' findings, or with ``findings_from_numbers``."""
    a = real(STRAGGLER, diagnose=not made_up_findings)
    if made_up_findings:
        a.findings = findings_from_numbers(a)
    return a


def findings_from_numbers(a) -> list[Finding]:
    """Three findings of each severity, with impacts and evidence taken from the analysis."""
    s = a.straggler
    step = a.mean.duration_us
    slow = s.straggler
    exposed = max(a.collectives, key=lambda c: c.exposed_us)
    n_steps = len(a.job.steps) * len(a.ranks)
    waiting = [r for r in a.ranks if r.rank != slow]
    return [
        # listed out of cost order on purpose: the pane sorts most costly first
        Finding(id="gloo-timing", title="Communication time includes peer wait (gloo)", severity="info",
                confidence=1.0, impact_us=0.0, impact_frac=0.0, summary=a.notes[0] if a.notes else "gloo",
                fix="Profile on GPU with NCCL for kernel-accurate communication time."),
        Finding(id="exposed-all-reduce", title=f"Exposed {exposed.kind} in {exposed.phase}", severity="warning",
                confidence=0.7, impact_us=exposed.exposed_us / n_steps,
                impact_frac=exposed.exposed_us / n_steps / step,
                summary=f"{exposed.count} calls, {exposed.exposed_us / 1e3:.1f} ms exposed in total.",
                fix="Overlap gradient all-reduce with backward: smaller DDP buckets (bucket_cap_mb=25).",
                evidence=[Evidence(text=f"{exposed.kind} exposed", time_us=exposed.exposed_us)],
                ranks=[r.rank for r in a.ranks]),
        Finding(id="straggler", title=f"Rank {slow} is a straggler ({s.cause})", severity="error",
                confidence=0.9, impact_us=s.spread_frac * step, impact_frac=s.spread_frac,
                summary=s.cause_evidence or "", source="train.py(120): train_step",
                fix=f"Remove the time.sleep on rank {slow} before forward.\nThen re-profile.",
                evidence=[Evidence(text=f"rank {p['straggler']} arrived last", rank=p["straggler"], step=p["step"],
                                   time_us=p["imbalance_us"]) for p in s.per_step]
                + [Evidence(text=f"rank {r.rank} waits", rank=r.rank, time_us=r.wait_us) for r in waiting],
                ranks=[slow]),
    ]


async def loaded(app, pilot):
    await app.workers.wait_for_complete()
    await pilot.pause()




# -- pilot tests -------------------------------------------------------------------
@needs_straggler
@timed
async def test_findings_sorted_and_selection_shows_detail():
    a = straggler_analysis(made_up_findings=True)
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(FindingsPane)
        assert [f.id for f in pane.shown] == ["straggler", "exposed-all-reduce", "gloo-timing"]
        assert isinstance(app.focused, FindingList)
        # the most costly is selected at start
        assert pane.current.id == "straggler"
        assert app.query_one(FixText).text == pane.current.fix
        await pilot.press("down")
        assert pane.current.id == "exposed-all-reduce"
        assert "Exposed all_reduce" in str(app.query_one("#detail-head").content)
        await pilot.press("k")
        assert pane.current.id == "straggler"
        head = str(app.query_one("#detail-head").content)
        assert "train.py(120): train_step" in head and "ERROR" in head
        evidence = str(app.query_one("#detail-evidence").content)
        step2 = a.straggler.per_step[0]
        assert f"[rank 1, step {step2['step']}, {step2['imbalance_us'] / 1e3:.1f} ms] rank 1 arrived last" in evidence
        # enter selects: focus moves to the (read-only, selectable) fix
        await pilot.press("enter")
        fix = app.query_one(FixText)
        assert app.focused is fix and fix.read_only
        assert fix.text == "Remove the time.sleep on rank 1 before forward.\nThen re-profile."
        await pilot.press("escape")
        assert isinstance(app.focused, FindingList)


@needs_straggler
@timed
async def test_copy_fix_to_clipboard_notifies():
    a = straggler_analysis()
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        straggler = next(f for f in a.findings if f.id == "straggler")
        assert app.clipboard == straggler.fix == app.query_one(FindingsPane).current.fix
        assert any("copied" in n.message for n in app._notifications)


@needs_fsdp1
@timed
async def test_filter_narrows_the_list():
    a = real(TRACES / "fsdp1_no_backward_prefetch_sleeper")  # a straggler warning beside prefetch infos
    by_id = {f.id: f for f in a.findings}
    assert {"fsdp-forward-prefetch-off", "fsdp1-no-backward-prefetch"} <= set(by_id)
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(FindingsPane)
        lst = app.query_one(FindingList)
        assert lst.option_count == len(a.findings) == len(pane.shown)
        await pilot.press("slash")
        assert app.focused.id == "filter"
        await pilot.press(*"sev:warning")  # at least a warning: the info finding goes
        assert {f.severity for f in pane.shown} <= {"warning", "error"} and pane.shown
        assert "fsdp-forward-prefetch-off" not in [f.id for f in pane.shown]
        assert lst.option_count == len(pane.shown) < len(a.findings)
        await pilot.press("enter")  # back to the list, filter kept
        assert isinstance(app.focused, FindingList)
        assert f"{len(pane.shown)} of {len(a.findings)}" in str(app.query_one("#filter-status").content)
        # `/` again selects the old filter, so typing replaces it
        await pilot.press("slash", *"id:fsdp1-no", "enter")
        assert [f.id for f in pane.shown] == ["fsdp1-no-backward-prefetch"]
        # the detail pane follows the (only) match: its evidence and fix
        f = by_id["fsdp1-no-backward-prefetch"]
        assert pane.current is f
        assert app.query_one(FixText).text == f.fix
        if f.evidence:
            assert f.evidence[0].text.split()[0] in str(app.query_one("#detail-evidence").content)
        await pilot.press("slash", *"prefetch sev:error")  # every word must match
        assert pane.shown == []
        assert "nothing matches" in dump(app)
        await pilot.press("escape")  # clears the filter
        assert len(pane.shown) == len(a.findings) == lst.option_count


@needs_straggler
@timed
async def test_mouse_selects_finding_and_switches_tab():
    app = FsdpDoctorApp(analysis=straggler_analysis(made_up_findings=True))
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(FindingsPane)
        assert pane.current.id == "straggler"
        await pilot.click("#finding-list", offset=(5, 2))  # second two-line item
        await pilot.pause()
        assert pane.current.id == "exposed-all-reduce"
        assert isinstance(app.focused, FindingList)  # a click selects; only enter moves to the fix
        await pilot.click("#--content-tab-tab-timeline")
        await pilot.pause()
        assert app.query_one("#panes").active == "tab-timeline"
        assert app.focused.id == "timeline-table"


def test_filter_matching_rules():
    f = Finding(id="host-sync", title="Host sync in the step", severity="warning", confidence=1, impact_us=1,
                impact_frac=0.1, summary=".item() in loss", fix="drop .item()")
    assert matches(f, "") and matches(f, "HOST") and matches(f, "sev:warning") and matches(f, "sev:w")
    assert matches(f, "id:host sync") and not matches(f, "sev:error") and not matches(f, "id:dataloader")
    assert not matches(f, "host loader")


@needs_straggler
@timed
async def test_rank_picker_filters_timeline_and_ranks():
    app = FsdpDoctorApp(analysis=straggler_analysis())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        timeline = app.query_one("#timeline-table", VimTable)
        assert app.focused is timeline
        all_rows = [k.value for k in timeline.rows]
        assert all_rows == [f"{r}:{s}" for r in (0, 1) for s in (2, 3, 4, 5)]
        ranks = app.query_one("#ranks-table", VimTable)
        assert [k.value for k in ranks.rows] == ["0", "1"]
        await pilot.press("r")
        assert isinstance(app.screen, RankPicker)
        await pilot.press("j", "j", "enter")  # all ranks, rank 0, rank 1
        await pilot.pause()
        assert app.rank == 1
        assert [k.value for k in timeline.rows] == ["1:2", "1:3", "1:4", "1:5"]
        # the rank view now lists rank 1's steps
        assert [k.value for k in ranks.rows] == ["2", "3", "4", "5"]
        assert "rank 1 (slowest rank)" in str(app.query_one("#ranks-caption").content)
        assert "showing rank 1" in dump(app)
        # back to all ranks
        await pilot.press("r", "home", "enter")
        await pilot.pause()
        assert app.rank is None and len(timeline.rows) == 8


@needs_straggler
@timed
async def test_timeline_bars_scaled_to_longest_step():
    a = straggler_analysis()
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        table = app.query_one("#timeline-table", VimTable)
        steps = [s for r in a.ranks for s in r.steps]
        longest = max(steps, key=lambda s: s.duration_us)
        bars = {f"{s.rank}:{s.step}": table.get_cell(f"{s.rank}:{s.step}", "bar") for s in steps}
        full = len(bars[f"{longest.rank}:{longest.step}"].plain)
        width = table.columns["bar"].width
        assert full == width
        for s in steps:
            assert abs(len(bars[f"{s.rank}:{s.step}"].plain) - width * s.duration_us / longest.duration_us) <= 1


@needs_straggler
@timed
async def test_timeline_marks_an_odd_step():
    a = straggler_analysis()
    odd = a.ranks[0].steps[1]
    odd.idle_us += 2 * odd.duration_us  # a step three times longer, all of it idle
    odd.duration_us *= 3
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        table = app.query_one("#timeline-table", VimTable)
        marked = [k.value for k in table.rows if table.get_cell(k, "time").plain.endswith("!")]
        assert marked == [f"{odd.rank}:{odd.step}"]
        # the odd step sets the scale: the others are about a third of the width
        width = table.columns["bar"].width
        assert len(table.get_cell(f"{odd.rank}:{odd.step}", "bar").plain) == width
        other = a.ranks[1].steps[0]
        assert len(table.get_cell(f"{other.rank}:{other.step}", "bar").plain) < width / 2
        assert "slow steps" in dump(app) or "median" in dump(app)


def test_open_tui_passes_selection_args(monkeypatch):
    import fsdpdoctor.tui.app as tui_app

    seen = {}

    def fake_run(self):
        seen.update(path=self.path, ranks=self.options.ranks, steps=self.options.steps, theme=self._light)
        return 0

    monkeypatch.setattr(tui_app.FsdpDoctorApp, "run", fake_run)
    monkeypatch.setattr("fsdpdoctor.commands.tui.require_terminal", lambda: None)  # pytest has no terminal
    assert main(["analyze", str(ROOT), "--tui", "--rank", "0,1", "--steps", "2-3"]) == 0
    assert seen == {"path": ROOT, "ranks": [0, 1], "steps": {2, 3}, "theme": False}
    assert main(["tui", str(ROOT), "--light"]) == 0 and seen["theme"] is True


def test_open_tui_passes_engine_args(monkeypatch):
    import fsdpdoctor.tui.app as tui_app

    seen = []
    monkeypatch.setattr(tui_app.FsdpDoctorApp, "run", lambda self: seen.append({"dask": self.options.dask, "workers": self.options.workers,
                                                                          "use_summaries": self.options.use_summaries}) or 0)
    monkeypatch.setattr("fsdpdoctor.commands.tui.require_terminal", lambda: None)  # pytest has no terminal
    assert main(["tui", str(ROOT), "--jobs", "3", "--dask", "tcp://sched:8786", "--no-summaries"]) == 0
    assert main(["analyze", str(ROOT), "--tui", "-j", "2"]) == 0
    assert main(["tui", str(ROOT)]) == 0
    assert seen == [{"dask": "tcp://sched:8786", "workers": 3, "use_summaries": False},
                    {"dask": None, "workers": 2, "use_summaries": True},
                    {"dask": None, "workers": None, "use_summaries": True}]   # open_analysis's defaults


@needs_straggler
@timed
async def test_app_runs_its_analysis_on_the_engine_asked_for(monkeypatch):
    import fsdpdoctor.pipeline as pipeline

    made = []
    real = pipeline.make_engine

    def spy(dask=None, workers=None, total_bytes=None, n_units=0):
        engine = real(dask, workers, total_bytes, n_units)
        made.append((dask, workers, type(engine).__name__))
        return engine

    monkeypatch.setattr(pipeline, "make_engine", spy)
    app = FsdpDoctorApp(STRAGGLER, engine={"workers": 2, "use_summaries": False})
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(app, pilot)
        assert app.error is None and not isinstance(app.screen, LoadingScreen)
        assert made == [(None, 2, "LocalEngine")]          # both ranks mapped by a pool of 2 processes
        assert [r.rank for r in app.analysis.ranks] == [0, 1]
        assert "Rank 1 is a straggler" in dump(app)           # the analysis is on screen
    # the same result as in this process, one rank at a time
    from fsdpdoctor.report.json_report import to_json

    serial = open_analysis(STRAGGLER, workers=1, use_summaries=False)
    assert to_json(app.analysis, include_events=True) == to_json(serial, include_events=True)


@needs_straggler
@timed
async def test_tab_cycles_panes_and_straggler_marked():
    app = FsdpDoctorApp(analysis=straggler_analysis())
    async with app.run_test(size=(80, 24)) as pilot:
        tabs = app.query_one("#panes")
        await pilot.press("tab")
        assert tabs.active == "tab-ranks"
        await pilot.pause()
        assert app.focused.id == "ranks-table"
        assert "1 ◀ slow" in dump(app)
        await pilot.press("tab")
        assert tabs.active == "tab-collectives"
        await pilot.pause()
        assert "all_reduce" in dump(app)
        await pilot.press("tab", "tab")
        assert tabs.active == "tab-findings"
        await pilot.press("shift+tab")
        assert tabs.active == "tab-timeline"


@needs_straggler
@timed
async def test_help_screen_and_theme_switch():
    app = FsdpDoctorApp(analysis=straggler_analysis())
    async with app.run_test(size=(80, 24)) as pilot:
        await check_help_theme_quit(app, pilot, HelpScreen, "filter findings")
    assert app.return_code == 0


@needs_straggler
@timed
async def test_loads_path_in_worker_with_progress(monkeypatch):
    seen = []
    original = LoadingScreen.update_progress

    def spy(self, name, done, total):
        seen.append((name, done, total))
        original(self, name, done, total)

    monkeypatch.setattr(LoadingScreen, "update_progress", spy)
    app = FsdpDoctorApp(STRAGGLER)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(app, pilot)
        assert app.analysis is not None and app.error is None
        assert not isinstance(app.screen, LoadingScreen)
        assert seen and seen[-1][1] == seen[-1][2] == 2
        assert app.label == "straggler" or app.label.endswith("traces/straggler")
        assert str(ROOT) not in dump(app)


@timed
async def test_bad_path_shows_error_screen():
    app = FsdpDoctorApp("no/such/trace")
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(app, pilot)
        assert isinstance(app.screen, ErrorScreen)
        text = dump(app)
        assert "no/such/trace: no such file or directory" in text
        assert "press q to quit" in text
        await pilot.press("q")
    assert app.return_code == 2


@timed
async def test_corrupt_trace_shows_error_screen(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [ {"ph": "X", "na')
    app = FsdpDoctorApp(bad)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(app, pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert app.error and "rank0.json" in app.error
        assert "Traceback" not in dump(app)


def test_cli_missing_path_is_one_line(capsys):
    assert main(["tui", "/nope"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fsdpdoctor: error: /nope: no such file or directory"
    assert main(["analyze", "/nope", "--tui"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_bad_selection_args_fail_before_launch(capsys, tmp_path):
    assert main(["tui", str(tmp_path), "--steps", "x-y"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_display_name_never_absolute(tmp_path):
    assert display_name("traces/straggler/") == "traces/straggler"
    assert display_name(tmp_path / "run7") == "run7"


@pytest.mark.skipif(not RECSYS.exists(), reason="public traces not present (../shared or $FSDPDOCTOR_SHARED)")
@timed
async def test_public_trace_128_rank_job():
    app = FsdpDoctorApp(RECSYS)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(app, pilot)
        text = dump(app)
        assert "world 128" in text and "recsys_2_of_128_ranks" in text
        assert str(SHARED) not in text
        await pilot.press("3")
        await pilot.pause()
        assert "all_to_all" in dump(app)


def _expected(folder: Path) -> list[str]:
    return EXPECTED[folder]["must"] if folder in EXPECTED else []


EXPECTED = expectations()
REAL = sorted(p for p in EXPECTED if p.parent == TRACES and _expected(p))


@pytest.mark.parametrize("folder", REAL[:3] or [pytest.param(None, marks=pytest.mark.skip("no bundled traces"))],
                         ids=lambda p: p.name if p else "none")
@timed
async def test_real_findings(folder):
    """Once the rules land: the expected findings are listed and their fix is shown."""
    a = open_analysis(folder)
    if not a.findings:
        pytest.skip("diagnosis rules produce no findings yet")
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(FindingsPane)
        ids = [f.id for f in pane.shown]
        for must in _expected(folder):
            assert must in ids
        # root causes most costly first, each followed at once by the findings it explains (most costly
        # first): a consequence is listed under its root, not by its own impact among the roots
        roots = [f for f in pane.shown if not f.caused_by or f.caused_by not in ids]
        assert [f.impact_us for f in roots] == sorted((f.impact_us for f in roots), reverse=True)
        for root in roots:
            at = pane.shown.index(root)
            group = [f for f in pane.shown if f.caused_by == root.id]
            assert pane.shown[at + 1:at + 1 + len(group)] == group
            assert [f.impact_us for f in group] == sorted((f.impact_us for f in group), reverse=True)
        must = _expected(folder)[0]
        await pilot.press("slash", *f"id:{must}", "enter")
        assert pane.current is not None and pane.current.id == must
        assert app.query_one(FixText).text == pane.current.fix


# -- snapshots ---------------------------------------------------------------------
async def _go(pilot, *keys):
    await pilot.press(*keys)
    await pilot.pause()


@needs_fsdp1
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot_findings(snap_compare, size):
    assert snap_compare(FsdpDoctorApp(analysis=real(FSDP1)), terminal_size=size)


@needs_straggler
def test_snapshot_finding_fix_focused(snap_compare):
    assert snap_compare(FsdpDoctorApp(analysis=straggler_analysis()), press=["enter"], terminal_size=(120, 40))


@needs_straggler
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot_timeline(snap_compare, size):
    assert snap_compare(FsdpDoctorApp(analysis=straggler_analysis()), press=["4"], terminal_size=size)


@needs_straggler
def test_snapshot_ranks_light(snap_compare):
    app = FsdpDoctorApp(analysis=straggler_analysis(), light=True)
    assert snap_compare(app, press=["2"], terminal_size=(80, 24))


@needs_fsdp1
def test_snapshot_no_findings(snap_compare):
    a = real(NO_FINDINGS)
    a.findings = []  # pinned: the healthy run, whatever the rules say about it later
    assert snap_compare(FsdpDoctorApp(analysis=a), terminal_size=(80, 24))


@needs_straggler
def test_snapshot_help(snap_compare):
    assert snap_compare(FsdpDoctorApp(analysis=straggler_analysis()), press=["question_mark"],
                        terminal_size=(80, 24))


def test_snapshot_error(snap_compare):
    async def wait(pilot):
        await loaded(pilot.app, pilot)

    assert snap_compare(FsdpDoctorApp("no/such/trace"), run_before=wait, terminal_size=(80, 24))


def _dropped_events_analysis(tmp_path: Path):
    """traces/straggler with a few of rank 1's operator events made unreadable: the loader drops and
    counts them, and the analysis says so in its data quality."""
    import gzip
    import shutil

    run = tmp_path / "straggler_damaged"
    shutil.copytree(STRAGGLER, run)
    doc = json.loads(gzip.decompress((run / "rank1.json.gz").read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    for e in ops[:3]:
        e["dur"] = -5.0      # a negative duration
    ops[3]["ts"] = "late"   # a time that is not a number
    (run / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    a = open_analysis(run, use_summaries=False)
    a.source = "traces/straggler_damaged"
    return a


@needs_straggler
@timed
async def test_data_quality_is_on_the_header_and_behind_d(tmp_path):
    from fsdpdoctor.report.data_quality import lines
    from fsdpdoctor.tui.screens import NotesScreen

    a = _dropped_events_analysis(tmp_path)
    quality = lines(a.data_quality)
    assert quality and "dropped" in quality[0]
    app = FsdpDoctorApp(analysis=a)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "data quality: rank 1: dropped" in dump(app)
        await pilot.press("d")
        assert isinstance(app.screen, NotesScreen)
        text = dump(app)
        assert all(line[:40] in text.replace("\n", " ") or line[:20] in text for line in quality)
        await pilot.press("escape")
        assert not isinstance(app.screen, NotesScreen)
    clean = FsdpDoctorApp(analysis=straggler_analysis())
    async with clean.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "data quality" not in dump(clean)


@needs_straggler
def test_snapshot_data_quality(snap_compare, tmp_path):
    assert snap_compare(FsdpDoctorApp(analysis=_dropped_events_analysis(tmp_path)), terminal_size=(80, 24))
