"""Text that came from a file, made safe where it meets a terminal or a structured format.

A trace, a manifest, a hang dump or a folder name can hold any bytes: ``ESC[2J`` clears the screen,
OSC 0 sets the window title, OSC 52 writes the clipboard (tmux passes it on), a C1 ``CSI`` (U+009B)
does on some terminals what ``ESC [`` does, bidirectional overrides reorder what is read (U+202E),
and a lone surrogate (an undecodable file-name byte) makes the print itself fail. The sinks show
such characters as visible escapes (``\\x1b``, ``\\u202e``) instead: the rich console
(``report/terminal.py``), the TUI (``tui/palette.py``), one-line errors (``cli.py``) and the JUnit
file (``report/junit.py``). ``--json`` needs nothing: ``json.dumps`` escapes every one of them and
keeps the text exact.
"""

from __future__ import annotations

import re
from functools import cache

# C0 but tab and newline, DEL, C1, the Unicode line separators and bidirectional controls, lone surrogates,
# and the two non-characters XML refuses (what is left is valid XML 1.0 text)
_IN_LINES = ("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
             "\ud800-\udfff\ufffe\uffff]")
# the same plus tab and newline: text that must stay on one line
_IN_ONE_LINE = ("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                "\ud800-\udfff\ufffe\uffff]")
_SURROGATES = "[\ud800-\udfff]"


@cache
def _pattern(chars: str) -> re.Pattern:
    """A class compiled when first used: ~2 ms for the three at every start, and ``analyze --json``
    of a run without a manifest uses none of them."""
    return re.compile(chars)


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str) -> str:
    """``text`` on one line, every control or escape character written as ``\\xNN`` / ``\\uNNNN``."""
    unsafe = _pattern(_IN_ONE_LINE)
    return text if unsafe.search(text) is None else unsafe.sub(_escape, text)


def visible_lines(text: str) -> str:
    """``visible`` keeping newlines and tabs (a report of several lines)."""
    unsafe = _pattern(_IN_LINES)
    return text if unsafe.search(text) is None else unsafe.sub(_escape, text)


def encodable(value):
    """``value`` (text, or lists and mappings of it, as ``json.loads`` gives) with every lone surrogate
    written as ``\\udcNN``: JSON's ``"\\udc9b"`` escape decodes to one, which no UTF-8 writer (a summary,
    a terminal) accepts. The same convention as a file name's odd bytes (``trace.io.shown``)."""
    if isinstance(value, str):
        surrogate = _pattern(_SURROGATES)
        return value if surrogate.search(value) is None else surrogate.sub(_escape, value)
    if isinstance(value, list):
        return [encodable(v) for v in value]
    if isinstance(value, dict):
        return {encodable(k) if isinstance(k, str) else k: encodable(v) for k, v in value.items()}
    return value


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds a character ``visible_lines`` would escape."""
    return _pattern(_IN_LINES).search(text) is not None
