"""Rules from metrics to findings."""

from fsdpdoctor.diagnose.rules import diagnose

__all__ = ["diagnose"]
