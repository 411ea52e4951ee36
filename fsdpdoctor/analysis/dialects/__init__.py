"""Trace dialects: one module each, tried in ``DIALECTS`` order by ``detect``.

A new dialect is one module implementing ``Dialect`` plus one line in ``DIALECTS``
(before the host-only gloo reading, which accepts any trace).
"""

from __future__ import annotations

from fsdpdoctor.analysis.dialects.base import CollectiveRecord, Dialect, StepWindow, Timelines
from fsdpdoctor.analysis.dialects.gloo_cpu import DIALECT as GLOO_CPU
from fsdpdoctor.analysis.dialects.nccl_gpu import DIALECT as NCCL_GPU
from fsdpdoctor.trace.table import RankTrace

DIALECTS: list[Dialect] = [NCCL_GPU, GLOO_CPU]


def detect(trace: RankTrace) -> Dialect:
    """The first registered dialect that reads ``trace``."""
    for d in DIALECTS:
        if d.matches(trace):
            return d
    return GLOO_CPU


def by_name(name: str) -> Dialect | None:
    return next((d for d in DIALECTS if d.name == name), None)


__all__ = ["CollectiveRecord", "DIALECTS", "Dialect", "StepWindow", "Timelines", "by_name", "detect"]
