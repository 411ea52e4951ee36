"""Fixes in the job's own terms: a rule names generic settings (``Setting(name, value)``: "ddp.find_unused_parameters"
False, "loader.num_workers" 2...), and this module writes them as the job's framework spells them
(``JobInfo.framework``: plain PyTorch, the Hugging Face Trainer's ``TrainingArguments``, Lightning's
``Trainer(strategy=DDPStrategy(...))``, Accelerate's kwargs handlers and FSDP plugin). One table, ``SPELLINGS``,
maps every generic setting to each framework's spelling, read from the frameworks' own sources
(transformers' TrainingArguments fields, accelerate's DistributedDataParallelKwargs and
FullyShardedDataParallelPlugin fields, Lightning's DDPStrategy/FSDPStrategy, which hand their keyword
arguments to DDP/FSDP). Where a framework has no spelling, the fix says so and gives the plain-PyTorch way
to reach the setting from inside it. Every setting names its side effect (``SIDE_EFFECTS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpdoctor.results import Setting

FRAMEWORK_WORDS = {"plain": "plain PyTorch", "hf-trainer": "the Hugging Face Trainer", "lightning": "Lightning",
                   "accelerate": "Accelerate"}


@dataclass(frozen=True)
class Spelling:
    """How one framework takes one setting: the object (``where``), the argument (``arg``; None where it has
    none: ``call`` is then the way around) and the call the arguments go in (``{args}``, or ``{value}``)."""

    where: str
    arg: str | None
    call: str
    style: str = "py"       # how the value is written: "py" (Python), "lower"/"upper" (a string), "enum"


def _py(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _value(value, style: str) -> str:
    if style == "enum" and isinstance(value, str):
        return f"BackwardPrefetch.{value}"
    if style == "lower" and isinstance(value, str):
        return _py(value.lower())
    return _py(value)


_DDP = {"plain": Spelling("DistributedDataParallel", "{name}", "DDP(model, {args})"),
        "hf-trainer": Spelling("TrainingArguments", "ddp_{name}", "TrainingArguments(..., {args})"),
        "lightning": Spelling("DDPStrategy", "{name}", "Trainer(strategy=DDPStrategy({args}))"),
        "accelerate": Spelling("DistributedDataParallelKwargs", "{name}",
                               "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({args})])")}
_LOADER = {"plain": Spelling("DataLoader", "{name}", "DataLoader(..., {args})"),
           "hf-trainer": Spelling("TrainingArguments", "dataloader_{name}", "TrainingArguments(..., {args})"),
           "lightning": Spelling("DataLoader", "{name}",
                                 "DataLoader(..., {args})  # the one trainer.fit() gets, or your LightningDataModule's "
                                 "train_dataloader() returns"),
           "accelerate": Spelling("DataLoader", "{name}", "DataLoader(..., {args})  # before accelerator.prepare()")}
_FSDP = {"plain": Spelling("torch.distributed.fsdp.FullyShardedDataParallel", "{name}", "FSDP(model, ..., {args})", "enum"),
         "hf-trainer": Spelling("TrainingArguments", "fsdp_config.{name}", "TrainingArguments(..., {args})", "lower"),
         "lightning": Spelling("FSDPStrategy", "{name}", "Trainer(strategy=FSDPStrategy({args}))", "enum"),
         "accelerate": Spelling("FullyShardedDataParallelPlugin", "{name}",
                                "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin({args}))")}


def _family(table: dict[str, Spelling], name: str, **override: Spelling | None) -> dict[str, Spelling | None]:
    out: dict[str, Spelling | None] = {}
    for fw, sp in table.items():
        if fw in override:
            out[fw] = override[fw]
        else:
            out[fw] = Spelling(sp.where, sp.arg.format(name=name) if sp.arg else None, sp.call, sp.style)
    return out


# generic setting -> framework -> its spelling (None: the framework has no spelling; the plain way is given)
SPELLINGS: dict[str, dict[str, Spelling | None]] = {
    "ddp.find_unused_parameters": _family(_DDP, "find_unused_parameters"),
    "ddp.bucket_cap_mb": _family(_DDP, "bucket_cap_mb"),
    "ddp.static_graph": _family(_DDP, "static_graph"),
    "ddp.broadcast_buffers": _family(_DDP, "broadcast_buffers"),
    # TrainingArguments has no ddp_gradient_as_bucket_view
    "ddp.gradient_as_bucket_view": _family(_DDP, "gradient_as_bucket_view", **{"hf-trainer": None}),
    "loader.num_workers": _family(_LOADER, "num_workers"),
    "loader.pin_memory": _family(_LOADER, "pin_memory"),
    "loader.persistent_workers": _family(_LOADER, "persistent_workers"),
    "loader.prefetch_factor": _family(_LOADER, "prefetch_factor"),
    "fsdp.backward_prefetch": _family(_FSDP, "backward_prefetch"),
    "fsdp.forward_prefetch": _family(_FSDP, "forward_prefetch"),
    "fsdp.limit_all_gathers": _family(_FSDP, "limit_all_gathers"),
    # gradient accumulation without the all-reduce of all but the last micro-step; the value is the number of
    # micro-steps per optimizer step. The frameworks' own accumulation skips the sync by itself.
    "grad_accum.no_sync": {
        "plain": Spelling("DistributedDataParallel.no_sync", None,
                          "with model.no_sync(): loss.backward()  # for all but the last of the {value} micro-steps"),
        "hf-trainer": Spelling("TrainingArguments", "gradient_accumulation_steps",
                               "TrainingArguments(..., {args})  # the Trainer's accumulation syncs only the last "
                               "micro-step: drop the hand-made accumulation"),
        "lightning": Spelling("Trainer", "accumulate_grad_batches",
                              "Trainer(..., {args})  # Lightning's accumulation syncs only the last micro-step: drop "
                              "the hand-made accumulation"),
        "accelerate": Spelling("Accelerator", "gradient_accumulation_steps",
                               "Accelerator({args}); with accelerator.accumulate(model): ...  # syncs only the last "
                               "micro-step")},
    # one FSDP unit per repeated block (value: the block's class name; "Block" where the trace cannot name it)
    "fsdp.wrap_per_block": {
        "plain": Spelling("torch.distributed.fsdp.FullyShardedDataParallel", "auto_wrap_policy",
                          "FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{{value}}}))"),
        "hf-trainer": Spelling("TrainingArguments", "fsdp_config.transformer_layer_cls_to_wrap",
                               'TrainingArguments(..., fsdp="full_shard auto_wrap", '
                               'fsdp_config={{"transformer_layer_cls_to_wrap": ["{value}"]}})'),
        "lightning": Spelling("FSDPStrategy", "auto_wrap_policy", "Trainer(strategy=FSDPStrategy(auto_wrap_policy={{{value}}}))"),
        "accelerate": Spelling("FullyShardedDataParallelPlugin", "transformer_cls_names_to_wrap",
                               'Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy='
                               '"transformer_based_wrap", transformer_cls_names_to_wrap=["{value}"]))')},
    # a logged or metric value synced over the ranks at every step
    "log.sync_dist": {
        "plain": Spelling("torchmetrics.Metric", "dist_sync_on_step",
                          "Metric(..., {args}); metric.compute() once at the epoch's end"),
        "hf-trainer": None,
        # Lightning syncs a value logged with sync_dist=True at every step it is logged on_step (a barrier and an
        # all-reduce each, lightning/fabric/utilities/distributed.py _sync_ddp), and only at the epoch's end when
        # it is logged on_step=False, on_epoch=True (logger_connector/result.py)
        "lightning": Spelling("LightningModule.log", "sync_dist",
                              "self.log(..., {args}, on_step=True)  # a rank-local step value; "
                              "self.log(name, value, on_step=False, on_epoch=True, sync_dist=True) syncs once, at "
                              "the epoch's end"),
        "accelerate": None},
}

# what each change costs, said beside it (a rule may give its own, sized text)
SIDE_EFFECTS: dict[str, str] = {
    "loader.num_workers": "each worker is a process with its own copy of the dataset object: more memory, and "
                          "its CPU time competes with the ranks' own threads",
    "loader.pin_memory": "page-locked host memory for every batch in flight",
    "loader.persistent_workers": "the workers and their memory stay alive between epochs",
    "loader.prefetch_factor": "prefetch_factor batches per worker held in memory",
    "ddp.find_unused_parameters": "DDP raises an error if some step leaves a parameter without a gradient",
    "ddp.static_graph": "DDP assumes the same parameters get gradients every step; a step that differs raises",
    "ddp.bucket_cap_mb": "larger buckets start their all-reduce later in backward (less overlap); smaller ones "
                         "pay the fixed latency more often",
    "ddp.gradient_as_bucket_view": "gradients become views into DDP's buckets: code that replaces .grad breaks",
    "ddp.broadcast_buffers": "buffers (BatchNorm statistics) stay per rank",
    "fsdp.backward_prefetch": "one more unit's parameters are unsharded in memory during backward",
    "fsdp.forward_prefetch": "one more unsharded unit in memory during forward",
    "fsdp.limit_all_gathers": "without the limit, all-gathers may run ahead and hold more unsharded memory",
    "grad_accum.no_sync": "gradients of the skipped micro-steps stay unreduced on each rank until the last one",
    "fsdp.wrap_per_block": "more, smaller collectives (each with its latency); in exchange the peak holds one block "
                           "unsharded at a time instead of the whole model",
    "log.sync_dist": "each rank's per-step value is its own (rank 0's is the one shown); the mean over ranks comes "
                     "once, at the epoch's end, where it is synced",
}


def spell(s: Setting, framework: str) -> Setting:
    """``s`` filled in ``framework``'s terms (``where``, ``spelled``, ``code``), its side effect defaulted."""
    fw = framework if framework in FRAMEWORK_WORDS else "plain"
    table = SPELLINGS.get(s.name, {})
    sp = table.get(fw)
    out = Setting(name=s.name, value=s.value, now=s.now, side_effect=s.side_effect or SIDE_EFFECTS.get(s.name),
                  sized=s.sized)
    if sp is None:
        plain = table.get("plain")
        if plain is None:
            out.where, out.code = "", f"{s.name}={_py(s.value)}"
            return out
        inner = _code([(plain, s)])
        out.where, out.spelled = plain.where, None
        out.code = (f"{FRAMEWORK_WORDS[fw]} has no setting for {s.name.split('.', 1)[1]}: "
                    f"{_around(fw)} {inner}")
        return out
    out.where, out.spelled = sp.where, sp.arg
    out.code = _code([(sp, s)])
    return out


def _around(fw: str) -> str:
    """Where a plain-PyTorch setting goes inside a framework that has no spelling for it."""
    return {"hf-trainer": "wrap the model yourself and hand the Trainer the wrapper, or subclass the Trainer:",
            "accelerate": "in your own loop:",
            "lightning": "in the LightningModule:"}.get(fw, "")


def _arg(sp: Spelling, s: Setting) -> tuple[str, str]:
    """(argument, value text) of one setting; ``fsdp_config.key`` arguments go into a dict argument."""
    return sp.arg or "", _value(s.value, sp.style)


def _code(group: list[tuple[Spelling, Setting]]) -> str:
    sp = group[0][0]
    if "{value}" in sp.call:
        return sp.call.format(value=group[0][1].value, args="")
    plain_args, nested = [], {}
    for spg, s in group:
        arg, val = _arg(spg, s)
        if "." in arg:
            outer, inner = arg.split(".", 1)
            nested.setdefault(outer, []).append(f'"{inner}": {val}')
        else:
            plain_args.append(f"{arg}={val}")
    plain_args += [f"{outer}={{{', '.join(items)}}}" for outer, items in nested.items()]
    return sp.call.format(args=", ".join(plain_args))


def render(settings: list[Setting], framework: str) -> tuple[list[Setting], str]:
    """The settings in ``framework``'s terms, and the code a user writes for them: one call per object that
    takes them (``TrainingArguments(ddp_find_unused_parameters=False, dataloader_num_workers=1)``), each with
    the job's current values where known."""
    spelled = [spell(s, framework) for s in settings]
    fw = framework if framework in FRAMEWORK_WORDS else "plain"
    groups: dict[str, list[tuple[Spelling, Setting]]] = {}
    alone: list[str] = []
    for raw, s in zip(settings, spelled):
        sp = SPELLINGS.get(raw.name, {}).get(fw)
        if sp is None or "{value}" in sp.call:
            alone.append(_with_now(s.code, [s]))
            continue
        groups.setdefault(sp.call, []).append((sp, s))
    lines = [_with_now(_code(group), [s for _, s in group]) for group in groups.values()] + alone
    return spelled, "; ".join(lines)


def _with_now(code: str, settings: list[Setting]) -> str:
    """The code with the current values as its comment, ahead of a comment the call carries already."""
    now = _now(settings)
    if now and "  # " in code:
        head, comment = code.split("  # ", 1)
        return f"{head}{now}; {comment}"
    return code + now


def _now(settings: list[Setting]) -> str:
    """The job's current values as a comment: the bare value for one setting, ``name=value`` for several."""
    known = [s for s in settings if s.now is not None]
    if len(settings) == 1 and known:
        now = known[0].now
        return f"  # now {now:g}" if isinstance(now, float) else f"  # now {now}"
    return ("  # now " + ", ".join(f"{s.spelled or s.name.split('.', 1)[1]}={_py(s.now)}" for s in known)) if known else ""


def fix_text(settings: list[Setting], framework: str, prose: str = "") -> tuple[list[Setting], str]:
    """The whole fix: the code in the framework's terms, then the rule's own words (or the words with the code
    at their ``{code}``), then each side effect and what a value was sized from."""
    spelled, code = render(settings, framework)
    if "{code}" in prose:
        parts = [prose.replace("{code}", code)]
    else:
        parts = ([code] if code else []) + ([prose] if prose else [])
    costs = list(dict.fromkeys(s.side_effect for s in spelled if s.side_effect))
    if costs:
        parts.append("Side effect: " + "; ".join(costs))
    sized = list(dict.fromkeys(s.sized for s in spelled if s.sized))
    if sized:
        parts.append("; ".join(sized))
    return spelled, ". ".join(p.rstrip(". ") for p in parts) + "."


# findings a setting's side effect can bring in the next run: `diff` and `check --baseline` name the base's
# fix beside such a finding when it is new or worse (more workers take cores from the ranks: a rank slower
# at the same work, longer waits in the collectives; other bucket sizes move the all-reduce's overlap)
SIDE_EFFECT_FINDINGS: dict[str, tuple[str, ...]] = {
    "loader.num_workers": ("straggler", "exposed-comm-high", "low-overlap"),
    "loader.prefetch_factor": ("straggler",),
    "ddp.bucket_cap_mb": ("latency-bound-collectives", "ddp-tiny-buckets", "ddp-single-bucket", "exposed-comm-high",
                          "low-overlap"),
    "ddp.static_graph": ("exposed-comm-high",),
}


def explained_by_fix(fid: str, fixed: list, new_loader_workers: bool | None) -> str | None:
    """Why a finding new (or worse) in the new run may come from a fix applied to the base: the first of the
    base's fixed findings (``fixed``: Finding objects gone or smaller) one of whose settings can bring it.
    ``new_loader_workers``: whether the new run's loader has worker processes (None: not seen)."""
    for f in fixed:
        for s in f.settings:
            if fid not in SIDE_EFFECT_FINDINGS.get(s.name, ()):
                continue
            value = s.code.split("  #")[0] if s.code else f"{s.name}={_py(s.value)}"
            applied = ""
            if s.name == "loader.num_workers" and new_loader_workers is not None:
                applied = ("; the new run's loader has worker processes, so it was applied" if new_loader_workers
                           else "; but the new run's loader has no worker processes: it was not applied")
            return (f"may be a side effect of the base's fix for {f.id} ({value}: {s.side_effect or 'its cost'})"
                    f"{applied}")
    return None
