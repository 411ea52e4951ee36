"""What every verb shares: its shape (a module with ``register``), the flags declared once, the
refusal to open a terminal UI without a terminal, and the ``--json`` document stamp.

A verb module declares its parser with the ``add_*`` helpers below and sets ``func`` (args ->
exit code); it parses and calls, nothing more: the work is in the library, the text in report/.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from fsdpdoctor.errors import InputError


if TYPE_CHECKING:
    from typing import Protocol

    class Verb(Protocol):
        """A verb module: ``register(parser)`` declares its flags on its parser (listed with its line
        of help by ``cli.VERBS``) and sets ``func`` on it."""

        def register(self, p: argparse.ArgumentParser) -> None: ...


def add_path(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("path", nargs="?" if optional else None,
                   help="a trace file (.json/.json.gz) or a folder of per-rank traces")


def add_selection(p: argparse.ArgumentParser, scope: str = "") -> None:
    """--rank and --steps (``scope``: " in every run" where a verb reads several)."""
    p.add_argument("--rank", action="append", metavar="R[,R...]",
                   help=f"analyse only these ranks{scope} (repeatable, comma lists)")
    p.add_argument("--steps", metavar="SPEC", help=f"profiler steps to analyse{scope}, e.g. 3-5,7")


def add_thresholds(p: argparse.ArgumentParser, example: str = "") -> None:
    """--threshold NAME=VALUE and --config FILE."""
    eg = f", e.g. {example}" if example else ""
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help=f"override a diagnosis threshold{eg} (see `fsdpdoctor check --list-thresholds`)")
    p.add_argument("--config", metavar="FILE", help="JSON or TOML file of threshold overrides")


def add_engine(p: argparse.ArgumentParser, summaries: bool = True) -> None:
    """--dask, --jobs and (where a verb reads summaries) --no-summaries."""
    p.add_argument("--dask", metavar="ADDRESS",
                   help="analyse the ranks on a Dask cluster (scheduler address, or 'local' for a LocalCluster); "
                        "the workers must see the traces at the same path (docs/scale-out.md). The cluster is "
                        "trusted with code execution in this process (docs/trust.md)")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="worker processes on this machine (default: one per core; 1: in this process)")
    if summaries:
        p.add_argument("--no-summaries", action="store_true",
                       help="re-read every trace even where a current rank<N>.summary.msgpack is present")


def add_window(p: argparse.ArgumentParser) -> None:
    """--window STEP: which of a run folder's profiled windows (capture's trigger and anomaly windows)."""
    p.add_argument("--window", type=int, metavar="STEP",
                   help="a run folder with windows: the window starting at STEP (default: the latest)")


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar while loading")


def add_output(p: argparse.ArgumentParser, what: str = "the report", tui: bool = False):
    """--json (and --tui where the verb has a screen), mutually exclusive; returns the group."""
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=f"print {what} as a versioned JSON document")
    if tui:
        out.add_argument("--tui", action="store_true", help=f"open the terminal UI on {what} (q quits)")
    return out


def add_analysis_flags(p: argparse.ArgumentParser, path_optional: bool = False) -> None:
    """Everything a verb that analyses one PATH takes: the path, the selection, the thresholds,
    the progress bar and the engine."""
    add_path(p, optional=path_optional)
    add_selection(p)
    add_thresholds(p)
    add_progress(p)
    add_engine(p)


def require_terminal() -> None:
    """A full-screen UI needs a terminal on both sides: without one it cannot read keys (stdin at
    end of file: the app spins) and its escape codes would pour into a file or a pipe."""
    missing = [name for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout))
               if stream is None or not stream.isatty()]
    if missing:
        # one line that fits 80 columns after "fsdpdoctor: error: "
        raise InputError(None, f"the TUI needs a terminal; {' and '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not one")


def json_document(doc: dict) -> str:
    """A verb's ``--json``: every document carries ``schema_version`` first (docs/json-schema.md)."""
    from fsdpdoctor.results import SCHEMA_VERSION  # loaded by the verb that prints, not by every start

    import json

    return json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=2, default=str)


def say(line: str) -> None:
    """One line of plain text on stdout, wrapped at spaces to the terminal's width (80 columns when
    piped, ``COLUMNS`` when set)."""
    from rich.text import Text

    from fsdpdoctor.report.terminal import terminal_console

    terminal_console(highlight=False).print(Text(line))


def print_json(doc: dict) -> None:
    sys.stdout.write(json_document(doc) + "\n")
