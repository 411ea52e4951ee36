"""Which rank makes the others wait, how sure we are, and why.

Collectives are matched across ranks by (step, order within the step). A
collective cannot finish on any rank before the last rank joins, so an early
rank's execution span includes its wait: for the k-th collective of a step,
rank r waited ``dur_k(r) - min_r dur_k``. A delay on one rank is absorbed
almost entirely by the first collective after it, so per step we keep the
collective with the largest wait; the rank that waited least there is that
step's last rank, and the wait (as a share of the step) its imbalance. Summing
waits over all collectives instead adds up noise: on shared CPU cores every
gloo span jitters by milliseconds. This is clock-free, so it works across
hosts; where clocks are comparable (one host) the issue-time lead of the last
rank is recorded as a cross-check.

The report carries the evidence a verdict needs, measured in this run; the
verdict itself (thresholds) is the diagnosis' job:

- consistency: how many steps the same rank was last, and the chance that a
  healthy rank is last that often (with N ranks a rank is last 1/N of steps
  when nothing singles it out: a binomial tail, times N for "any rank");
- the others' wait for it (median over the steps it was last);
- the run's own step-to-step noise: a MAD-based spread of the differences of
  consecutive step times (a constant straggler adds none), so that a wait is
  judged against what this machine does anyway;
- what the culprit spends its extra time on (compute, sleep, loading, host
  sync) and the culprit's own user frames where it goes, compared with the
  same frames on the other ranks.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from fsdpdoctor.analysis.clock import aligned_lead
from fsdpdoctor.analysis.collectives import first_tensor_numel
from fsdpdoctor.analysis.context import RankContext, is_user_frame
from fsdpdoctor.analysis.rankresult import CpuShare, WorkCounts
from fsdpdoctor.analysis.stats import median
from fsdpdoctor.results import ClockReport, Collective, RankSummary, StragglerReport
from fsdpdoctor.trace.table import CPU_OP, KERNEL, PYFUNC
from fsdpdoctor.trace.vocabulary import SHAPED_OPS

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution -> its standard deviation


def _by_rank_and_step(colls: list[Collective]) -> dict[tuple[int, int | None], list[Collective]]:
    """Each rank's calls per step, in issue order: the k-th of a step matches the others' k-th."""
    groups: dict[tuple[int, int | None], list[Collective]] = defaultdict(list)
    for c in colls:
        groups[(c.rank, c.step)].append(c)
    return groups


def analyze(colls: list[Collective], ranks: list[RankSummary], same_clock: bool,
            clock: ClockReport | None = None, sub_groups: bool = False,
            group_ranks: dict[str, list[int]] | None = None,
            groups: dict | None = None) -> StragglerReport | None:
    """``sub_groups``: the ranks' process groups include some smaller than the world (a 2-D mesh: HSDP,
    TP + FP). Then a rank's k-th collective runs in its own group, and a rank late in one group makes its
    group's peers late in their other groups: ranks that share no group with it wait for it too, through
    them. Where the trace says each call's group (``Collective.process_group``, ``group_ranks``: name ->
    ranks) calls are matched within their group (``through_named_groups``); otherwise per step each rank's
    wait is its largest over the step's collectives; the rank waited for is the one whose largest wait is
    smallest, and had it been on time the others would not have waited the least of their largest waits
    (``saving_us``), not the next-latest arrival at one collective.

    ``groups``: the calls per (rank, step) in issue order, where a merged partial result holds them
    (analysis/partial.py); else grouped from ``colls`` (calls matched within named groups read ``colls``)."""
    rank_ids = [r.rank for r in ranks]
    groups = groups if groups is not None else _by_rank_and_step(colls)
    if len(rank_ids) < 2 or not groups:
        return None
    if sub_groups:
        named = through_named_groups(colls, ranks, group_ranks or {})
        if named is not None:
            return named
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
        cands = []  # (wait, culprit index, k, lead, waits)
        for k in range(n):
            cs = [x[k] for x in lists]
            if len({c.kind for c in cs}) > 1:
                continue  # order diverged: do not compare different collectives
            durs = np.array([c.duration_us for c in cs])
            waits = durs - durs.min()
            lead = aligned_lead(cs, clock, same_clock)  # issue-time lead on one clock (analysis/clock.py)
            cands.append((float(waits.max()), int(np.argmin(durs)), k, lead, waits, cs[0]))
        if not cands:
            continue
        if sub_groups:
            per_rank = np.max(np.array([c[4] for c in cands]), axis=0)   # each rank's largest wait in the step
            ci = int(np.argmin(per_rank))
            _, _, k, lead, _, coll = max(cands, key=lambda c: c[0])
            waits, wait = per_rank, float(per_rank.max())
            for r, w in zip(rank_ids, waits):
                total_wait[r] += float(w)
            st_time = step_time.get((rank_ids[int(np.argmax(waits))], st), 0.0) or 1.0
            culprits[rank_ids[ci]] += 1
            per_step.append({"step": st, "straggler": rank_ids[ci], "imbalance_us": wait,
                             "imbalance_frac": min(wait / st_time, 1.0), "collective_index": k, "arrival_lead_us": None,
                             "kind": coll.kind, "phase": coll.phase, "mean_wait_us": float(waits.mean()),
                             "saving_us": float(np.sort(waits)[1])})
            continue
        wait, ci, k, lead, waits, coll = max(cands, key=lambda c: c[0])
        for r, w in zip(rank_ids, waits):
            total_wait[r] += float(w)
        # a share of the step of the rank that waits longest: the wait is spent in its step, and a
        # collective that runs past that step's end still cannot make the wait more than the whole step
        waiter_step = step_time.get((rank_ids[int(np.argmax(waits))], st), 0.0)
        st_time = waiter_step or float(median([step_time.get((r, st), 0.0) for r in rank_ids])) or 1.0
        culprits[rank_ids[ci]] += 1
        per_step.append({"step": st, "straggler": rank_ids[ci], "imbalance_us": wait,
                         "imbalance_frac": min(wait / st_time, 1.0), "collective_index": k, "arrival_lead_us": lead,
                         # where the wait lands (rules subtract it from what a comm fix would save there)
                         "kind": coll.kind, "phase": coll.phase, "mean_wait_us": float(waits.mean()),
                         # had it arrived with the others, the step ends when the next-latest rank arrives:
                         # the saving is the smallest wait among the other ranks
                         "saving_us": float(np.sort(waits)[1])})
    rep = _report("wait" + ("+arrival" if same_clock or clock is not None else ""), per_step, culprits, total_wait,
                  ranks, sub_groups)
    if rep is not None and sub_groups:
        rep.groups_note = ("the trace does not say which process group each collective ran in (no Process Group "
                           "Name on record_param_comms, no FSDP2 HSDP collectives): the culprit is the rank whose "
                           "largest wait in a step was least, not read from the groups it made wait")
    return rep


def _report(method: str, per_step: list[dict], culprits: dict, total_wait: dict, ranks: list[RankSummary],
            through_groups: bool) -> StragglerReport | None:
    """The run's verdict from its steps' culprits: the rank last most often, its wait and saving (medians over
    the steps it was last) and the chance a healthy rank is last that often."""
    if not per_step:
        return None
    rank_ids = [r.rank for r in ranks]
    culprit, count = max(culprits.items(), key=lambda kv: kv[1])
    nsteps = len(per_step)
    mine = [p["imbalance_us"] for p in per_step if p["straggler"] == culprit]
    saving = [p["saving_us"] for p in per_step if p["straggler"] == culprit]
    return StragglerReport(method=method, straggler=culprit,
                           spread_frac=float(median([p["imbalance_frac"] for p in per_step])),
                           last_fraction=count / nsteps, per_step=per_step,
                           wait_by_rank={r: total_wait[r] / nsteps for r in rank_ids},
                           steps_last=count, steps_total=nsteps,
                           chance=chance_last(count, nsteps, len(rank_ids)),
                           wait_us=float(median(mine)) if mine else 0.0,
                           saving_us=float(median(saving)) if saving else 0.0,
                           noise_us=step_time_noise(ranks), through_groups=through_groups)


def _group_calls(colls: list[Collective], rank_ids: list[int], group_ranks: dict[str, list[int]]):
    """Per step, each group call matched across its members: {step: [(group ranks, {rank: call})]}: a rank's
    j-th call of a step in a group matches its peers' j-th there. None unless most calls name a group whose
    ranks are known (a call without one runs in the world group)."""
    world = tuple(sorted(rank_ids))
    named = sum(1 for c in colls if c.process_group is not None and c.process_group in group_ranks)
    if named < 0.5 * len(colls):
        return None
    out: dict = defaultdict(list)
    for (r, st), cs in _by_rank_and_step(colls).items():
        if st is None:
            continue
        seen: dict = defaultdict(int)
        for c in sorted(cs, key=lambda c: c.index):
            members = tuple(group_ranks.get(c.process_group or "", world))
            key = (st, members, seen[members])
            seen[members] += 1
            out[key] = out.get(key) or {}
            out[key][r] = c
    steps: dict = defaultdict(list)
    for (st, members, _), calls in out.items():
        if set(calls) == set(members) and len({c.kind for c in calls.values()}) == 1:
            steps[st].append((members, calls))
    return steps


def through_named_groups(colls: list[Collective], ranks: list[RankSummary],
                         group_ranks: dict[str, list[int]]) -> StragglerReport | None:
    """The straggler of a 2-D mesh, from calls matched within their process groups (``_group_calls``).

    At each call the member that waited least arrived last, and its peers' waits there are caused by it.
    A rank late only because it waited for another (a peer of the culprit, making its own other group
    wait) causes about as much as it was caused to wait; the culprit causes waits and waits little. So per
    step the culprit is the rank whose caused wait exceeds its own wait the most; each rank's wait is the
    sum of its waits in the step's calls, the others' largest is the step's imbalance and the least of
    theirs what the step would save were the culprit on time. None where the trace does not name groups."""
    steps = _group_calls(colls, [r.rank for r in ranks], group_ranks)
    if not steps:
        return None
    rank_ids = [r.rank for r in ranks]
    step_time = {(r.rank, s.step): s.duration_us for r in ranks for s in r.steps}
    per_step, culprits, total_wait = [], defaultdict(int), defaultdict(float)
    shared: dict = defaultdict(lambda: defaultdict(float))   # (culprit, group) -> {kind: wait caused}
    for st in sorted(steps):
        caused, waited, longest = defaultdict(float), defaultdict(float), defaultdict(float)
        for members, calls in steps[st]:
            durs = {r: c.duration_us for r, c in calls.items()}
            last = min(durs, key=durs.get)
            for r in members:
                w = durs[r] - durs[last]
                waited[r] += w
                caused[last] += w
                longest[r] = max(longest[r], w)
        net = {r: caused[r] - waited[r] for r in rank_ids}
        culprit = max(net, key=net.get)
        others = sorted(waited[r] for r in rank_ids if r != culprit)
        for members, calls in steps[st]:
            durs = {r: c.duration_us for r, c in calls.items()}
            if culprit in members and min(durs, key=durs.get) == culprit:
                shared[(culprit, members)][next(iter(calls.values())).kind] += sum(durs[r] - durs[culprit]
                                                                                   for r in members)
        for r in rank_ids:
            total_wait[r] += waited[r]
        # the wait the verdict weighs is the others' longest in one call (a sum over the step's calls adds up
        # every call's jitter: a healthy (2, 2) mesh on shared cores summed to 4.5x its step noise); the
        # saving is the least of their waits over the whole step, which a culprit late in every call causes
        wait = max((longest[r] for r in rank_ids if r != culprit), default=0.0)
        waiter = max((r for r in rank_ids if r != culprit), key=lambda r: longest[r])
        st_time = step_time.get((waiter, st), 0.0) or 1.0
        culprits[culprit] += 1
        per_step.append({"step": st, "straggler": culprit, "imbalance_us": wait,
                         "imbalance_frac": min(wait / st_time, 1.0), "collective_index": None,
                         "arrival_lead_us": None, "kind": None, "phase": None,
                         "mean_wait_us": sum(waited.values()) / len(rank_ids),
                         "saving_us": others[0] if others else 0.0, "net_late_us": net[culprit],
                         "step_wait_us": others[-1] if others else 0.0})
    rep = _report("wait per process group", per_step, culprits, total_wait, ranks, True)
    if rep is not None:
        n = len(per_step)
        rep.culprit_groups = [{"ranks": list(members), "kinds": sorted(kinds), "wait_us": sum(kinds.values()) / n}
                              for (c, members), kinds in sorted(shared.items(), key=lambda kv: kv[0][1])
                              if c == rep.straggler]
        near = {r for g in rep.culprit_groups for r in g["ranks"]}
        rep.far_ranks = [r for r in rank_ids if r not in near]
    return rep


def chance_last(k: int, n: int, nranks: int) -> float:
    """Chance that some healthy rank is last in at least k of n steps (each rank last 1/N of steps).

    Binomial tail P(X >= k), X ~ B(n, 1/N), times N for "any of the N ranks" (a Bonferroni bound).
    """
    if n <= 0 or nranks < 2:
        return 1.0
    q = 1.0 / nranks
    tail = sum(math.comb(n, i) * q ** i * (1 - q) ** (n - i) for i in range(k, n + 1))
    return min(1.0, nranks * tail)


def step_time_noise(ranks: list[RankSummary]) -> float:
    """Step-to-step jitter of step time in this run (a robust standard deviation, us).

    From the differences of consecutive steps, pooled over ranks: a constant delay (a straggler)
    adds nothing, and a slow drift (the machine getting busier) adds little, unlike a spread
    around the median. For differences d of two independent steps, sigma = 1.4826 * MAD / sqrt(2)
    with the median of |d| as MAD (consecutive differences have median ~0).
    """
    diffs = []
    for r in ranks:
        d = [s.duration_us for s in r.steps]
        diffs.extend(abs(b - a) for a, b in zip(d, d[1:]))
    return MAD_TO_SIGMA * float(median(diffs)) / math.sqrt(2) if diffs else 0.0


def attribute_cause(report: StragglerReport, ranks: list[RankSummary],
                    work: dict[int, WorkCounts] | None = None, colls: list[Collective] | None = None) -> None:
    """What the straggler spends its extra time on, compared with the other ranks.

    Extra compute is split by the work the steps hold (``work``, per rank): "more work" when the
    late rank's steps hold more (larger inputs, more ops or kernels) and that excess accounts for at
    least half of its extra compute time; otherwise the same work done slower. More work that a
    collective hands it (``colls``: a call whose message on the late rank is a multiple of the others',
    as uneven all_to_all splits are) by enough to account for that half too came through that exchange,
    not from its own batches. Extra sleep, host syncs, loading or time outside ops is the rank waiting
    on its host."""
    by = {r.rank: r for r in ranks}
    s = by.get(report.straggler)
    others = [r.mean for r in ranks if r.rank != report.straggler and r.mean]
    if s is None or s.mean is None or not others:
        return
    m = s.mean

    def med(f):
        return float(median([getattr(o, f) for o in others]))

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
    report.extra_us = amount
    report.extra_each_us = _extra_each(s, [r for r in ranks if r.rank != report.straggler], cause)
    report.cause_evidence = (f"rank {s.rank} spends {amount / 1e3:.1f} ms/step more on {cause} than the median "
                             f"of the other ranks")
    if cause != "compute" or not work or report.straggler not in work:
        return
    base = med("compute_us") + med("optimizer_us")
    compute_ratio = (m.compute_us + m.optimizer_us) / base if base > 0 else math.inf
    ratios = work_ratios(work, report.straggler)
    if not ratios:
        return
    what, ratio = max(ratios.items(), key=lambda kv: kv[1])
    same = ", ".join(f"{k} x{v:.2f}" for k, v in ratios.items())
    if ratio > 1.0 and ratio - 1.0 >= 0.5 * (compute_ratio - 1.0):
        report.cause = "more work"
        report.cause_evidence = (f"rank {s.rank}'s steps hold {ratio:.1f}x the {what} of the other ranks (median; "
                                 f"{same}), and it computes {compute_ratio:.1f}x as long: {amount / 1e3:.1f} ms/step "
                                 "more")
        exchange = uneven_exchange(colls or [], report.straggler)
        # the same test as for the work itself: the exchange's excess accounts for half the extra compute
        if exchange and exchange[1] - 1.0 >= 0.5 * (compute_ratio - 1.0):
            report.exchange_kind, report.exchange_ratio = exchange
            report.cause_evidence += (f"; its {exchange[0]} calls carry {exchange[1]:.1f}x the elements of the "
                                      "other ranks' (the most uneven call of each step, median): the exchange "
                                      "hands it the extra work")
    elif ratio >= MORE_WORK_RATIO:
        # sizes are exact: a rank whose steps hold more than the others' is not doing the same work, even where
        # the excess explains less than half of its extra compute (the rest is it computing slower)
        report.cause_evidence += (f"; its steps hold {ratio:.1f}x the {what} of the other ranks ({same}), which "
                                  f"accounts for less than half of its {compute_ratio:.1f}x compute time: it also "
                                  "computes slower")
    else:
        report.cause_evidence += f"; its steps hold the same work as theirs ({same})"


_CAUSE_PARTS = {"data loading": ("data_loading_us",), "compute": ("compute_us", "optimizer_us"),
                "host sync": ("host_sync_us",), "sleep": ("sleep_us",)}


def _extra_each(s: RankSummary, others: list[RankSummary], cause: str) -> list[float]:
    """The culprit's time in ``cause`` less the other ranks' median, step by step (steps every rank has): the
    repeated measurements of its imbalance, whose spread is that imbalance's own noise."""
    def part(b) -> float:
        if cause == "idle":
            return b.idle_us - b.sleep_us
        return sum(getattr(b, f) for f in _CAUSE_PARTS[cause])

    theirs = [{b.step: part(b) for b in o.steps} for o in others]
    out = []
    for b in s.steps:
        vals = [t[b.step] for t in theirs if b.step in t]
        if len(vals) == len(theirs) and vals:
            out.append(part(b) - float(median(vals)))
    return out


# a rank whose steps hold this multiple of the others' work (exact counts: sizes, ops) holds more work, whatever
# share of its extra compute that explains
MORE_WORK_RATIO = 1.05

# the culprit must have run alone (the others waiting) for at least this share of its runnable time for its
# speed alone to be told from its speed beside them
MIN_ALONE_SHARE = 0.1


def shared_core_speeds(report: StragglerReport, shares: dict[int, CpuShare], hosts: dict[int, str | None]) -> None:
    """How fast the culprit computes beside the others and alone, where they share one host's cores.

    From each rank's schedstat over the recorded steps (``CpuShare``: its training thread's time on a CPU
    and runnable but queued): a rank's speed is on-CPU over runnable time. The other ranks run only while
    the culprit runs too (they then wait for it, off the CPU), so their speed is the speed beside them and
    their runnable time how long the culprit ran beside them; the rest of the culprit's runnable time it ran
    alone, at the speed its remaining CPU time over that rest gives. Balancing its work moves that alone
    part onto ranks that run beside each other: the diagnosis prices it at the speed beside them."""
    c = report.straggler
    mine = shares.get(c)
    others = [v for r, v in shares.items() if r != c and hosts.get(r) == hosts.get(c)]
    if mine is None or not others:
        return
    runnable = [o.on_cpu_us + o.runqueue_us for o in others]
    if min(runnable) <= 0:
        return
    beside = float(median([o.on_cpu_us / r for o, r in zip(others, runnable)]))
    together = float(median(runnable))
    alone = mine.on_cpu_us + mine.runqueue_us - together
    if alone < MIN_ALONE_SHARE * (mine.on_cpu_us + mine.runqueue_us):
        return
    report.beside_speed = beside
    report.alone_speed = min(max((mine.on_cpu_us - beside * together) / alone, 0.0), 1.0)


def uneven_exchange(colls: list[Collective], rank: int) -> tuple[str, float] | None:
    """(kind, ratio) of the collective that hands ``rank`` the most data relative to the other ranks.

    Calls are matched across ranks as in ``analyze`` (step, order within the step). A matched call of one
    kind whose message is larger on ``rank`` than the others' median (uneven all_to_all splits; the
    gradient collectives of DDP and FSDP are the same size on every rank) hands it that multiple of
    their data; per step the largest such multiple, then the median over steps (sizes are exact, so
    any multiple above 1 is real). None without such a call."""
    groups = _by_rank_and_step(colls)
    ranks = sorted({r for r, _ in groups})
    if rank not in ranks or len(ranks) < 2:
        return None
    per_step: list[tuple[float, str | None]] = []  # (largest multiple, its kind) per step; 1.0 where none
    for st in sorted({s for _, s in groups if s is not None}):
        lists = [groups.get((r, st), []) for r in ranks]
        best: tuple[float, str | None] = (1.0, None)
        for cs in zip(*lists):
            if len({c.kind for c in cs}) > 1 or any(not c.size_bytes for c in cs):
                continue
            mine = next(c.size_bytes for c in cs if c.rank == rank)
            theirs = float(median([c.size_bytes for c in cs if c.rank != rank]))
            if theirs > 0 and mine / theirs > best[0]:
                best = (mine / theirs, cs[0].kind)
        per_step.append(best)
    kinds = [k for _, k in per_step if k is not None]
    if not kinds:
        return None
    kind = max(set(kinds), key=kinds.count)
    return kind, float(median([r if k == kind else 1.0 for r, k in per_step]))


def work_ratios(work: dict[int, WorkCounts], rank: int) -> dict[str, float]:
    """The late rank's work over the other ranks' median, per measure the trace holds."""
    mine, others = work[rank], [w for r, w in work.items() if r != rank]
    if not others:
        return {}
    out = {}
    for label, field in (("input elements", "input_elems"), ("ops", "ops"), ("kernels", "kernels")):
        theirs = [getattr(o, field) for o in others]
        if getattr(mine, field) is None or any(v is None for v in theirs):
            continue
        ref = float(median(theirs))
        if ref > 0:
            out[label] = getattr(mine, field) / ref
    return out


def step_work(ctx: RankContext, wins: list) -> WorkCounts | None:
    """Per-rank part of ``attribute_cause``: ops on the main thread, kernels, and the elements of
    model-level ops' first inputs, per step of the analysed windows."""
    t = ctx.t
    if not wins:
        return None
    wins = sorted(wins, key=lambda w: w.start)
    starts = np.array([w.start for w in wins])
    ends = np.array([w.end for w in wins])

    def inside(rows: np.ndarray) -> np.ndarray:
        if not len(rows):
            return rows
        ts = t.ts[rows]
        k = np.searchsorted(starts, ts, side="right") - 1
        ok = (k >= 0) & (ts < ends[np.clip(k, 0, None)])
        return rows[ok]

    ops = t.rows_named(lambda n: True, cat=CPU_OP)
    ops = inside(ops[t.track[ops] == ctx.main_track] if len(ops) else ops)
    kernels = inside(t.rows_named(lambda n: True, cat=KERNEL))
    shaped = inside(t.rows_named(lambda n: n in SHAPED_OPS, cat=CPU_OP))
    sizes = [first_tensor_numel(t.args.get(int(r), {}).get("Input Dims")) for r in shaped]
    known = [x for x in sizes if x is not None]
    n = len(wins)
    return WorkCounts(ops=len(ops) / n, kernels=len(kernels) / n,
                      input_elems=sum(known) / n if known else None, shaped_ops=len(known) / n)


def user_frame_times(ctx: RankContext, wins: list) -> dict[str, float]:
    """Per-rank part of ``culprit_frames``: inclusive time per step of every user-code Python
    frame on the main thread, inside the analysed steps (empty without stacks)."""
    t = ctx.t
    if not t.has_stacks or not wins:
        return {}
    rows = t.rows_named(is_user_frame, cat=PYFUNC)
    rows = rows[t.track[rows] == ctx.main_track] if len(rows) else rows
    if not len(rows):
        return {}
    ts = t.ts[rows]
    inside = np.zeros(len(rows), dtype=bool)
    for w in wins:
        inside |= (ts >= w.start) & (ts < w.end)
    acc: dict[str, float] = defaultdict(float)
    for r in rows[inside]:
        acc[t.name(int(r))] += float(t.dur[r])
    return {k: v / len(wins) for k, v in acc.items()}


def culprit_frames(report: StragglerReport, per_rank: dict[int, dict[str, float]]) -> None:
    """The culprit's own user frames where its extra time goes, against the same frames elsewhere.

    ``per_rank``: each rank's ``user_frame_times``. A frame the culprit spends much longer in
    than the other ranks (median) holds its extra work; of nested frames that all carry it
    (train_step > micro_step > slow_fn) the innermost, the one with the least inclusive time,
    is named.
    """
    per_rank = {r: v for r, v in per_rank.items() if v}
    if report.straggler not in per_rank or len(per_rank) < 2:
        return
    mine = per_rank.get(report.straggler)
    others = [v for r, v in per_rank.items() if r != report.straggler]
    if not mine or not others:
        return
    diffs = []
    for name, us in mine.items():
        base = float(median([o.get(name, 0.0) for o in others]))
        diffs.append((us - base, us, base, name))
    top = max(d[0] for d in diffs)
    if top <= 0:
        return
    heavy = [d for d in diffs if d[0] >= 0.8 * top]
    extra, us, base, name = min(heavy, key=lambda d: d[1])
    report.cause_source = name
    report.cause_frames = [{"frame": n, "culprit_us": u, "others_us": b, "extra_us": e}
                           for e, u, b, n in sorted(diffs, reverse=True)[:5] if e > 0]
