"""Reference job with a small Transformer encoder classifying token sequences, the way a text user
writes one: DDP under torchrun, variable-length batches, captured with ``fsdpdoctor.capture.capture``.

    torchrun --nproc_per_node 2 reference_jobs/seq_encoder.py --scenario seq_length_skew --out runs/skew

``seq_length_skew``: the batches are not grouped by length, so one rank keeps drawing the long
sequences: rank ``slow_rank``'s batches are ``length_skew`` times longer than the others' (the same
number of samples, more tokens). ``seq_ddp`` is the same job with equal lengths.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # fsdpdoctor, when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import jobkit  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

BATCH, BASE_LEN, VOCAB, CLASSES, D_MODEL = 16, 64, 1000, 4, 128


class SeqClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=4 * D_MODEL, batch_first=True,
                                           dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        return self.head(h.mean(dim=1))


def batch_for(rank: int, step: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return (torch.randint(VOCAB, (BATCH, length), generator=g), torch.randint(CLASSES, (BATCH,), generator=g))


def main(argv=None) -> int:
    args = jobkit.parse_args(SCENARIOS, __doc__, argv)
    sc = SCENARIOS[args.scenario]
    p = dict(sc["params"])
    rank, world = jobkit.launcher_rank()
    dist.init_process_group("gloo")

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(SeqClassifier())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    slow = rank == p["slow_rank"]
    length = round(BASE_LEN * p["length_skew"]) if slow else BASE_LEN
    steps = args.steps if args.steps is not None else args.wait + args.warmup + args.active + 1
    counter = iter(range(10 ** 9))

    def train_step():
        tokens, labels = batch_for(rank, next(counter), length)
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tokens_per_step = BATCH * (BASE_LEN * (world - 1) + round(BASE_LEN * p["length_skew"]))
    scenario = {"name": args.scenario, "injects": sc["injects"], "params": p}
    model.train()
    elapsed = jobkit.run_steps(args, steps, train_step, model=model, optimizer=opt, scenario=scenario,
                               samples_per_step=BATCH * world, tokens_per_step=tokens_per_step)
    return jobkit.finish(args, steps, world, elapsed)


if __name__ == "__main__":
    sys.exit(main())
