"""The notebook API: ``fsdpdoctor.analyze(path)`` and pandas views of an ``Analysis``.

pandas is an optional extra (``pip install fsdpdoctor[pandas]``), imported only
when a DataFrame is asked for. Every DataFrame is a flat view of the typed
result (``fsdpdoctor.results.Analysis``): the same numbers as ``--json``.
"""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.options import Options
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.results import Analysis
from fsdpdoctor.trace.io import write_atomic
from fsdpdoctor.results.frames import collectives_df, findings_df, ranks_df, step_table_df, steps_df


def analyze(path: str | Path, options: Options | None = None, **selection) -> Analysis:
    """Load, analyse and diagnose a trace file, a run folder or a saved ``--json``; returns the typed result
    (``fsdpdoctor.analyze``, the front door, calls this).

    ``options`` (``fsdpdoctor.options.Options``), or its fields as keywords: ``ranks``, ``steps``,
    ``window`` (a run folder's capture window by its first step), ``thresholds``, ``workers``
    (processes on this machine; None: one per core), ``dask`` (a scheduler address or "local"),
    ``use_summaries`` (read current per-rank summaries instead of their traces)."""
    return open_analysis(path, options, **selection)


def save_json(a: Analysis, path: str | Path, include_events: bool = False) -> None:
    write_atomic(path, a.to_json(include_events=include_events))


__all__ = ["analyze", "steps_df", "step_table_df",
           "collectives_df", "ranks_df", "findings_df", "save_json"]
