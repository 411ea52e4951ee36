"""Which rank makes the others wait, and why.

Collectives are matched across ranks by (step, order within the step). Two
estimates (fsdp-signatures.md §11f):
- arrival: with comparable clocks (all ranks on one host), the lead of the last
  rank to issue each collective; the straggler issues last.
- wait: clock-free; each rank's execution time of a matched collective minus
  the fastest rank's. Early ranks sit inside the collective waiting; the
  straggler waits least.
Per step we keep the collective with the largest spread, since a delay is
absorbed almost entirely by the first collective after it.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from fsdpdoctor.results import Collective, RankSummary, StragglerReport


def _by_step(colls: list[Collective]) -> dict[tuple[int, int | None], list[Collective]]:
    out: dict[tuple[int, int | None], list[Collective]] = defaultdict(list)
    for c in colls:
        out[(c.rank, c.step)].append(c)
    return out


def analyze(colls: list[Collective], ranks: list[RankSummary], same_clock: bool) -> StragglerReport | None:
    rank_ids = [r.rank for r in ranks]
    if len(rank_ids) < 2 or not colls:
        return None
    groups = _by_step(colls)
    steps = sorted({s for (_, s) in groups if s is not None}) or [None]
    step_time = {(r.rank, s.step): s.duration_us for r in ranks for s in r.steps}
    per_step = []
    wait = defaultdict(float)
    last_counts = defaultdict(int)
    method = "arrival" if same_clock else "wait"
    fracs = []
    for st in steps:
        lists = [groups.get((r, st), []) for r in rank_ids]
        n = min(len(x) for x in lists)
        if n == 0:
            continue
        best = None
        for k in range(n):
            cs = [x[k] for x in lists]
            if len({c.kind for c in cs}) > 1:
                continue  # order diverged: do not compare different collectives
            durs = np.array([c.duration_us for c in cs])
            waits = durs - durs.min()
            for r, w in zip(rank_ids, waits):
                wait[r] += w
            if method == "arrival" and all(c.issue_us is not None for c in cs):
                issue = np.array([c.issue_us for c in cs])
                lead = issue.max() - issue
                spread, last = float(lead.max()), rank_ids[int(np.argmax(issue))]
            else:
                spread, last = float(waits.max()), rank_ids[int(np.argmin(durs))]
            if best is None or spread > best[0]:
                best = (spread, last, k)
        if best is None:
            continue
        spread, last, k = best
        st_time = float(np.median([step_time.get((r, st), 0.0) for r in rank_ids])) or 1.0
        fracs.append(spread / st_time)
        last_counts[last] += 1
        per_step.append({"step": st, "straggler": last, "spread_us": spread, "spread_frac": spread / st_time,
                         "collective_index": k})
    if not per_step:
        return None
    culprit, count = max(last_counts.items(), key=lambda kv: kv[1])
    nsteps = len(per_step)
    return StragglerReport(method=method, straggler=culprit, spread_frac=float(np.mean(fracs)),
                           last_fraction=count / nsteps, per_step=per_step,
                           wait_by_rank={r: wait[r] / nsteps for r in rank_ids})


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
