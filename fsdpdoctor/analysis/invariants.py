"""What every analysed run must satisfy before anything is rendered, checked in one place.

``check`` lists the violations of an ``Analysis`` (after the reduce and the diagnosis); ``enforce``
is what the pipeline calls on every run:

- in production a violated figure is never shown as if it were valid: a finding's impact above the
  step is cut to the step, a share outside [0, 1] is cut into it, a table that does not add up is
  withheld, and in every case a note names the invariant and the figure;
- under tests (``FSDPDOCTOR_STRICT_INVARIANTS=1``, set by the test suite) a violation raises
  ``InvariantError``, so a defect fails the test instead of being papered over.

The invariants:

- ``share-in-unit``: every share (a finding's impact share, overlap, straggler shares) lies in [0, 1];
- ``impact-within-step``: a finding's impact is at most its step;
- ``roots-within-step``: the root findings' impacts together are at most the step (the rules leave
  out of a root's impact the time another root explains, so their sum is their union);
- ``step-adds-up``: each step's compute, optimizer, exposed communication, data loading and idle add
  up to its duration; exposed plus overlapped communication is the communication; the kinds' and the
  phases' communication add up to it (unions, not sums);
- ``collectives-add-up``: the Collectives table's rows add up to the ranks' communication and
  exposed communication in the analysed steps;
- ``steps-disjoint``: a rank's steps never overlap, and a step never spans two profiler cycles.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Literal

from fsdpdoctor.results import Analysis, StepBreakdown

Invariant = Literal["share-in-unit", "impact-within-step", "roots-within-step", "step-adds-up",
                    "collectives-add-up", "steps-disjoint"]

STRICT_ENV = "FSDPDOCTOR_STRICT_INVARIANTS"
# Sums of float microseconds over thousands of intervals: 1 us absolute (the trace's own resolution)
# plus one part in 10^6 of the figure (float rounding of large epoch timestamps).
ABS_US = 1.0
REL = 1e-6
# Findings' impacts are estimates shown as a share of the step to 0.1 %: an excess below that cannot be
# seen in any report, so impacts are held to the step within it.
SHOWN_SHARE = 1e-3


@dataclass(slots=True)
class Violation:
    """A figure outside the bound an invariant sets for it."""

    invariant: Invariant
    figure: str                 # which figure, e.g. "finding host-sync impact"
    value: float
    bound: float
    detail: str = ""

    def __str__(self) -> str:
        return f"invariant {self.invariant}: {self.figure} is {self.value:.6g}, bound {self.bound:.6g}" + (
            f" ({self.detail})" if self.detail else "")


class InvariantError(AssertionError):
    def __init__(self, violations: list[Violation]):
        super().__init__("; ".join(map(str, violations)))
        self.violations = violations


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= ABS_US + REL * max(abs(a), abs(b))


def _at_most(a: float, b: float) -> bool:
    return a <= b + ABS_US + REL * abs(b)


def check(a: Analysis) -> list[Violation]:
    """Every violation of the invariants above in ``a``."""
    out: list[Violation] = []
    out += _steps(a)
    out += _collectives(a)
    out += _findings(a)
    out += _shares(a)
    return out


def _step_sums(b: StepBreakdown, what: str) -> list[Violation]:
    if _step_fine(b):   # the usual answer, without building a violation (tens of thousands of rank-steps)
        return []
    out = []
    parts = b.compute_us + b.optimizer_us + b.exposed_comm_us + b.data_loading_us + b.idle_us
    if not _close(parts, b.duration_us):
        out.append(Violation("step-adds-up", f"{what}: compute+optimizer+exposed+data+idle", parts,
                             b.duration_us, "the parts of a step add up to its duration"))
    if not _close(b.exposed_comm_us + b.overlapped_comm_us, b.comm_us):
        out.append(Violation("step-adds-up", f"{what}: exposed+overlapped communication",
                             b.exposed_comm_us + b.overlapped_comm_us, b.comm_us))
    if b.comm_by_kind:
        busy = sum(k.busy_us for k in b.comm_by_kind.values())
        exposed = sum(k.exposed_us for k in b.comm_by_kind.values())
        if not _close(busy, b.comm_us):
            out.append(Violation("step-adds-up", f"{what}: communication by kind", busy, b.comm_us))
        if not _close(exposed, b.exposed_comm_us):
            out.append(Violation("step-adds-up", f"{what}: exposed communication by kind", exposed,
                                 b.exposed_comm_us))
    if b.exposed_by_phase and not _close(sum(b.exposed_by_phase.values()), b.exposed_comm_us):
        out.append(Violation("step-adds-up", f"{what}: exposed communication by phase",
                             sum(b.exposed_by_phase.values()), b.exposed_comm_us))
    for name in ("compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us", "data_loading_us",
                 "idle_us", "comm_us"):
        v = getattr(b, name)
        if v < -ABS_US or not _at_most(v, b.duration_us) and name != "comm_us":
            out.append(Violation("step-adds-up", f"{what}: {name}", v, b.duration_us, "within [0, step]"))
    return out


_PARTS = ("compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us", "data_loading_us", "idle_us")


def _step_fine(b: StepBreakdown) -> bool:
    """Whether ``_step_sums`` finds nothing in ``b``: the same tests, inline."""
    d = b.duration_us
    parts = b.compute_us + b.optimizer_us + b.exposed_comm_us + b.data_loading_us + b.idle_us
    if abs(parts - d) > ABS_US + REL * max(abs(parts), abs(d)):
        return False
    x = b.exposed_comm_us + b.overlapped_comm_us
    if abs(x - b.comm_us) > ABS_US + REL * max(abs(x), abs(b.comm_us)):
        return False
    if b.comm_by_kind:
        busy = exposed = 0.0
        for k in b.comm_by_kind.values():
            busy += k.busy_us
            exposed += k.exposed_us
        if abs(busy - b.comm_us) > ABS_US + REL * max(abs(busy), abs(b.comm_us)) or \
                abs(exposed - b.exposed_comm_us) > ABS_US + REL * max(abs(exposed), abs(b.exposed_comm_us)):
            return False
    if b.exposed_by_phase:
        x = sum(b.exposed_by_phase.values())
        if abs(x - b.exposed_comm_us) > ABS_US + REL * max(abs(x), abs(b.exposed_comm_us)):
            return False
    top = d + ABS_US + REL * abs(d)
    return all(-ABS_US <= getattr(b, name) <= top for name in _PARTS) and b.comm_us >= -ABS_US


def _steps(a: Analysis) -> list[Violation]:
    out = []
    for r in a.ranks:
        for s in r.steps:
            out += _step_sums(s, f"rank {r.rank} step {s.step}")
        if r.mean:
            out += _step_sums(r.mean, f"rank {r.rank} mean step")
        spans = sorted((s.start_us, s.start_us + s.duration_us, s.step) for s in r.steps)
        for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            if not _at_most(e0, s1):
                out.append(Violation("steps-disjoint", f"rank {r.rank} step {n0} end", e0, s1,
                                     f"overlaps step {n1}"))
        cycles = r.cycles
        if cycles:
            for s0, e0, n0 in spans:
                inside = any(_at_most(c0, s0) and _at_most(e0, c1) for c0, c1 in cycles)
                if not inside:
                    out.append(Violation("steps-disjoint", f"rank {r.rank} step {n0} span", e0 - s0, 0.0,
                                         "spans two profiler cycles (or lies outside every cycle)"))
    if a.mean:
        out += _step_sums(a.mean, "job mean step")
    return out


def _collectives(a: Analysis) -> list[Violation]:
    if not a.collectives:
        return []
    out = []
    steps = [s for r in a.ranks for s in r.steps]
    comm = sum(s.comm_us for s in steps)
    exposed = sum(s.exposed_comm_us for s in steps)
    busy_rows = sum(c.total_us for c in a.collectives)
    exposed_rows = sum(c.exposed_us for c in a.collectives)
    if not _close(busy_rows, comm):
        out.append(Violation("collectives-add-up", "Collectives table: communication", busy_rows, comm,
                             "the rows add up to the ranks' communication in the analysed steps"))
    if not _close(exposed_rows, exposed):
        out.append(Violation("collectives-add-up", "Collectives table: exposed communication", exposed_rows,
                             exposed))
    return out


def _step_us(a: Analysis) -> float | None:
    return a.mean.duration_us if a.mean and a.mean.duration_us > 0 else None


def _findings(a: Analysis) -> list[Violation]:
    step = _step_us(a)
    if step is None:
        return []
    out = []
    for f in a.findings:
        if f.impact_us > step * (1 + SHOWN_SHARE):
            out.append(Violation("impact-within-step", f"finding {f.id} impact (us per step)", f.impact_us, step))
    roots = [f for f in a.findings if not f.caused_by]
    total = sum(f.impact_us for f in roots)
    if len(roots) > 1 and total > step * (1 + SHOWN_SHARE):
        out.append(Violation("roots-within-step", "root findings' impacts together (us per step)", total, step,
                             ", ".join(f"{f.id} {f.impact_us / 1e3:.1f} ms" for f in roots)))
    return out


def _shares(a: Analysis) -> list[Violation]:
    out = []

    def unit(name: str, v: float | None) -> None:
        if v is None:
            return
        if math.isnan(v) or v < -REL or v > 1 + SHOWN_SHARE:
            out.append(Violation("share-in-unit", name, v, 1.0))

    for f in a.findings:
        unit(f"finding {f.id} impact share", f.impact_frac)
        unit(f"finding {f.id} confidence", f.confidence)
    if a.mean:
        unit("job overlap share", a.mean.overlap_frac)
    for r in a.ranks:
        if r.mean:
            unit(f"rank {r.rank} overlap share", r.mean.overlap_frac)
    if a.straggler:
        unit("straggler spread share", a.straggler.spread_frac)
        unit("straggler last-arrival share", a.straggler.last_fraction)
    return out


# the figures of an analysis that are signed by definition: the job mean's rank (-1, "all ranks") and a
# rank's clock offset, drift and their bounds against the reference rank (docs/json-schema.md)
# a prediction's interval may reach below 0 (the fix may cost time: diagnose/prediction.py); the
# straggler's per-step excess over the other ranks' median is below 0 in a step where it was quicker
_SIGNED = re.compile(r"^mean\.rank$|^clock\.ranks\[\d+\]\.(offset_us|drift_ppm|bound_lo_us|bound_hi_us)$"
                     r"|^findings\[\d+\]\.impact_interval_us\[0\]$|^straggler\.extra_each_us\[\d+\]$")


def document_problems(a: Analysis) -> list[str]:
    """What rules out ``a``, read back from a saved ``--json`` document, as an analysis this program
    wrote: a number that is not finite, negative where no figure of ours is, or a share (``*_frac``)
    above 1, and each violation of the invariants its notes do not already name (a figure the writing
    run could not bound is kept with a note; a document edited afterwards has none). Its figures are
    shown and gated on as they are, so they are held to what every fresh analysis is held to."""
    import msgspec

    out: list[str] = []

    def walk(x, path: str) -> None:
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return
        if isinstance(x, (int, float)):
            if not math.isfinite(x) or (x < 0 and not _SIGNED.match(path)) or \
                    (path.endswith("_frac") and x > 1 + SHOWN_SHARE):   # every *_frac is a share
                out.append(f"{path} is {x!r}")
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")

    walk(msgspec.to_builtins(a), "")
    named = " ".join(n for n in a.notes if n.startswith("invariant "))
    out += [str(v) for v in check(a) if f"invariant {v.invariant}" not in named]
    return out


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def enforce(a: Analysis) -> list[Violation]:
    """Check ``a``; strict: raise on any violation; else withhold or bound each violated figure and
    say so in ``a.notes``. Returns the violations found."""
    found = check(a)
    if not found:
        return found
    if strict():
        raise InvariantError(found)
    step = _step_us(a)
    kinds = {v.invariant for v in found}
    for f in a.findings:
        if step is not None and f.impact_us > step:
            a.notes.append(f"invariant impact-within-step: finding {f.id} estimated {f.impact_us / 1e3:.1f} ms per "
                           f"step, more than the {step / 1e3:.1f} ms step; shown as at most the step")
            f.impact_us = step
        if f.impact_frac > 1 or f.impact_frac < 0 or math.isnan(f.impact_frac):
            f.impact_frac = min(max(f.impact_frac, 0.0), 1.0) if not math.isnan(f.impact_frac) else 0.0
    if "roots-within-step" in kinds:
        v = next(v for v in found if v.invariant == "roots-within-step")
        a.notes.append(f"invariant roots-within-step: the root findings together claim "
                       f"{v.value / v.bound:.0%} of the step ({v.detail}): they explain some of the same time, "
                       "so their impacts overlap and must not be added up")
    if "collectives-add-up" in kinds:
        a.notes.append("invariant collectives-add-up: the Collectives table does not add up to the step's "
                       "communication and is withheld")
        a.collectives = []
    for v in found:
        if v.invariant in ("step-adds-up", "steps-disjoint", "share-in-unit"):
            a.notes.append(str(v) + ": this figure is not reliable")
    return found
