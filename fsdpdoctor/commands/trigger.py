"""`fsdpdoctor trigger RUN_DIR [--steps N]`: ask a running, captured job for a profiled window (docs/capture.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fsdpdoctor.commands.base import say
from fsdpdoctor.errors import InputError

# the coordinator writes its step series at every poll (every half second); older than this, no job is writing
ALIVE_S = 10.0


def register(p) -> None:
    p.description = ("Write a window request into the run folder of a job running under "
                     "fsdpdoctor.capture.capture(); every rank profiles the same N steps into "
                     "RUN_DIR/window-<first step>/. Works from any shell that sees the folder.")
    p.add_argument("run_dir", help="the folder given to capture()")
    p.add_argument("--steps", type=int, default=3, metavar="N", help="steps to profile (default 3)")
    p.set_defaults(func=run)


def _pending(run_dir: Path) -> str:
    """"" when no request is there, a note when the one there was taken by the job but could not be
    removed (it is replaced); refuses, in one line, when a request is still waiting to be taken."""
    from fsdpdoctor.capture.windows import TRIGGER_NAME, read_request, read_taken, request_key

    path = run_dir / TRIGGER_NAME
    if not os.path.lexists(path):
        return ""
    request, problem = read_request(path)
    if request is None:
        raise InputError(path, f"is there and is not a request ({problem}): the job sets it aside at its "
                               "next poll; remove it if it stays")
    if request_key(path, request) in read_taken(run_dir):
        return " (replacing a request the job took but could not remove)"
    when = f" written at {request.requested}" if request.requested else ""
    raise InputError(path, f"a request for {request.steps} step{'s' if request.steps > 1 else ''}{when} is "
                           "waiting to be taken: not replaced (the job takes one request at a time; run "
                           "`fsdpdoctor trigger` again once it is gone)")


def run(args) -> int:
    from fsdpdoctor.capture.series import series_path
    from fsdpdoctor.capture.windows import MAX_WINDOW_STEPS, write_request

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, "not a folder (give the folder the job passes to capture())")
    if not 1 <= args.steps <= MAX_WINDOW_STEPS:
        raise InputError(None, f"--steps must be 1..{MAX_WINDOW_STEPS}, got {args.steps}")
    note = _pending(run_dir)
    try:
        path = write_request(run_dir, args.steps, replace=bool(note))
    except FileExistsError:   # another caller's request landed between the look and the write
        _pending(run_dir)
        raise InputError(run_dir, "another request was written at the same instant: not replaced") from None
    except OSError as exc:
        raise InputError(run_dir, f"cannot write the request: {exc.strerror or exc}") from None
    say(f"requested a window of {args.steps} step{'s' if args.steps > 1 else ''}: {path}{note}")
    try:
        age = time.time() - series_path(run_dir, 0).stat().st_mtime
    except OSError:
        age = None
    if age is None or age > ALIVE_S:
        seen = "no step series from rank 0" if age is None else f"rank 0's step series last written {age:.0f} s ago"
        say(f"note: no running capture seen in this folder ({seen}); the request waits for the next job armed on it")
    else:
        say("the job's rank 0 takes it within a second; the traces land in "
            f"{run_dir}/window-<first step>/ (`fsdpdoctor steps {run_dir}` shows where)")
    return 0
