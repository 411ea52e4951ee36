"""Two analyses of the same job -> what changed, with a noise guard (``diff``, ``check --baseline``).

Every metric is compared on per-step samples (the mean over ranks of each step, see
``diagnose/stats.py`` for why the step is the unit) with a confidence interval on the
difference of means; a change whose interval spans zero is "no detectable change".

A slower machine is told from a slower job by the step's *composition*: when the
machine slows (contention, lower clocks) every part scales by about the same factor,
so each part's share of the step stays put and every part's time ratio equals the
step's. A part is *off the common factor* when its share moved beyond noise or its
time-ratio interval (log scale) does not overlap the step's. The change those parts
carry beyond the common factor (``new_step * Δshare``) is the job's; when it reaches
``diff_job_share`` of the step-time change, or a finding appeared or grew beyond noise,
the change is the job's. "Environment" has to be shown, not assumed: no part off the
common factor, no finding appeared or grew, and even the far ends of all share
intervals together (``new_step * ½ Σ max|Δshare|``: the most the parts could carry
beyond the common factor) stay below ``diff_job_share`` of the change. Anything in
between is "unattributed", fails the gate, and says how many more steps would decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsdpdoctor.diagnose.fix_outcomes import fix_outcomes
from fsdpdoctor.diagnose.settings import explained_by_fix
from fsdpdoctor.diagnose.stats import estimate, half_width_after, log_ratio_interval, steps_until
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import SEVERITY_RANK as _SEVERITY_RANK
from fsdpdoctor.results import Analysis, StepBreakdown
from fsdpdoctor.results.comparison import Comparison, ComponentChange, Estimate, FindingChange

# the parts of a step: they add up to its duration
PARTITION = ("compute", "optimizer", "exposed_comm", "data_loading", "idle")
# a part must hold this share of the step for its share or time ratio to count as off the common factor
# (two non-overlapping intervals are already a conservative test, ~99.5 % at 95 % each): a sliver (a
# 200 µs optimizer) moves by large factors on any machine and could not carry a visible part of a change
MIN_RATIO_SHARE = 0.01
# finding id keyword -> the component whose share the finding is about (first match wins; else the step time)
FINDING_COMPONENT = (
    ("input", "data_loading"), ("loader", "data_loading"),
    ("host-sync", "idle"),
    ("comm", "exposed_comm"), ("overlap", "exposed_comm"), ("prefetch", "exposed_comm"),
    ("bucket", "exposed_comm"), ("collective", "exposed_comm"), ("bandwidth", "exposed_comm"),
    ("grad-accum", "exposed_comm"), ("no-sync", "exposed_comm"), ("straggler", "exposed_comm"),
    ("optimizer", "optimizer"), ("compute", "compute"),
)


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
    step_ratio = log_ratio_interval(step_samples(base, "step"), step_samples(new, "step"), level)
    comps: dict[str, ComponentChange] = {}
    for name in _component_names(base, new):
        tb, tn = step_samples(base, name), step_samples(new, name)
        cc = ComponentChange(
            name=name, in_partition=name in PARTITION, time=estimate(name, tb, tn, level),
            share=estimate(f"{name} share", step_samples(base, name, True), step_samples(new, name, True), level),
            log_ratio=log_ratio_interval(tb, tn, level))
        if cc.in_partition and max(cc.share.base_mean, cc.share.new_mean) >= MIN_RATIO_SHARE:
            cc.off_common = cc.share.significant or _ratio_apart(cc, step_ratio, step.base_mean)
        comps[name] = cc
    c.components = list(comps.values())
    c.findings = _finding_changes(base, new, comps, step, level)
    _verdict(c, comps, th)
    machine = None if c.verdict in ("regression", "improvement", "no-detectable-change") else \
        "the machine may have moved the step too: the comparison could not show the change is the job's"
    c.fixes = fix_outcomes(base, c.findings, step, th["fix_saving_tolerance"], machine)
    _side_effects(base, new, c.findings)
    return c


def _side_effects(base: Analysis, new: Analysis, changes: list[FindingChange]) -> None:
    """Name the base's fix beside a finding new or worse in the new run that its side effect can bring."""
    fixed_ids = {f.id for f in changes if f.status in ("gone", "better")}
    fixed = [f for f in base.findings if f.id in fixed_ids and f.settings]
    if not fixed:
        return
    loaders = new.signals.dataloader if new.signals else []
    workers = None if not loaders else any(not d.iterator.startswith("_SingleProcess") for d in loaders)
    for ch in changes:
        if ch.status in ("new", "worse"):
            ch.explained_by = explained_by_fix(ch.id, fixed, workers)


def _ratio_apart(cc: ComponentChange, step_ratio: tuple[float, float] | None, base_step: float) -> bool:
    """The part's time ratio and the step's cannot be one common factor: their log intervals do not overlap.

    Only for a part that holds at least ``MIN_RATIO_SHARE`` of the base step: the ratio of a sliver
    (a 20 µs optimizer) moves by large factors on any machine and carries no time either way."""
    if cc.log_ratio is None or step_ratio is None or cc.time.base_mean < MIN_RATIO_SHARE * base_step:
        return False
    return cc.log_ratio[0] > step_ratio[1] or cc.log_ratio[1] < step_ratio[0]


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
            base_impact_interval_us=list(b.impact_interval_us) if b and b.impact_interval_us else None,
            base_impact_withheld=b.impact_withheld if b else None,
            time=time, share=share))
    order = {"new": 0, "worse": 1, "better": 2, "gone": 3, "same": 4}
    out.sort(key=lambda x: (not x.significant, order[x.status]))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _moved(f: FindingChange, sign: int, floor: float) -> bool:
    """A finding appeared or grew (sign +1), or went away or shrank (sign -1), whether or not its share guard
    is significant: severity crossed a band, or its impact moved by at least the warning band of the step."""
    first, second = (f.base_severity, f.new_severity) if sign > 0 else (f.new_severity, f.base_severity)
    if first is None:
        return _SEVERITY_RANK.get(second or "", 0) >= 1
    if second is None:
        return False
    if _SEVERITY_RANK.get(second, 0) > _SEVERITY_RANK.get(first, 0):
        return True
    a, b = (f.base_impact_frac, f.new_impact_frac) if sign > 0 else (f.new_impact_frac, f.base_impact_frac)
    return a is not None and b is not None and b - a >= floor


def _job_part(parts: list[ComponentChange], new_step: float, sign: int, k: int = 0,
              shares_only: bool = False) -> float:
    """Time carried beyond the common factor, in the change's direction, by the parts whose share is beyond
    noise (with ``k`` more steps per run: the same means and spread) or, unless ``shares_only``, whose time
    ratio is off the step's."""
    out = 0.0
    for p in parts:
        d = p.share.diff * sign
        if d <= 0:
            continue
        hw = half_width_after(p.share, k) if k else p.share.half_width
        if (p.off_common and not shares_only) or (hw is not None and hw < d):
            out += new_step * d
    return out


def _job_bound(parts: list[ComponentChange], new_step: float, k: int = 0) -> float:
    """The most the parts could carry beyond the common factor: the share vectors' total-variation distance
    at the far ends of the share intervals (inf when a share has no interval)."""
    total = 0.0
    for p in parts:
        hw = half_width_after(p.share, k) if k else p.share.half_width
        if hw is None:
            return math.inf
        total += abs(p.share.diff) + hw
    return new_step * total / 2


def _steps(n: int) -> str:
    return f"{n} more profiled step{'s' if n != 1 else ''}"


def _name(n: str) -> str:
    return n.replace("_", " ")


def _grew_reason(p: ComponentChange, step: Estimate, sign: int) -> str:
    what = f"{_name(p.name)} {'grew' if sign > 0 else 'shrank'} {p.share.diff * step.new_mean / 1e3:+.1f} ms/step " \
           f"beyond the common factor (share {_pct(p.share.diff)}"
    if p.ratio is None or not step.base_mean:
        return what + ")"
    return what + f", time x{p.ratio:.2f} vs step x{step.new_mean / step.base_mean:.2f})"


@dataclass
class _OwnPart:
    """A part of the step that moved beyond every other part's factor, in the change's direction."""

    part: ComponentChange
    beside: ComponentChange   # the other part that moved most the same way: the common factor at its largest
    excess_us: float          # per step, what the part carries beyond that factor (point estimates)
    sure_us: float            # the same at the far end of the other part's interval; 0 unless the intervals are apart


def _own_parts(part: list[ComponentChange], step: Estimate, sign: int) -> list[_OwnPart]:
    """The parts that grew (``sign`` +1; shrank: -1) beyond the factor of every other part. A machine slows
    every part alike; a part beside which even the fastest-growing other part grew by a smaller factor
    carries the difference itself (idle x3 beside compute x1: all of its growth is the job's). Only parts
    holding ``MIN_RATIO_SHARE`` of the base step count, as part and as the factor beside it."""
    subs = [p for p in part if p.log_ratio is not None and p.time.base_mean >= MIN_RATIO_SHARE * step.base_mean]
    out = []
    for p in subs:
        others = [q for q in subs if q is not p]
        if not others:
            continue
        q = max(others, key=lambda o: sign * sum(o.log_ratio))
        excess = sign * (p.time.new_mean - p.time.base_mean * q.ratio)
        apart = p.log_ratio[0] > q.log_ratio[1] if sign > 0 else p.log_ratio[1] < q.log_ratio[0]
        far = math.exp(q.log_ratio[1] if sign > 0 else q.log_ratio[0])
        sure = sign * (p.time.new_mean - p.time.base_mean * far) if apart else 0.0
        if excess > 0:
            out.append(_OwnPart(p, q, excess, max(sure, 0.0)))
    return out


def _own_reason(o: _OwnPart, level: float) -> str:
    p, q = o.part, o.beside
    return (f"{_name(p.name)} grew {o.sure_us / 1e3:+.1f} ms/step beyond the factor of every other part "
            f"(time x{p.ratio:.2f} beside {_name(q.name)} x{q.ratio:.2f}, the {100 * level:.0f}% intervals apart): "
            "the job's own part, whatever the rest of the step did")


def _verdict(c: Comparison, comps: dict[str, ComponentChange], th: dict[str, float]) -> None:
    """Decide ``c.verdict``, ``c.fails_gate`` and the reasons: the first judge that can decide does."""
    part = [comps[n] for n in PARTITION]
    own = _own_parts(part, c.step, 1 if c.step.diff >= 0 else -1)
    for judge in (_own_part_decides, _within_noise, _job_decides, _unattributed):
        if judge(c, part, own, th):
            return
    _environment(c, part)


def _own_part_decides(c: Comparison, part: list[ComponentChange], own: list[_OwnPart], th: dict[str, float]) -> bool:
    """A slow-down that one part carries beyond the common factor is the job's whatever the rest of the step
    did: beyond every other part's factor (intervals apart) by most of a significant change, or by the cost
    of an error-level finding while the step time is within its noise; or its share of the step grew beyond
    noise by that cost (shares are robust to a noisy machine, step times are not). A part beyond the others
    by less than most of the change is not claimed for the job (a loaded machine also makes one rank lag,
    and its peers wait): ``_unattributed`` names it and the gate fails a large slow-down on it."""
    step = c.step
    if step.diff <= 0:
        return False
    large_us = th["diff_large_slowdown"] * step.base_mean
    target = th["diff_job_share"] * step.diff
    sure = [o for o in own if o.sure_us >= (target if step.significant else large_us)]
    grown = _job_part(part, step.new_mean, 1, shares_only=True)
    by_share = grown >= large_us and (not step.significant or grown < target)
    if not sure and not by_share:
        return False
    c.verdict, c.fails_gate = "regression", True
    c.job_part_us = max(grown, sum(o.sure_us for o in sure))
    if sure:
        c.reasons += [_own_reason(o, c.level) for o in sure]
    else:
        c.reasons += [_grew_reason(p, step, 1) for p in part if p.off_common and p.share.diff > 0]
        c.reasons.append(f"together {grown / 1e3:.1f} ms/step ({_pct(grown / step.base_mean)} of the base step) "
                         "beyond the common factor: at least the cost of an error-level finding, "
                         + ("although the step time itself is within its noise" if not step.significant else
                            "whatever the machine did to the rest of the step")
                         + (f" (step {_pct(step.rel)}, {100 * step.level:.0f}% CI {_pct(step.rel_interval[0])}.."
                            f"{_pct(step.rel_interval[1])})" if step.rel_interval else ""))
    c.reasons += [f"finding {f.id} is {f.status} ({f.new_severity})" for f in c.findings
                  if _moved(f, 1, th["severity_warning_frac"])]
    return True


def _within_noise(c: Comparison, part, own, th: dict[str, float]) -> bool:
    """The step-time change is within its noise: a finding that grew beyond noise still regresses, and one
    step per run cannot pass a slow-down larger than healthy runs' step-to-step noise."""
    step = c.step
    if step.significant:
        return False
    bad = [f for f in c.findings if f.regressed]
    if step.lo is None and step.n_base and step.n_new and step.rel is not None and step.rel > th["diff_one_step_noise"]:
        c.verdict, c.fails_gate = "slower-unattributed", True
        c.reasons.append(f"one profiled step per run and the step is {_pct(step.rel)} slower, more than the "
                         f"step-to-step noise of healthy runs allows ({_pct(th['diff_one_step_noise'])}): "
                         "a slow-down that cannot be judged fails the gate; profile at least 3 steps per run")
    elif bad:
        c.verdict, c.fails_gate = "regression", True
        c.reasons += [f"finding {f.id} is {f.status}: {_name(f.component)} share "
                      f"{_pct(f.share.diff if f.share else f.time.rel if f.time else None)} "
                      "(significant) although the step-time change is within noise" for f in bad]
    else:
        c.verdict = "no-detectable-change"
        c.reasons.append(_no_change_reason(step))
    return True


def _no_change_reason(step: Estimate) -> str:
    if step.method == "identical":
        return "the two runs have identical per-step samples"
    if step.more_steps is not None:
        return (f"the step-time difference ({_pct(step.rel)}) is within the noise; about "
                f"{_steps(step.more_steps)} per run would tell whether it is real")
    return "too few steps for an interval" if step.lo is None else "the interval of the step-time difference spans zero"


def _job_decides(c: Comparison, part: list[ComponentChange], own, th: dict[str, float]) -> bool:
    """Parts off the common factor carry most of the change, or a finding grew (shrank) beyond noise."""
    step = c.step
    sign = 1 if step.diff > 0 else -1
    c.job_part_us = sign * _job_part(part, step.new_mean, sign)
    c.job_bound_us = None if math.isinf(b := _job_bound(part, step.new_mean)) else b
    found = [f for f in c.findings if f.regressed] if sign > 0 else \
        [f for f in c.findings if f.significant and f.status in ("gone", "better")]
    if abs(c.job_part_us) < th["diff_job_share"] * abs(step.diff) and not found:
        return False
    c.verdict = "regression" if sign > 0 else "improvement"
    c.fails_gate = sign > 0
    c.reasons += [_grew_reason(p, step, sign) for p in part if p.off_common and p.share.diff * sign > 0]
    c.reasons += [f"finding {f.id} is {f.status} ({_name(f.component)} share "
                  f"{_pct(f.share.diff if f.share else None)})" for f in found]
    return True


def _unattributed(c: Comparison, part: list[ComponentChange], own: list[_OwnPart], th: dict[str, float]) -> bool:
    """Neither the job's nor shown to be the machine: a part off the common factor, a finding that moved, a
    part whose point estimate grew far beyond the others' within a wide interval, or shares too uncertain.
    "Mostly the machine" needs the parts that grew to agree within their noise."""
    step = c.step
    sign = 1 if step.diff > 0 else -1
    slower = sign > 0
    target = th["diff_job_share"] * abs(step.diff)
    off = [p for p in part if p.off_common]
    grew_off = [p for p in off if p.share.diff * sign > 0]
    moved = [f for f in c.findings if _moved(f, sign, th["severity_warning_frac"])]
    # a part beyond every other part's factor by the cost of an error-level finding (point estimates): the parts
    # do not agree, whether or not the intervals can tell yet
    suspects = [o for o in own if o.excess_us >= th["diff_large_slowdown"] * step.base_mean]
    blockers = [f"{_name(p.name)} is off the common factor ("
                + (f"share {_pct(p.share.diff)} beyond noise, " if p.share.significant else "")
                + f"time x{p.ratio:.2f} vs step x{step.new_mean / step.base_mean:.2f})"
                for p in (grew_off or off) if p.ratio is not None]
    blockers += [f"{_name(o.part.name)} x{o.part.ratio:.2f} beside {_name(o.beside.name)} x{o.beside.ratio:.2f} "
                 f"({o.excess_us / 1e3:.1f} ms/step beyond its factor, "
                 + (f"{100 * o.excess_us / abs(step.diff):.0f}% of the change)" if o.sure_us else
                    f"within the noise of {step.n_base} vs {step.n_new} steps)") for o in suspects]
    blockers += [f"finding {f.id} {'appeared' if (f.status == 'new') == slower else 'went away'} or "
                 f"{'grew' if slower else 'shrank'} ({f.base_severity or '-'} -> {f.new_severity or '-'})"
                 for f in moved]
    majority = c.job_bound_us is None or c.job_bound_us >= target
    if not blockers and not majority:
        return False
    c.verdict = "slower-unattributed" if slower else "faster-unattributed"
    change = f"{abs(step.diff) / 1e3:.1f} ms change"
    if blockers:
        why = (f"{'; '.join(blockers)}: so it is not shown to be the machine, and the parts off the common "
               f"factor carry {abs(c.job_part_us) / 1e3:.1f} ms of the {change}, too little to call it the job's")
    else:
        bound = "an unknown part" if c.job_bound_us is None else f"up to {c.job_bound_us / 1e3:.1f} ms"
        why = (f"with {step.n_base} vs {step.n_new} steps the parts' shares are too uncertain: {bound} of the "
               f"{change} could be parts growing beyond the common factor (the job) rather than every part "
               f"scaling alike (the machine)")
    c.more_steps = steps_until(lambda k: _job_part(part, step.new_mean, sign, k) >= target
                               or (not off and not moved and not suspects
                                   and _job_bound(part, step.new_mean, k) < target), cap=10_000)
    more = (f"about {_steps(c.more_steps)} per run would tell job from machine (if the step-to-step "
            "spread stays as measured)" if c.more_steps is not None else
            "more steps of these runs would not tell job from machine")
    c.reasons.append(f"{why}; {more}")
    if slower:
        _unattributed_gate(c, th, majority, [_name(p.name) for p in grew_off] + [_name(o.part.name) for o in suspects],
                           [f.id for f in moved if f.new_severity == "error" and f.base_severity != "error"])
    return True


def _unattributed_gate(c: Comparison, th: dict[str, float], majority: bool, grew: list[str], new_error: list[str]) -> None:
    """An unattributed slow-down fails the gate when a finding newly reached error, or when it is large (the
    cost of an error-level finding) and either the job could have carried most of it or a part grew beyond the
    common factor (the parts do not agree, so it is not the machine). Otherwise it passes with the warning."""
    step = c.step
    large = step.rel is not None and step.rel >= th["diff_large_slowdown"]
    c.fails_gate = bool(new_error) or (large and (majority or bool(grew)))
    if new_error:
        c.reasons.append(f"fails the gate: finding {', '.join(new_error)} newly reached error")
    elif large and majority:
        c.reasons.append(f"fails the gate: a large slow-down ({_pct(step.rel)}, at least "
                         f"{_pct(th['diff_large_slowdown'])} of the step) that the job could have carried most of")
    elif large and grew:
        c.reasons.append(f"fails the gate: a large slow-down ({_pct(step.rel)}, at least "
                         f"{_pct(th['diff_large_slowdown'])} of the step) in which {', '.join(dict.fromkeys(grew))} "
                         "grew beyond the other parts: they do not agree within their noise, so it is not shown "
                         "to be the machine")
    elif not majority and not grew:
        c.reasons.append(f"passes the gate: mostly the machine (the parts could carry at most "
                         f"{c.job_bound_us / 1e3:.1f} ms of the {step.diff / 1e3:.1f} ms change beyond the "
                         "common factor, and none grew beyond the others)")
    else:
        c.reasons.append(f"passes the gate: the slow-down ({_pct(step.rel)}) is under the "
                         f"{_pct(th['diff_large_slowdown'])} from which an unattributed one fails it")


def _environment(c: Comparison, part: list[ComponentChange]) -> None:
    step = c.step
    slower = step.diff > 0
    ratios = ", ".join(f"{_name(p.name)} x{p.ratio:.2f}" for p in part
                       if p.ratio is not None and p.time.base_mean >= MIN_RATIO_SHARE * step.base_mean)
    c.verdict = "environment-slower" if slower else "environment-faster"
    c.reasons.append(f"no part of the step moved off the common factor (time ratios: {ratios}), no finding "
                     f"{'appeared or grew' if slower else 'went away or shrank'}, and the parts could carry at "
                     f"most {c.job_bound_us / 1e3:.1f} ms of the {abs(step.diff) / 1e3:.1f} ms change beyond "
                     f"it: every part {'slowed' if slower else 'sped up'} alike, so the machine changed "
                     "(contention, clocks, another job), not the job")
