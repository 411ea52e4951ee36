"""Trace dialects: one module each, tried in ``DIALECTS`` order by ``detect``.

A new dialect is one module implementing ``Dialect`` plus its entry in ``DIALECTS`` (before the
host-only gloo reading, which accepts any trace): docs/adding-a-dialect.md.
"""

from __future__ import annotations

from fsdpdoctor.analysis.dialects.base import CollectiveRecord, Dialect, StepWindow, Timelines
from fsdpdoctor.analysis.dialects import gloo_cpu, nccl_gpu
from fsdpdoctor.trace.table import RankTrace

DIALECTS: list[Dialect] = [nccl_gpu.DIALECT, gloo_cpu.DIALECT]


def detect(trace: RankTrace) -> Dialect:
    """The first registered dialect that reads ``trace``."""
    for d in DIALECTS:
        if d.matches(trace):
            return d
    return gloo_cpu.DIALECT


__all__ = ["CollectiveRecord", "DIALECTS", "Dialect", "StepWindow", "Timelines", "detect"]
