"""The fault/fix pairs, in one table (no torch import: the calibration benchmark and the tests read it).

Each pair is one job run twice by ``reference_jobs/pairs.py``: ``--variant fault`` with the problem,
``--variant fix`` with the fix the finding names applied and nothing else changed. ``expect`` is the
finding id that must fire on the fault and not on the fix; the calibration benchmark
(``benchmarks/calibrate.py``) compares that finding's predicted saving with the measured one.

``model``: ``mixer`` (an MLP-Mixer on 32x32 images), ``encoder`` (pre-LN transformer blocks on token
sequences), ``convnet`` (a VGG-style conv net with GroupNorm), ``mlp`` (a residual MLP), ``gru`` (a two-layer
GRU language model on token sequences, added for the calibration under contention): none of them is a
bundled scenario's model. ``world``: processes under torchrun. ``fault`` / ``fix``: parameters
over ``DEFAULTS`` (pairs.py reads them). ``mode="processes"``: the calibration times this pair with a
launch per run, never in alternating blocks of one launch: a fix's loader workers would fill their
prefetch queue while the fault's block runs, and the fix's block would start on batches already made.
"""

from __future__ import annotations

DEFAULTS = {
    "wrap": "ddp",                  # ddp / fsdp1 / fsdp2 / none
    "sleep_ms": 0.0,                # rank 1 sleeps this long before every forward (host-side straggler)
    "lengths": (1.0, 1.0),          # encoder: per-rank sequence length, times the base length
    "item_sleep_ms": 0.0,           # Dataset.__getitem__ sleeps this long per sample (slow reads)
    "num_workers": 0,               # DataLoader workers
    "bucket_cap_mb": None,          # DDP (None: the torch default)
    "find_unused_parameters": False,
    "backward_prefetch": "BACKWARD_PRE",   # FSDP1: BACKWARD_PRE / BACKWARD_POST / none
    "forward_prefetch": False,             # FSDP1
    "fsdp2_prefetch": "default",    # FSDP2: default / self (set_modules_to_backward_prefetch([m]): disabled)
    "accum": 1,                     # micro-steps per optimizer step
    "no_sync": True,                # DDP no_sync() on all but the last micro-step
    "host_sync": False,             # .item() of the loss and the grad norm every step (with clip_grad)
    "clip_grad": False,             # clip_grad_norm_ every step
    "batch": 16,                    # samples per micro-step
    "width": 1,                     # mlp: hidden width times 256
    "resident_data": False,         # one batch made once on the device and reused (no loader in the step)
    "offload": False,               # FSDP2 CPUOffloadPolicy (parameters and optimizer step on the host)
    "checkpoint": False,            # mlp: torch.utils.checkpoint around every block (recomputed in backward)
    "readback": 0,                  # per-sample losses read back every step: this many values
    "readback_batched": False,      # ... in one copy (.tolist()), not one .item() per value
    "host_batch": False,            # one batch made once on the host, copied to the device every step
    "pin": True,                    # ... from pinned memory (non_blocking); False: pageable memory
    "cuda_graph": False,            # the whole step (forward, backward, AdamW(capturable=True)) replayed as
                                    # one CUDA graph (needs resident_data and a GPU)
}

PAIRS: dict[str, dict] = {
    "straggler_sleep": dict(
        model="mixer", world=2, expect="straggler",
        case="rank 1 sleeps 80 ms before every forward (MLP-Mixer, DDP); fix: no sleep",
        fault={"sleep_ms": 80.0}, fix={}),
    "length_skew": dict(
        model="encoder", world=2, expect="straggler",
        # 4x, not 2.5x: at 2.5x the fix saved about 10 ms of a 45 ms step, inside this machine's noise
        # (M 6.9 [-3.3, 16.4], 8.9 [-2.2, 19.4]) and the finding was missed under load
        case="rank 1's sequences 4x longer than rank 0's (encoder, DDP); fix: equal token budget (2.5x each)",
        fault={"lengths": (1.0, 4.0)}, fix={"lengths": (2.5, 2.5)}),
    "loader_workers": dict(
        model="convnet", world=2, expect="input-bound", mode="processes",
        case="__getitem__ sleeps 4 ms a sample, 16 a batch, num_workers=0 (conv net, DDP); fix: num_workers=2",
        fault={"item_sleep_ms": 4.0}, fix={"item_sleep_ms": 4.0, "num_workers": 2}),
    "ddp_single_bucket": dict(
        model="convnet", world=2, expect="ddp-single-bucket",
        case="DDP bucket_cap_mb=1000 (conv net); fix: the default buckets",
        fault={"bucket_cap_mb": 1000}, fix={}),
    "fsdp1_no_backward_prefetch": dict(
        model="encoder", world=2, expect="fsdp1-no-backward-prefetch",
        case="FSDP1 backward_prefetch=None (encoder blocks); fix: BACKWARD_PRE",
        fault={"wrap": "fsdp1", "backward_prefetch": "none"}, fix={"wrap": "fsdp1"}),
    "fsdp1_backward_post": dict(
        model="mixer", world=2, expect="fsdp1-backward-post",
        case="FSDP1 backward_prefetch=BACKWARD_POST (MLP-Mixer blocks); fix: BACKWARD_PRE",
        fault={"wrap": "fsdp1", "backward_prefetch": "BACKWARD_POST"}, fix={"wrap": "fsdp1"}),
    "fsdp1_forward_prefetch_off": dict(
        model="encoder", world=2, expect="fsdp-forward-prefetch-off",
        case="FSDP1 forward_prefetch=False (encoder blocks); fix: forward_prefetch=True",
        fault={"wrap": "fsdp1"}, fix={"wrap": "fsdp1", "forward_prefetch": True}),
    "fsdp2_prefetch_disabled": dict(
        model="mixer", world=2, expect="fsdp2-backward-prefetch-ineffective",
        case="FSDP2 set_modules_to_backward_prefetch([m]) on every unit (MLP-Mixer); fix: the default prefetch",
        fault={"wrap": "fsdp2", "fsdp2_prefetch": "self"}, fix={"wrap": "fsdp2"}),
    "grad_accum_no_sync": dict(
        model="mlp", world=2, expect="grad-accum-without-no-sync",
        case="4 micro-steps, every one all-reduces (residual MLP, DDP); fix: no_sync() on the first 3",
        fault={"accum": 4, "no_sync": False}, fix={"accum": 4}),
    "ddp_world_size_1": dict(
        model="convnet", world=1, expect="wrapper-world-size-1",
        case="DDP wrapper on 1 process (conv net); fix: no wrapper",
        fault={}, fix={"wrap": "none"}),
    "find_unused_unneeded": dict(
        model="encoder", world=2, expect="ddp-find-unused-unneeded",
        case="DDP find_unused_parameters=True, every parameter used (encoder); fix: False",
        fault={"find_unused_parameters": True}, fix={}),
    "host_sync": dict(
        model="mlp", world=2, expect="host-sync",
        case=".item() of the loss and the clipped grad norm every step (residual MLP, DDP, CPU); fix: clip, no .item()",
        fault={"clip_grad": True, "host_sync": True}, fix={"clip_grad": True}),
    # on a model the calibration had not seen (issue 45: the GRU LM with 8 micro-batches was the pair whose
    # prediction failed beside CPU hogs)
    "gru_grad_accum_no_sync": dict(
        model="gru", world=2, expect="grad-accum-without-no-sync",
        case="8 micro-steps, every one all-reduces (GRU LM, DDP); fix: no_sync() on the first 7",
        fault={"accum": 8, "no_sync": False, "batch": 8}, fix={"accum": 8, "batch": 8}),
    "gru_loader_workers": dict(
        model="gru", world=2, expect="input-bound", mode="processes",
        case="__getitem__ sleeps 3 ms a sample, 16 a batch, num_workers=0 (GRU LM, DDP); fix: num_workers=2",
        fault={"item_sleep_ms": 3.0}, fix={"item_sleep_ms": 3.0, "num_workers": 2}),
}

# Pairs for one CUDA GPU (``device="cuda"``, NCCL at world size 1: one GPU gives no cross-rank collectives),
# run by ``benchmarks/calibrate.py --device cuda`` where a GPU is lent; their recordings are bundled under
# traces/cuda/pairs/. The steps are GPU-bound (a wide MLP on resident data), unlike the CPU pairs' small
# models, so that what a fix removes shows on the device timeline.
CUDA_PAIRS: dict[str, dict] = {
    "cuda_host_sync": dict(
        model="mlp", world=1, device="cuda", expect="host-sync",
        case=".item() of the loss and the clipped grad norm every step (wide residual MLP on one GPU, no wrapper); "
             "fix: clip, no .item()",
        fault={"wrap": "none", "width": 8, "batch": 2048, "resident_data": True, "clip_grad": True,
               "host_sync": True},
        fix={"wrap": "none", "width": 8, "batch": 2048, "resident_data": True, "clip_grad": True}),
    "cuda_loader_workers": dict(
        model="convnet", world=1, device="cuda", expect="input-bound", mode="processes",
        case="__getitem__ sleeps 2 ms a sample, 64 a batch, num_workers=0 (conv net on one GPU, no wrapper); "
             "fix: num_workers=4",
        fault={"wrap": "none", "batch": 64, "item_sleep_ms": 2.0},
        fix={"wrap": "none", "batch": 64, "item_sleep_ms": 2.0, "num_workers": 4}),
    "cuda_ddp_world_size_1": dict(
        model="mlp", world=1, device="cuda", expect="wrapper-world-size-1",
        case="DDP wrapper on 1 process, NCCL (residual MLP on one GPU); fix: no wrapper",
        fault={"width": 4, "batch": 256, "resident_data": True},
        fix={"wrap": "none", "width": 4, "batch": 256, "resident_data": True}),
    "cuda_offload": dict(
        model="mlp", world=1, device="cuda", expect="offload-exposed",
        case="FSDP2 with CPUOffloadPolicy (wide residual MLP on one GPU); fix: no offload",
        fault={"wrap": "fsdp2", "width": 4, "batch": 512, "resident_data": True, "offload": True},
        fix={"wrap": "fsdp2", "width": 4, "batch": 512, "resident_data": True}),
    "cuda_readback": dict(
        model="mlp", world=1, device="cuda", expect="host-sync", residual=True,
        case="64 per-sample losses read back one .item() at a time every step, for logging (residual MLP on one "
             "GPU, no wrapper); fix: the same values read back in one copy (.tolist())",
        fault={"wrap": "none", "width": 4, "batch": 256, "resident_data": True, "readback": 64},
        fix={"wrap": "none", "width": 4, "batch": 256, "resident_data": True, "readback": 64,
             "readback_batched": True}),
    "cuda_pageable_copy": dict(
        model="mlp", world=1, device="cuda", expect="offload-exposed", residual=True,
        case="a 50 MB batch held in pageable host memory, copied to the device every step (residual MLP on one "
             "GPU, no wrapper); fix: the batch in pinned memory, copied with non_blocking=True",
        fault={"wrap": "none", "width": 2, "batch": 16384, "host_batch": True, "pin": False},
        fix={"wrap": "none", "width": 2, "batch": 16384, "host_batch": True}),
    "cuda_launch_bound": dict(
        model="mlp", world=1, device="cuda", expect="gpu-idle",
        case="a small residual MLP (batch 64, width 256) stepped eagerly: the GPU waits for the host to launch "
             "each kernel (one GPU, no wrapper); fix: the whole step captured once as a CUDA graph and replayed",
        fault={"wrap": "none", "width": 1, "batch": 64, "resident_data": True},
        fix={"wrap": "none", "width": 1, "batch": 64, "resident_data": True, "cuda_graph": True}),
    "cuda_recompute": dict(
        model="mlp", world=1, device="cuda", expect="activation-recompute",
        case="activation checkpointing of every block (wide residual MLP on one GPU, no wrapper); fix: no "
             "checkpointing (at the memory of the blocks' activations)",
        fault={"wrap": "none", "width": 8, "batch": 4096, "resident_data": True, "checkpoint": True},
        fix={"wrap": "none", "width": 8, "batch": 4096, "resident_data": True}),
}

ALL_PAIRS: dict[str, dict] = {**PAIRS, **CUDA_PAIRS}
VARIANTS = ("fault", "fix")


def params(pair: str, variant: str) -> dict:
    """The full parameter set of one variant of one pair."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {VARIANTS}")
    return {**DEFAULTS, **ALL_PAIRS[pair][variant]}

