"""A plain-Python interval union for tests: an independent reference for fsdpdoctor.analysis.intervals."""

from __future__ import annotations


def merge(intervals):
    """Sorted-merge union of [start, end) pairs."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
