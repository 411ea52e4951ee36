"""pandas views of an ``Analysis``: each DataFrame a flat view of the typed result, the same numbers
as ``--json``. pandas is an optional extra (``pip install fsdpdoctor[pandas]``), imported only when a
DataFrame is asked for. ``a`` is a ``results.Analysis`` (read by attribute only: this module imports
none of the types, which call it)."""

from __future__ import annotations

import dataclasses

# the time components of a step; compute + optimizer + exposed comm + data loading + idle == duration
COMPONENTS = ("compute_us", "optimizer_us", "exposed_comm_us", "data_loading_us", "idle_us")


def _fields(obj) -> dict:
    """A result's fields by name, in order (the result types are slotted dataclasses: no instance dict)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("fsdpdoctor's DataFrames need pandas: pip install 'fsdpdoctor[pandas]'") from None
    return pd


def steps_df(a):
    """One row per (rank, step, component): ``rank, step, component, us, share`` (share of that step).

    Components: compute, optimizer, exposed_comm, data_loading, idle (they add up to the step),
    then overlapped_comm and comm (inside those) and ``comm[KIND]`` busy time per collective kind.
    """
    pd = _pandas()
    rows = []
    for r in a.ranks:
        for s in r.steps:
            parts = [(c.removesuffix("_us"), getattr(s, c)) for c in COMPONENTS]
            parts += [("overlapped_comm", s.overlapped_comm_us), ("comm", s.comm_us)]
            parts += [(f"comm[{k}]", kt.busy_us) for k, kt in sorted(s.comm_by_kind.items())]
            for name, us in parts:
                rows.append({"rank": r.rank, "step": s.step, "component": name, "us": float(us),
                             "share": float(us) / s.duration_us if s.duration_us else float("nan"),
                             "step_us": s.duration_us})
    return pd.DataFrame(rows, columns=["rank", "step", "component", "us", "share", "step_us"])


def step_table_df(a):
    """One row per (rank, step) with every scalar field of ``StepBreakdown`` as a column."""
    pd = _pandas()
    rows = []
    for r in a.ranks:
        for s in r.steps:
            d = {k: v for k, v in _fields(s).items() if not isinstance(v, dict)}
            rows.append(d)
    return pd.DataFrame(rows)


def collectives_df(a, events: bool = False):
    """Per (kind, phase) statistics; ``events=True``: one row per collective call (needs the events)."""
    pd = _pandas()
    if events:
        return pd.DataFrame([_fields(c) | {"duration_us": c.duration_us} for c in a.collective_events])
    return pd.DataFrame([_fields(c) for c in a.collectives])


def ranks_df(a):
    """One row per rank: file, host, mean step breakdown (scalars), wait, straggler flag, clock offset."""
    pd = _pandas()
    rows = []
    for r in a.ranks:
        d = {"rank": r.rank, "file": r.file, "dialect": r.dialect, "host": r.host, "device": r.device,
             "steps": len(r.steps), "wait_us": r.wait_us, "is_straggler": r.is_straggler}
        if r.mean is not None:
            d |= {k: v for k, v in _fields(r.mean).items() if not isinstance(v, dict) and k not in ("rank", "step")}
        rc = a.clock.of(r.rank) if a.clock else None
        d |= {"clock_offset_us": rc.offset_us if rc else None,
              "clock_uncertainty_us": rc.uncertainty_us if rc else None}
        rows.append(d)
    return pd.DataFrame(rows)


def findings_df(a):
    """One row per finding: id, title, severity, confidence, impact, summary, fix, ranks, source, cause."""
    pd = _pandas()
    return pd.DataFrame([{"id": f.id, "title": f.title, "severity": f.severity, "confidence": f.confidence,
                          "impact_us": f.impact_us, "impact_frac": f.impact_frac, "summary": f.summary,
                          "fix": f.fix, "ranks": list(f.ranks), "source": f.source, "caused_by": f.caused_by,
                          "evidence": len(f.evidence)} for f in a.findings],
                        columns=["id", "title", "severity", "confidence", "impact_us", "impact_frac", "summary",
                                 "fix", "ranks", "source", "caused_by", "evidence"])
