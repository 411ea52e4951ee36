"""Which process group each collective ran in, where the trace says so.

On a 2-D mesh (FSDP2 HSDP, TP + FSDP) a rank's k-th collective of a step runs in one of its groups, and
only the ranks of that group wait for each other there: comparing it with another group's k-th call is
comparing two different collectives. The trace says which group a call ran in in one of three ways:

- ``record_param_comms``' ``Process Group Name`` (NCCL dialect: ``Collective.process_group``);
- FSDP2's own collectives under HSDP: all-gathers and reduce-scatters run in the shard group (the mesh's
  last dimension), the all-reduce of the reduce-scattered gradients in the replicate group (its first);
- nothing: a gloo collective of other code, or a trace without stacks and annotations.

``distributedInfo.pg_config`` lists each rank's groups (name, description, ranks). Group names are the
same on every rank (every rank creates every group, in the same order), so the ranks' lists together map
a name to its ranks.
"""

from __future__ import annotations

from fsdpdoctor.results import Collective

_SHARD_KINDS = ("all_gather", "reduce_scatter")


def pg_ranks(distributed_info: dict | None) -> dict[str, list[int]]:
    """pg_name -> its ranks, from one rank's ``distributedInfo.pg_config`` (the entries it can read)."""
    pgs = (distributed_info or {}).get("pg_config")
    out = {}
    for p in pgs if isinstance(pgs, list) else []:
        ranks = p.get("ranks") if isinstance(p, dict) else None
        if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks) and "pg_name" in p:
            out[str(p["pg_name"])] = sorted(ranks)
    return out


def hsdp_roles(distributed_info: dict | None, world_size: int | None) -> dict[str, str]:
    """{"shard": pg_name, "replicate": pg_name} of a rank's 2-D mesh, where its pg_config shows one: two
    groups smaller than the world whose sizes multiply to it. A description naming the dimension
    ("mesh_shard", "dp_replicate") decides; otherwise the order of creation does (a mesh creates its
    dimensions' groups first to last, and FSDP2's HSDP mesh is (replicate, shard)). Empty where it cannot
    be told."""
    pgs = (distributed_info or {}).get("pg_config")
    if not world_size or not isinstance(pgs, list):
        return {}
    sub = [p for p in pgs if isinstance(p, dict) and isinstance(p.get("pg_size"), int)
           and 1 < p["pg_size"] < world_size and "pg_name" in p]
    if len(sub) != 2 or sub[0]["pg_size"] * sub[1]["pg_size"] != world_size:
        return {}
    by_desc = {}
    for p in sub:
        desc = str(p.get("pg_desc") or "").lower()
        for role in ("shard", "replicate"):
            if role in desc:
                by_desc[role] = str(p["pg_name"])
    if len(set(by_desc.values())) == 2 and len(by_desc) == 2:
        return by_desc
    first, last = sorted(sub, key=lambda p: (len(str(p["pg_name"])), str(p["pg_name"])))
    return {"replicate": str(first["pg_name"]), "shard": str(last["pg_name"])}


def annotate(colls: list[Collective], roles: dict[str, str]) -> None:
    """Set ``process_group`` on FSDP2's collectives the trace does not name a group for (gloo), from the
    rank's HSDP mesh (``hsdp_roles``): all-gathers and reduce-scatters in the shard group, all-reduces in the
    replicate group."""
    if not roles:
        return
    for c in colls:
        if c.process_group is not None or c.issuer != "fsdp":
            continue
        role = "shard" if c.kind in _SHARD_KINDS else "replicate" if c.kind == "all_reduce" else None
        if role in roles:
            c.process_group = roles[role]
