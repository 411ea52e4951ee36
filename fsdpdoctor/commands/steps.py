"""`fsdpdoctor steps RUN_DIR [--json]`: each rank's step time over the whole run, windows marked (docs/capture.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fsdpdoctor.commands.base import add_output, print_json, say
from fsdpdoctor.errors import InputError
from fsdpdoctor.visible_text import visible_lines


def register(sub) -> None:
    p = sub.add_parser("steps", help="each rank's step time over the whole run, with the profiled windows marked",
                       description="Plot the step series that fsdpdoctor.capture keeps for every rank "
                                   "(RUN_DIR/steps/rank<N>.steps) in the terminal, windows marked.")
    p.add_argument("run_dir", help="the folder given to capture()")
    add_output(p, "the series and the windows")
    p.add_argument("--width", type=int, default=None,
                   help="columns of the plot (default: the terminal's width; 80 when piped)")
    p.add_argument("--height", type=int, default=12, help="rows of the plot (default 12)")
    p.set_defaults(func=run)


def run(args) -> int:
    run_dir = Path(args.run_dir)
    from fsdpdoctor.report.steps_plot import load, render   # numpy: only when the verb runs

    series, windows, notes = load(run_dir)
    if args.json:
        doc = {"fsdpdoctor_steps": 1, "run_dir": str(run_dir), "notes": notes,
               "ranks": [{"rank": s.rank, "world_size": s.world_size, "origin_unix_s": s.origin_unix_s,
                          "cut": s.cut, "steps": s.steps, "start_s": s.start_s, "duration_s": s.duration_s,
                          "wait_s": s.wait_s} for s in series],
               "windows": [{"folder": w.folder.name if w.trigger != "schedule" else ".", "first_step": w.first,
                            "last_step": w.last, "trigger": w.trigger, "reason": w.reason,
                            "partial_steps": w.partial} for w in windows]}
        print_json(doc)
        return 0
    if args.width is None:  # the terminal's width, COLUMNS when set, 80 when piped (as every verb's text)
        args.width = shutil.get_terminal_size((80, 24)).columns
    if args.width < 40 or args.height < 4:
        raise InputError(None, "--width must be >= 40 and --height >= 4")
    print(visible_lines("\n".join(render(series, windows, args.width, args.height))))
    for n in notes:
        say(f"note: {n}")
    return 0
