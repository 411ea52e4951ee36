"""Text for the terminal that wraps between words, never inside a figure, continuation lines indented.

Rich breaks a line at any space, so "32.8 ms" or "46.3 %" can end one line with the number and start the
next with its unit, and a wrapped line goes on at column 0. ``Prose`` is a ``rich.text.Text`` whose
wrapping keeps a number and its unit together and indents each continuation two columns past its own
line's indent (a "- " item goes on under its text). Every ``str`` and top-level ``Text`` the terminal
console prints is wrapped this way (report/terminal.py); renderers put ``Prose`` inside panels and tables.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.containers import Lines
from rich.measure import Measurement
from rich.text import Text

HANG = 2   # a continuation line starts this many columns right of its line's own indent
# a word: a run of non-space characters, a number with its unit ("12.5 ms", "(46.3 %)", "1.9 MB,"), or an
# interval ("[25.6, 40.1]/step")
_UNIT = r"(?:ms|us|µs|ns|s|min|h|%|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)(?!\w)"
_WORD = re.compile(rf"\S*\[[-+.\d]+, [-+.\d]+\]\S*|\S*\d {_UNIT}\S*|\S+")


def continuation_indent(line: str, width: int, hang: int = HANG) -> int:
    """Where a wrapped line goes on: its own indent plus ``hang``, at most half the width."""
    return min(len(line) - len(line.lstrip(" ")) + hang, width // 2)


def breaks(line: str, width: int, hang: int = HANG) -> list[int]:
    """Offsets in ``line`` (no newline) where the next line starts, for lines of ``width`` cells whose
    continuations are indented by the line's indent plus ``hang``. A word longer than a line is folded."""
    indent = continuation_indent(line, width, hang)
    offsets: list[int] = []
    col, prev_end = 0, 0
    for m in _WORD.finditer(line):
        start, end = m.span()
        gap = cell_len(line[prev_end:start])
        if prev_end and col + gap + cell_len(m.group()) > width:
            offsets.append(start)
            col = indent
        else:
            col += gap
        pos = start
        while col + cell_len(line[pos:end]) > width and end - pos > 1:   # fold what fits on no line
            pos += max(1, width - col)
            offsets.append(pos)
            col = indent
        col += cell_len(line[pos:end])
        prev_end = end
    return offsets


class Prose(Text):
    """A ``Text`` that wraps as ``breaks`` says; with ``no_wrap`` or a centred/right/full justification it
    is laid out as a plain ``Text``."""

    def wrap(self, console, width, *, justify=None, overflow=None, tab_size=8, no_wrap=None) -> Lines:
        mode = justify or self.justify
        if no_wrap or self.no_wrap or overflow == "ignore" or mode in ("center", "right", "full") or width < 4:
            return super().wrap(console, width, justify=justify, overflow=overflow, tab_size=tab_size,
                                no_wrap=no_wrap)
        lines = Lines()
        for line in self.split(allow_blank=True):
            if "\t" in line:
                line.expand_tabs(tab_size)
            plain = line.plain
            indent = continuation_indent(plain, width)
            for i, piece in enumerate(line.divide(breaks(plain, width))):
                piece.rstrip()
                if i:
                    piece.pad_left(indent)
                lines.append(piece)
        return lines

    def __rich_measure__(self, console, options) -> Measurement:
        """As a Text measures, with a figure and its unit as one word, and room for a word on a
        continuation line (a table column is never too narrow for either)."""
        lines = self.plain.splitlines()
        widest = max(map(cell_len, lines), default=0)
        words = _WORD.findall(self.plain)
        if not words:
            return Measurement(widest, widest)
        longest = max(map(cell_len, words))
        return Measurement(min(widest, longest + HANG if len(words) > 1 else longest), widest)


def prose(text: str | Text = "", style: str = "") -> Prose:
    """``text`` (a str, or a Text whose styled spans are kept) as ``Prose``."""
    if isinstance(text, Prose):
        return text
    if isinstance(text, str):
        return Prose(text, style=style)
    out = Prose(text.plain, style=text.style, justify=text.justify, overflow=text.overflow,
                no_wrap=text.no_wrap, end=text.end)
    out._spans = list(text._spans)   # noqa: SLF001  (the spans, as Text.copy keeps them)
    return out
