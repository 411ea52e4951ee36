"""The hang pipeline, beside ``pipeline.open_analysis``: the watchdog's dumps (``trace/hang.py``) ->
what each rank did (``analysis/hang.py``), joined with the trend of the profiled steps when the
folder has traces -> the verdicts (``diagnose/hang.py``). ``hang`` and ``check`` both call it."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.errors import InputError
from fsdpdoctor.results.hang import HangReport, Trend


def open_hang(path: str | Path, trend: bool = True, thresholds: dict[str, float] | None = None) -> HangReport:
    from fsdpdoctor.analysis.hang import analyze_hang, trend_from_analysis
    from fsdpdoctor.diagnose.hang import diagnose_hang
    from fsdpdoctor.diagnose.thresholds import resolve
    from fsdpdoctor.trace.hang import load_hang_dumps

    dumps = load_hang_dumps(path)
    tr = None
    root = Path(dumps.run_dir)
    if trend and any(root.glob("rank*.json*")):
        from fsdpdoctor.pipeline import open_analysis

        try:
            tr = trend_from_analysis(open_analysis(root, thresholds=thresholds))
        except InputError as exc:
            tr = Trend(False, summary=f"the profiled traces could not be read ({exc})")
    return diagnose_hang(analyze_hang(dumps, tr, resolve(thresholds)), thresholds)
