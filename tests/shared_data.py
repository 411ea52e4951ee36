"""Where the tests find the shared recordings (never copied into the repository): ``../shared`` beside
the repository root, or the folder that ``FSDPDOCTOR_SHARED`` names. Tests that need them skip cleanly
when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FSDPDOCTOR_SHARED") or ROOT.parent / "shared")
PUBLIC_DIR = SHARED / "traces-public"
PUBLIC = PUBLIC_DIR if PUBLIC_DIR.is_dir() else None   # None: not present here
needs_public = pytest.mark.skipif(PUBLIC is None, reason=f"public traces not found at {PUBLIC_DIR} "
                                                         "(../shared/traces-public or $FSDPDOCTOR_SHARED)")
