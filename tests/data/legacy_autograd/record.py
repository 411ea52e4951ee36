"""Records rank0.json.gz here: torch.autograd.profiler's legacy list export
(EventList.export_chrome_trace, what torch builds without Kineto write) of a 1-rank gloo loop with a naive
per-parameter all-reduce and 3 ProfilerStep# markers: python tests/data/legacy_autograd/record.py OUT.json
(then gzip it)."""
import os
import sys
import torch
import torch.distributed as dist
from torch.autograd import profiler
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("gloo", rank=0, world_size=1)
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(32, 64)
with profiler.profile() as p:
    for i in range(3):
        with profiler.record_function(f"ProfilerStep#{i}"):
            loss = m(x).sum()
            loss.backward()
            for q in m.parameters():  # a naive per-parameter all-reduce
                dist.all_reduce(q.grad)
            opt.step()
            opt.zero_grad()
            loss.item()
p.function_events.export_chrome_trace(sys.argv[1])
dist.destroy_process_group()
