"""The data-quality notes in words: what the loader dropped or ignored, shown with every report."""

from __future__ import annotations

from fsdpdoctor.results import DataQuality


def lines(dq: DataQuality | None) -> list[str]:
    if dq is None or dq.clean:
        return []
    out = []
    for q in dq.ranks:
        if q.dropped:
            reasons = ", ".join(f"{n} {r}" for r, n in q.by_reason.items())
            kinds = ", ".join(f"{n} {k}" for k, n in q.by_kind.items())
            where = (f"they cover {100 * q.step_share_covered:.2f} % of the step time" if q.step_share_covered
                     is not None else "")
            if q.unlocated:
                where += ("; " if where else "") + f"{q.unlocated} with unknown time"
            out.append(f"rank {q.rank}: dropped {q.dropped} of {q.events_read} events ({reasons}; kinds: {kinds}"
                       + (f"; {where}" if where else "") + "): the figures leave them out")
        out.extend(f"rank {q.rank}: {n}" for n in q.notes)
    out.extend(dq.manifest)
    out.extend(dq.notes)
    return out
