"""Every selection an analysis takes, in one object: built by each door (the CLI's ``commands/``,
the notebook's ``api.analyze``, the TUI) and read by the pipeline, so a new option is one field here
instead of a keyword copied through every signature on the way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable


@dataclass(frozen=True)
class Options:
    """What to analyse and where.

    ``ranks``/``steps``: only those; ``window``: in a run folder with ``window-<step>`` folders, the one
    starting at that step (None: the latest); ``thresholds``: overrides for the rules; ``dask`` (a
    scheduler address or "local"), ``workers`` (processes here; None: one per core) and
    ``use_summaries`` (read a rank's current summary instead of its trace) say where the per-rank step
    runs; ``diagnose``: run the rules; ``progress(name, done, total)``: per-rank progress."""

    ranks: list[int] | None = None
    steps: set[int] | None = None
    window: int | None = None
    thresholds: dict[str, float] | None = None
    dask: str | None = None
    workers: int | None = None
    use_summaries: bool = True
    diagnose: bool = True
    progress: Callable[[str, int, int], None] | None = None

    def but(self, **changes) -> Options:
        """A copy with some fields changed (an unknown name is refused, as a keyword would be)."""
        return dataclasses.replace(self, **changes) if changes else self


FIELDS = tuple(f.name for f in dataclasses.fields(Options))
