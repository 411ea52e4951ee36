"""The one severity scale, mildest first: every finding (analysis, hang, scaling) is on it, and
whatever orders or gates findings (check --fail-on, the rules' folding, diff, the TUI) reads it here.
Its own module (re-exported by ``fsdpdoctor.results``) so that a verb's flags can name it without
loading the result types."""

from __future__ import annotations

from typing import Literal, get_args

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
