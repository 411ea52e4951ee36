"""``fsdpdoctor steps``: the step series as a plot that fits the console's width (``steps_plot``), the
notes below it, and the ``--json`` document."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from fsdpdoctor.report.steps_plot import render as plot
from fsdpdoctor.results.steps import StepsResult


def render(result: StepsResult, console: Console, width: int | None = None, height: int = 12) -> None:
    """The plot at ``width`` columns (default: the console's), then one line per note, wrapped."""
    for line in plot(result.series, result.windows, width or console.width, height):
        console.print(Text(line), soft_wrap=True)   # the plot is already fitted: never re-wrapped
    for n in result.notes:
        console.print(Text(f"note: {n}"))


def document(result: StepsResult) -> dict:
    """``steps --json``: each rank's series and each window; a scheduled window's folder is the run's."""
    return {"fsdpdoctor_steps": 1, "run_dir": result.run_dir, "notes": result.notes,
            "ranks": [{"rank": s.rank, "world_size": s.world_size, "origin_unix_s": s.origin_unix_s,
                       "cut": s.cut, "steps": s.steps, "start_s": s.start_s, "duration_s": s.duration_s,
                       "wait_s": s.wait_s} for s in result.series],
            "windows": [{"folder": w.folder.name if w.trigger != "schedule" else ".", "first_step": w.first,
                         "last_step": w.last, "trigger": w.trigger, "reason": w.reason,
                         "partial_steps": w.partial} for w in result.windows]}
