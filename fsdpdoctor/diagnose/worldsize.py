"""The step at another world size (weak scaling): ``fsdpdoctor whatif RUN --world-size N`` (docs/whatif.md).

Each collective kind costs, per byte a rank holds, what its algorithm moves over the slowest link: a ring
all-reduce 2(N-1)/N x size / bandwidth, all-gather, reduce-scatter and all-to-all (N-1)/N x size /
bandwidth; a tree all-reduce (NCCL's kernel names say TREE) 2 x size / bandwidth at any N > 1. The
bandwidth is read from the trace: the bytes of a kind's calls, times their factor at the run's size, over
their transfer time, the fastest rank's time in them per step (a rank's span holds its wait for the last
peer; the rank that waited least shows the transfer). Where the trace moved no bytes between ranks (one
rank) or has no sizes, a stated ``--link-gbps`` stands for it, or nothing is predicted.

The compute per rank is unchanged (weak scaling: the same batch per rank) while every rank has a core of
its own; ranks added to a host with no core to spare share cores, and then the step is not predicted (how
much a rank slows depends on how long each waits off its core). The overlap is kept as measured: time
hidden under compute stays hidden, a longer transfer adds to the exposed time. Waits for slower ranks,
data loading and idle are kept as measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdpdoctor.analysis.host import host_cores, starved
from fsdpdoctor.analysis.scaling import part_label, step_parts
from fsdpdoctor.diagnose.noise import interval
from fsdpdoctor.results import Analysis
from fsdpdoctor.results.whatif import WhatIf, WhatIfPart

SIZED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def factor(kind: str, n: int, tree: bool = False) -> float:
    """Bytes over the slowest link per byte of a rank's message, at ``n`` ranks."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 if tree else 2.0 * (n - 1) / n
    return (n - 1) / n


@dataclass
class KindTransfer:
    kind: str
    bytes_per_step: float           # per rank
    transfer_us: list[float]        # per step: the fastest rank's time in this kind's calls
    tree: bool = False
    gbps: float | None = None       # bus bandwidth read from the trace (GB/s), None where it cannot be

    @property
    def mean_us(self) -> float:
        return sum(self.transfer_us) / len(self.transfer_us) if self.transfer_us else 0.0


@dataclass
class WorldSizeInputs:
    kinds: list[KindTransfer] = field(default_factory=list)
    withheld: str | None = None


def transfers(a: Analysis) -> list[KindTransfer]:
    """Per sized kind: bytes per rank and step, the per-step transfer time and the bandwidth they give."""
    n0 = a.job.world_size or len(a.ranks) or 1
    steps = sorted({s.step for r in a.ranks for s in r.steps if s.step is not None})
    ranks = [r.rank for r in a.ranks]
    out = []
    for kind in SIZED_KINDS:
        calls = [c for c in a.collective_events if c.kind == kind and c.step in steps]
        if not calls:
            continue
        dur: dict = {}
        for c in calls:
            dur[(c.rank, c.step)] = dur.get((c.rank, c.step), 0.0) + max(c.duration_us, 0.0)
        per_step = [min(dur.get((r, s), 0.0) for r in ranks) for s in steps]
        nbytes = sum(c.size_bytes or 0 for c in calls) / max(len(steps) * len(ranks), 1)
        tree = any("TREE" in (c.raw_name or "").upper() for c in calls)
        t = KindTransfer(kind, nbytes, per_step, tree)
        if nbytes > 0 and t.mean_us > 0 and n0 > 1:
            t.gbps = factor(kind, n0, tree) * nbytes / (t.mean_us * 1e-6) / 1e9
        out.append(t)
    return out


def _withhold(a: Analysis, n: int, per_host: int, cores: int | None, source: str) -> str | None:
    """Why the compute per rank at ``n`` ranks cannot be told (ranks sharing cores), None where it can."""
    host = host_cores(a, cores)
    if per_host <= host.ranks_per_host:
        return None   # no more ranks on a host than measured: each shares its cores as it did
    if host.cores is None:
        if not a.job.traits.shared_host_cores:
            return None
        return (f"{per_host} ranks on one host where the run had {host.ranks_per_host}: the host's cores are not "
                "recorded, so whether the ranks would share cores cannot be told (state them: --host-cores)")
    if per_host > host.cores:
        return (f"{per_host} ranks on a host of {host.cores} cores ({source}): the ranks would share cores, and how "
                "much each slows depends on how long it waits off its core; the step cannot be told from this run "
                "(profile at that size, or on a host with a core per rank)")
    return None


def _starved(a: Analysis) -> str | None:
    late = starved(a)
    return None if not late else (
        f"rank {late[0]}'s training thread waited for a CPU {late[1]:.0%} of the profiled window (schedstat): "
        "its compute and transfer times hold the host's load, not the job's; re-profile on an idle host")


def _no_transfer(kinds: list[KindTransfer], n: int, n0: int, link_gbps: float | None) -> str | None:
    """Why the run's collectives give no cost at ``n`` ranks, None where they do."""
    sized = [k for k in kinds if k.bytes_per_step > 0]
    if not kinds and n != n0:
        return ("the run's steps hold no collective with a size (all-reduce, all-gather, reduce-scatter, "
                "all-to-all): what the job would communicate at another size cannot be read from it")
    if kinds and not sized:
        return ("the trace records no message sizes for its collectives (record_shapes, or record_param_comms "
                "args): their bandwidth and cost at another size cannot be told")
    if sized and link_gbps is None and any(k.gbps is None for k in sized):
        return ("this run moved no bytes between ranks (one rank), so its bandwidth cannot be read from the trace: "
                "state the link's with --link-gbps" if n0 <= 1 else
                "the trace's collectives give no transfer time to read a bandwidth from: state the link's with "
                "--link-gbps")
    return None


def _comm_change(out: WhatIf, sized: list[KindTransfer], kinds: list[KindTransfer], n: int, n0: int,
                 link_gbps: float | None) -> tuple[dict[str, float], list[float]]:
    """Per kind the change of its transfer per step at ``n`` ranks, and the change per step (summed over
    kinds) that its interval rests on; what each kind was read as goes into ``out.assumptions``."""
    change: dict[str, float] = {}
    samples = [0.0] * max(len(kinds[0].transfer_us) if kinds else 0, 1)
    for k in sized:
        gbps = link_gbps / 8.0 if link_gbps is not None else k.gbps   # Gbit/s -> GB/s
        then_us = factor(k.kind, n, k.tree) * k.bytes_per_step / (gbps * 1e9) * 1e6
        change[k.kind] = then_us - k.mean_us
        # per step: that step's transfer scaled (the bandwidth as measured in it), or the stated link's cost
        for i, t in enumerate(k.transfer_us):
            samples[i] += (then_us - t) if link_gbps is not None or not k.mean_us else t * (then_us / k.mean_us - 1)
        out.assumptions.append(
            f"{k.kind}: {k.bytes_per_step / 1e6:.2f} MB per rank and step, "
            + (f"bandwidth {link_gbps:g} Gbit/s as stated" if link_gbps is not None else
               f"bus bandwidth {k.gbps:.3g} GB/s read from the trace ({k.bytes_per_step / 1e6:.2f} MB x "
               f"{factor(k.kind, n0, k.tree):.2f} in {k.mean_us / 1e3:.1f} ms per step)")
            + f", {'tree' if k.tree else 'ring'}: {then_us / 1e3:.1f} ms per step at {n} ranks")
    return change, samples


def predict_world_size(a: Analysis, n: int, link_gbps: float | None = None, per_host: int | None = None,
                       cores: int | None = None, level: float = 0.9) -> WhatIf:
    """The mean step at ``n`` ranks from this run (weak scaling), with its parts and what it assumes."""
    n0 = a.job.world_size or len(a.ranks) or 1
    host = host_cores(a, cores)
    per_host = per_host or min(host.ranks_per_host, n)
    parts = step_parts(a)
    out = WhatIf(source=a.source, question=f"--world-size {n}", model="ring/tree collective costs (weak scaling)",
                 step_us=parts.step_us)
    kinds = transfers(a)
    saved = ("the analysis was saved without its per-call collectives (analyze --json --events keeps them): "
             "their sizes and times cannot be read" if not a.collective_events and a.collectives else None)
    out.withheld = (_withhold(a, n, per_host, cores, host.source) or _starved(a) or saved
                    or _no_transfer(kinds, n, n0, link_gbps))
    if out.withheld:
        return out
    sized = [k for k in kinds if k.bytes_per_step > 0]
    change, samples = _comm_change(out, sized, kinds, n, n0, link_gbps)
    if sized and link_gbps is None and len(a.ranks) < n0:
        out.assumptions.append(f"the transfer is read from {len(a.ranks)} of the run's {n0} ranks: a rank's time in "
                               "a collective holds its wait for the others, so the bandwidth read is a lower bound")
    if not any(k.tree for k in sized) and sized:
        out.assumptions.append("ring algorithm (the trace names no tree algorithm)")
    rows = [WhatIfPart("compute", "compute", parts.compute_us, parts.compute_us)]
    for kind, v in sorted(parts.comm_by_kind.items(), key=lambda kv: -kv[1]):
        rows.append(WhatIfPart(f"comm:{kind}", part_label(f"comm:{kind}"), v, max(v + change.get(kind, 0.0), 0.0)))
    for kind, d in change.items():
        if kind not in parts.comm_by_kind:
            rows.append(WhatIfPart(f"comm:{kind}", part_label(f"comm:{kind}"), 0.0, max(d, 0.0)))
    rows += [WhatIfPart("wait", "waiting on slower ranks", parts.wait_us, parts.wait_us),
             WhatIfPart("data_loading", "data loading", parts.data_loading_us, parts.data_loading_us),
             WhatIfPart("idle", "idle", parts.idle_us, parts.idle_us)]
    residual = parts.step_us - sum(r.now_us for r in rows)
    if abs(residual) >= 1.0:
        rows.append(WhatIfPart("residual", "unattributed", residual, residual))
    out.parts = rows
    out.change_us = sum(r.change_us for r in rows)
    out.predicted_step_us = parts.step_us + out.change_us
    iv = interval(samples, level)
    if iv is not None:
        mean, lo, hi, _ = iv
        out.change_interval_us = [lo + out.change_us - mean, hi + out.change_us - mean]
        out.interval_level, out.interval_basis = level, f"the transfer's step-to-step spread over {len(samples)} steps"
    out.assumptions += [
        "compute per rank unchanged (weak scaling: the same batch per rank, a core per rank)",
        "overlap kept as measured: a longer transfer adds to the exposed time",
        "waits for slower ranks, data loading and idle kept as measured",
    ]
    if link_gbps is None and n > host.ranks_per_host >= n0 and sized:
        out.assumptions.append(f"the bandwidth measured between this run's ranks on one host also holds between "
                               f"hosts at {n} ranks ({per_host} per host): give --link-gbps for the network's")
    return out
