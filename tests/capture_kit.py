"""What the capture tests share: a tiny model's training step, a few steps run under `capture`, and
the wait for the summary the capture writes in the background."""

from __future__ import annotations

import time
import warnings
from pathlib import Path


def tiny_training(torch, hidden: int = 32):
    """A small MLP, its optimizer and one training step (sleeping ``sleep_s`` after it when asked)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(sleep_s: float = 0.0):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if sleep_s:
            time.sleep(sleep_s)

    return model, opt, train_step


def run_captured(out: Path, train_step, steps: int = 4, **capture_kwargs):
    """``steps`` training steps under ``capture(out, **capture_kwargs)``: the capture object and the
    warnings it raised."""
    from fsdpdoctor.capture import capture

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(out, **capture_kwargs) as cap:
            for _ in range(steps):
                train_step()
                cap.step()
    return cap, caught


def wait_for_summary(out: Path, rank: int = 0, timeout_s: float = 120.0) -> Path:
    """The rank's summary, which the capture writes in a background process after the trace."""
    summary = out / f"rank{rank}.summary.msgpack"
    deadline = time.monotonic() + timeout_s
    while not summary.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert summary.exists(), "the background summary was not written"
    return summary


# a toy Hugging Face Trainer job's model and data, the head of a script a test runs in its own process (the
# Trainer call that follows differs by test: tests/test_frameworks.py, tests/test_fix_settings.py)
HF_TOY_JOB_HEAD = """
import sys, tempfile, torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments
from fsdpdoctor.capture.hf import FsdpdoctorCallback

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
    def forward(self, x, labels):
        return {"loss": torch.nn.functional.cross_entropy(self.lin(x), labels)}

class Data(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return {"x": torch.randn(8), "labels": i % 2}
"""
