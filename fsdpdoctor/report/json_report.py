"""``analyze --json``: the Analysis as a versioned document (docs/json-schema.md)."""

from __future__ import annotations

from fsdpdoctor.results import Analysis
from fsdpdoctor.results.analysis import dumps_indented


def document(a: Analysis, include_events: bool = False) -> dict:
    """The analysis's schema (``Analysis.to_dict``, read back by ``Analysis.from_dict``); the manifest
    goes only with ``--events``."""
    d = a.to_dict(include_events=include_events)
    if not include_events:
        d["job"].pop("manifest", None)
    return d


def to_json(a: Analysis, include_events: bool = False) -> str:
    return dumps_indented(document(a, include_events))
