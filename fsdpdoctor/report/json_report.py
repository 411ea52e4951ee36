"""``--json``: the Analysis as a versioned document (docs/json-schema.md)."""

from __future__ import annotations

from fsdpdoctor.results import Analysis
from fsdpdoctor.results.analysis import dumps_indented


def to_json(a: Analysis, include_events: bool = False) -> str:
    d = a.to_dict(include_events=include_events)
    d["job"].pop("manifest", None) if not include_events else None
    return dumps_indented(d)
