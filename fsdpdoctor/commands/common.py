"""Argument parsing shared by the verbs that analyse a path."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fsdpdoctor.commands.base import add_analysis_flags
from fsdpdoctor.errors import InputError

if TYPE_CHECKING:
    from fsdpdoctor.options import Options


def add_selection_args(p: argparse.ArgumentParser) -> None:
    """The flags of a verb that analyses one PATH (declared once, in commands/base.py)."""
    add_analysis_flags(p)


def parse_ranks(values: list[str] | None) -> list[int] | None:
    if not values:
        return None
    out = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            if not (part.isascii() and part.isdigit()):   # "²".isdigit() holds, int("²") raises
                raise InputError(None, f"--rank expects non-negative integers, got {part!r}")
            out.append(int(part))
    return out


# a step number has at most 18 digits (trace/vocabulary.STEP_NAME: torch counts steps in 64 bits), and
# one range names at most a million steps (far more than any recording profiles; each is held in a set)
MAX_STEP = 10 ** 18 - 1
MAX_RANGE = 1_000_000


def parse_steps(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = _step_number(a), _step_number(b)
                if hi < lo:
                    raise ValueError
                if hi - lo >= MAX_RANGE:
                    raise InputError(None, f"--steps {part!r} names more than {MAX_RANGE:,} steps (name the steps "
                                           "the recording holds, e.g. 3-5,7)")
                out.update(range(lo, hi + 1))
            elif part:
                out.add(_step_number(part))
        except ValueError:
            raise InputError(None, f"--steps: cannot read {part!r} (use e.g. 3-5,7; step numbers up to "
                                   f"{MAX_STEP})") from None
    if not out:  # an empty set would select nothing, and read downstream as no selection at all
        raise InputError(None, f"--steps {spec!r} names no step (use e.g. 3-5,7)")
    return out


def _step_number(text: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_STEP:
        raise ValueError(text)
    return int(text)


def parse_thresholds(args) -> dict[str, float]:
    from fsdpdoctor.diagnose.thresholds import load_overrides, parse_assignment

    out: dict[str, float] = {}
    if getattr(args, "config", None):
        out.update(load_overrides(args.config))
    for item in getattr(args, "threshold", []) or []:
        k, v = parse_assignment(item)
        out[k] = v
    return out


@contextmanager
def progress_bar(enabled: bool):
    """A progress callback drawing on stderr (only on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fsdpdoctor.report.terminal import terminal_console
    from fsdpdoctor.trace.io import showing_bytes

    with Progress(TextColumn("loading {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=terminal_console(stderr=True), transient=True) as prog:
        task = prog.add_task("traces", total=None)

        def cb(name: str, done: int, total: int) -> None:
            prog.update(task, description=name or "done", completed=done, total=total)

        def read(name: str, done: int, total: int) -> None:  # within one large trace: how far it is read
            prog.update(task, description=f"{name} ({done / 2**20:,.0f} of {total / 2**20:,.0f} MiB read)")

        with showing_bytes(read):
            yield cb


def run_analysis(args):
    from fsdpdoctor.pipeline import open_analysis

    with progress_bar(not args.no_progress) as cb:
        analysis = open_analysis(args.path, options_from(args, progress=cb))
    if os.path.isdir(os.path.join(args.path, "hang")):  # the dump reader loads only where there may be dumps
        from fsdpdoctor.trace.hang import hang_note

        if note := hang_note(args.path):
            analysis.notes.append(note)
    return analysis


def options_from(args, **changes) -> Options:
    """Every selection the command line gives (ranks, steps, window, thresholds, engine), as one object."""
    from fsdpdoctor.options import Options   # here, not at import: a wrong flag loads no dataclasses

    return Options(ranks=parse_ranks(getattr(args, "rank", None)), steps=parse_steps(getattr(args, "steps", None)),
                   window=getattr(args, "window", None), thresholds=parse_thresholds(args),
                   **engine_kwargs(args)).but(**changes)


def engine_kwargs(args) -> dict:
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        raise InputError(None, f"--jobs expects a positive number, got {jobs}")
    return {"dask": getattr(args, "dask", None), "workers": jobs,
            "use_summaries": not getattr(args, "no_summaries", False)}
