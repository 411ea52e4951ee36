"""Placeholder until the rule set lands."""

from __future__ import annotations


def diagnose(analysis, thresholds=None):
    return []
