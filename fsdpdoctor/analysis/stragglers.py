"""Which rank makes the others wait, and why.

Collectives are matched across ranks by (step, order within the step). A
collective cannot finish on any rank before the last rank joins, so an early
rank's execution span includes its wait: for the k-th collective of a step,
rank r waited ``dur_k(r) - min_r dur_k``. A delay on one rank is absorbed
almost entirely by the first collective after it (fsdp-signatures.md §7), so
per step we keep the collective with the largest wait; the rank that waited
least there is that step's straggler, and the wait (as a share of the step)
its imbalance. Summing waits over all collectives instead adds up noise: on
shared CPU cores every gloo span jitters by milliseconds. This is clock-free,
so it works across hosts; where clocks are comparable (one host) the issue-time
lead of the last rank is recorded as a cross-check.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from fsdpdoctor.analysis.clock import aligned_lead
from fsdpdoctor.results import ClockReport, Collective, RankSummary, StragglerReport


def analyze(colls: list[Collective], ranks: list[RankSummary], same_clock: bool,
            clock: ClockReport | None = None) -> StragglerReport | None:
    rank_ids = [r.rank for r in ranks]
    if len(rank_ids) < 2 or not colls:
        return None
    groups: dict[tuple[int, int | None], list[Collective]] = defaultdict(list)
    for c in colls:
        groups[(c.rank, c.step)].append(c)
    steps = sorted({s for (_, s) in groups if s is not None}) or [None]
    step_time = {(r.rank, s.step): s.duration_us for r in ranks for s in r.steps}
    per_step = []
    total_wait = defaultdict(float)
    culprits = defaultdict(int)
    for st in steps:
        lists = [groups.get((r, st), []) for r in rank_ids]
        n = min(len(x) for x in lists)
        if n == 0:
            continue
        best = None  # (wait, culprit index, k, lead)
        for k in range(n):
            cs = [x[k] for x in lists]
            if len({c.kind for c in cs}) > 1:
                continue  # order diverged: do not compare different collectives
            durs = np.array([c.duration_us for c in cs])
            waits = durs - durs.min()
            lead = aligned_lead(cs, clock, same_clock)  # issue-time lead on one clock (analysis/clock.py)
            if best is None or waits.max() > best[0]:
                best = (float(waits.max()), int(np.argmin(durs)), k, lead, waits)
        if best is None:
            continue
        wait, ci, k, lead, waits = best
        for r, w in zip(rank_ids, waits):
            total_wait[r] += float(w)
        st_time = float(np.median([step_time.get((r, st), 0.0) for r in rank_ids])) or 1.0
        culprits[rank_ids[ci]] += 1
        per_step.append({"step": st, "straggler": rank_ids[ci], "imbalance_us": wait,
                         "imbalance_frac": wait / st_time, "collective_index": k, "arrival_lead_us": lead})
    if not per_step:
        return None
    culprit, count = max(culprits.items(), key=lambda kv: kv[1])
    nsteps = len(per_step)
    return StragglerReport(method="wait" + ("+arrival" if same_clock or clock is not None else ""), straggler=culprit,
                           spread_frac=float(np.median([p["imbalance_frac"] for p in per_step])),
                           last_fraction=count / nsteps, per_step=per_step,
                           wait_by_rank={r: total_wait[r] / nsteps for r in rank_ids})


def attribute_cause(report: StragglerReport, ranks: list[RankSummary]) -> None:
    """What the straggler spends its extra time on, compared with the other ranks."""
    by = {r.rank: r for r in ranks}
    s = by.get(report.straggler)
    others = [r.mean for r in ranks if r.rank != report.straggler and r.mean]
    if s is None or s.mean is None or not others:
        return
    m = s.mean

    def med(f):
        return float(np.median([getattr(o, f) for o in others]))

    # the straggler's own comm is short (it waits less); look at what it does instead
    extra = {
        "data loading": m.data_loading_us - med("data_loading_us"),
        "compute": (m.compute_us + m.optimizer_us) - (med("compute_us") + med("optimizer_us")),
        "host sync": m.host_sync_us - med("host_sync_us"),
        "sleep": m.sleep_us - med("sleep_us"),
        "idle": (m.idle_us - m.sleep_us) - (med("idle_us") - med("sleep_us")),
    }
    cause, amount = max(extra.items(), key=lambda kv: kv[1])
    if amount <= 0:
        return
    report.cause = cause
    report.cause_evidence = (f"rank {s.rank} spends {amount / 1e3:.1f} ms/step more on {cause} than the median "
                             f"of the other ranks")
