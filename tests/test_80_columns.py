"""Every output at 80 columns (issue 30 item 6), in one place: each verb's text at ``COLUMNS=80`` and
each TUI screen at 80x24 (the main app's panes and its step-series modal, help, hang, scaling). No line is wider than 80 and no word is cut: every word shown at 80 columns is a word of
the same output at a width where nothing has to give (a header cut to "most time fir" would show
"fir", a word the wide output does not hold). Tokens of 20 characters or more (paths, calls) may be
folded; a cell that wraps at a space keeps its words whole and passes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from bundled import TRACES
from pilot import dump

from fsdpdoctor.cli import main

WIDE = 200
UNWRAPPED = 2000   # wide enough that no paragraph wraps
_WORD = re.compile(r"[A-Za-z]{2,}")
_TOKEN = re.compile(r"[^\s│┃|]+")


def _tokens(text: str) -> set[str]:
    return set(_TOKEN.findall(text))


def _cut_words(narrow: str, wide: str) -> set[str]:
    """Words of ``narrow`` that ``wide`` does not hold, outside the pieces of its long tokens (a path,
    a call) folded over lines."""
    whole = _tokens(wide)
    long_tokens = [t for t in whole if len(t) >= 20]
    words = set(_WORD.findall(" ".join(whole)))
    odd = {t for t in _tokens(narrow) - whole if not any(t in lt for lt in long_tokens)}
    return {w for t in odd for w in _WORD.findall(t)} - words


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
    "steps": ["steps", "traces/periodic_checkpoint"],
    "diff-comm-kinds": ["diff", "traces/ddp_default", "traces/straggler"],
    "analyze-cuda": ["analyze", "traces/cuda/ddp_default", "--no-progress"],
    "memory-fits": ["memory", "--params", "7B", "--strategy", "ddp", "--world-size", "4", "--gpu-memory", "80GB"],
    "whatif-set": ["whatif", "traces/dataloader_slow", "--set", "num_workers=2", "--no-progress"],
    "whatif-world-size": ["whatif", "traces/scaling_2proc", "--world-size", "64", "--link-gbps", "400",
                          "--no-progress"],
    "whatif-withheld": ["whatif", "traces/weak_2rank", "--world-size", "4", "--ranks-per-host", "4",
                        "--no-progress"],
}


def _text(verb: str, columns: int, tmp: Path, monkeypatch, capsys, extra: tuple = ()) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    # in a folder of its own (what the verbs write goes there), with the bundled traces at a short
    # relative path as a user would type it
    monkeypatch.chdir(tmp)
    if not (tmp / "traces").exists():
        (tmp / "traces").symlink_to(TRACES)
    shutil.rmtree(tmp / "run", ignore_errors=True)   # a run folder of a job to come (trigger), fresh each
    (tmp / "run").mkdir()                           # time: a second request while one waits is refused
    argv = [a.replace("{tmp}/", "") for a in TEXT_VERBS[verb]] + list(extra)
    rc = main(argv)
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    return out.out.splitlines()


# a figure's unit: a line never starts with one (its number would end the line above)
_UNIT_FIRST = re.compile(r"(ms|us|µs|ns|s|%|B|KB|MB|GB|TB|KiB|MiB|GiB|GB/s)(?!\w)")
_BORDER = "│┃|"



def _body(line: str) -> str:
    """A line without a panel's borders, its indent kept."""
    return line[1:] if line[:1] in _BORDER else line


def _words(line: str) -> str:
    """A line's text: no borders, spaces between cells as one."""
    return " ".join(_body(line).rstrip().rstrip(_BORDER).split())


def _cells(line: str) -> list[str]:
    """A line's cells: its text split at borders and at runs of two spaces or more."""
    return [" ".join(c.split()) for c in re.split(r"\s{2,}|[│┃]", _body(line).strip())]


def _is_rule(c: str) -> bool:
    return "\u2500" <= c <= "\u257f" and c not in _BORDER


def _indent(line: str) -> int:
    b = _body(line)
    return len(b) - len(b.lstrip(" "))


def _layout_problems(narrow_lines: list[str], wide_lines: list[str]) -> list[str]:
    """Lines that end in spaces, start with a figure's unit, or go on from the line above (a line of the
    narrow text that starts no line of the wide one) at or left of that line's indent."""
    starts = [_words(w) for w in wide_lines]
    starts = [w for w in starts if w]
    rows = [c for c in map(_cells, wide_lines) if len(c) > 2]   # a table's rows
    bad, start_indent, above, in_table = [], 0, "", False
    for ln in narrow_lines:
        if ln != ln.rstrip():
            bad.append(f"trailing spaces: {ln!r}")
        text = _words(ln)
        if not text or _is_rule(text[0]):   # a blank line, a panel's top or bottom, a table's rule
            in_table = bool(text) and not text.startswith(("╭", "╰"))   # a table's rows follow its rule
            continue
        if _UNIT_FIRST.match(text) and above[-1:].isdigit():
            bad.append(f"a figure parted from its unit: {above!r} / {text!r}")
        cells = _cells(ln)
        if in_table or not cells[0] or _body(ln).count("│") > 1:   # a cell wraps in its column
            continue
        # a line of its own, or a table row whose first cell wrapped
        if any(w.startswith(text) for w in starts) or any(r[0].startswith(cells[0]) for r in rows):
            start_indent = _indent(ln)
        elif _indent(ln) <= start_indent:
            bad.append(f"continuation not indented: {ln!r}")
        above = text
    return bad


@pytest.mark.parametrize("verb", sorted(TEXT_VERBS))
def test_every_verb_fits_80_columns_words_whole(verb, tmp_path, monkeypatch, capsys):
    narrow_lines = _text(verb, 80, tmp_path, monkeypatch, capsys)
    assert narrow_lines, "no output"
    too_wide = [ln for ln in narrow_lines if len(ln.rstrip()) > 80]
    assert not too_wide, too_wide[:3]
    narrow = "\n".join(narrow_lines)
    # the same text where nothing has to give (steps draws at --width, not at COLUMNS)
    extra = ("--width", str(WIDE)) if verb == "steps" else ()
    wide = "\n".join(_text(verb, WIDE, tmp_path, monkeypatch, capsys, extra))
    assert not _cut_words(narrow, wide), (_cut_words(narrow, wide), narrow)
    # where no line wraps, every line starts one of the 80-column text's lines
    extra = ("--width", str(UNWRAPPED)) if verb == "steps" else ()
    whole = _text(verb, UNWRAPPED, tmp_path, monkeypatch, capsys, extra)
    assert not _layout_problems(narrow_lines, whole), (_layout_problems(narrow_lines, whole), narrow)
    # a table row holding nothing but a mark is a cell that broke off its row
    assert not [ln for ln in narrow_lines if ln.strip(" │┃|") == "*"], narrow
    if "comm[all reduce]" in wide:   # a component's name is never split over two rows
        assert "comm[all reduce]" in narrow, narrow


def _bundled_runs() -> list[str]:
    return sorted(p.name for p in TRACES.iterdir() if p.is_dir() and not p.name.startswith(("hang_", "cuda", "ab"))
                  and any(p.glob("*.json*"))) if TRACES.is_dir() else []


@pytest.mark.parametrize("run", _bundled_runs())
def test_every_bundled_report_at_80_columns(run, monkeypatch):
    """The analyze report of every bundled run at 80 columns: no trailing spaces, no figure parted from
    its unit, every wrapped line indented under its start; and no "data quality" line on a run whose
    loader dropped and set aside nothing."""
    import io

    from fsdpdoctor.pipeline import open_analysis
    from fsdpdoctor.report.console import render
    from fsdpdoctor.report.terminal import terminal_console

    monkeypatch.chdir(TRACES.parent)   # the path in the panel's title as a user types it
    a = open_analysis(f"traces/{run}")

    def shown(width: int) -> list[str]:
        out = io.StringIO()
        render(a, terminal_console(file=out, width=width, color_system=None, highlight=False))
        return out.getvalue().splitlines()

    narrow, wide = shown(80), shown(UNWRAPPED)
    assert max(map(len, narrow)) <= 80
    assert not _layout_problems(narrow, wide), (_layout_problems(narrow, wide), "\n".join(narrow))
    assert not _cut_words("\n".join(narrow), "\n".join(wide))
    assert any(ln.startswith("data quality: ") for ln in narrow) == (not a.data_quality.clean)


# -- the TUI at 80x24 --------------------------------------------------------------------------------

def _shot(app) -> str:
    """The screen as text; with a modal open, only the modal's box (beside it the screen below shows
    through, cut by the box, not by its layout)."""
    from textual.screen import ModalScreen

    text = dump(app)
    if not isinstance(app.screen, ModalScreen):
        return text
    r = app.screen.children[0].region
    return "\n".join(ln[r.x:r.x + r.width] for ln in text.splitlines()[r.y:r.y + r.height])


async def _settled(app, pilot) -> str:
    """The screen once two looks in a row agree: on a loaded machine one pause can catch a frame whose
    footer is still being laid out (words cut in a screen the next refresh shows whole)."""
    last = None
    for _ in range(40):
        await pilot.pause()
        shot = _shot(app)
        if shot == last:
            break
        last = shot
    return shot


async def _screens(app, size, keys) -> list[str]:
    """The screen after loading, then after each key of ``keys`` (a pane, a modal)."""
    shots = []
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()
        shots.append(await _settled(app, pilot))
        for k in keys:
            await pilot.press(k)
            shots.append(await _settled(app, pilot))
            if type(app.screen).__name__ == "StepsScreen":   # the plot fits its modal: no row wraps
                whole = {ln.strip() for ln in app.screen.lines} | {""}
                rows = [ln.strip("│ ▄▀▁▂▃▅▆▇█▉▊▋▌▍▎▏") for ln in shots[-1].splitlines()[1:-1]]
                broken = [r for r in rows if r not in whole and not r.startswith(("[ and ]", "closes"))]
                assert not broken, (broken, shots[-1])
    return shots


def _timed(fn):
    """Two apps and a dozen screens: a longer bound than pilot.timed's 30 s, for a loaded machine."""
    import asyncio
    import functools

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        async with asyncio.timeout(180):
            return await fn(*args, **kwargs)

    return pytest.mark.asyncio(wrapper)


def _main_app():
    from fsdpdoctor.tui.app import FsdpDoctorApp

    return FsdpDoctorApp(TRACES / "periodic_checkpoint")


# the four panes (1-4: findings, ranks, collectives, timeline), the step series (s), help
MAIN_KEYS = ["1", "2", "3", "4", "s", "escape", "question_mark"]


def _check_screens(narrow: list[str], wide: list[str]) -> None:
    for i, (n, w) in enumerate(zip(narrow, wide)):
        assert max(map(len, n.splitlines())) <= 80
        assert not _cut_words(n, w), (i, _cut_words(n, w), n)


@_timed
async def test_tui_screens_fit_80x24_words_whole():
    narrow = await _screens(_main_app(), (80, 24), MAIN_KEYS)
    wide = await _screens(_main_app(), (WIDE, 60), MAIN_KEYS)
    assert "step time of 2 ranks" in narrow[5]
    _check_screens(narrow, wide)


@_timed
async def test_hang_tui_fits_80x24_words_whole():
    from fsdpdoctor.hang_pipeline import open_hang
    from fsdpdoctor.tui.hang_app import HangApp

    rep = open_hang(str(TRACES / "hang_loader"))
    narrow = await _screens(HangApp(rep), (80, 24), ["up", "question_mark"])
    wide = await _screens(HangApp(rep), (WIDE, 60), ["up", "question_mark"])
    _check_screens(narrow, wide)


@_timed
async def test_scaling_tui_fits_80x24_words_whole():
    from fsdpdoctor.cli import build_parser
    from fsdpdoctor.commands.scaling import build_report
    from fsdpdoctor.tui.scaling_app import ScalingApp

    args = build_parser().parse_args(["scaling", str(TRACES / "scaling_1proc"), str(TRACES / "scaling_2proc")])
    rep = build_report(args)
    narrow = await _screens(ScalingApp(rep), (80, 24), ["question_mark"])
    wide = await _screens(ScalingApp(rep), (WIDE, 60), ["question_mark"])
    _check_screens(narrow, wide)
