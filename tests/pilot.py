"""Helpers shared by the Textual pilot tests (test_tui.py, test_tui_scaling.py)."""

from __future__ import annotations

import asyncio
import functools

import pytest

TIMEOUT = 30  # seconds for any one pilot test: a stuck UI fails instead of hanging the suite


def dump(app) -> str:
    """The screen as plain text."""
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def timed(fn):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        async with asyncio.timeout(TIMEOUT):
            return await fn(*args, **kwargs)

    return pytest.mark.asyncio(wrapper)


async def check_help_theme_quit(app, pilot, help_screen, help_text: str) -> None:
    """`?` opens help (showing ``help_text``), escape closes it, `t` switches to a light theme, `q` quits."""
    await pilot.press("question_mark")
    assert isinstance(app.screen, help_screen)
    assert help_text in dump(app)
    await pilot.press("escape")
    assert not isinstance(app.screen, help_screen)
    theme = app.theme
    await pilot.press("t")
    await pilot.pause()
    assert app.theme != theme and "light" in app.theme
    await pilot.press("q")
