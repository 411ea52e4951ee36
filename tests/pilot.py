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
