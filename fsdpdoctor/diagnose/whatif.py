"""``fsdpdoctor whatif``: the step after one change, from the same model per fix that the rule uses.

One model, two callers: ``--fix ID`` reads the finding the rule made (its saving and interval, as
``analyze`` printed them); ``--set NAME=VALUE`` calls the model the rule's saving comes from
(``host_rules.loader_hidden``, ``ddp_rules.bucket_model`` and ``no_sync_model``, ``prefetch_rules.hideable``)
with the value asked for, and takes its interval from the same machinery as a finding's
(``noise.gate_by_noise``). A setting no model covers says so and gives no number. ``--world-size`` is in
``diagnose/worldsize.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpdoctor.analysis.scaling import part_label, step_parts
from fsdpdoctor.diagnose import ddp_rules, host_rules, prefetch_rules
from fsdpdoctor.diagnose.framework import RuleContext, severity_for
from fsdpdoctor.diagnose.noise import SAMPLES_KEY, gate_by_noise, per_step
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.errors import InputError
from fsdpdoctor.results import Analysis
from fsdpdoctor.results.whatif import WhatIf, WhatIfPart

# where a finding's time lies in the step's parts (analysis/scaling.step_parts keys), drawn in this order; a
# "comm:" entry without a kind draws on every exposed kind in proportion; a collective's exposed time holds
# the rank's wait in it (the parts carve it out as "wait"), so a comm finding draws on the wait after its
# kind. What is left after them is shown as "not placed" rather than taken from a part the model does not name.
WHERE: dict[str, tuple[str, ...]] = {
    "input-bound": ("data_loading",),
    "straggler": ("wait", "comm:", "idle"),
    # no_sync's overlapped share (shared cores) is compute time
    "grad-accum-without-no-sync": ("comm:all_reduce", "wait", "compute"),
    "ddp-single-bucket": ("comm:all_reduce", "wait"), "ddp-tiny-buckets": ("comm:all_reduce", "wait"),
    "ddp-find-unused-unneeded": ("compute", "comm:all_reduce"), "metric-sync": ("comm:all_reduce", "wait"),
    "fsdp1-no-backward-prefetch": ("comm:all_gather", "wait"), "fsdp1-backward-post": ("comm:all_gather", "wait"),
    "fsdp-forward-prefetch-off": ("comm:all_gather", "wait"),
    "fsdp2-backward-prefetch-ineffective": ("comm:all_gather", "wait"),
    "fsdp-single-unit": ("comm:", "wait"), "exposed-comm-high": ("comm:", "wait"), "low-overlap": ("comm:", "wait"),
    "latency-bound-collectives": ("comm:", "wait"), "low-bus-bandwidth": ("comm:", "wait"),
    "wrapper-world-size-1": ("compute",), "activation-recompute": ("compute",),
    "host-sync": ("idle",), "gpu-idle": ("idle",), "periodic-stall": ("idle", "compute"),
}

SETTINGS = ("num_workers", "bucket_cap_mb", "backward_prefetch", "forward_prefetch", "no_sync",
            "find_unused_parameters")


@dataclass
class Setting:
    name: str
    value: str


def parse_setting(text: str) -> Setting:
    """NAME=VALUE; anything else is bad input (one line, exit 2)."""
    name, eq, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not name or not value or not name.replace("_", "").replace(".", "").isalnum():
        raise InputError(None, f"--set takes NAME=VALUE (e.g. num_workers=2), got {text!r}")
    return Setting(name, value)


def _parts_after(a: Analysis, saving: float, where: tuple[str, ...]) -> list[WhatIfPart]:
    """The step's parts with ``saving`` taken from the parts ``where`` names, in order."""
    p = step_parts(a)
    now = {"compute": p.compute_us, **{f"comm:{k}": v for k, v in p.comm_by_kind.items()}, "wait": p.wait_us,
           "data_loading": p.data_loading_us, "idle": p.idle_us}
    then = dict(now)
    left = max(saving, 0.0)
    for key in where:
        keys = [k for k in now if k.startswith("comm:")] if key == "comm:" else [key]
        have = sum(then.get(k, 0.0) for k in keys)
        take = min(left, have)
        for k in keys:
            if have > 0:
                then[k] = then.get(k, 0.0) - take * then.get(k, 0.0) / have
        left -= take
    labels = {"wait": "waiting on slower ranks", "data_loading": "data loading", "idle": "idle",
              "compute": "compute"}
    rows = [WhatIfPart(k, labels.get(k) or part_label(k), now[k], then[k]) for k in now
            if now[k] > 0 or k in ("compute", "data_loading", "idle")]
    residual = p.step_us - sum(now.values())
    if abs(residual) >= 1.0:
        rows.append(WhatIfPart("residual", "unattributed", residual, residual))
    if left > 1e-6:
        rows.append(WhatIfPart("unplaced", "saving not placed in a part", 0.0, -left))
    return rows


def _answer(a: Analysis, question: str, model: str, saving: float, interval: list[float] | None,
            where: tuple[str, ...], basis: str | None, level: float) -> WhatIf:
    rows = _parts_after(a, saving, where)
    step = step_parts(a).step_us
    return WhatIf(source=a.source, question=question, model=model, step_us=step, predicted_step_us=step - saving,
                  change_us=-saving, parts=rows,
                  change_interval_us=None if interval is None else [-interval[1], -interval[0]],
                  interval_level=level if interval is not None else None, interval_basis=basis)


def what_if_fix(a: Analysis, finding_id: str, thresholds: dict | None = None) -> WhatIf:
    """The step with the finding ``finding_id`` fixed: the saving and interval the rule gave it."""
    from fsdpdoctor.diagnose.rules import RULE_IDS

    if finding_id not in RULE_IDS:
        raise InputError(None, f"unknown finding id {finding_id!r} (one of: {', '.join(RULE_IDS)})")
    level = resolve(thresholds)["impact_confidence"]
    step = step_parts(a).step_us
    question = f"--fix {finding_id}"
    found = [f for f in a.findings if f.id == finding_id]
    roots = [f for f in found if not f.caused_by]
    if not found:
        return WhatIf(a.source, question, None, step, withheld=f"this run has no {finding_id} finding: nothing to "
                      "fix, so no change is predicted")
    if not roots:
        return WhatIf(a.source, question, None, step, finding=finding_id, withheld=(
            f"{finding_id} here is a consequence of {found[0].caused_by}: its time goes when that is fixed "
            f"(whatif --fix {found[0].caused_by})"))
    why = next((f.impact_withheld for f in roots if f.impact_withheld), None)
    if why:
        return WhatIf(a.source, question, f"the {finding_id} rule's saving model", step, finding=finding_id,
                      withheld=why)
    saving = sum(f.impact_us for f in roots)
    ivs = [f.impact_interval_us for f in roots]
    interval = [sum(i[0] for i in ivs), sum(i[1] for i in ivs)] if all(ivs) else None
    out = _answer(a, question, f"the {finding_id} rule's saving model", saving, interval,
                  WHERE.get(finding_id, ()), "the finding's own interval, as analyze gave it", level)
    out.finding = finding_id
    if saving <= 0:
        out.assumptions.append("the finding predicts no saving on this run (its evidence says why)")
    return out


def _context(a: Analysis, thresholds: dict | None) -> RuleContext:
    return RuleContext(a, resolve(thresholds))


def _interval(ctx: RuleContext, rule: str, saving: float,
              samples: list[float] | None) -> tuple[list[float] | None, str | None, str | None]:
    """The interval the rule's finding with this saving and these per-step values would get (noise.gate_by_noise:
    the step noise and the rule's calibrated error, widened by the window's contention), or why it gives none."""
    f = ctx.finding(rule, "what if", saving, "", "", confidence=1.0, evidence=[], samples=samples)
    gate_by_noise([f], ctx.a, ctx.table, ctx._cache.get(SAMPLES_KEY, {}), severity_for)
    basis = ("its per-step values and the rule's calibrated error, as a finding's" if samples else
             "the step time's noise and the rule's calibrated error, as a finding's")
    return f.impact_interval_us, basis if f.impact_interval_us else None, f.impact_withheld


def what_if_set(a: Analysis, setting: Setting, thresholds: dict | None = None,
                host_cores: int | None = None) -> WhatIf:
    """The step with one setting changed, from the model of the rule that covers it."""
    ctx = _context(a, thresholds)
    step = step_parts(a).step_us
    question = f"--set {setting.name}={setting.value}"
    # a finding's settings name them generically ("loader.num_workers", "ddp.bucket_cap_mb"): the same setting
    short = setting.name.rsplit(".", 1)[-1]
    handler = _HANDLERS.get(short if short in SETTINGS else setting.name)
    if handler is None:
        return WhatIf(a.source, question, None, step, withheld=(
            f"no model for {setting.name}: whatif predicts {', '.join(SETTINGS)} (docs/whatif.md)"))
    got = handler(ctx, setting, host_cores)
    if isinstance(got, str):
        return WhatIf(a.source, question, None, step, withheld=got)
    if isinstance(got, WhatIf):   # the setting is exactly a finding's fix: that finding's saving
        got.question = question
        return got
    model, saving, samples, where, notes, finding = got
    interval, basis, why = _interval(ctx, finding, saving, samples)
    if why:   # the window was starved past what the rule's predictions were calibrated for
        return WhatIf(a.source, question, model, step, withheld=why, finding=finding)
    out = _answer(a, question, model, saving, interval, where, basis, ctx.table["impact_confidence"])
    out.assumptions += notes
    out.finding = finding
    return out


def _int_value(s: Setting, lo: int = 0) -> int:
    try:
        v = int(s.value)
    except ValueError:
        raise InputError(None, f"{s.name} takes a whole number, got {s.value!r}") from None
    if v < lo:
        raise InputError(None, f"{s.name} takes a whole number of at least {lo}, got {v}")
    return v


def _num_workers(ctx: RuleContext, s: Setting, cores: int | None):
    workers = _int_value(s)
    loaders = ctx.a.signals.dataloader if ctx.a.signals else []
    if not loaders or not ctx.a.mean:
        return "no model for num_workers on this run: the trace shows no DataLoader in the step"
    single = max(loaders, key=lambda d: d.exposed_frac).iterator.startswith("_SingleProcess")
    if not single:
        return ("no model for num_workers on this run: it loads in worker processes already, and the trace does "
                "not say how many")
    spare = host_rules.loader_spare(ctx, cores)
    saving, ev = host_rules.loader_saving(ctx, single, workers, spare)
    samples = per_step(ctx.a, lambda st: host_rules.loader_hidden(ctx, st, single, workers, spare))
    host = host_rules.host_cores(ctx.a, cores)
    notes = [e.text for e in ev]
    notes.append(f"the host's cores: {host.cores} ({host.source}), {host.ranks_per_host} rank(s) per host"
                 if host.cores else "the host's cores are not recorded: " + (
                     "the ranks are taken to fill them (CPU/gloo)" if ctx.traits.shared_host_cores
                     else "taken to have one to spare per worker"))
    return ("input-bound (loader workers: host_rules.loader_hidden)", saving, samples, ("data_loading",), notes,
            "input-bound")


def _bucket_cap(ctx: RuleContext, s: Setting, cores: int | None):
    cap = _cap_value(s)   # None: the argument left unset (DDP's default buckets, a 1 MiB first one)
    d = ctx.a.signals.ddp if ctx.a.signals else None
    grad_ar = ddp_rules.gradient_allreduces(ctx) if d else []
    if not grad_ar:
        return "no model for bucket_cap_mb on this run: no DDP gradient all-reduce in the trace"
    per_backward = len(grad_ar) / ddp_rules.rank_steps(ctx) / max(d.backwards_with_allreduce_per_step, 1.0)
    tiny = [f for f in ctx.a.findings if f.id == "ddp-tiny-buckets" and not f.caused_by]
    if per_backward > 1.01 and tiny and (cap is None or cap >= ddp_rules.DDP_DEFAULT_BUCKET_MB):
        return what_if_fix(ctx.a, "ddp-tiny-buckets", dict(ctx.table))   # its fix: buckets of the default size
    if per_backward > 1.01:
        return (f"no model for bucket_cap_mb on this run: the bucket model covers gradients all-reduced in one "
                f"bucket after backward, and this run has {per_backward:.0f} per backward pass")
    grad_bytes = max((c.nelems or 0 for c in grad_ar), default=0) * ddp_rules._grad_dtype_bytes(ctx)
    if not grad_bytes:
        return "no model for bucket_cap_mb on this run: the trace records no gradient sizes"
    sizes = ddp_rules.bucket_sizes(grad_bytes, None if cap is None else cap * ddp_rules.MIB)
    saving, samples, note = ddp_rules.bucket_model(ctx, grad_ar, sizes)
    at = ("bucket_cap_mb unset (a 1 MiB first bucket, then 25 MiB)" if cap is None else
          f"bucket_cap_mb={cap:g} (a value passed caps the first bucket too)")
    return ("ddp-single-bucket (DDP bucket overlap: ddp_rules.bucket_model)", saving, samples,
            ("comm:all_reduce", "wait"),
            [f"{len(sizes)} bucket{'s' if len(sizes) != 1 else ''} of the {grad_bytes / 1e6:.2f} MB of gradients "
             f"with {at}", note], "ddp-single-bucket")


def _cap_value(s: Setting) -> float | None:
    if s.value.lower() in ("none", "unset", "default"):
        return None
    try:
        cap = float(s.value)
    except ValueError:
        raise InputError(None, f"bucket_cap_mb takes a number of MiB or None (unset), got {s.value!r}") from None
    if not cap > 0 or cap != cap or cap == float("inf"):
        raise InputError(None, f"bucket_cap_mb takes a positive number of MiB, got {s.value!r}")
    return cap


def _backward_prefetch(ctx: RuleContext, s: Setting, cores: int | None):
    want = s.value.upper().removeprefix("BACKWARDPREFETCH.")
    if want not in ("BACKWARD_PRE", "BACKWARD_POST", "NONE"):
        raise InputError(None, f"backward_prefetch takes BACKWARD_PRE, BACKWARD_POST or None, got {s.value!r}")
    p = ctx.a.prefetch
    if not p or p.framework not in ("fsdp1", "fsdp2"):
        return "no model for backward_prefetch on this run: it is not FSDP"
    if want != "BACKWARD_PRE":
        return (f"no model for backward_prefetch={want}: the prefetch model predicts what a prefetch hides, "
                "not what removing one costs")
    if p.framework == "fsdp1" and p.backward_mode not in ("none", "post"):
        return "backward_prefetch is BACKWARD_PRE on this run already: nothing to change"
    if p.framework == "fsdp2" and p.backward_mode != "none":
        return "this FSDP2 run prefetches its backward all-gathers already: nothing to change"
    calls = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "backward"]
    saving, samples, note = prefetch_rules.hideable(ctx, calls, "backward")
    rule = "fsdp2-backward-prefetch-ineffective" if p.framework == "fsdp2" else (
        "fsdp1-no-backward-prefetch" if p.backward_mode == "none" else "fsdp1-backward-post")
    return (f"{rule} (prefetch: prefetch_rules.hideable)", saving, samples, ("comm:all_gather", "wait"),
            [note.strip()] if note.strip() else [], rule)


def _forward_prefetch(ctx: RuleContext, s: Setting, cores: int | None):
    if s.value.lower() not in ("true", "1", "yes"):
        if s.value.lower() in ("false", "0", "no"):
            return "no model for forward_prefetch=False: the prefetch model predicts what a prefetch hides"
        raise InputError(None, f"forward_prefetch takes True or False, got {s.value!r}")
    p = ctx.a.prefetch
    if not p or p.framework != "fsdp1":
        return "no model for forward_prefetch on this run: it is an FSDP1 setting"
    if p.forward_mode != "off":
        return "forward_prefetch is on in this run already: nothing to change"
    from fsdpdoctor.diagnose.facts import straggler_wait_in

    fwd = [c for c in ctx.a.collective_events if c.kind == "all_gather" and c.phase == "forward"]
    saving, samples, note = prefetch_rules.hideable(ctx, fwd, "forward",
                                                    deduct_us=straggler_wait_in(ctx, "all_gather", "forward"))
    return ("fsdp-forward-prefetch-off (prefetch: prefetch_rules.hideable)", saving, samples,
            ("comm:all_gather", "wait"),
            [note.strip()] if note.strip() else [], "fsdp-forward-prefetch-off")


def _no_sync(ctx: RuleContext, s: Setting, cores: int | None):
    # True, or the micro-steps per optimizer step (a finding's setting gives them): no_sync() on all but the last
    if s.value.lower() not in ("true", "yes") and not (s.value.isdigit() and int(s.value) >= 1):
        raise InputError(None, f"no_sync takes True (all but the last micro-step under no_sync()), got {s.value!r}")
    d = ctx.a.signals.ddp if ctx.a.signals else None
    if not d or d.forwards_per_step < 2 or d.backwards_with_allreduce_per_step < 2:
        return ("no model for no_sync on this run: it all-reduces gradients once per step already (or is "
                "not DDP with gradient accumulation)")
    saving, samples, share = ddp_rules.no_sync_model(ctx, ddp_rules.gradient_allreduces(ctx))
    return ("grad-accum-without-no-sync (ddp_rules.no_sync_model)", saving, samples,
            ("comm:all_reduce", "wait", "compute"),
            ["the all-reduces of all but the last micro-step go: their exposed time"
             + (f" and {share:.0%} of their time under backward (shared cores)" if share else "")],
            "grad-accum-without-no-sync")


def _find_unused(ctx: RuleContext, s: Setting, cores: int | None):
    if s.value.lower() not in ("false", "0", "no"):
        return f"no model for find_unused_parameters={s.value}: the model predicts what turning it off saves"
    if not any(f.id == "ddp-find-unused-unneeded" for f in ctx.a.findings):
        return ("no model for find_unused_parameters=False on this run: it makes no ddp-find-unused-unneeded "
                "finding (the flag is off, or a parameter may miss its gradient, or the capture did not record "
                "which parameters got one)")
    return what_if_fix(ctx.a, "ddp-find-unused-unneeded", dict(ctx.table))


_HANDLERS = {"num_workers": _num_workers, "bucket_cap_mb": _bucket_cap, "backward_prefetch": _backward_prefetch,
             "forward_prefetch": _forward_prefetch, "no_sync": _no_sync, "find_unused_parameters": _find_unused}
