"""``--json``: the Analysis as a versioned document (docs/json-schema.md).

A run of a few ranks gets the whole document, as it always has. Past the ranks whose per-rank detail
(``ranks[]``, the signals' per-rank rows, clock offsets, straggler waits, data quality) fits
``DETAIL_BUDGET_BYTES`` (a rank count derived from one rank's encoded size), the default document
keeps that detail for the ranks a finding names only, written by msgspec's encoder straight from
the result objects, and says where the rest is: ``--ranks all`` prints every rank, ``--ranks-detail
FILE`` writes the whole document to FILE (compact JSON, readable by ``analyze FILE``)."""

from __future__ import annotations

import dataclasses

from fsdpdoctor.results import Analysis
from fsdpdoctor.results.serial import dumps_indented

# the per-rank detail a default document holds at most: a few MB whatever the ranks (issue 32)
DETAIL_BUDGET_BYTES = 4 * 2**20


def to_json(a: Analysis, include_events: bool = False) -> str:
    """The whole document (every rank), as it always was."""
    d = a.to_dict(include_events=include_events)
    if not include_events:
        d["job"].pop("manifest", None)
    return dumps_indented(d)


def document(a: Analysis, include_events: bool = False, all_ranks: bool = False,
             detail_file: str | None = None) -> bytes:
    """The ``--json`` document as bytes: the whole one where its per-rank detail fits the budget (or
    ``all_ranks``), else the compact one. ``detail_file``: the whole document is written there too."""
    if detail_file is not None:
        with open(detail_file, "wb") as f:
            f.write(_encode(_whole(a, include_events)))
    limit = rank_limit(a)
    if all_ranks or include_events or len(a.ranks) <= limit:
        return to_json(a, include_events=include_events).encode()
    return compact(a, limit, detail_file)


def rank_limit(a: Analysis) -> int:
    """How many ranks' detail fit the budget, from the first rank's encoded size."""
    if not a.ranks:
        return 0
    one = len(_encode(_rank_rows(a, {a.ranks[0].rank})))
    return max(1, DETAIL_BUDGET_BYTES // max(one, 1))


def named_ranks(a: Analysis) -> list[int]:
    """The ranks the result points at: named by a finding or its evidence, the straggler, the rank
    with a periodic stall, the clocks' reference; in that order, each once."""
    out: dict[int, None] = {}
    for f in a.findings:
        out.update(dict.fromkeys(f.ranks))
        out.update((e.rank, None) for e in f.evidence if e.rank is not None)
    for r in (a.straggler.straggler if a.straggler else None, a.periodic.rank if a.periodic else None,
              a.clock.reference_rank if a.clock else None):
        if r is not None:
            out[r] = None
    return list(out)


def compact(a: Analysis, limit: int, detail_file: str | None) -> bytes:
    """The document with the per-rank detail of the named ranks only (at most ``limit``)."""
    import msgspec

    have = {r.rank for r in a.ranks}
    keep = [r for r in named_ranks(a) if r in have][:limit]
    keep_set = set(keep)
    d = _whole(a, False)
    d.update(_rank_rows(a, keep_set))
    where = (f"written to {detail_file}" if detail_file else
             "not written: `--ranks-detail FILE` writes the whole document to FILE, `--ranks all` prints it here")
    d["notes"] = [*a.notes, f"per-rank detail (ranks, signals, clock offsets, straggler waits, data quality) of "
                            f"{len(keep)} of {len(a.ranks)} ranks, those the findings name; the whole document is {where}"]
    d["rank_detail"] = {"ranks_total": len(a.ranks), "ranks_shown": keep, "file": detail_file,
                        "budget_bytes": DETAIL_BUDGET_BYTES}
    return msgspec.json.format(_encode(d), indent=2)


def _whole(a: Analysis, include_events: bool) -> dict:
    """Analysis's top-level fields, the result objects themselves (msgspec encodes dataclasses)."""
    d = {f.name: getattr(a, f.name) for f in dataclasses.fields(Analysis)
         if include_events or f.name != "collective_events"}
    if not include_events:
        d["job"] = {f.name: getattr(a.job, f.name) for f in dataclasses.fields(a.job) if f.name != "manifest"}
    return d


def _rank_rows(a: Analysis, keep: set[int]) -> dict:
    """The top-level fields that hold one row per rank, with the rows of ``keep`` only."""
    d: dict = {"ranks": [r for r in a.ranks if r.rank in keep]}
    s = a.signals
    if s is not None:
        d["signals"] = dataclasses.replace(
            s, **{name: [x for x in getattr(s, name) if x.rank in keep]
                  for name in ("host_syncs", "dataloader", "gpu_idle", "setup", "recompute", "offload")},
            sleep_sources={r: v for r, v in s.sleep_sources.items() if r in keep})
    if a.clock is not None:
        d["clock"] = dataclasses.replace(a.clock, ranks=[c for c in a.clock.ranks if c.rank in keep])
    if a.straggler is not None:
        d["straggler"] = dataclasses.replace(a.straggler, wait_by_rank={r: w for r, w in a.straggler.wait_by_rank.items()
                                                                        if r in keep})
    d["data_quality"] = dataclasses.replace(a.data_quality, ranks=[q for q in a.data_quality.ranks if q.rank in keep])
    return d


def _encode(d) -> bytes:
    import msgspec

    return msgspec.json.encode(d, enc_hook=str)
