"""The one rich console every report prints through: text from files is shown, never obeyed.

Rich passes an ``ESC`` or a C1 byte inside a text straight to the terminal; this console writes
them visibly (``visible_text.visible_lines``) in every segment of text it renders, after layout and
before rich adds its own styling codes (which are control segments or styles, never text)."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.segment import Segment

from fsdpdoctor.visible_text import has_unsafe, visible_lines


class VisibleConsole(Console):
    def render(self, renderable, options=None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and has_unsafe(seg.text):
                yield Segment(visible_lines(seg.text), seg.style)
            else:
                yield seg


def terminal_console(**kwargs) -> Console:
    """A rich ``Console`` (same arguments) whose output holds no control byte taken from a file."""
    return VisibleConsole(**kwargs)
