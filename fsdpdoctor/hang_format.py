"""The hang dump format, in one place for its writer (``capture/watch.py``) and its reader
(``trace/hang.py``): the file names in ``<run>/hang/``, the JSON dump's version and trigger
vocabulary, and the header line of the C-level faulthandler file. No torch.

A rank's faulthandler file starts with one header line, written when the watchdog arms; the
C handler appends stacks below it on a fatal signal, SIGTERM or a GIL-held timeout. ``close()``
removes the file, so a file that still holds only its header means the process ended without
running any handler or exit code (SIGKILL, the OOM killer) or is frozen: the rank vanished.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypedDict

FOLDER = "hang"
DUMP_VERSION = 1

# why a JSON dump was written (the watchdog's timeout, or an exception leaving the training loop)
# and what a faulthandler file's stacks say happened
JsonTrigger = Literal["timeout", "exception"]
Trigger = Literal["timeout", "exception", "fatal-signal", "sigterm", "gil-timeout"]  # a dump of either kind


def dump_name(rank: int) -> str:
    return f"rank{rank}.json"


def faulthandler_name(rank: int) -> str:
    return f"rank{rank}.faulthandler.txt"


def recovered_name(rank: int) -> str:
    """Where a dump goes when its rank stepped again: not a stall in progress any more."""
    return f"rank{rank}.recovered.json"


DUMP_NAME = re.compile(r"^rank(\d+)\.json$")
FAULTHANDLER_NAME = re.compile(r"^rank(\d+)\.faulthandler\.txt$")

_HEADER_MARK = "# fsdpdoctor faulthandler"
_HEADER = re.compile(r"^# fsdpdoctor faulthandler rank=(\d+) last_step=(\d+) timeout_s=([\d.eE+-]+)"
                     r"(?: unix=([\d.]+))?(?: world_size=(\d+))?")


@dataclass(frozen=True)
class FaultHeader:
    rank: int
    last_step: int                    # completed steps when the watchdog last armed: a lower bound
    timeout_s: float
    time_unix: float | None = None    # when it armed
    world_size: int | None = None     # None in files written before the field existed

    def line(self) -> str:
        unix = f" unix={self.time_unix:.3f}" if self.time_unix is not None else ""
        world = f" world_size={self.world_size}" if self.world_size is not None else ""
        return (f"{_HEADER_MARK} rank={self.rank} last_step={self.last_step} timeout_s={self.timeout_s:g}"
                f"{unix}{world}\n")


def parse_header(line: str) -> FaultHeader | None:
    """The header of a faulthandler file, or None when the line is not one."""
    m = _HEADER.match(line)
    if m is None:
        return None
    return FaultHeader(int(m.group(1)), int(m.group(2)), float(m.group(3)),
                       float(m.group(4)) if m.group(4) else None, int(m.group(5)) if m.group(5) else None)


@dataclass
class Frame:
    """One frame of a rank's Python stack, as a dump records it."""

    file: str
    line: int
    function: str
    code: str = ""

    def where(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


# --------------------------------------------------------------------------- the JSON dump
# ``hang/rank<N>.json`` as the watch writes it (capture/watch.py builds these, trace/hang.py checks
# and reads them); the flight recorder's own entries are torch's (``profiling_name``,
# ``collective_seq_id``, ``process_group``, ``input_sizes`` ...), kept as torch wrote them


class FrameDoc(TypedDict):
    file: str
    line: int
    function: str
    code: str


class SampleDoc(TypedDict):          # one sample of the main thread's innermost frame
    file: str
    line: int
    function: str


class ThreadDoc(TypedDict):
    id: int
    name: str
    main: bool
    daemon: bool | None
    frames: list[FrameDoc]            # outermost first


class ExceptionDoc(TypedDict):
    type: str
    message: str
    frames: list[FrameDoc]


class GroupDoc(TypedDict):
    desc: str | None
    backend: str | None
    ranks: list[int]


class DumpDoc(TypedDict):
    fsdpdoctor_hang: int              # DUMP_VERSION
    rank: int
    world_size: int
    host: str
    pid: int
    trigger: JsonTrigger
    time_unix: float
    timeout_s: float
    last_step: int                    # completed steps
    seconds_since_step: float
    exception: ExceptionDoc | None
    flight_recorder: dict             # torch's dump (entries, pg_status, version) and our note
    groups: dict[str, GroupDoc]
    threads: list[ThreadDoc]
    main_samples: list[SampleDoc]
    main_runnable_share: float | None  # share of the sampling window the main thread was runnable
