"""Records rank0.json.gz here: torch.profiler (Kineto, CPU activity only) around a few training
iterations with no prof.step() call, so the trace holds no ProfilerStep# marker; each iteration logs
its loss with .item() (a host sync).

    python tests/data/no_step_cpu/record.py tests/data/no_step_cpu/rank0.json.gz
"""
import gzip
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(32, 64)
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(3):
        loss = m(x).sum()
        loss.backward()
        print(f"loss {loss.item():.3f}")
        opt.step()
        opt.zero_grad()
with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
    p.export_chrome_trace(tmp.name)
    with open(tmp.name, "rb") as src, gzip.open(sys.argv[1], "wb") as dst:
        shutil.copyfileobj(src, dst)
