"""`fsdpdoctor steps RUN_DIR [--json]`: each rank's step time over the whole run, windows marked (docs/capture.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fsdpdoctor.commands.base import add_output, print_json
from fsdpdoctor.errors import InputError


def register(p) -> None:
    p.description = ("Plot the step series that fsdpdoctor.capture keeps for every rank "
                     "(RUN_DIR/steps/rank<N>.steps) in the terminal, windows marked.")
    p.add_argument("run_dir", help="the folder given to capture()")
    add_output(p, "the series and the windows")
    p.add_argument("--width", type=int, default=None,
                   help="columns of the plot (default: the terminal's width; 80 when piped)")
    p.add_argument("--height", type=int, default=12, help="rows of the plot (default 12)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fsdpdoctor.report.steps import document, render   # numpy: only when the verb runs
    from fsdpdoctor.report.terminal import terminal_console
    from fsdpdoctor.trace.step_series import open_steps

    result = open_steps(Path(args.run_dir))
    if args.json:
        print_json(document(result))
        return 0
    # the terminal's width, COLUMNS when set, 80 when piped (as every verb's text)
    width = args.width if args.width is not None else shutil.get_terminal_size((80, 24)).columns
    if width < 40 or args.height < 4:
        raise InputError(None, "--width must be >= 40 and --height >= 4")
    render(result, terminal_console(highlight=False, width=width), width, args.height)
    return 0
