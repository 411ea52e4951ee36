"""Text that came from a file is shown, never obeyed (issue 33 item 1).

Every string field of a trace, a manifest, a hang dump and the run folder's name is given
``ESC[2J`` (clear screen), OSC 0 (window title), OSC 52 (clipboard write), a C1 CSI, other C0
controls, DEL and a bidirectional override. Whatever the verbs print (analyze, check --junit, diff,
hang, steps, one-line errors), whatever the TUI puts on the screen, and the JUnit file hold none of
those characters raw; the JUnit file parses, and ``--json`` keeps the text exact.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.trace.vocabulary import is_comm_name
from fsdpdoctor.visible_text import visible, visible_lines

TRACES = Path(__file__).resolve().parents[1] / "traces"
HOST_SYNC, HANG = TRACES / "host_sync", TRACES / "hang_collective_order"
pytestmark = pytest.mark.skipif(not (HOST_SYNC / "rank0.json.gz").exists() or not (HANG / "hang").is_dir(),
                                reason="bundled traces not present")

# what a hostile file holds: clear screen, set the window title, write the clipboard, C1 CSI, BS, DEL, RLO
PAYLOAD = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x9b31m\x08\x7f\u202e\x00"
FOLDER = "run" + PAYLOAD.replace("\x00", "")  # a file name cannot hold NUL (nor "/")
# any of these in what reaches a terminal or a JUnit file is a defect (tab and newline are layout)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def poison(v, key=None):
    """Every string of a JSON document with the payload appended, except what names the event's kind
    (phase, category, step markers, collective names): those keep the analysis itself unchanged, so
    the text reaches every part of the report."""
    if isinstance(v, str):
        keep = key in ("ph", "cat", "Collective name", "fsdpdoctor_hang", "trigger", "format")
        return v if keep or v.startswith("ProfilerStep") or is_comm_name(v) else v + PAYLOAD
    if isinstance(v, list):
        return [poison(x) for x in v]
    if isinstance(v, dict):
        return {k: poison(x, k) for k, x in v.items()}
    return v


def hostile_run(tmp_path: Path, src: Path = HOST_SYNC, name: str = FOLDER) -> Path:
    run = tmp_path / name
    run.mkdir(parents=True)
    for f in sorted(src.glob("rank*.json.gz")):
        (run / f.name[:-3]).write_text(json.dumps(poison(json.loads(gzip.open(f).read()))))
    (run / "manifest.json").write_text(json.dumps(poison(json.loads((src / "manifest.json").read_text()))))
    if (src / "hang").is_dir():
        (run / "hang").mkdir()
        for f in (src / "hang").glob("*.json"):
            (run / "hang" / f.name).write_text(json.dumps(poison(json.loads(f.read_text()))))
    return run


def hostile_finding():
    from fsdpdoctor.results import Evidence, Finding

    return Finding(id="r" + PAYLOAD, title="t" + PAYLOAD, severity="warning", confidence=1.0, impact_us=1e3,
                   impact_frac=0.01, summary="s" + PAYLOAD, fix="f" + PAYLOAD,
                   evidence=[Evidence(text="e" + PAYLOAD, source="x" + PAYLOAD)], source="src" + PAYLOAD)


def assert_shown_not_obeyed(*texts: str) -> None:
    for text in texts:
        bad = RAW.search(text)
        assert bad is None, f"raw {bad.group()!r} in: {text[max(0, bad.start() - 60):bad.end() + 20]!r}"


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert_shown_not_obeyed(out, err)
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, out, err


def test_visible_escapes_every_control_and_keeps_the_rest():
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("\x9b\u202e\udc9b\x7f") == "\\x9b\\u202e\\udc9b\\x7f"
    assert visible("x\ny") == "x\\x0ay" and visible_lines("x\ny\tz") == "x\ny\tz"
    assert visible("ordinary text, ünïcode, 日本") == "ordinary text, ünïcode, 日本"


def test_analyze_shows_escapes_and_json_keeps_them_exact(tmp_path, capsys):
    run = hostile_run(tmp_path)
    rc, out, _ = cli(capsys, "analyze", "--no-progress", run)
    assert rc == 0 and "\\x1b]52;c;" in out  # shown, visibly
    rc, out, _ = cli(capsys, "analyze", "--no-progress", "--verbose", run)
    assert rc == 0
    rc, out, _ = cli(capsys, "analyze", "--json", "--no-progress", run)
    doc = json.loads(out)
    assert doc["source"].endswith(FOLDER)  # exact: JSON escapes what it holds
    assert doc["job"]["host_names"] if "host_names" in doc["job"] else True


def test_check_junit_parses_and_holds_no_control_byte(tmp_path, capsys):
    run = hostile_run(tmp_path)
    junit = tmp_path / "out.xml"
    rc, out, err = cli(capsys, "check", "--no-progress", "--fail-on", "info", "--junit", junit, run)
    assert rc in (0, 1), err
    xml = junit.read_text()
    assert_shown_not_obeyed(xml)
    ET.fromstring(xml)


def test_junit_of_findings_whose_every_text_is_hostile(tmp_path):
    from fsdpdoctor.report.junit import to_junit
    from synthetic import analysis

    a = analysis()
    f = hostile_finding()
    xml = to_junit(a, [f], [f.id])
    assert_shown_not_obeyed(xml)
    root = ET.fromstring(xml)
    assert "\\x1b]52;c;" in root.find("testcase/failure").text


def test_diff_and_check_baseline(tmp_path, capsys):
    run = hostile_run(tmp_path)
    saved = tmp_path / ("base" + FOLDER[3:] + ".json")
    rc, out, _ = cli(capsys, "analyze", "--json", "--no-progress", run)
    saved.write_text(out)
    rc, out, err = cli(capsys, "diff", saved, run)
    assert rc == 0, err
    rc, out, err = cli(capsys, "check", "--no-progress", "--baseline", saved, run)
    assert rc in (0, 1), err


def test_hang_dumps(tmp_path, capsys):
    run = hostile_run(tmp_path, HANG)
    rc, out, err = cli(capsys, "hang", run)
    assert rc in (0, 1), err
    assert "\\x1b" in out


def test_steps_of_a_hostile_folder(tmp_path, capsys):
    import time

    from fsdpdoctor.capture.series import SeriesWriter, encode_records, series_path

    run = tmp_path / FOLDER
    w = SeriesWriter(series_path(run, 0), 0, 1, time.time_ns())
    w.append(encode_records(0, [10_000_000, 20_000_000], 0, 0, {}))
    w.close()
    (run / "steps" / ("rank1" + FOLDER[3:] + ".steps")).write_bytes(b"not a series")
    rc, out, err = cli(capsys, "steps", run)
    assert rc == 0, err


def test_one_line_errors(tmp_path, capsys):
    run = tmp_path / FOLDER
    run.mkdir()
    (run / "rank0.json").write_text("{" + json.dumps(PAYLOAD))
    rc, out, err = cli(capsys, "analyze", "--no-progress", run)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "\\x1b" in err
    rc, out, err = cli(capsys, "analyze", "--no-progress", tmp_path / ("missing" + FOLDER))
    assert rc == 2 and len(err.strip().splitlines()) == 1


def _screen_text(app) -> str:
    """What the app would write to the terminal for its whole screen, through its own ``_display``."""
    written: list[str] = []

    class Driver:
        is_inline = False

        def write(self, data: str) -> None:
            written.append(data)

        def flush(self) -> None:
            pass

    update = app.screen._compositor.render_update(full=True)
    real = app._driver
    app._driver = Driver()
    try:
        type(app).is_headless = property(lambda self: False)
        app._display(app.screen, update)
    finally:
        del type(app).is_headless
        app._driver = real
    assert written
    return "".join(written)


def _terminal_codes_removed(screen: str) -> str:
    """The screen text without the codes the TUI itself writes (cursor moves, colours, sync)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)


def test_tui_screens(tmp_path):
    pytest.importorskip("textual")
    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.tui.app import FsdpDoctorApp

    run = hostile_run(tmp_path)
    a = open_analysis(run, diagnose=True)
    a.findings.append(hostile_finding())

    async def drive() -> list[str]:
        app = FsdpDoctorApp(analysis=a)
        screens = []
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            for key in ("down", "tab", "tab", "tab"):
                screens.append(_screen_text(app))
                await pilot.press(key)
                await pilot.pause()
            screens.append(_screen_text(app))
        return screens

    screens = asyncio.run(drive())
    joined = "".join(screens)
    assert "\\x1b" in joined  # the hostile text is on screen, visibly
    for s in screens:
        assert_shown_not_obeyed(_terminal_codes_removed(s))
        assert "\x1b]" not in s and "\x1b[2J" not in s


def test_tui_hang(tmp_path):
    pytest.importorskip("textual")
    from fsdpdoctor.commands.hang import build_report
    from fsdpdoctor.tui.hang_app import HangApp

    rep = build_report(str(hostile_run(tmp_path, HANG)))

    async def drive() -> str:
        app = HangApp(rep)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            return _screen_text(app)

    screen = asyncio.run(drive())
    assert "\\x1b" in screen
    assert_shown_not_obeyed(_terminal_codes_removed(screen))
    assert "\x1b]" not in screen


def test_a_lone_surrogate_in_a_manifest_or_hang_dump_is_text_not_a_crash(tmp_path, capsys):
    # JSON's "\udc9b" escape decodes to a lone surrogate, which no UTF-8 writer accepts: the rank summary's
    # encoder raised UnicodeEncodeError (exit 3; found by the fuzzer's text mutation). Now written as text
    def surrogate(v):
        if isinstance(v, str):
            return v + "\udc9b"
        if isinstance(v, list):
            return [surrogate(x) for x in v]
        if isinstance(v, dict):
            return {k: surrogate(x) for k, x in v.items()}
        return v

    run = tmp_path / "run"
    shutil.copytree(HOST_SYNC, run)
    (run / "manifest.json").write_text(json.dumps(surrogate(json.loads((HOST_SYNC / "manifest.json").read_text()))))
    rc, out, err = cli(capsys, "analyze", "--json", "--no-progress", run)
    assert rc == 0, err
    hang = tmp_path / "hang"
    shutil.copytree(HANG, hang)
    for f in (hang / "hang").glob("*.json"):
        f.write_text(json.dumps(surrogate(json.loads(f.read_text()))))
    rc, out, err = cli(capsys, "hang", hang)
    assert rc in (0, 1), err
