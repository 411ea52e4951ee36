"""Reading trace files and folders into per-rank event tables (both dialects)."""

from fsdpdoctor.trace.loader import load_file
from fsdpdoctor.trace.manifest import read_manifest
from fsdpdoctor.trace.table import RankTrace

__all__ = ["RankTrace", "load_file", "read_manifest"]
