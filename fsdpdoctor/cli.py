"""Command line: thin verbs over the library. One module per verb in
``fsdpdoctor.commands``; each exposes ``register(subparsers)`` which sets
``func`` (args -> exit code) on its parser. Adding a verb is one module and one line in
``VERBS``."""

from __future__ import annotations

import argparse
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
from fsdpdoctor.commands import (  # noqa: E402
    analyze, check, diff, export, hang, memory, reference, scaling, steps, summarize, trigger, tui,
)
TYPE_CHECKING = False   # typing.TYPE_CHECKING without loading typing at every start
if TYPE_CHECKING:
    from fsdpdoctor.commands.base import Verb
from fsdpdoctor.errors import InputError  # noqa: E402
from fsdpdoctor.visible_text import visible  # noqa: E402

# the verbs, in the order `--help` lists them
VERBS: tuple[Verb, ...] = (analyze, check, diff, export, tui, scaling, memory, summarize, reference, hang, steps,
                           trigger)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsdpdoctor",
        description="Profile and diagnose PyTorch DDP/FSDP training jobs from torch.profiler traces.",
    )
    parser.add_argument("--version", action="version", version=f"fsdpdoctor {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for verb in VERBS:
        verb.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _numpy_one_thread()
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
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
        print(f"fsdpdoctor: internal error: {type(exc).__name__}: {visible(str(exc))} "
              "(set FSDPDOCTOR_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 3
