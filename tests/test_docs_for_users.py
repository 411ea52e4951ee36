"""README.md and docs/*.md are for users: no numbered work periods, commit ids of this project, UTC
times or machine loads. Figures that need a date or a load beside them live in benchmarks/README.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

HISTORY = {
    "a numbered work period": re.compile(r"\bsession \d+", re.I),
    "a commit id": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a UTC time": re.compile(r"\b\d\d:\d\d(:\d\d)? UTC\b"),
    "a machine load": re.compile(r"\bload( average)?( \(1 min\))? \d", re.I),
}
# another project's commit is part of where its trace comes from: a link or an owner/repo@commit source;
# and what the tool prints, quoted ("host load 7.9-8.4 on 2 cores"), is an example, not a log
_SOURCES = re.compile(r'https?://\S+|[\w.-]+/[\w.-]+@[0-9a-f]{7,40}\b|\("[^"]*"\)')


def history(text: str) -> list[str]:
    """What in ``text`` belongs in a lab notebook, each with its line number."""
    bare = _SOURCES.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)   # the line numbers kept
    out = []
    for n, line in enumerate(bare.splitlines(), 1):
        out += [f"line {n}: {what}: {m.group()!r}" for what, rx in HISTORY.items() for m in rx.finditer(line)]
    return out


def test_the_guard_finds_what_it_looks_for():
    found = history("session 11 on b7a45ae, 2026-11-27 18:33 UTC, load 0.6; load average 2.5\n"
                    "from [x](https://github.com/o/r/blob/f4d0062c/a.json) and o/r@171dd747\n"
                    "1234567 events at 0xdeadbeef; it prints (\"host load 2.5\nover 2 cores\")")
    assert [f.split(": ")[1] for f in found] == ["a numbered work period", "a commit id", "a UTC time",
                                                  "a machine load", "a machine load"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_pages_hold_no_lab_notebook(page):
    assert not history(page.read_text()), history(page.read_text())


def test_readme_is_short_and_readable():
    """Under 200 lines, none of them a log: the measurements live in benchmarks/README.md."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200
    assert max(map(len, lines)) <= 200, max(lines, key=len)
