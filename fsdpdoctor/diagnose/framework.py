"""The rule framework: what a rule is, the context it reads, and what happens to its findings.

A rule is a function ``(RuleContext) -> list[Finding]`` made a ``Rule`` by ``@rule(ids=...,
thresholds=...)``: it declares the finding ids it may emit and the thresholds it reads. While it runs,
``ctx.th`` holds only the declared thresholds (reading another is a bug and raises), and every
finding it returns must carry a declared id. Facts several rules share (is there a straggler, what
idles the GPU, are CUDA tensors on gloo) live in ``diagnose/facts.py``, computed from the whole
threshold table. ``diagnose/rules.py`` lists the rule modules and runs them.

Impact is the time per step that fixing the problem is predicted to save (what the fix changes, bounded
by what the backend lets it change), with an interval from the per-step values it rests on. Severity is one scale for every rule: the saving as a share of the step, weighted by the
confidence of the diagnosis, against the bands of the threshold table (``severity_*_frac``); a rule
may raise it to a floor of at most "warning" (a configuration that is wrong, not merely non-default),
never to "error" without the measured cost; and a warning or an error only where its saving's interval
stays in that band beyond the run's own step-to-step noise (diagnose/noise.py).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Literal, get_args
from collections.abc import Callable, Iterable, Iterator, Mapping

from fsdpdoctor.diagnose.noise import EXPLICIT, SAMPLES_KEY, gate_by_noise
from fsdpdoctor.diagnose.settings import fix_text
from fsdpdoctor.diagnose.thresholds import BY_NAME
from fsdpdoctor.results import SEVERITY_RANK, Analysis, DialectTraits, Evidence, Finding, Setting


class UndeclaredThreshold(KeyError):
    """A rule read a threshold it did not declare: a defect of the rule, never of the input."""


class DeclaredThresholds(Mapping[str, float]):
    """The part of the resolved threshold table a rule declared; reading anything else raises."""

    def __init__(self, table: Mapping[str, float], names: Iterable[str], rule: str):
        self._table, self._names, self._rule = table, frozenset(names), rule

    def __getitem__(self, name: str) -> float:
        if name not in self._names:
            raise UndeclaredThreshold(f"rule {self._rule} reads threshold {name!r} it did not declare")
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)


@dataclass(slots=True)
class RuleContext:
    """What a rule reads: the analysis and the resolved thresholds (its own declared ones as ``th``)."""

    a: Analysis
    table: Mapping[str, float]          # the whole resolved table (framework and shared facts)
    th: Mapping[str, float] = None      # what the running rule declared (the whole table outside a rule)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.th is None:
            self.th = self.table

    def for_rule(self, r: Rule) -> RuleContext:
        """The same analysis and shared facts, with only the thresholds ``r`` declared."""
        return RuleContext(self.a, self.table, DeclaredThresholds(self.table, r.thresholds, r.name), self._cache)

    def cached(self, key: str, compute: Callable[[], object]):
        """A shared fact computed once per diagnosis (facts.py)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def step_us(self) -> float:
        return self.a.mean.duration_us if self.a.mean else 0.0

    @property
    def traits(self) -> DialectTraits:
        return self.a.job.traits

    @property
    def wrap(self) -> dict:
        return self.a.job.wrapping_details or {}

    def frac(self, us: float) -> float:
        return us / self.step_us if self.step_us else 0.0

    @property
    def device_word(self) -> str:
        """What computes: "the GPU" only where the trace has a device timeline."""
        return "the GPU" if self.traits.device_timeline else "compute"

    def severity(self, impact_us: float, floor: str = "info", confidence: float = 1.0) -> str:
        """One scale for every rule: the saving a fix brings (share of the step) times the confidence.

        ``floor`` raises it for a configuration known to be wrong, but never above "warning": an
        error needs the measured cost.
        """
        return severity_for(self.frac(impact_us) * max(min(confidence, 1.0), 0.0), self.table, floor)

    def finding(self, id: str, title: str, impact_us: float, summary: str, fix: str, *, confidence: float,
                evidence: list[Evidence], severity: str | None = None, ranks=None, source=None,
                floor: str = "info", consequences: Iterable[str] = (),
                samples: list[float] | None = None, settings: Iterable[Setting] = ()) -> Finding:
        """``samples``: the per-step values the saving rests on (diagnose/noise.py: its interval and whether
        it is beyond the run's noise); without them the step time's noise stands for it. ``settings``: the
        generic settings the fix changes (diagnose/settings.py); the fix is then their code in the job's
        framework's terms, followed by ``fix`` (the rule's own words) and their side effects."""
        settings, framework = list(settings), None
        if settings:
            framework = self.a.job.framework
            settings, fix = fix_text(settings, framework, fix)
        f = Finding(id=id, title=title,
                    severity=severity or self.severity(impact_us, floor=floor, confidence=confidence),
                    confidence=confidence, impact_us=impact_us, impact_frac=self.frac(impact_us),
                    summary=summary, fix=fix, evidence=evidence,
                    ranks=list(ranks or self.a.job.ranks_analyzed), source=source,
                    consequences=list(consequences), settings=settings, framework=framework)
        self._cache.setdefault(SAMPLES_KEY, {})[builtins.id(f)] = (
            None if samples is None else list(samples), floor if severity is None else EXPLICIT)
        return f


def severity_for(weighted_frac: float, th: Mapping[str, float], floor: str = "info") -> str:
    sev = ("error" if weighted_frac >= th["severity_error_frac"] else
           "warning" if weighted_frac >= th["severity_warning_frac"] else "info")
    floor = floor if SEVERITY_RANK.get(floor, 0) <= SEVERITY_RANK["warning"] else "warning"
    return sev if SEVERITY_RANK[sev] >= SEVERITY_RANK.get(floor, 0) else floor


RuleFn = Callable[[RuleContext], list[Finding]]


# the parts of a step (StepBreakdown fields) a finding's impact may be declared to lie in
Part = Literal["exposed_comm_us", "idle_us", "data_loading_us", "compute_us", "optimizer_us"]
# parts of the step that are work, not waiting: only a root declared in one of them saves busy time
BUSY_PARTS = ("compute_us", "optimizer_us")


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule as the framework sees it: the function, the ids it may emit, the thresholds it reads, and
    for ids whose impact is time inside one part of the step (their exposed collectives are exposed
    communication), that part."""

    fn: RuleFn
    ids: tuple[str, ...]
    thresholds: tuple[str, ...]
    parts: Mapping[str, Part] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.fn.__module__.rsplit('.', 1)[-1]}.{self.fn.__name__}"

    def __call__(self, ctx: RuleContext) -> list[Finding]:
        return self.fn(ctx)

    def run(self, ctx: RuleContext) -> list[Finding]:
        """Run on ``ctx`` with only the declared thresholds; every finding must carry a declared id."""
        found = self.fn(ctx.for_rule(self))
        wrong = sorted({f.id for f in found} - set(self.ids))
        if wrong:
            raise RuleDefect(f"rule {self.name} emitted {', '.join(wrong)}, declared {', '.join(self.ids)}")
        return found


class RuleDefect(RuntimeError):
    """A rule broke its declaration (an id or threshold it did not declare)."""


def rule(*, ids: Iterable[str], thresholds: Iterable[str] = (),
         parts: Mapping[str, Part] | None = None) -> Callable[[RuleFn], Rule]:
    """Declare a rule: the finding ids it emits, the thresholds (names in diagnose/thresholds.py) it reads,
    and ``parts``: for an id whose impact is time inside one part of the step, that part (roots drawing
    on one part together claim at most that part's time)."""
    ids, thresholds, parts = tuple(ids), tuple(thresholds), dict(parts or {})
    unknown = [t for t in thresholds if t not in BY_NAME]
    if not ids or unknown or set(parts) - set(ids) or set(parts.values()) - set(get_args(Part)):
        raise RuleDefect(f"a rule needs ids, known thresholds (unknown: {unknown}) and parts of its own ids "
                         f"among {get_args(Part)}")

    def deco(fn: RuleFn) -> Rule:
        return Rule(fn, ids, thresholds, parts)
    return deco


# ------------------------------------------------------------------ helpers rules share for their prose
def first_source(a: Analysis, pred) -> str | None:
    return next((c.source for c in a.collective_events if pred(c) and c.source), None)


def sync_confidence(ctx: RuleContext, confidence: float) -> float:
    """Where collectives block the host, an overlap fix cannot be measured here: halve the confidence."""
    return confidence if ctx.traits.async_collectives else confidence * 0.5


def wrap_site(ctx: RuleContext) -> str | None:
    """Where the model is wrapped, when the manifest recorded it."""
    w = ctx.wrap
    return w.get("call_site") or w.get("source") or w.get("wrapped_at")


def rank_steps(ctx: RuleContext) -> int:
    """Rank-steps analysed (the divisor of per-rank, per-step means), at least 1."""
    return max(len(ctx.a.job.steps), 1) * max(len(ctx.a.ranks), 1)


# ------------------------------------------------------------------ after the rules
def run_rules(rules: Iterable[Rule], analysis: Analysis, table: Mapping[str, float]) -> list[Finding]:
    """Every rule on one context, then root causes folded, impacts bounded, thin evidence capped."""
    ctx = RuleContext(analysis, table)
    findings: list[Finding] = []
    parts: dict[str, Part] = {}
    for r in rules:
        findings.extend(r.run(ctx))
        parts.update(r.parts)
    if below_resolution(analysis, table):
        return []
    out = fold_consequences(findings)
    bound_impacts(out, ctx, parts)
    gate_by_noise(out, analysis, table, ctx._cache.get(SAMPLES_KEY, {}), severity_for)
    cap_unmarked_steps(out, analysis)
    cap_thin_evidence(out, analysis)
    return out


# Chrome/Kineto trace timestamps are in microseconds: an interval's two edges carry about one tick
# of rounding together, so a share of a step is known to about TICK_US / step.
TICK_US = 1.0


def resolution_floor_us(table: Mapping[str, float]) -> float:
    """The shortest step whose shares can be told from timer rounding: one tick must be less than the
    lowest severity band (severity_warning_frac of the step), 20 us with the defaults."""
    return TICK_US / table["severity_warning_frac"]


def below_resolution(a: Analysis, table: Mapping[str, float]) -> bool:
    """A step shorter than the resolution floor gives no finding: its shares are timer rounding. Says so once
    in the analysis notes."""
    if not a.mean or a.mean.duration_us >= resolution_floor_us(table):
        return False
    note = (f"the mean step lasts {a.mean.duration_us:.2f} us, under {resolution_floor_us(table):.0f} us: at the "
            f"trace's {TICK_US:.0f} us timer resolution its shares cannot be told from rounding, so no finding "
            "is made")
    if note not in a.notes:
        a.notes.append(note)
    return True


def _cost_order(f: Finding) -> tuple:
    # severity first; among equals the finding that explains more (a setup fault) claims first
    return (-SEVERITY_RANK.get(f.severity, 0), -len(f.consequences), -f.impact_us, f.id)


def fold_consequences(findings: list[Finding]) -> list[Finding]:
    """Root cause first: fold the findings a root names in ``consequences`` under it.

    Roots claim in order of severity, then how much they explain, then impact (a setup fault
    before a straggler), a finding
    is claimed once (so no cycles), a claimed finding's own effects move up under the new root
    (one level: root, then all its effects), and a finding claimed before its turn claims nothing.
    A consequence gets ``caused_by`` and is capped at "info", so only its root gates ``check``.
    Returned order: roots by cost (most costly first), each followed by its consequences.
    """
    by_id: dict[str, list[Finding]] = {}
    for f in findings:
        by_id.setdefault(f.id, []).append(f)
    # a rule may name its own root cause (caused_by) instead of the root naming it: turn that into
    # the root's claim, and drop a named cause that did not fire
    for f in findings:
        if f.caused_by:
            for root in by_id.get(f.caused_by, []):
                if f.id not in root.consequences:
                    root.consequences.append(f.id)
            f.caused_by = None
    children: dict[int, list[Finding]] = {}
    for root in sorted(findings, key=_cost_order):
        if root.caused_by:
            root.consequences = []
            continue
        claimed = []
        for cid in dict.fromkeys(root.consequences):
            for g in by_id.get(cid, []):
                if g is root or g.caused_by:
                    continue
                g.caused_by = root.id
                g.severity = "info"
                g.consequences = []
                claimed.append(g)
                # an effect that had claimed effects of its own hands them up: one level under the root
                for h in children.pop(id(g), []):
                    h.caused_by = root.id
                    claimed.append(h)
        root.consequences = list(dict.fromkeys(g.id for g in claimed))
        children[id(root)] = sorted(claimed, key=_cost_order)
    out: list[Finding] = []
    for root in sorted((f for f in findings if not f.caused_by), key=lambda f: (-f.impact_us, -SEVERITY_RANK.get(
            f.severity, 0), f.id)):
        out.append(root)
        out.extend(children.get(id(root), []))
    return out


PART_WORDS = {"exposed_comm_us": "exposed communication", "idle_us": "idle time", "data_loading_us": "data loading",
              "compute_us": "compute", "optimizer_us": "optimizer time"}


def bound_impacts(findings: list[Finding], ctx: RuleContext, parts: Mapping[str, Part] | None = None) -> None:
    """No finding saves more than its step or its part of it, and the roots together save at most the step.

    A fix cannot give back more than the step it shortens, so each impact is capped at the step; one
    whose time lies in a declared part of the step (``parts``: id -> part) is capped at that part's
    mean time too (exposed collectives summed call by call can overlap each other). Roots may explain
    the same time twice (a rank that waits for a late peer shows it as exposed communication and as the
    peer's lateness; exposed all-gathers as unprefetched and as slow): time one root explains is left out
    of the next. In cost order (as folded) each root keeps at most what the roots before it left of the
    step, and of its part, so the roots' impacts together are a union, never more than the step or the
    part. A root whose saving shrinks this way says so in its evidence.
    """
    step = ctx.step_us
    if step <= 0:
        return
    parts = parts or {}
    mean = ctx.a.mean
    part_us = {p: max(float(getattr(mean, p, 0.0)), 0.0) if mean else 0.0 for p in set(parts.values())}
    left, left_in = step, dict(part_us)
    left_free = step - _least_busy(ctx)
    for f in findings:
        part = parts.get(f.id)
        busy = part in BUSY_PARTS
        own = min(f.impact_us, step, part_us[part] if part else step)
        if part and own < min(f.impact_us, step) - 1e-6:
            f.evidence.append(Evidence(
                f"impact limited to the step's {PART_WORDS[part]}, {own / 1e3:.1f} ms of the {f.impact_us / 1e3:.1f} "
                "ms its calls add up to: calls that run at the same time are counted once", time_us=own))
        if not f.caused_by:
            room = left if busy else min(left, max(left_free, 0.0))
            kept = min(own, room, left_in[part] if part else room)
            if kept <= own - TICK_US:  # a cut below the trace's resolution is not a measured one
                digits = 1 if own - kept >= 50.0 else 3
                rest = (f"the rest of the step's {PART_WORDS[part]} ({part_us[part] / 1e3:.1f} ms per step)"
                        if part and left_in[part] < room else "the rest of the step" if room == left else
                        "the rest of the time a fix could save (the step less its compute)")
                f.evidence.append(Evidence(
                    f"impact limited to {kept / 1e3:.{digits}f} ms of its {own / 1e3:.{digits}f} ms: {rest} is "
                    "already explained by the findings above", time_us=kept))
                f.severity = _severity_after_cut(f, own, kept, ctx)
            own, left = kept, max(left - kept, 0.0)
            if not busy:
                left_free -= kept
            if part:
                left_in[part] = max(left_in[part] - kept, 0.0)
        if own != f.impact_us:
            f.impact_us, f.impact_frac = own, ctx.frac(own)


def _least_busy(ctx: RuleContext) -> float:
    """The busy time (compute, optimizer) per step of the least busy rank: what a fix of waiting (idle,
    exposed communication, loading) can save is the step less that, since the rank that waits most
    stops waiting; only a root declared in a busy part (``BUSY_PARTS``) draws on the busy time itself."""
    means = [r.mean for r in ctx.a.ranks if r.mean] or ([ctx.a.mean] if ctx.a.mean else [])
    if not means:
        return 0.0
    return min(max(m.compute_us, 0.0) + max(m.optimizer_us, 0.0) for m in means)


def _severity_after_cut(f: Finding, own_us: float, kept_us: float, ctx: RuleContext) -> str:
    """The severity the time a root alone explains earns: never more than it had, and not below a floor
    its rule set for a configuration known to be wrong (a severity above what its own impact earned)."""
    earned = severity_for(ctx.frac(own_us) * f.confidence, ctx.table)
    floor = f.severity if SEVERITY_RANK.get(f.severity, 0) > SEVERITY_RANK[earned] else "info"
    now = severity_for(ctx.frac(kept_us) * f.confidence, ctx.table, floor)
    return now if SEVERITY_RANK[now] < SEVERITY_RANK.get(f.severity, 0) else f.severity


def cap_thin_evidence(findings: list[Finding], a: Analysis) -> None:
    """An error needs evidence over at least 2 steps or 2 ranks: one step of one rank is one sample,
    whose cost may be a one-off (a first-step warm-up, a page fault), so it is at most a warning."""
    if len(a.job.steps) >= 2 or len(a.ranks) >= 2:
        return
    for f in findings:
        if f.severity == "error":
            f.severity = "warning"
            f.evidence.append(Evidence("capped at warning: the trace holds one step of one rank, and an error "
                                       "needs evidence over at least 2 steps or 2 ranks"))


def cap_unmarked_steps(findings: list[Finding], a: Analysis) -> None:
    """Without step markers (no ProfilerStep on any rank) "the step" is the whole recording, and the time
    between steps (setup, a benchmark harness between timed regions, the wait for the profiler to stop)
    is in it: its figures are shares of the recording, not of a step, and no saving per step can be
    claimed from them. Every finding is at most info, and says why."""
    if a.job.steps or not a.ranks:
        return
    for f in findings:
        if SEVERITY_RANK.get(f.severity, 0) > SEVERITY_RANK["info"]:
            f.severity = "info"
            f.evidence.append(Evidence(
                "capped at info: the trace has no step markers (ProfilerStep), so this is a share of the whole "
                "recording, including whatever ran between steps; record with torch.profiler's schedule and "
                "prof.step() for a per-step verdict"))
