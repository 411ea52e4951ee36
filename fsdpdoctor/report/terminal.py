"""The one rich console every report prints through: text from files is shown, never obeyed.

Rich passes an ``ESC`` or a C1 byte inside a text straight to the terminal; this console writes
them visibly (``visible_text.visible_lines``) in every segment of text it renders, after layout and
before rich adds its own styling codes (which are control segments or styles, never text).

It also lays text out for a reader: every string or ``Text`` printed alone wraps as ``Prose``
(a number never parted from its unit, continuation lines indented: report/prose.py), and no line it
writes ends in spaces (rich pads panels, tables and padded blocks to the full width)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from fsdpdoctor.report.prose import prose
from fsdpdoctor.visible_text import has_unsafe, visible_lines


def _no_trailing_spaces(segments: Iterable[Segment]) -> Iterable[Segment]:
    """The segments with the spaces before each newline (and at the end) left out; a space with a
    background colour is shown, not padding."""
    pending: list[Segment] = []   # spaces not yet known to end a line
    for seg in segments:
        if seg.control is not None or (seg.style is not None and seg.style.bgcolor is not None):
            yield from pending
            pending.clear()
            yield seg
            continue
        for i, part in enumerate(seg.text.split("\n")):
            if i:
                pending.clear()
                yield Segment.line()
            body = part.rstrip(" ")
            if body:
                yield from pending
                pending.clear()
                yield Segment(body, seg.style)
            if len(body) < len(part):
                pending.append(Segment(part[len(body):], seg.style))


class VisibleConsole(Console):
    def render(self, renderable, options=None) -> Iterable[Segment]:
        def visible():
            for seg in super(VisibleConsole, self).render(renderable, options):
                if seg.control is None and has_unsafe(seg.text):
                    yield Segment(visible_lines(seg.text), seg.style)
                else:
                    yield seg
        return _no_trailing_spaces(visible())

    def print(self, *objects, **kwargs) -> None:
        if len(objects) == 1 and isinstance(objects[0], (str, Text)):
            one = objects[0]
            if isinstance(one, str):
                one = self.render_str(one, **{k: kwargs[k] for k in _STR_OPTIONS if k in kwargs})
            one = prose(one)
            one.end = kwargs.get("end", "\n")
            objects = (_Whole(one),)
        super().print(*objects, **kwargs)


_STR_OPTIONS = ("emoji", "markup", "highlight", "justify", "overflow")


class _Whole:
    """One text printed as itself: rich joins the texts of one print into a new plain ``Text``."""

    def __init__(self, text: Text):
        self.text = text

    def __rich_console__(self, console, options):
        yield self.text


def terminal_console(**kwargs) -> Console:
    """A rich ``Console`` (same arguments) whose output holds no control byte taken from a file."""
    return VisibleConsole(**kwargs)
