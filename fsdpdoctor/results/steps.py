"""A run's step series (``fsdpdoctor steps``, the TUI's ``s``): every rank's step times over the whole
run as capture() kept them (``capture/series.py``), the profiled windows, and notes on series that
could not be read or were cut. Read by ``trace/step_series.py``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepsResult:
    run_dir: str
    series: list = field(default_factory=list)    # capture.series.StepSeries per rank, by rank
    windows: list = field(default_factory=list)   # trace.windows.Window, in step order
    notes: list[str] = field(default_factory=list)
