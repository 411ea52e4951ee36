"""Hang verdicts as findings: the cause of each verdict of ``analysis/hang.py`` with its title and
fix, on the severity scale of every other finding (so ``check``, ``--json`` and the TUI treat a
hang like any other finding).

Impact: a hang stops the job, so fixing its cause gives back the whole step (``impact_frac`` 1).
The time per step is not known from the dumps (``impact_us`` 0, never guessed). Confidence is 1:
each verdict rests on what the dumps show (a flight-recorder sequence number, a raised error, a
fatal signal, a stack, a rank that left nothing); where they cannot tell which of two ranks is
wrong, the verdict names both. Severity is then ``severity_for(1 x 1)``: an error.
"""

from __future__ import annotations

from typing import get_args

from fsdpdoctor.results.hang import Cause, HangReport
from fsdpdoctor.results.hang import HangVerdict as Verdict
from fsdpdoctor.diagnose.framework import severity_for
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import Evidence, Finding

TITLES: dict[Cause, str] = {
    "desync": "desync: the ranks disagree on a collective",
    "crashed": "a rank crashed",
    "aborted": "a rank aborted",
    "skipped-collective": "a rank skipped a collective",
    "collective-order": "collectives issued in different orders",
    "no-dump": "a rank vanished: no dump (dead or hard-stuck)",
    "data-loader": "a rank is stuck in its data loader",
    "checkpoint": "a rank is stuck in a checkpoint save/load",
    "busy-loop": "a rank is looping outside the collectives",
    "blocked": "a rank is blocked outside the collectives",
    "gil-held": "a rank holds the GIL",
    "user-code": "a rank is in its own code",
}

FIXES: dict[Cause, str] = {
    "desync": "Every rank of a group must issue the same collectives, with the same sizes, in the same order: look "
              "for rank- or data-dependent branches around collectives (a rank that skips or adds one, uneven batch "
              "counts, tensors of different shapes). TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective as it is "
              "issued and names the first mismatch.",
    "crashed": "Fix the error this rank raised; the other ranks' errors (connection reset, timeouts) are its "
               "consequences.",
    "aborted": "The rank's process aborted (fatal signal): read its stderr for the C++ error; with gloo a size check "
               "failing means the ranks disagree on a collective.",
    "skipped-collective": "Make the collective unconditional on every rank of its group: move the rank- or "
                          "data-dependent condition inside it (all-reduce a zero or a flag instead of skipping).",
    "collective-order": "Issue collectives on different process groups in one fixed order on every rank (a "
                        "rank-dependent order deadlocks: each rank waits in a group the other has not reached).",
    "no-dump": "This rank left no dump: it died (OOM killer, segfault, SIGKILL: check its log and `dmesg`) or is "
               "frozen below Python (driver, kernel, hardware). The other ranks wait for it; restart from the last "
               "checkpoint and investigate the node.",
    "data-loader": "Find out why the read blocks (a stalled filesystem or network read, a dead loader worker); give "
                   "the read a timeout, use DataLoader(num_workers>0, timeout=...) so a stuck read raises instead of "
                   "hanging, and make every rank see the same number of batches (DistributedSampler(drop_last=True)).",
    "checkpoint": "This rank is still saving (or loading) a checkpoint while the others wait in a collective: save "
                  "collectively (torch.distributed.checkpoint, every rank) or asynchronously (dcp.async_save), or "
                  "have the others wait at a barrier whose timeout covers the save.",
    "busy-loop": "This rank loops without reaching the next collective: check the loop's exit condition (it may "
                 "depend on rank-local data, e.g. an uneven number of batches).",
    "blocked": "This rank waits on something outside the collective (a sleep, a lock, a queue, a subprocess, a "
               "network call): make that wait bounded, or make it happen on every rank.",
    "gil-held": "A thread held the GIL for the whole timeout (a C extension that does not release it): the "
                "faulthandler stack shows where; release the GIL in that extension or move the call out of the "
                "training process.",
    "user-code": "This rank is in its own code, not in a collective: the shown frame is where it is; make sure "
                 "every rank reaches the next collective (no rank-dependent early exit or extra work).",
}


# the finding ids: one per cause, beside the rule ids in check's JUnit report
HANG_IDS: list[str] = [f"hang-{c}" for c in get_args(Cause)]


def hang_finding(v: Verdict, th: dict[str, float]) -> Finding:
    confidence = 1.0
    return Finding(
        id=f"hang-{v.cause}", title=TITLES[v.cause], severity=severity_for(1.0 * confidence, th),
        confidence=confidence, impact_us=0.0, impact_frac=1.0, summary=v.summary, fix=FIXES[v.cause],
        evidence=[Evidence(e) for e in v.evidence], ranks=list(v.ranks),
        source=v.frame.where() if v.frame is not None else None)


def diagnose_hang(rep: HangReport, thresholds: dict[str, float] | None = None) -> HangReport:
    """``rep`` with one finding per verdict, in the verdicts' order (the first is the verdict)."""
    th = resolve(thresholds)
    rep.findings = [hang_finding(v, th) for v in rep.verdicts]
    return rep
