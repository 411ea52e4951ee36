"""Two analyses of the same job -> what changed (for `fsdpdoctor diff`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdpdoctor.results import Analysis

# impact changes smaller than this share of the base step are noise on real clusters
NOISE_FRAC = 0.02


@dataclass
class FindingChange:
    id: str
    title: str
    status: str                  # "new", "gone", "better", "worse", "same"
    base_impact_us: float | None
    new_impact_us: float | None
    base_severity: str | None
    new_severity: str | None


@dataclass
class Comparison:
    base: str
    new: str
    base_step_us: float
    new_step_us: float
    step_change_frac: float
    breakdown_change_us: dict[str, float] = field(default_factory=dict)
    findings: list[FindingChange] = field(default_factory=list)


def compare(base: Analysis, new: Analysis) -> Comparison:
    bs = base.mean.duration_us if base.mean else 0.0
    ns = new.mean.duration_us if new.mean else 0.0
    c = Comparison(base=base.source, new=new.source, base_step_us=bs, new_step_us=ns,
                   step_change_frac=(ns - bs) / bs if bs else 0.0)
    if base.mean and new.mean:
        for f in ("compute_us", "optimizer_us", "exposed_comm_us", "overlapped_comm_us", "data_loading_us", "idle_us"):
            c.breakdown_change_us[f] = getattr(new.mean, f) - getattr(base.mean, f)
    bmap = {f.id: f for f in base.findings}
    nmap = {f.id: f for f in new.findings}
    noise = NOISE_FRAC * bs
    for fid in list(dict.fromkeys([*bmap, *nmap])):
        b, n = bmap.get(fid), nmap.get(fid)
        if b and not n:
            status = "gone"
        elif n and not b:
            status = "new"
        else:
            d = n.impact_us - b.impact_us
            status = "worse" if d > noise else "better" if d < -noise else "same"
        ref = n or b
        c.findings.append(FindingChange(id=fid, title=ref.title, status=status,
                                        base_impact_us=b.impact_us if b else None,
                                        new_impact_us=n.impact_us if n else None,
                                        base_severity=b.severity if b else None,
                                        new_severity=n.severity if n else None))
    order = {"new": 0, "worse": 1, "better": 2, "gone": 3, "same": 4}
    c.findings.sort(key=lambda x: order[x.status])
    return c
