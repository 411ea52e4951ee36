"""Two analyses of the same job -> what changed, with a noise guard (``diff``, ``check --baseline``).

Every metric is compared on per-step samples (the mean over ranks of each step, see
``diagnose/stats.py`` for why the step is the unit) with a confidence interval on the
difference of means; a change whose interval spans zero is "no detectable change".

A slower machine is told from a slower job by the step's *composition*: when the
machine slows (contention, lower clocks) every component scales by about the same
factor, so each component's share of the step stays put. The part of the step-time
change that components whose share moved significantly carry beyond that common factor
(``new_step * Δshare``) is the job's when it reaches ``diff_job_share`` of the change.
The verdict is "environment", not "regression", only when no finding appeared or grew and
no single part could have carried that share (the far end of each part's share interval);
with too few steps to show either, a slow-down is "slower-unattributed" and fails the gate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from fsdpdoctor.diagnose.stats import Estimate, estimate
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import Analysis, StepBreakdown

# the parts of a step: they add up to its duration
PARTITION = ("compute", "optimizer", "exposed_comm", "data_loading", "idle")
# finding id keyword -> the component whose share the finding is about (first match wins; else the step time)
FINDING_COMPONENT = (
    ("input", "data_loading"), ("loader", "data_loading"),
    ("host-sync", "idle"),
    ("comm", "exposed_comm"), ("overlap", "exposed_comm"), ("prefetch", "exposed_comm"),
    ("bucket", "exposed_comm"), ("collective", "exposed_comm"), ("bandwidth", "exposed_comm"),
    ("grad-accum", "exposed_comm"), ("no-sync", "exposed_comm"), ("straggler", "exposed_comm"),
    ("optimizer", "optimizer"), ("compute", "compute"),
)

Verdict = Literal["no-detectable-change", "regression", "improvement", "environment-slower",
                  "environment-faster", "slower-unattributed", "faster-unattributed"]
FindingStatus = Literal["new", "gone", "worse", "better", "same"]


@dataclass
class ComponentChange:
    name: str                            # "compute", "exposed_comm", "comm[all_reduce]", ...
    time: Estimate                       # µs per step
    share: Estimate                      # share of the step
    in_partition: bool                   # one of the parts that add up to the step

    @property
    def ratio(self) -> float | None:
        return self.time.new_mean / self.time.base_mean if self.time.base_mean > 0 else None


@dataclass
class FindingChange:
    id: str
    title: str
    status: FindingStatus                # by the finding's presence, then by its component's share
    significant: bool                    # the component it measures changed beyond noise in that direction
    component: str                       # what the finding measures ("step" when not known)
    base_impact_us: float | None
    new_impact_us: float | None
    base_impact_frac: float | None
    new_impact_frac: float | None
    base_severity: str | None
    new_severity: str | None
    time: Estimate | None = None         # the component's time per step
    share: Estimate | None = None        # and its share of the step

    @property
    def regressed(self) -> bool:
        return self.significant and self.status in ("new", "worse")


@dataclass
class Comparison:
    base: str
    new: str
    level: float                         # confidence level of every interval
    step: Estimate
    components: list[ComponentChange] = field(default_factory=list)
    findings: list[FindingChange] = field(default_factory=list)
    verdict: Verdict = "no-detectable-change"
    job_part_us: float = 0.0             # step-time change carried by components beyond the common factor
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        # a significant slow-down that these samples cannot attribute to the machine fails the gate too
        return self.verdict in ("regression", "slower-unattributed")

    # the figures the first diff showed, kept for readers of the JSON
    @property
    def base_step_us(self) -> float:
        return self.step.base_mean

    @property
    def new_step_us(self) -> float:
        return self.step.new_mean

    @property
    def step_change_frac(self) -> float:
        return self.step.rel or 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d |= {"regressed": self.regressed, "base_step_us": self.base_step_us, "new_step_us": self.new_step_us,
              "step_change_frac": self.step_change_frac}
        _add_estimate_props(d["step"], self.step)
        for dc, c in zip(d["components"], self.components):
            _add_estimate_props(dc["time"], c.time)
            _add_estimate_props(dc["share"], c.share)
            dc["ratio"] = c.ratio
        for df, f in zip(d["findings"], self.findings):
            for k in ("time", "share"):
                if getattr(f, k) is not None:
                    _add_estimate_props(df[k], getattr(f, k))
            df["regressed"] = f.regressed
        return d


def _add_estimate_props(d: dict, e: Estimate) -> None:
    ri = e.rel_interval
    d |= {"significant": e.significant, "rel": e.rel, "rel_lo": ri[0] if ri else None,
          "rel_hi": ri[1] if ri else None}


def _value(s: StepBreakdown, name: str) -> float:
    if name == "step":
        return s.duration_us
    if name.startswith("comm["):
        kt = s.comm_by_kind.get(name[5:-1])
        return kt.busy_us if kt else 0.0
    return float(getattr(s, f"{name}_us"))


def step_samples(a: Analysis, name: str, share: bool = False) -> list[float]:
    """One value per profiled step: the mean over ranks of the component (or of its share of the step)."""
    by_step: dict = {}
    for r in a.ranks:
        for s in r.steps:
            v = _value(s, name)
            if share:
                if not s.duration_us:
                    continue
                v /= s.duration_us
            by_step.setdefault(s.step, []).append(v)
    return [sum(v) / len(v) for _, v in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


def finding_component(fid: str) -> str:
    return next((c for kw, c in FINDING_COMPONENT if kw in fid), "step")


def _component_names(base: Analysis, new: Analysis) -> list[str]:
    kinds = sorted({k for a in (base, new) for r in a.ranks for s in r.steps for k in s.comm_by_kind})
    return [*PARTITION, "overlapped_comm", "comm", *(f"comm[{k}]" for k in kinds)]


def compare(base: Analysis, new: Analysis, thresholds: dict[str, float] | None = None) -> Comparison:
    th = resolve(thresholds)
    level = th["diff_confidence"]
    step = estimate("step", step_samples(base, "step"), step_samples(new, "step"), level)
    c = Comparison(base=base.source, new=new.source, level=level, step=step)
    for what, b, n in (("world size", base.job.world_size, new.job.world_size),
                       ("wrapping", base.job.wrapping, new.job.wrapping),
                       ("trace dialect", base.job.dialect, new.job.dialect)):
        if b != n:
            c.notes.append(f"the runs differ in {what} ({b} vs {n}): this compares different jobs")
    if step.n_base < 2 and step.n_new < 2:
        c.notes.append("one profiled step per run: no step-to-step noise to judge a change by; profile more steps")
    comps: dict[str, ComponentChange] = {}
    for name in _component_names(base, new):
        comps[name] = ComponentChange(
            name=name, in_partition=name in PARTITION,
            time=estimate(name, step_samples(base, name), step_samples(new, name), level),
            share=estimate(f"{name} share", step_samples(base, name, True), step_samples(new, name, True), level))
    c.components = list(comps.values())
    c.findings = _finding_changes(base, new, comps, step, level)
    _verdict(c, comps, th["diff_job_share"])
    return c


def _finding_changes(base: Analysis, new: Analysis, comps: dict[str, ComponentChange], step: Estimate,
                     level: float) -> list[FindingChange]:
    bmap = {f.id: f for f in base.findings}
    nmap = {f.id: f for f in new.findings}
    out = []
    for fid in dict.fromkeys([*bmap, *nmap]):
        b, n = bmap.get(fid), nmap.get(fid)
        comp = finding_component(fid)
        if comp in comps:
            time, share = comps[comp].time, comps[comp].share
            guard = share          # a finding is about a share of the step: a uniformly slower machine moves none
        else:
            time, share, guard = step, None, step
        up = guard.significant and guard.diff > 0
        down = guard.significant and guard.diff < 0
        if b and not n:
            status, significant = "gone", down
        elif n and not b:
            status, significant = "new", up
        else:
            status = "worse" if up else "better" if down else "same"
            significant = up or down
        ref = n or b
        out.append(FindingChange(
            id=fid, title=ref.title, status=status, significant=significant, component=comp,
            base_impact_us=b.impact_us if b else None, new_impact_us=n.impact_us if n else None,
            base_impact_frac=b.impact_frac if b else None, new_impact_frac=n.impact_frac if n else None,
            base_severity=b.severity if b else None, new_severity=n.severity if n else None,
            time=time, share=share))
    order = {"new": 0, "worse": 1, "better": 2, "gone": 3, "same": 4}
    out.sort(key=lambda x: (not x.significant, order[x.status]))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _unclear_reason(unclear: list[ComponentChange], step: Estimate) -> str:
    """Why a significant step-time change is neither clearly the job's nor clearly the machine's."""
    names = ", ".join(p.name.replace("_", " ") for p in unclear)
    return (f"with {step.n_base} vs {step.n_new} steps the share of {names} is too uncertain to rule out that "
            "it carried most of the change (the job), so it cannot be shown that every part scaled alike (the "
            "machine); profile more steps")


def _verdict(c: Comparison, comps: dict[str, ComponentChange], job_share: float) -> None:
    step = c.step
    part = [comps[n] for n in PARTITION]
    moved = [p for p in part if p.share.significant]
    # the change each component carries beyond the common factor: new_step * Δshare
    excess = {p.name: step.new_mean * p.share.diff for p in moved}
    bad = [f for f in c.findings if f.regressed]
    good = [f for f in c.findings if f.significant and f.status in ("gone", "better")]
    ratios = ", ".join(f"{p.name.replace('_', ' ')} x{p.ratio:.2f}" for p in part
                       if p.ratio is not None and p.time.base_mean >= 0.01 * step.base_mean)
    if step.significant:
        sign = 1 if step.diff > 0 else -1
        c.job_part_us = sum(v for v in excess.values() if v * sign > 0)
        job = abs(c.job_part_us) >= job_share * abs(step.diff)
        # "the machine" needs evidence that no single part carried the change: the most any part could carry
        # beyond the common factor (the far end of its share interval) must stay below job_share of the change
        reach = {p.name: (p.share.hi if sign > 0 else -p.share.lo) if p.share.lo is not None else math.inf
                 for p in part}
        unclear = [p for p in part if reach[p.name] * step.new_mean >= job_share * abs(step.diff)]
        if sign > 0:
            if job or bad:
                c.verdict = "regression"
                c.reasons += [f"{k.replace('_', ' ')} grew {v / 1e3:+.1f} ms/step beyond the common factor"
                              for k, v in excess.items() if v > 0]
                c.reasons += [f"finding {f.id} is {f.status} ({f.component.replace('_', ' ')} share "
                              f"{_pct(f.share.diff if f.share else None)})" for f in bad]
            elif unclear:
                c.verdict = "slower-unattributed"
                c.reasons.append(_unclear_reason(unclear, step))
            else:
                c.verdict = "environment-slower"
                c.reasons.append(f"no part of the step changed its share beyond noise (time ratios: {ratios}) and "
                                 "no finding appeared or grew: every part slowed alike, so the machine changed "
                                 "(contention, clocks, another job), not the job")
        else:
            if job or good:
                c.verdict = "improvement"
                c.reasons += [f"{k.replace('_', ' ')} shrank {v / 1e3:+.1f} ms/step beyond the common factor"
                              for k, v in excess.items() if v < 0]
                c.reasons += [f"finding {f.id} is {f.status}" for f in good]
            elif unclear:
                c.verdict = "faster-unattributed"
                c.reasons.append(_unclear_reason(unclear, step))
            else:
                c.verdict = "environment-faster"
                c.reasons.append(f"no part of the step changed its share beyond noise (time ratios: {ratios}): "
                                 "every part sped up alike, so the machine changed, not the job")
    elif bad:
        c.verdict = "regression"
        c.reasons += [f"finding {f.id} is {f.status}: {f.component.replace('_', ' ')} share "
                      f"{_pct(f.share.diff if f.share else f.time.rel if f.time else None)} "
                      "(significant) although the step-time change is within noise" for f in bad]
    else:
        c.verdict = "no-detectable-change"
        if step.method == "identical":
            c.reasons.append("the two runs have identical per-step samples")
        elif step.more_steps is not None:
            c.reasons.append(f"the step-time difference ({_pct(step.rel)}) is within the noise; about "
                             f"{step.more_steps} more profiled steps per run would tell whether it is real")
        elif step.lo is None:
            c.reasons.append("too few steps for an interval")
        else:
            c.reasons.append("the interval of the step-time difference spans zero")
