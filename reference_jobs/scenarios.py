"""The reference scenarios, in one table (no torch import: the CLI reads it; rule ids from the registry).

Each scenario: ``script`` (the job under reference_jobs/ that runs it),
``wrap`` (ddp / fsdp1 / fsdp2 / none: the manifest's wrapping kind), ``injects`` (one line: what is
wrong, or "nothing (healthy)"), ``params`` (how train.py configures the job),
``must`` (diagnosis rule ids that must fire on its traces) and ``must_not``
(rule ids that must not fire). ``must_not`` is derived below: every rule of a
problem the scenario does not contain.
"""

from __future__ import annotations

from fsdpdoctor.diagnose.rules import RULE_IDS

# Rules the CPU/gloo reference jobs cannot judge, with why: every other rule of the registry is judged
# (must fire where a scenario injects its problem, must not fire elsewhere), so a new rule is judged
# on every scenario from the day it is added.
NOT_JUDGED = {
    "exposed-comm-high": "gloo collectives block the host: healthy runs expose up to half the step (noise study)",
    "low-overlap": "device timeline only",
    "latency-bound-collectives": "small models: every healthy job's messages are small",
    "low-bus-bandwidth": "device timeline only",
    "cpu-staged-collectives": "needs CUDA tensors",
    "ranks-never-communicate": "injected by the user-style jobs only",
    "wrapper-world-size-1": "the scaling runs' 1-process job, not a scenario",
    "mixed-backends": "every scenario launches one backend",
    "gpu-idle": "device timeline only",
    "activation-recompute": "injected by the user-style jobs only",
    "offload-exposed": "device timeline only",
}
assert set(NOT_JUDGED) <= set(RULE_IDS), set(NOT_JUDGED) - set(RULE_IDS)
# every rule id the train.py scenarios judge, in registry order
RULES = [r for r in RULE_IDS if r not in NOT_JUDGED]

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
        params={"find_unused_parameters": True}, must=["ddp-find-unused-unneeded"],
        # the flag's cost is the bitmap's own time past the gradient all-reduces it queues behind in gloo
        # (1.6 ms [0, 6.2] of a 420 ms step over 3 steps): made, at info, and `check` passes the run
        gates=False),
    "dataloader_slow": dict(
        wrap="ddp", injects="DataLoader num_workers=0 with a slow __getitem__ (~32 ms/batch)",
        params={"num_workers": 0, "item_sleep_ms": 4.0}, must=["input-bound"]),
    "dataloader_fixed": dict(
        wrap="ddp", injects="same slow dataset, num_workers=2 (fixed)",
        params={"num_workers": 2, "item_sleep_ms": 4.0}, must=[]),
    "straggler": dict(
        wrap="ddp", injects="rank 1 sleeps 300 ms before every forward",
        params={"slow_rank": 1, "delay_ms": 300.0}, must=["straggler"]),
    # a rank late in its own frames beside a prefetch fault: two causes, each a root of its own
    "fsdp1_no_backward_prefetch_sleeper": dict(
        wrap="fsdp1", injects="FSDP1 backward_prefetch=None, and rank 1 sleeps 300 ms before every forward",
        params={"fsdp1_backward_prefetch": "none", "slow_rank": 1, "delay_ms": 300.0},
        must=["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off", "straggler"]),
    "fsdp1_backward_post_sleeper": dict(
        wrap="fsdp1", injects="FSDP1 backward_prefetch=BACKWARD_POST, and rank 1 sleeps 300 ms before every forward",
        params={"fsdp1_backward_prefetch": "BACKWARD_POST", "slow_rank": 1, "delay_ms": 300.0},
        must=["fsdp1-backward-post", "fsdp-forward-prefetch-off", "straggler"]),
    "fsdp2_no_backward_prefetch_sleeper": dict(
        wrap="fsdp2", injects="FSDP2 backward prefetch disabled, and rank 1 sleeps 300 ms before every forward",
        params={"fsdp2_backward_prefetch": "self", "slow_rank": 1, "delay_ms": 300.0},
        must=["fsdp2-backward-prefetch-ineffective", "straggler"]),
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

# Jobs written the way users write them, with other models than train.py: a transformers
# Qwen2 decoder (hf_decoder.py) and a small ResNet-style CNN (cnn.py). Their rule universe
# adds the rules of problems only they inject.
USER_JOB_RULES = [r for r in RULE_IDS if r in RULES or r in ("ranks-never-communicate", "activation-recompute")]

USER_JOB_PARAMS = {
    "launch": "torchrun",        # torchrun (init_process_group) / accelerate (cpu=True) /
                                 # accelerate_default (no cpu flag: DistributedType.NO) / no_process_group
    "act_ckpt": "none",          # none / checkpoint_wrapper (apply_activation_checkpointing) / hf /
                                 # torch_checkpoint (user_loops.py: checkpoint() called in the forward)
    "item_sleep_ms": 0.0,        # sleep in Dataset.__getitem__ (per sample)
    "num_workers": 0,
    "straggler": "none",         # none / matmul / sleep, on slow_rank before every forward
    "straggler_share": 0.3,      # injected extra time / step time, sized from the measured step
    "slow_rank": 1,
    "length_skew": 1.0,          # seq_encoder.py: slow_rank's sequences are this many times longer
    "expert_skew": 1.0,          # moe.py: slow_rank's expert gets this many times the tokens of each other one
    "loop": "plain",             # frameworks.py: plain / lightning / lbfgs / hf_trainer (who runs the step);
                                 # user_loops.py: vit_fsdp2_bf16_ckpt / gru_lm / gru_lm_sync_every /
                                 # mlp_loss_allreduce
    "periodic": "none",          # periodic.py: checkpoint / eval on rank 0 every `every` steps
    "every": 4,
    "periodic_ranks": "rank0",   # periodic.py: rank0 / all (every rank does its share of the periodic work)
    "total_steps": None,         # periodic.py: steps of the whole run (None: 20)
    "persistent_workers": False,  # epoch_loader.py: DataLoader(persistent_workers=...)
    "units": "per_block",        # wrapping.py: per_block / fsdp2_root_only / fsdp1_no_policy /
                                 # fsdp1_per_block_no_prefetch
    "collate_sleep_ms": 0.0,     # wrapping.py: slow_rank's collate_fn sleeps this long per batch
    "metrics": "epoch",          # metric_sync.py: torchmetrics dist_sync_on_step=True ("step") / False ("epoch")
    "variant": "ddp",            # metric_sync.py: ddp / clip_fsdp1 (FSDP1 + clip_grad_norm_) /
                                 # zero (DDP + ZeroRedundancyOptimizer)
    "token_skew": 1.0,           # hsdp_tokens.py: slow_rank's batches hold this many times the others' tokens
    "logging": "epoch",          # lightning_metrics.py: sync_dist (Lightning self.log/log_dict(sync_dist=True)
                                 # every step) / torchmetrics_compute (MetricCollection.compute() every step)
                                 # / epoch (no per-step sync)
}

USER_SCENARIOS: dict[str, dict] = {
    "hf_ddp": dict(
        script="hf_decoder.py", wrap="ddp", injects="nothing (healthy): Qwen2 decoder, DDP", params={}, must=[]),
    "hf_fsdp1": dict(
        script="hf_decoder.py", wrap="fsdp1",
        injects="Qwen2 decoder, FSDP1 transformer_auto_wrap_policy with defaults (forward_prefetch off)",
        params={}, must=["fsdp-forward-prefetch-off"]),
    "hf_fsdp2": dict(
        script="hf_decoder.py", wrap="fsdp2", injects="nothing (healthy): Qwen2 decoder, fully_shard per layer",
        params={}, must=[]),
    "hf_accelerate": dict(
        script="hf_decoder.py", wrap="ddp", injects="nothing (healthy): Qwen2 decoder through Accelerate(cpu=True)",
        params={"launch": "accelerate"}, must=[]),
    "hf_accelerate_unsynchronized": dict(
        script="hf_decoder.py", wrap="none",
        injects="Accelerate without cpu=True on a CPU machine: DistributedType.NO, ranks never communicate",
        params={"launch": "accelerate_default"}, must=["ranks-never-communicate"]),
    "hf_straggler_matmul": dict(
        script="hf_decoder.py", wrap="ddp", injects="rank 1 does extra matmuls, ~30% of the step, before forward",
        params={"straggler": "matmul"}, must=["straggler"]),
    "hf_straggler_sleep": dict(
        script="hf_decoder.py", wrap="fsdp1",
        injects="rank 1 sleeps ~30% of the step before forward (FSDP1 defaults)",
        params={"straggler": "sleep"}, must=["straggler", "fsdp-forward-prefetch-off"]),
    "hf_fsdp1_checkpoint_wrapper": dict(
        script="hf_decoder.py", wrap="fsdp1",
        injects="FSDP1 + apply_activation_checkpointing(checkpoint_wrapper) on every decoder layer",
        params={"act_ckpt": "checkpoint_wrapper"}, must=["activation-recompute", "fsdp-forward-prefetch-off"]),
    "hf_ddp_gradient_checkpointing": dict(
        script="hf_decoder.py", wrap="ddp", injects="DDP + model.gradient_checkpointing_enable()",
        params={"act_ckpt": "hf"}, must=["activation-recompute"]),
    "hf_dataloader_slow": dict(
        script="hf_decoder.py", wrap="ddp",
        injects="DataLoader num_workers=0 with a slow __getitem__ (8 samples x 5 ms per batch)",
        params={"item_sleep_ms": 5.0}, must=["input-bound"]),
    "cnn_ddp": dict(
        script="cnn.py", wrap="ddp", injects="nothing (healthy): ResNet-style CNN with BatchNorm, DDP",
        params={}, must=[]),
    "seq_ddp": dict(
        script="seq_encoder.py", wrap="ddp", injects="nothing (healthy): Transformer encoder, equal lengths, DDP",
        params={}, must=[]),
    "seq_length_skew": dict(
        script="seq_encoder.py", wrap="ddp",
        injects="rank 1's batches hold 2.7x longer sequences (no length-grouped batching)",
        params={"length_skew": 2.7}, must=["straggler"]),
    "moe_balanced": dict(
        script="moe.py", wrap="ddp",
        injects="nothing (healthy): mixture of experts, one expert per rank, all-to-all dispatch/combine, "
                "balanced routing", params={}, must=[]),
    "moe_routing_skew": dict(
        script="moe.py", wrap="ddp",
        injects="the router sends rank 1's expert 3x the tokens of rank 0's (all-to-all dispatch/combine)",
        params={"expert_skew": 3.0}, must=["straggler"]),
    "mixer_plain": dict(
        script="frameworks.py", wrap="ddp", injects="nothing (healthy): MLP-Mixer, DDP, hand-written loop",
        params={}, must=[]),
    "mixer_lightning": dict(
        script="frameworks.py", wrap="ddp",
        injects="nothing (healthy): the same MLP-Mixer under Lightning Trainer(strategy='ddp'): forward and "
                "backward inside optimizer.step(closure)", params={"loop": "lightning"}, must=[]),
    "mixer_lbfgs": dict(
        script="frameworks.py", wrap="ddp",
        injects="nothing (healthy): the same MLP-Mixer with LBFGS: forward and backward inside the closure",
        params={"loop": "lbfgs"}, must=[]),
    "mixer_hf_trainer": dict(
        script="frameworks.py", wrap="ddp",
        injects="the same MLP-Mixer under the Hugging Face Trainer (Accelerate, DDP) with its default "
                "ddp_find_unused_parameters (True for a model without gradient checkpointing)",
        params={"loop": "hf_trainer"}, must=["ddp-find-unused-unneeded"],
        # the flag's cost here (one graph traversal, about 1 ms of a step of hundreds) is inside the step's
        # noise: the finding is made, at info, and `check` passes the run (issue 28: severity follows evidence)
        gates=False),
    "syncbn_ddp": dict(
        script="syncbn.py", wrap="ddp",
        injects="nothing (healthy): pre-activation ResNet with 17 synchronised BatchNorms (all-gather in "
                "forward, all-reduce in backward) and DDP's buffer broadcast", params={}, must=[]),
    "periodic_checkpoint": dict(
        script="periodic.py", wrap="ddp",
        injects="rank 0 saves a checkpoint (about three steps long) after every 4th step",
        params={"periodic": "checkpoint", "every": 4}, must=["periodic-stall"]),
    "periodic_eval": dict(
        script="periodic.py", wrap="ddp",
        injects="rank 0 runs an evaluation pass (a few steps long) after every 3rd step",
        params={"periodic": "eval", "every": 3}, must=["periodic-stall"]),
    "periodic_checkpoint_short": dict(
        script="periodic.py", wrap="ddp", active=8,
        injects="rank 0 saves a checkpoint (about three steps long) after every 4th step; the run is only the "
                "profiled window (8 steps): the stall is seen twice", params={"periodic": "checkpoint", "every": 4,
                                                                           "total_steps": 10},
        must=["periodic-stall"]),
    "periodic_eval_all_ranks": dict(
        script="periodic.py", wrap="ddp",
        injects="every rank runs its share of an evaluation pass (about four steps long) after every 3rd step",
        params={"periodic": "eval", "every": 3, "periodic_ranks": "all"}, must=["periodic-stall"]),
    "loader_epoch_restart": dict(
        script="epoch_loader.py", wrap="ddp", active=8,
        injects="epochs of 4 batches, DataLoader(num_workers=2) without persistent_workers: the workers start "
                "again at every epoch and both ranks wait about half a step for the first batch",
        params={"persistent_workers": False}, must=["input-bound"]),
    "loader_epoch_persistent": dict(
        script="epoch_loader.py", wrap="ddp", active=8,
        injects="nothing (healthy): the same epochs with persistent_workers=True (the workers start once)",
        params={"persistent_workers": True}, must=[]),
    "wrap_fsdp2_per_block": dict(
        script="wrapping.py", wrap="fsdp2", injects="nothing (healthy): small ViT, fully_shard per block then root",
        params={}, must=[]),
    "wrap_fsdp2_root_only": dict(
        script="wrapping.py", wrap="fsdp2", injects="small ViT, fully_shard(model) on the root only: one unit",
        params={"units": "fsdp2_root_only"}, must=["fsdp-single-unit"]),
    "wrap_fsdp1_no_policy": dict(
        script="wrapping.py", wrap="fsdp1",
        injects="small ViT, FullyShardedDataParallel(model) without auto_wrap_policy: one unit",
        params={"units": "fsdp1_no_policy"}, must=["fsdp-single-unit"]),
    "wrap_fsdp1_no_prefetch_slow_collate": dict(
        script="wrapping.py", wrap="fsdp1",
        injects="two faults: FSDP1 per block with backward_prefetch=None, and rank 1's collate_fn sleeps 250 ms",
        params={"units": "fsdp1_per_block_no_prefetch", "collate_sleep_ms": 250.0},
        must=["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off", "straggler", "input-bound"]),
    "gcn_metric_sync_step": dict(
        script="metric_sync.py", wrap="ddp",
        injects="graph network, DDP, torchmetrics accuracy and mean loss with dist_sync_on_step=True: 6 barriers "
                "and 10 all-gathers every step", params={"metrics": "step"}, must=["metric-sync"]),
    "gcn_metric_sync_epoch": dict(
        script="metric_sync.py", wrap="ddp",
        injects="nothing (healthy): the same metrics with dist_sync_on_step=False, synced once at the epoch's end",
        params={"metrics": "epoch"}, must=[]),
    "gcn_clip_fsdp1": dict(
        script="metric_sync.py", wrap="fsdp1",
        injects="graph network, FSDP1 per layer with defaults (forward_prefetch off), model.clip_grad_norm_ every "
                "step (one all-reduce of the norm)", params={"variant": "clip_fsdp1"},
        must=["fsdp-forward-prefetch-off"]),
    "gcn_zero": dict(
        script="metric_sync.py", wrap="ddp",
        injects="nothing (healthy): graph network, DDP with ZeroRedundancyOptimizer (parameters broadcast after "
                "every step)", params={"variant": "zero"}, must=[]),
    "vit_fsdp2_bf16_ckpt": dict(
        script="user_loops.py", wrap="fsdp2",
        injects="small ViT, fully_shard per block with MixedPrecisionPolicy(param_dtype=bfloat16), every block "
                "recomputed in backward (torch.utils.checkpoint in the forward)",
        params={"loop": "vit_fsdp2_bf16_ckpt", "act_ckpt": "torch_checkpoint"}, must=["activation-recompute"]),
    "gru_lm_amp_accum": dict(
        script="user_loops.py", wrap="ddp",
        injects="nothing (healthy): GRU language model, DDP gradient_as_bucket_view=True, "
                "autocast(cpu, bfloat16), 3 micro-steps, first 2 in no_sync()",
        params={"loop": "gru_lm"}, must=[]),
    "gru_lm_amp_accum_sync_every": dict(
        script="user_loops.py", wrap="ddp",
        injects="the same GRU language model, 3 micro-steps without no_sync() (all-reduce every micro-step)",
        params={"loop": "gru_lm_sync_every"}, must=["grad-accum-without-no-sync"]),
    "mlp_loss_allreduce": dict(
        script="user_loops.py", wrap="ddp",
        injects="nothing (healthy): MLP, DDP, zero_grad(set_to_none=False), dist.all_reduce of the loss and "
                ".item() for the log every step (one scalar; the .item() is a host sync, free on CPU)",
        params={"loop": "mlp_loss_allreduce"}, must=["host-sync"]),
    "gru_lm_static_graph": dict(
        script="user_loops.py", wrap="ddp",
        injects="nothing (healthy): the same GRU language model, DDP static_graph=True, one micro-step per step",
        params={"loop": "gru_lm_static"}, must=[]),
    "mlp_compiled_loss_allreduce": dict(
        script="user_loops.py", wrap="ddp",
        injects="the loop of mlp_loss_allreduce with torch.compile(DDP(model)) (TorchDynamo's DDPOptimizer splits "
                "the graph at the buckets): the .item() is the one host sync", params={"loop": "mlp_compiled"},
        must=["host-sync"]),
    "hsdp_balanced": dict(
        script="hsdp_tokens.py", wrap="fsdp2", nproc=4,
        injects="nothing (healthy): LLaMA-style decoder LM, FSDP2 HSDP on a (2, 2) mesh, equal batches",
        params={}, must=[]),
    "hsdp_token_skew": dict(
        script="hsdp_tokens.py", wrap="fsdp2", nproc=4,
        injects="the same decoder, FSDP2 HSDP on a (2, 2) mesh: rank 1's batches hold 2x the tokens of the others'",
        params={"token_skew": 2.0}, must=["straggler"]),
    "unet_syncnorm_ddp": dict(
        script="unet_syncnorm.py", wrap="ddp",
        injects="nothing (healthy): small U-Net segmenting per pixel with 10 synchronised BatchNorms (an "
                "all-gather in forward and an all-reduce in backward each) under DDP", params={}, must=[]),
    "widedeep_lightning_sync_dist": dict(
        script="lightning_metrics.py", wrap="ddp",
        injects="Wide & Deep click model under Lightning (DDPStrategy): self.log(loss, sync_dist=True) and "
                "self.log_dict(5 batch statistics, sync_dist=True) every step: 6 barriers and 6 all-reduces a step",
        params={"logging": "sync_dist"}, must=["metric-sync"]),
    "widedeep_torchmetrics_compute": dict(
        script="lightning_metrics.py", wrap="ddp",
        injects="the same model, hand-written DDP loop: torchmetrics MetricCollection (accuracy, precision, "
                "recall) and MeanMetric compute()-d every step for a progress line (sync_on_compute=True)",
        params={"logging": "torchmetrics_compute"}, must=["metric-sync"]),
    "widedeep_lightning_epoch": dict(
        script="lightning_metrics.py", wrap="ddp",
        injects="nothing (healthy): the Lightning job logging the loss without sync_dist and the accuracy as a "
                "torchmetrics object on_epoch (synced at the epoch's end)", params={"logging": "epoch"}, must=[]),
    "cnn_no_process_group": dict(
        script="cnn.py", wrap="none",
        injects="torchrun without init_process_group: two independent models, no communication",
        params={"launch": "no_process_group"}, must=["ranks-never-communicate"]),
}

# Not scenarios: ddp_default run on 1 and 2 processes (for the scaling verb).
# the same job at several world sizes (weak scaling: the per-rank batch is fixed): scaling_* for the scaling
# verb, weak_* for whatif --world-size (docs/whatif.md), 4 ranks on a 2-core host included on purpose
SCALING_RUNS = {"scaling_1proc": ("ddp_default", 1), "scaling_2proc": ("ddp_default", 2),
                "weak_1rank": ("ddp_default", 1), "weak_2rank": ("ddp_default", 2), "weak_4rank": ("ddp_default", 4)}

for _name, _s in SCENARIOS.items():
    _s["name"] = _name
    _s["script"] = "train.py"
    _s["must_not"] = [r for r in RULES if r not in _s["must"]]
    _s["params"] = {**DEFAULT_PARAMS, **_s["params"]}
for _name, _s in USER_SCENARIOS.items():
    _s["name"] = _name
    _s["must_not"] = [r for r in USER_JOB_RULES if r not in _s["must"]]
    _s["params"] = {**USER_JOB_PARAMS, **_s["params"]}
SCENARIOS.update(USER_SCENARIOS)


def expected(name: str) -> dict:
    s = SCENARIOS[name]
    out = {"scenario": name, "must": list(s["must"]), "must_not": list(s["must_not"])}
    if s.get("gates") is False:
        out["gates"] = False   # its findings are made but within the run's noise: `check` passes it
    return out
