"""Command line: thin verbs over the library. One module per verb in
``fsdpdoctor.commands``; each exposes ``register(parser)`` which declares its flags and sets
``func`` (args -> exit code) on its parser. Adding a verb is one module and one line in
``VERBS``."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys


def _numpy_one_thread() -> None:
    """Load numpy with OpenBLAS on one thread: the verbs multiply no matrices, and the thread per core
    OpenBLAS starts on load costs ~25-50 ms of CPU per run here. After parsing (``--help`` and a wrong
    flag load no numpy: the verbs' modules import what they compute with when they run), before the
    verb runs; a setting of the user's wins, and the variable is removed again so that the jobs a verb
    starts (torchrun, Dask workers) do not inherit it."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


from fsdpdoctor.version import __version__  # noqa: E402

# The verbs, in the order `--help` lists them: each the module fsdpdoctor.commands.<name>, whose
# ``register(parser)`` declares its flags and sets ``func`` (args -> exit code), and its line of `--help`.
# Only the module of the verb the command line names is imported: `--help` costs the interpreter and
# argparse, a verb's wrong flag its module too, not twelve modules and what they import.
VERBS: tuple[tuple[str, str], ...] = (
    ("analyze", "step-time breakdown, communication, prefetch, stragglers and findings"),
    ("check", "CI gate: exit 1 when findings reach the bar"),
    ("diff", "compare two runs: step time, components and findings, with confidence intervals"),
    ("export", "write all ranks on one clock-aligned timeline (Perfetto/Chrome JSON)"),
    ("tui", "browse the analysis and findings in a terminal UI"),
    ("scaling", "scaling efficiency across world sizes, with a waterfall of the losses"),
    ("memory", "predict per-rank model-state memory for DDP/ZeRO/FSDP (and compare with a measured peak)"),
    ("summarize", "write rank<N>.summary.msgpack beside each trace (fast re-analysis)"),
    ("reference", "list or run the reference scenarios (needs the source checkout and torch)"),
    ("hang", "hang forensics: which rank stopped, where and why (from hang/ dumps)"),
    ("steps", "each rank's step time over the whole run, with the profiled windows marked"),
    ("trigger", "ask a running job captured into RUN_DIR to profile the next N steps"),
    ("whatif", "predict the step after a fix, a setting or another world size, with its parts"),
)


class _OneLineParser(argparse.ArgumentParser):
    """A wrong flag or value is one line and exit 2, as every other bad input (argparse printed its
    usage block first: four lines and more)."""

    def error(self, message: str):
        from fsdpdoctor.visible_text import visible

        self.exit(2, f"{self.prog}: error: {visible(message)} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``: the version and whether the compiled trace scanner reads the traces (looked up only
    when asked: it loads the trace package)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from fsdpdoctor.trace import scanner

        print(f"fsdpdoctor {__version__}\ntrace scanner: {scanner.state()}")
        parser.exit(0)


def _say_missing_scanner() -> None:
    """An install without the compiled scanner (no C compiler at install) still reads every trace, more
    slowly: said once per command, on stderr, so that stdout (--json) stays the document. Looked for as a
    file: importing the trace package to ask would cost a verb that reads no trace ~0.1 s of CPU."""
    from importlib.machinery import EXTENSION_SUFFIXES
    from pathlib import Path

    trace = Path(__file__).resolve().parent / "trace"
    if any((trace / f"_scan{suffix}").is_file() for suffix in EXTENSION_SUFFIXES):
        return
    from fsdpdoctor.trace import scanner

    note = scanner.missing()
    if note:
        print(f"fsdpdoctor: trace scanner {note}", file=sys.stderr)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``only``, a verb's name, that verb alone is declared (its
    subparser and flags: what its command line can reach, ~2 ms of CPU less than twelve subparsers
    with their help actions); with another word, or none, every verb is listed with its line of help
    (``--help``, and the choices a misspelt verb is told)."""
    from importlib import import_module

    parser = _OneLineParser(
        prog="fsdpdoctor",
        description="Profile and diagnose PyTorch DDP/FSDP training jobs from torch.profiler traces.",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and the trace scanner's state")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    named = only is not None and any(name == only for name, _ in VERBS)
    for name, line in VERBS:
        if named and name != only:
            continue
        p = sub.add_parser(name, help=line)
        if only is None or name == only:
            import_module(f"fsdpdoctor.commands.{name}").register(p)
    return parser


def _verb(argv: list[str]) -> str:
    """The verb on a command line: its first word that is not a flag (the top level's flags take no
    value); "" where there is none (`--help`, `--version`), so that no verb's module is loaded."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(only=_verb(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _numpy_one_thread()
    _say_missing_scanner()
    with _collector_for(args):
        return _run(args)


@contextlib.contextmanager
def _collector_for(args):
    """The garbage collector while a verb runs, in the command's process only (the library leaves its
    caller's collector alone): off, since the analysis's results are trees that reference counting
    frees, and a many-rank analysis makes millions of objects that each collection would traverse again
    (a quarter of the CPU of 4,096 ranks); on, with fewer young-generation collections, where the verb
    makes cyclic garbage as it goes (the TUI's app, a Dask client). What a caller of main() had is
    restored."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    if getattr(args, "verb", None) == "tui" or getattr(args, "tui", False) or getattr(args, "dask", None):
        gc.set_threshold(50_000, 20, 20)
    else:
        gc.disable()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if enabled:
            gc.enable()


def _run(args) -> int:
    from fsdpdoctor.errors import InputError

    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        from fsdpdoctor.visible_text import visible

        print(f"fsdpdoctor: error: {visible(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fsdpdoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug of ours: one line unless asked for the traceback
        if os.environ.get("FSDPDOCTOR_DEBUG"):
            raise
        from fsdpdoctor.visible_text import visible

        print(f"fsdpdoctor: internal error: {type(exc).__name__}: {visible(str(exc))} "
              "(set FSDPDOCTOR_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 3
