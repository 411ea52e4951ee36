"""The hang report (``fsdpdoctor hang``): each rank's state, the process groups' divergences and
mismatches, the verdicts (and the same verdicts as findings, on the one severity scale), and the
trend of the profiled steps before the hang. Built by ``analysis/hang.py`` from the dumps
(``trace/hang.py``), judged by ``diagnose/hang.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.hang_format import Frame
from fsdpdoctor.results.analysis import Finding

# what stopped the job (a verdict's cause) and what a rank was doing when it was dumped
Cause = Literal["desync", "crashed", "aborted", "skipped-collective", "collective-order", "no-dump",
                "data-loader", "checkpoint", "busy-loop", "blocked", "gil-held", "user-code"]
Activity = Literal["collective", "backward", "data-loader", "checkpoint", "blocked", "busy-loop", "user-code",
                   "exception", "unknown"]


@dataclass
class RankState:
    rank: int
    dump: str | None                 # "json", "faulthandler", None (wrote nothing)
    trigger: str | None
    last_step: int | None
    activity: Activity
    frame: Frame | None              # innermost user frame of the main thread
    library: str | None              # innermost library function below it ("all_reduce", "wait")
    current: dict | None = None      # its last flight-recorder entry: {"group", "label", "seq", "op", "sizes"}
    exception: str | None = None
    note: str | None = None


@dataclass
class GroupDivergence:
    group: str
    label: str                       # the group's description ("default_pg", "metrics") or its name
    members: list[int]
    seq: int                         # the first collective a lagging rank never entered (else the frontier)
    op: str
    sizes: list
    issued_at: Frame | None          # where a rank that entered it issued it (its innermost user frame)
    entered: list[int]               # at the frontier: waiting inside it
    never_entered: list[int]         # below it
    unknown: list[int]               # members with no flight-recorder data
    last_enqueued: dict[int, int] = field(default_factory=dict)
    last_completed: dict[int, int] = field(default_factory=dict)


@dataclass
class Mismatch:
    group: str
    label: str
    seq: int
    by_rank: dict[int, str]          # rank -> "all_reduce [[8]] Float"
    odd_ranks: list[int]             # minority signature holders (all, on a tie)
    sites: dict[int, str] = field(default_factory=dict)


@dataclass
class HangVerdict:
    """Why the job hangs: a cause, the ranks it names, where (its fix is the finding's)."""

    cause: Cause
    ranks: list[int]                 # the lagging / culprit ranks
    group: str | None
    label: str | None
    seq: int | None
    op: str | None
    frame: Frame | None
    summary: str                     # the evidence in one sentence (the fix is the finding's: diagnose/hang.py)
    evidence: list[str] = field(default_factory=list)


@dataclass
class Trend:
    available: bool
    straggler: int | None = None
    lagging_was_straggler: bool | None = None
    wait_ms_per_step: dict[int, float] = field(default_factory=dict)   # mean time each rank waited for slower ones
    summary: str = ""


@dataclass
class HangReport:
    run_dir: str
    world_size: int | None
    dumped: list[int]
    silent: list[int]                # ranks that wrote nothing
    ranks: list[RankState]
    divergences: list[GroupDivergence]
    mismatches: list[Mismatch]
    verdicts: list[HangVerdict]
    trend: Trend | None = None
    notes: list[str] = field(default_factory=list)
    # the verdicts as findings, one each in the same order, on the severity scale of every other
    # finding (diagnose/hang.py fills them)
    findings: list[Finding] = field(default_factory=list)
