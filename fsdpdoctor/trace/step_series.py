"""Open a run folder's step series (``RUN_DIR/steps/rank<N>.steps``, written by capture()) and its
windows as a ``StepsResult``: ``fsdpdoctor steps`` and the TUI's ``s``."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.errors import InputError
from fsdpdoctor.results.steps import StepsResult


def open_steps(run_dir: Path | str) -> StepsResult:
    """Every rank's series (ranks whose file cannot be read are named in the notes), the run's windows."""
    from fsdpdoctor.capture.series import read_series, series_files
    from fsdpdoctor.trace.windows import list_windows

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, "not a folder")
    series, notes = [], []
    for f in series_files(run_dir):
        try:
            s = read_series(f)
        except (OSError, ValueError) as exc:
            notes.append(f"{f.name} skipped: {exc}")
            continue
        if s.cut:
            notes.append(f"rank {s.rank}: the series ends inside a record (the job stopped mid-write); "
                         "whole records kept")
        if s.dropped:
            notes.append(f"rank {s.rank}: {s.dropped} record(s) out of the writer's step sequence left out "
                         "(a damaged or doubled file)")
        series.append(s)
    if not series:
        extra = f" ({'; '.join(notes)})" if notes else ""
        raise InputError(run_dir, f"no step series here (steps/rank<N>.steps, written by capture()){extra}")
    return StepsResult(str(run_dir), sorted(series, key=lambda s: s.rank), list_windows(run_dir), notes)
