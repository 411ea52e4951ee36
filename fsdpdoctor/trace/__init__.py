"""Reading trace files and folders into per-rank event tables (both dialects)."""

from fsdpdoctor.trace.loader import Run, load_file, load_run
from fsdpdoctor.trace.manifest import read_manifest
from fsdpdoctor.trace.table import RankTrace

__all__ = ["Run", "RankTrace", "load_file", "load_run", "read_manifest"]
