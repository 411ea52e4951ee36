"""The cross-rank reduce's collective part as partial results that merge.

A ``CrossRankPartial`` holds what the reduce needs about the collectives of a group of ranks: per
rank, its calls per step as small rows (kind, phase, execution span, issue time: what the arrival
statistics, the waits and the clock matches read), and per (kind, phase) the sums of the Collectives
table. Any group of ranks is summarised alone (``of_results``) and two partials of disjoint groups
merge (``merge``) into the partial of their union, in any grouping and any order, into the same
value: rows are keyed by rank (a rank belongs to one group), and every sum is of integers (time in
nanoseconds, bytes, bandwidth x time in byte-scaled units), so no sum depends on the order of its
terms. The first (rank, call) that shows a (kind, phase) is kept by minimum, so the table's row
order does not depend on the grouping either.

``collective_stats`` and ``groups`` (the per-(rank, step) calls stragglers and clocks match) are
read from a merged partial; map_reduce.reduce builds one from its results, or takes one merged
elsewhere (a tree of workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fsdpdoctor.results import Collective, CollectiveStat


class Call(NamedTuple):
    """One collective call as the cross-rank matching reads it (Collective's names, a tenth its size)."""

    rank: int
    index: int
    step: int | None
    kind: str
    phase: str
    start_us: float
    end_us: float
    issue_us: float | None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


def _ns(us: float) -> int:
    """Microseconds to integer nanoseconds: sums of these do not depend on their order."""
    return round(us * 1000.0)


@dataclass(slots=True)
class KindPhaseSums:
    """The Collectives table's row of one (kind, phase) before division: integers only."""

    first: tuple[int, int]          # (rank, position in its calls) of the first call seen: the table's tie order
    count: int = 0
    busy_ns: int = 0
    exposed_ns: int = 0
    duration_ns: int = 0
    sized: int = 0
    size_bytes: int = 0
    bw_calls: int = 0
    bw_duration_ns: int = 0
    bw_weight: int = 0              # sum of busbw (GB/s) x duration (ns), in thousandths

    def merged(self, o: KindPhaseSums) -> KindPhaseSums:
        return KindPhaseSums(
            first=min(self.first, o.first), count=self.count + o.count, busy_ns=self.busy_ns + o.busy_ns,
            exposed_ns=self.exposed_ns + o.exposed_ns, duration_ns=self.duration_ns + o.duration_ns,
            sized=self.sized + o.sized, size_bytes=self.size_bytes + o.size_bytes,
            bw_calls=self.bw_calls + o.bw_calls, bw_duration_ns=self.bw_duration_ns + o.bw_duration_ns,
            bw_weight=self.bw_weight + o.bw_weight)

    def stat(self, kind: str, phase: str, n_rank_steps: int) -> CollectiveStat:
        rank_steps = max(n_rank_steps, 1)
        busy, exposed = self.busy_ns / 1000.0, self.exposed_ns / 1000.0
        return CollectiveStat(
            kind=kind, phase=phase, count=self.count, per_step=self.count / rank_steps, total_us=busy,
            exposed_us=exposed, mean_us=self.duration_ns / 1000.0 / self.count,
            busy_per_step_us=busy / rank_steps, exposed_per_step_us=exposed / rank_steps,
            size_bytes=self.size_bytes if self.sized else None,
            mean_size_bytes=self.size_bytes / self.sized if self.sized else None,
            # total bytes over total time weights each call by its duration
            busbw_gbps=self.bw_weight / 1000.0 / self.bw_duration_ns if self.bw_calls and self.bw_duration_ns else None)


@dataclass(slots=True)
class CrossRankPartial:
    """The collectives of a group of ranks, reduced as far as the group alone allows."""

    # rank -> step -> calls in issue order: Call rows, or Collectives (which have the same names)
    calls: dict[int, dict[int | None, list]] = field(default_factory=dict)
    sums: dict[tuple[str, str], KindPhaseSums] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.calls)

    def groups(self) -> dict[tuple[int, int | None], list[Call]]:
        """Each rank's calls per step, in issue order (the k-th of a step matches the others' k-th)."""
        return {(r, st): cs for r in self.ranks for st, cs in self.calls[r].items()}

    def by_rank(self) -> dict[int, list[Call]]:
        """Each rank's calls in its issue order (what clock matching reads)."""
        return {r: [c for cs in self.calls[r].values() for c in cs] for r in self.ranks}

    def collective_stats(self, n_rank_steps: int) -> list[CollectiveStat]:
        keys = sorted(self.sums, key=lambda kp: self.sums[kp].first)
        out = [self.sums[kp].stat(kp[0], kp[1], n_rank_steps) for kp in keys]
        # small_messages depends on a threshold: the diagnosis fills it from the resolved table
        out.sort(key=lambda s: -s.exposed_us)
        return out


def of_ranks(collectives: dict[int, list[Collective]], compact: bool = True) -> CrossRankPartial:
    """The partial of a group of ranks from each rank's collectives (in its issue order).

    ``compact``: rows as ``Call`` (a partial sent between processes); else the Collectives themselves
    (the reduce in the process that holds them: no second copy of every call)."""
    p = CrossRankPartial()
    keys: dict[tuple[str, str], int] = {}   # (kind, phase) -> its code, in order of first call
    firsts: list[tuple[int, int]] = []
    codes: list[int] = []
    flat: list[Collective] = []
    for rank in sorted(collectives):        # the first call of a key in rank order is its minimum
        colls = collectives[rank]
        steps: dict[int | None, list] = {}
        for i, c in enumerate(colls):
            row = Call(rank, c.index, c.step, c.kind, c.phase, c.start_us, c.end_us, c.issue_us) if compact else c
            steps.setdefault(c.step, []).append(row)
            code = keys.setdefault((c.kind, c.phase), len(keys))
            if code == len(firsts):
                firsts.append((rank, i))
            codes.append(code)
        flat.extend(colls)
        p.calls[rank] = steps
    p.sums = _sums(keys, firsts, np.array(codes, dtype=np.int64), flat)
    return p


def _ns_array(us: np.ndarray) -> np.ndarray:
    """``_ns`` of each (numpy's rint rounds half to even, as round does)."""
    return np.rint(us * 1000.0)


def _int_sum(values: np.ndarray) -> int:
    """The exact sum of whole numbers held as floats (Python ints: no overflow at any count)."""
    return sum(map(int, values.tolist()))


def _sums(keys: dict[tuple[str, str], int], firsts: list[tuple[int, int]], codes: np.ndarray,
          flat: list[Collective]) -> dict[tuple[str, str], KindPhaseSums]:
    """KindPhaseSums of every (kind, phase), column by column (one pass per attribute, not per call)."""
    busy = _ns_array(np.array([c.comm_share_us for c in flat], dtype=float))
    exposed = _ns_array(np.array([c.exposed_us for c in flat], dtype=float))
    dur = _ns_array(np.array([c.end_us - c.start_us for c in flat], dtype=float))
    size = np.array([int(c.size_bytes) if c.size_bytes else 0 for c in flat], dtype=object)
    bw = np.array([c.busbw_gbps if c.busbw_gbps is not None else np.nan for c in flat], dtype=float)
    has_bw = ~np.isnan(bw)
    out = {}
    for kp, code in keys.items():
        m = codes == code
        sized = m & (size != 0)
        mb = m & has_bw
        out[kp] = KindPhaseSums(
            first=firsts[code], count=int(m.sum()), busy_ns=_int_sum(busy[m]), exposed_ns=_int_sum(exposed[m]),
            duration_ns=_int_sum(dur[m]), sized=int(sized.sum()), size_bytes=sum(size[sized].tolist()),
            bw_calls=int(mb.sum()), bw_duration_ns=_int_sum(dur[mb]),
            bw_weight=_int_sum(np.rint(bw[mb] * dur[mb] * 1000.0)))
    return out


def of_results(results, compact: bool = True) -> CrossRankPartial:
    """The partial of the ranks in ``results`` (RankResults; those skipped by --steps hold no calls)."""
    return of_ranks({r.rank: r.collectives for r in results if not r.skipped}, compact)


def merge(a: CrossRankPartial, b: CrossRankPartial) -> CrossRankPartial:
    """The partial of two disjoint groups of ranks: associative and commutative."""
    both = set(a.calls) & set(b.calls)
    if both:
        raise ValueError(f"rank {min(both)} is in both partial results: each rank is reduced in one group")
    sums = dict(a.sums)
    for key, s in b.sums.items():
        sums[key] = sums[key].merged(s) if key in sums else s
    return CrossRankPartial(calls={**a.calls, **b.calls}, sums=sums)


def merge_all(parts) -> CrossRankPartial:
    """Merge any number of partials (in the order given: the result does not depend on it)."""
    out = CrossRankPartial()
    for p in parts:
        out = merge(out, p)
    return out
