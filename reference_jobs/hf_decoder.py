"""Reference job written the way a transformers user writes one: a Qwen2 decoder
built from a small config (no download), trained on synthetic tokens under
torchrun with DDP, FSDP1 (auto-wrap on the decoder layer class), FSDP2
(``fully_shard`` per layer) or through Accelerate, captured with
``fsdpdoctor.capture.capture`` as the README shows.

    torchrun --nproc_per_node 2 reference_jobs/hf_decoder.py --scenario hf_ddp --out runs/hf

The injected problems (scenarios.py): a straggler sized to a share of the step
(extra matmul or sleep on one rank), activation checkpointing, a slow
``__getitem__``, and an Accelerate launch that never synchronises the ranks.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402


SEQ, BATCH, VOCAB = 64, 8, 1024


def build_model():
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
                         tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config)


class TokenFile(Dataset):
    """Synthetic pre-tokenised samples; ``read_ms`` stands for a slow read per sample."""

    def __init__(self, n: int, read_ms: float = 0.0):
        self.n, self.read_ms = n, read_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.read_ms:
            time.sleep(self.read_ms / 1000.0)  # slow storage / tokenisation
        g = torch.Generator().manual_seed(int(i))
        return {"input_ids": torch.randint(VOCAB, (SEQ,), generator=g)}


def apply_checkpointing(model, how: str):
    if how == "checkpoint_wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                           checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, Qwen2DecoderLayer))
    elif how == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    launch = p["launch"]
    rank, world = jobkit.launcher_rank()

    accelerator = None
    if launch == "torchrun":
        dist.init_process_group("gloo")
    elif launch in ("accelerate", "accelerate_default"):
        from accelerate import Accelerator

        # cpu=True is what makes Accelerate use gloo on a machine without GPUs; without it,
        # two torchrun processes each get DistributedType.NO and train on their own
        accelerator = Accelerator(cpu=(launch == "accelerate"))
    synchronized = launch == "torchrun" or (accelerator is not None and accelerator.num_processes > 1)

    torch.manual_seed(0)
    model = build_model()
    if sc["wrap"] == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Qwen2DecoderLayer})
        model = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"))
        apply_checkpointing(model, p["act_ckpt"])
    else:
        apply_checkpointing(model, p["act_ckpt"])
        if sc["wrap"] == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        elif sc["wrap"] == "ddp" and launch == "torchrun":
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    calib = 3 if p["straggler"] != "none" else 0
    schedule_steps = args.wait + args.warmup + args.active
    steps = args.steps if args.steps is not None else schedule_steps + 1
    ds = TokenFile(BATCH * world * (steps + calib + 2), p["item_sleep_ms"])
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False) if launch == "torchrun" else None
    nw = int(p["num_workers"])
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=nw, persistent_workers=nw > 0,
                        drop_last=True)
    if accelerator is not None:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    it = iter(loader)

    slow_rank = args.slow_rank if args.slow_rank is not None else p["slow_rank"]
    straggler = jobkit.Straggler(p["straggler"], rank == slow_rank, p["straggler_share"], args.delay_ms)

    def train_step():
        batch = next(it)
        straggler()
        out = model(input_ids=batch["input_ids"], labels=batch["input_ids"])
        if accelerator is not None:
            accelerator.backward(out.loss)
        else:
            out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        straggler.step_done()

    model.train()
    if calib:
        straggler.size(jobkit.calibrate(train_step, calib, synchronized), synchronized)

    scenario = {"name": args.scenario, "injects": sc["injects"], "params": {**p, **straggler.facts()}}
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world, tokens_per_step=BATCH * SEQ * world)
    return jobkit.finish(args, steps, world, elapsed, barrier=synchronized,
                         extra=f"; straggler {straggler.facts()}" if calib else "")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
