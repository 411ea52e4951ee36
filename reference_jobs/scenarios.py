"""The reference scenarios, in one table (no torch import: the CLI reads it).

Each scenario: ``wrap`` (ddp / fsdp1 / fsdp2), ``injects`` (one line: what is
wrong, or "nothing (healthy)"), ``params`` (how train.py configures the job),
``must`` (diagnosis rule ids that must fire on its traces) and ``must_not``
(rule ids that must not fire). ``must_not`` is derived below: every rule of a
problem the scenario does not contain.
"""

from __future__ import annotations

# every rule id the reference scenarios exercise
RULES = [
    "fsdp-forward-prefetch-off",
    "fsdp1-backward-post",
    "fsdp1-no-backward-prefetch",
    "fsdp2-backward-prefetch-ineffective",
    "fsdp2-explicit-prefetch-noop",
    "ddp-single-bucket",
    "ddp-tiny-buckets",
    "ddp-find-unused-unneeded",
    "input-bound",
    "straggler",
    "host-sync",
    "grad-accum-without-no-sync",
]

# Defaults of every parameter train.py understands; a scenario overrides some.
DEFAULT_PARAMS = {
    "bucket_cap_mb": None,            # DDP: None = torch default (25)
    "find_unused_parameters": False,  # DDP
    "fsdp1_backward_prefetch": "BACKWARD_PRE",   # FSDP1: BACKWARD_PRE / BACKWARD_POST / none
    "fsdp1_forward_prefetch": False,
    "fsdp2_backward_prefetch": "default",        # FSDP2: default / self / empty
    "num_workers": 0,                 # DataLoader workers
    "item_sleep_ms": 0.0,             # sleep in Dataset.__getitem__ (per sample)
    "slow_rank": None,                # straggler: rank that sleeps before forward
    "delay_ms": 0.0,
    "host_sync": False,               # .item() on loss and grad norm inside the step
    "accum_steps": 1,                 # micro-steps per optimizer step
    "no_sync": True,                  # use DDP no_sync() for the non-final micro-steps
}

SCENARIOS: dict[str, dict] = {
    "fsdp1_backward_pre": dict(
        wrap="fsdp1", injects="nothing (healthy): FSDP1 BACKWARD_PRE", params={},
        # forward_prefetch=False: the forward all-gathers are on demand (the on/off pair with fsdp1_forward_prefetch)
        must=["fsdp-forward-prefetch-off"]),
    "fsdp1_backward_post": dict(
        wrap="fsdp1", injects="FSDP1 backward_prefetch=BACKWARD_POST",
        params={"fsdp1_backward_prefetch": "BACKWARD_POST"}, must=["fsdp1-backward-post", "fsdp-forward-prefetch-off"]),
    "fsdp1_no_backward_prefetch": dict(
        wrap="fsdp1", injects="FSDP1 backward_prefetch=None",
        params={"fsdp1_backward_prefetch": "none"},
        must=["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off"]),
    "fsdp1_forward_prefetch": dict(
        wrap="fsdp1", injects="FSDP1 BACKWARD_PRE + forward_prefetch=True (no problem)",
        params={"fsdp1_forward_prefetch": True}, must=[]),
    "fsdp2_default": dict(
        wrap="fsdp2", injects="nothing (healthy): FSDP2 default prefetch", params={}, must=[]),
    "fsdp2_no_backward_prefetch": dict(
        wrap="fsdp2", injects="FSDP2 m.set_modules_to_backward_prefetch([m]) on every unit (disables it)",
        params={"fsdp2_backward_prefetch": "self"}, must=["fsdp2-backward-prefetch-ineffective"]),
    "fsdp2_empty_prefetch_list": dict(
        wrap="fsdp2", injects="FSDP2 set_modules_to_backward_prefetch([]) on every unit (a no-op)",
        params={"fsdp2_backward_prefetch": "empty"}, must=["fsdp2-explicit-prefetch-noop"]),
    "ddp_default": dict(
        wrap="ddp", injects="nothing (healthy): DDP default buckets", params={}, must=[]),
    "ddp_one_bucket": dict(
        wrap="ddp", injects="DDP bucket_cap_mb=1000 (one bucket, no overlap)",
        params={"bucket_cap_mb": 1000}, must=["ddp-single-bucket"]),
    "ddp_tiny_buckets": dict(
        wrap="ddp", injects="DDP bucket_cap_mb=0.05 (one all-reduce per parameter)",
        params={"bucket_cap_mb": 0.05}, must=["ddp-tiny-buckets"]),
    "ddp_find_unused": dict(
        wrap="ddp", injects="DDP find_unused_parameters=True with no unused parameter",
        params={"find_unused_parameters": True}, must=["ddp-find-unused-unneeded"]),
    "dataloader_slow": dict(
        wrap="ddp", injects="DataLoader num_workers=0 with a slow __getitem__ (~32 ms/batch)",
        params={"num_workers": 0, "item_sleep_ms": 4.0}, must=["input-bound"]),
    "dataloader_fixed": dict(
        wrap="ddp", injects="same slow dataset, num_workers=2 (fixed)",
        params={"num_workers": 2, "item_sleep_ms": 4.0}, must=[]),
    "straggler": dict(
        wrap="ddp", injects="rank 1 sleeps 300 ms before every forward",
        params={"slow_rank": 1, "delay_ms": 300.0}, must=["straggler"]),
    "host_sync": dict(
        wrap="ddp", injects=".item() on the loss and the grad norm inside the step",
        params={"host_sync": True}, must=["host-sync"]),
    "grad_accum_no_sync": dict(
        wrap="ddp", injects="nothing (healthy): 4 micro-steps, first 3 in no_sync()",
        params={"accum_steps": 4, "no_sync": True}, must=[]),
    "grad_accum_sync_every": dict(
        wrap="ddp", injects="4 micro-steps without no_sync() (all-reduce every micro-step)",
        params={"accum_steps": 4, "no_sync": False}, must=["grad-accum-without-no-sync"]),
}

# Not scenarios: ddp_default run on 1 and 2 processes (for the scaling verb).
SCALING_RUNS = {"scaling_1proc": ("ddp_default", 1), "scaling_2proc": ("ddp_default", 2)}

for _name, _s in SCENARIOS.items():
    _s["name"] = _name
    _s["must_not"] = [r for r in RULES if r not in _s["must"]]
    _s["params"] = {**DEFAULT_PARAMS, **_s["params"]}


def expected(name: str) -> dict:
    s = SCENARIOS[name]
    return {"scenario": name, "must": list(s["must"]), "must_not": list(s["must_not"])}
