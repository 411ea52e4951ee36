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

from fsdpdoctor.version import __version__


def analyze(path, *, ranks=None, steps=None, thresholds=None, dask=None, workers=None, use_summaries=True):
    """Analyse and diagnose a trace file, a run folder or a saved ``--json``: returns an ``Analysis``.

    ``workers``/``dask``/``use_summaries``: where the per-rank work runs (``fsdpdoctor.api.analyze``)."""
    from fsdpdoctor.api import analyze as _analyze

    return _analyze(path, ranks=ranks, steps=steps, thresholds=thresholds, dask=dask, workers=workers,
                    use_summaries=use_summaries)


def __getattr__(name):
    if name in ("Analysis", "Finding", "StepBreakdown"):
        from fsdpdoctor import results

        return getattr(results, name)
    raise AttributeError(f"module 'fsdpdoctor' has no attribute {name!r}")
