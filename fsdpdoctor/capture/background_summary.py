"""The summary of a freshly written trace, built in a separate, niced process so that the training
thread never pays for it (``fsdpdoctor analyze`` on the folder then reads summaries, not traces).

The child calls one library function, :func:`fsdpdoctor.pipeline.summarize_beside`, not the command
line: nothing here depends on how the ``summarize`` verb parses its options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# the child's whole program: the library call, with the child's own priority lowered first
_CHILD = ("import os, sys; sys.path[:] = [{root!r}] + [p for p in sys.path if p not in ('', '.')]; os.nice(10); "
          "from fsdpdoctor.pipeline import summarize_beside; summarize_beside({path!r}, param_dtype={dtype!r})")


def start_summary(trace: Path, param_dtype: str | None = None) -> subprocess.Popen:
    """Start the child that writes ``trace``'s summary beside it; returns at once. The child imports
    this very fsdpdoctor: ``-c`` would put the job's working folder first on the path, where a folder
    named fsdpdoctor (a checkout) would be imported instead."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = _CHILD.format(root=root, path=str(trace), dtype=param_dtype)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
