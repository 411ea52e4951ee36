"""The TUI's sink for text from files: every line the screen is about to receive is made visible.

Widgets lay out text as given (an ``ESC`` is 0 cells wide to rich), and Textual writes each line's
segments raw, so a trace's frame name holding ``ESC[2J`` or OSC 52 would reach the terminal. The apps
(``FsdpDoctorApp``, ``HangApp``, ``ScalingApp``) derive from ``VisibleTextApp``, which rewrites the
text of each line of every screen update with ``visible_text.visible_lines`` just before it is
written. A line that held such a character is cut back to its width, so it stays inside its pane.

Textual has no public hook at this point: ``_display`` and the update classes below are its
internals (textual 8). Should they change, ``tests/test_untrusted_text.py`` fails rather than the
screen receiving raw bytes unnoticed."""

from __future__ import annotations

from rich.segment import Segment
from textual._compositor import ChopsUpdate, InlineUpdate, LayoutUpdate
from textual.strip import Strip

from fsdpdoctor.visible_text import has_unsafe, visible_lines


def visible_strip(strip: Strip) -> Strip:
    """``strip`` itself, or a copy of it whose text has no control byte, at most as wide."""
    if not any(seg.control is None and has_unsafe(seg.text) for seg in strip):
        return strip
    segs = [Segment(visible_lines(s.text).replace("\n", "\\x0a").replace("\t", " "), s.style)
            if s.control is None and has_unsafe(s.text) else s for s in strip]
    return Strip(segs).crop(0, strip.cell_length)


def visible_update(update):
    """A Textual screen update with every line through ``visible_strip``."""
    if isinstance(update, LayoutUpdate):
        update.strips = [[visible_strip(s) for s in line] for line in update.strips]
    elif isinstance(update, InlineUpdate):
        update.strips = [visible_strip(s) for s in update.strips]
    elif isinstance(update, ChopsUpdate):
        update.chops = [{x: None if s is None else visible_strip(s) for x, s in chop.items()} for chop in update.chops]
    return update


class VisibleTextApp:
    """Mixed in before ``textual.app.App``: screen updates carry no control byte from a file, and
    neither does what is copied to the clipboard (a pasted ``ESC[201~`` ends a bracketed paste)."""

    def _display(self, screen, renderable) -> None:
        super()._display(screen, visible_update(renderable))

    def copy_to_clipboard(self, text: str) -> None:
        super().copy_to_clipboard(visible_lines(text))
