"""One call from a path to a diagnosed ``Analysis``: load -> analyze -> diagnose."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.analysis.engine import analyze_run
from fsdpdoctor.results import Analysis
from fsdpdoctor.trace.loader import Progress, load_run


def analyze_path(path: str | Path, *, ranks: list[int] | None = None, steps: set[int] | None = None,
                 thresholds: dict[str, float] | None = None, progress: Progress | None = None,
                 diagnose: bool = True) -> Analysis:
    run = load_run(path, ranks=ranks, progress=progress)
    analysis = analyze_run(run, steps=steps)
    analysis.data_quality = run.quality
    if diagnose:
        from fsdpdoctor.diagnose import diagnose as run_rules

        analysis.findings = run_rules(analysis, thresholds=thresholds)
    return analysis
