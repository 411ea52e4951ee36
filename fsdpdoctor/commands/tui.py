"""`fsdpdoctor tui PATH` (and `analyze PATH --tui`): the terminal UI."""

from __future__ import annotations

from pathlib import Path

from fsdpdoctor.commands.base import add_window, require_terminal
from fsdpdoctor.commands.common import (add_selection_args, engine_kwargs, parse_ranks, parse_steps,
                                        parse_thresholds)
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = "Open the terminal UI on a trace file or a folder of per-rank traces."
    add_selection_args(p)
    p.add_argument("--light", action="store_true", help="start with the light theme (t toggles)")
    add_window(p)  # [ and ] move between the windows
    p.set_defaults(func=open_tui)


def open_tui(args) -> int:
    """Validate what can be validated before the screen switches, then run the app."""
    from fsdpdoctor.trace.loader import missing_reason

    path = Path(args.path)
    if not path.exists():
        raise InputError(args.path, missing_reason(path))
    ranks = parse_ranks(getattr(args, "rank", None))
    steps = parse_steps(getattr(args, "steps", None))
    thresholds = parse_thresholds(args)
    engine = engine_kwargs(args)  # --jobs 0 is refused here, not on the error screen
    require_terminal()

    from fsdpdoctor.tui.app import FsdpDoctorApp

    app = FsdpDoctorApp(path, ranks=ranks, steps=steps, thresholds=thresholds,
                        light=bool(getattr(args, "light", False)), engine=engine)
    app.window = getattr(args, "window", None)
    rc = app.run()
    if app.error:
        # the error screen showed it; repeat it on the terminal the user returns to
        import sys

        from fsdpdoctor.visible_text import visible

        print(f"fsdpdoctor: error: {visible(str(app.error))}", file=sys.stderr)
        return 2
    return int(rc or 0)
