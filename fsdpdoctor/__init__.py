"""fsdpdoctor: profile and diagnose PyTorch DDP/FSDP training jobs.

Data flows one way: capture -> trace files -> load (``trace``) -> analyze
(``analysis``) -> diagnose (``diagnose``) -> render (``report``, ``tui``).
Only ``fsdpdoctor.capture`` imports torch.

In a notebook::

    import fsdpdoctor
    a = fsdpdoctor.analyze("runs/r1")      # typed result: fsdpdoctor.results.Analysis
    a.findings, a.steps_df(), a.collectives_df(), a.ranks_df(), a.findings_df()

Importing this package loads nothing heavy; the analysis modules load on the first call.
"""

from typing import TYPE_CHECKING

from fsdpdoctor.version import __version__

if TYPE_CHECKING:
    from fsdpdoctor.options import Options

__all__ = ["analyze", "Options", "Analysis", "Finding", "StepBreakdown", "__version__"]


def analyze(path, options: "Options | None" = None, **selection):
    """Load, analyse and diagnose a trace file, a run folder or a saved ``--json``: returns an ``Analysis``.

    The one front door, with every option: ``options`` (an :class:`Options`), or its fields as
    keywords (``ranks``, ``steps``, ``window``: a run folder's capture window by its first step,
    ``thresholds``, ``workers``: processes on this machine, None: one per core, ``dask``: a scheduler
    address or "local", ``use_summaries``, ``diagnose``, ``progress``); keywords change those of
    ``options``. A name that is not a field is a TypeError."""
    from fsdpdoctor.api import analyze as _analyze

    return _analyze(path, options, **selection)


def __getattr__(name):
    if name == "Options":
        from fsdpdoctor.options import Options

        return Options
    if name in ("Analysis", "Finding", "StepBreakdown"):
        from fsdpdoctor import results

        return getattr(results, name)
    raise AttributeError(f"module 'fsdpdoctor' has no attribute {name!r}")
