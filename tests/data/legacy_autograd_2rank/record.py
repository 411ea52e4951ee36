"""Records rank0.json.gz and rank1.json.gz here: torch.autograd.profiler's legacy list export
(EventList.export_chrome_trace, the writer of torch builds without Kineto; torch 2.13's
profile(use_kineto=False) writes Kineto's format, so the list is exported from the events) of a
2-rank gloo job (processes started by torch.multiprocessing; each export's clock starts at its own
profiler start) with 8 ProfilerStep# markers, a naive
per-parameter all-reduce (4 per step) and rank 1 sleeping 20 ms per step before its all-reduces:
    python tests/data/legacy_autograd_2rank/record.py OUT_DIR   (then gzip the two files)"""
import os
import sys
import time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.autograd import profiler


def run(rank: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29537")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    dist.all_reduce(torch.ones(1))  # gloo connects on the first collective: before the profiler starts
    with profiler.profile() as p:
        for i in range(8):
            with profiler.record_function(f"ProfilerStep#{i}"):
                loss = m(x).sum()
                loss.backward()
                if rank == 1:
                    time.sleep(0.02)  # a slow rank: rank 0 waits for it in every all-reduce
                for q in m.parameters():
                    dist.all_reduce(q.grad)
                opt.step()
                opt.zero_grad()
                loss.item()
    p.function_events.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1],), nprocs=2)
