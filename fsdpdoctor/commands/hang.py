"""`fsdpdoctor hang RUN_DIR`: which rank stopped, where, and why, from the hang watchdog's dumps
(``hang/rank<N>.json``) joined with the profiled steps when the folder has them (docs/hang.md)."""

from __future__ import annotations

from fsdpdoctor.commands.base import add_output, add_thresholds, print_json, require_terminal


def register(p) -> None:
    p.description = ("Read the dumps the hang watchdog wrote (capture(..., hang_timeout_s=N) or "
                     "fsdpdoctor.capture.watch) and name, per process group, the collective where "
                     "the ranks diverge, the ranks that never entered it, what they do instead "
                     "(their innermost frame) and a fix.")
    p.add_argument("path", help="the run folder (holding hang/) or the hang folder itself")
    p.add_argument("--no-trend", action="store_true", help="do not read the profiled rank traces")
    add_thresholds(p, "hang_busy_runnable_share=0.7")
    add_output(p, tui=True)
    p.set_defaults(func=run)


def build_report(path: str, trend: bool = True, thresholds: dict[str, float] | None = None):
    from fsdpdoctor.hang_pipeline import open_hang

    return open_hang(path, trend=trend, thresholds=thresholds)


def run(args) -> int:
    from fsdpdoctor.commands.common import parse_thresholds

    rep = build_report(args.path, trend=not args.no_trend, thresholds=parse_thresholds(args))
    if args.tui:
        require_terminal()
        from fsdpdoctor.tui.hang_app import HangApp

        return int(HangApp(rep).run() or 0)
    from fsdpdoctor.report.hang import document, render

    if args.json:
        print_json(document(rep))
    else:
        render(rep)
    return 0
