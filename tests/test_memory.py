"""`fsdpdoctor memory`: known answers, strategy ordering, parsing, CLI, measured peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fsdpdoctor.analysis import memory as mem
from fsdpdoctor.results.memory import ActivationSpec, MemoryConfig
from conftest import error_lines

GB = 1e9


def model_state(**kw) -> float:
    return mem.estimate(MemoryConfig(**kw)).model_state


def close(a, b, rel=0.01):
    return abs(a - b) <= rel * abs(b)


# ------------------------------------------------------------ known answers

def test_7b_bf16_adamw_is_84_gb():
    assert close(model_state(parameters=mem.parse_param_count("7B"), dtype="bf16", optimizer="adamw"), 84 * GB)
    assert mem.bytes_per_param(MemoryConfig(parameters=1, dtype="bf16")).total == 12


def test_13b_bf16_adamw_is_156_gb():
    assert close(model_state(parameters=mem.parse_param_count("13B"), dtype="bf16", optimizer="adamw"), 156 * GB)


def test_7b_fp32_adam_is_112_gb():
    assert close(model_state(parameters=7_000_000_000, dtype="fp32", optimizer="adam"), 112 * GB)


def test_mixed_precision_is_16_bytes_per_param():
    bpp = mem.bytes_per_param(MemoryConfig(parameters=1, dtype="bf16", mixed_precision=True))
    assert (bpp.weights, bpp.gradients, bpp.master_weights, bpp.optimizer_states) == (2, 2, 4, 8)
    assert close(model_state(parameters=7e9, dtype="bf16", mixed_precision=True), 112 * GB)


@pytest.mark.parametrize("strategy,expected", [("ddp", 112), ("zero1", 70), ("zero2", 49), ("zero3", 28)])
def test_zero_stages_7b_fp32_adam_4_ranks(strategy, expected):
    got = model_state(parameters=7_000_000_000, dtype="fp32", optimizer="adam", world_size=4, strategy=strategy)
    assert close(got, expected * GB)


def test_zero_stage_ordering_and_aliases():
    kw = dict(parameters=7_000_000_000, dtype="bf16", world_size=8)
    vals = [model_state(strategy=s, **kw) for s in ("ddp", "zero1", "zero2", "zero3")]
    assert vals[0] > vals[1] > vals[2] > vals[3]
    assert model_state(strategy="NO_SHARD", **kw) == vals[0] == model_state(strategy="zero0", **kw)
    assert model_state(strategy="SHARD_GRAD_OP", **kw) == vals[2]
    assert model_state(strategy="ShardingStrategy.FULL_SHARD", **kw) == vals[3]


def test_hybrid_between_no_shard_and_full_shard():
    kw = dict(parameters=7_000_000_000, dtype="bf16", world_size=32, gpus_per_node=8)
    no_shard = model_state(strategy="no_shard", **kw)
    hybrid = model_state(strategy="hybrid_shard", **kw)
    full = model_state(strategy="full_shard", **kw)
    assert full < hybrid < no_shard
    assert close(hybrid, no_shard / 8) and close(full, no_shard / 32)


def test_cpu_offload_moves_bytes_to_host():
    kw = dict(parameters=7_000_000_000, dtype="bf16", mixed_precision=True, world_size=8, strategy="zero3")
    on_dev = mem.estimate(MemoryConfig(**kw))
    off = mem.estimate(MemoryConfig(cpu_offload=True, **kw))
    assert on_dev.host.total == 0
    assert off.model_state < on_dev.model_state
    assert off.host.total > 0
    assert off.model_state + off.host.total == on_dev.model_state  # bytes moved, not lost
    # ZeRO-2 + offload: weights stay on device (needed unsharded for compute)
    z2 = mem.estimate(MemoryConfig(cpu_offload=True, **{**kw, "strategy": "zero2"}))
    assert z2.weights == 7_000_000_000 * 2 and z2.optimizer_states == 0 and z2.host.optimizer_states > 0


def test_transient_included_only_when_largest_unit_known():
    kw = dict(parameters=7_000_000_000, dtype="bf16", world_size=8, strategy="zero3")
    e = mem.estimate(MemoryConfig(**kw))
    assert e.peak_transient is None and any("transient" in s for s in e.not_included)
    e2 = mem.estimate(MemoryConfig(largest_unit_params=200_000_000, **kw))
    assert e2.peak_transient and e2.total == e2.model_state + e2.peak_transient
    assert e2.peak_transient < 200_000_000 * 4 + 1


def test_activation_estimate_korthikanti():
    spec = ActivationSpec(layers=2, hidden=1024, seq=512, micro_batch=4, heads=16)
    a = mem.estimate_activations(spec, "bf16")
    s, b, h, heads = 512, 4, 1024, 16
    assert a.per_layer_bytes == round(s * b * h * (34 + 5 * heads * s / h))
    assert a.total_bytes == 2 * a.per_layer_bytes
    ck = mem.estimate_activations(ActivationSpec(layers=2, hidden=1024, seq=512, micro_batch=4, heads=16,
                                                     checkpointing=True), "bf16")
    assert ck.per_layer_bytes == 2 * s * b * h and ck.total_bytes < a.total_bytes
    assert "estimate" in a.notes[0]


def test_comparison_covers_every_strategy():
    cfg = MemoryConfig(parameters=7_000_000_000, dtype="bf16", world_size=16, gpus_per_node=8, strategy="ddp")
    rows = mem.compare_strategies(cfg)
    names = {r.strategy for r in rows}
    assert {"ddp", "zero1", "zero2", "zero3", "hybrid_shard"} <= names
    assert sum(r.current for r in rows) == 1
    sentences = mem.comparison_sentences(cfg, rows)
    assert any(s.startswith("ZeRO-3 / FULL_SHARD would cut model state from 84.00 GB to 5.25 GB") for s in sentences)


# ------------------------------------------------------------ parsing

@pytest.mark.parametrize("text,value", [("7B", 7_000_000_000), ("350M", 350_000_000), ("13e9", 13_000_000_000),
                                        ("1.3b", 1_300_000_000), ("125_000_000", 125_000_000), ("2k", 2000)])
def test_parse_param_count(text, value):
    assert mem.parse_param_count(text) == value


@pytest.mark.parametrize("text", ["-7B", "0", "7X", "", "abc", "nan", "B"])
def test_parse_param_count_rejects(text):
    with pytest.raises(ValueError):
        mem.parse_param_count(text)


# ------------------------------------------------------------ CLI

def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", "memory", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "160"})


def test_cli_table_ok():
    r = cli("--params", "7B", "--dtype", "bf16", "--optimizer", "adamw", "--world-size", "8", "--strategy", "zero3",
            "--gpus-per-node", "4", "--layers", "32", "--hidden", "4096", "--seq", "2048", "--micro-batch", "1")
    assert r.returncode == 0, r.stderr
    assert "GB = 1e9 bytes" in r.stdout and "GiB" in r.stdout
    assert "10.50 GB" in r.stdout  # 84 GB / 8
    assert "ESTIMATE" in r.stdout


def test_cli_json_parses():
    r = cli("--params", "7B", "--world-size", "4", "--strategy", "zero2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["estimate"]["per_rank_bytes"]["model_state"] == 49_000_000_000
    assert {row["strategy"] for row in doc["comparison"]} >= {"ddp", "zero1", "zero2", "zero3"}


@pytest.mark.parametrize("args", [
    ["--params=-7B"], ["--params", "seven"], ["--params", "7B", "--strategy", "zero9"],
    ["--params", "7B", "--world-size", "0"], ["--params", "7B", "--dtype", "int8"],
    ["/definitely/not/here"], [],
])
def test_cli_bad_input_one_line_exit_2(args):
    r = cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdpdoctor: error:"), r.stderr
    assert r.stdout == ""


def test_cli_folder_without_manifest(tmp_path):
    r = cli(str(tmp_path))
    assert r.returncode == 2 and "manifest.json" in r.stderr and len(error_lines(r.stderr)) == 1


def manifest_for(n_params, *, profile_memory, files=None, dtype="float32", optimizer="AdamW",
                 wrapping=None, world_size=1, devices=None):
    return {
        "fsdpdoctor_manifest": 1, "created": "2026-11-21T17:45:00Z", "world_size": world_size, "backend": "gloo",
        "profiled_ranks": list(range(world_size)),
        "files": files if files is not None else {str(r): f"rank{r}.json" for r in range(world_size)},
        "versions": {"torch": None, "cuda": None, "nccl": None, "python": None, "fsdpdoctor": "0.1.0"},
        "hosts": {str(r): "node-a" for r in range(world_size)},
        "devices": devices or {str(r): "cpu" for r in range(world_size)},
        "schedule": None, "profiled_steps": [0, 1, 2], "samples_per_step": 8, "tokens_per_step": None,
        "options": {"record_shapes": False, "with_stack": False, "profile_memory": profile_memory},
        "model": {"parameters": n_params, "trainable_parameters": n_params, "param_dtype": dtype,
                  "param_bytes": n_params * 4, "optimizer": optimizer},
        "wrapping": wrapping or {"kind": "none"}, "scenario": None,
    }


def test_manifest_fsdp1_mapping(tmp_path):
    m = manifest_for(8_000_000, profile_memory=False, world_size=4,
                     wrapping={"kind": "fsdp1", "sharding_strategy": "SHARD_GRAD_OP", "cpu_offload": False,
                               "mixed_precision": {"param_dtype": "torch.bfloat16", "reduce_dtype": None,
                                                   "buffer_dtype": None}, "units": 4})
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    r = cli(str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cfg = doc["estimate"]["config"]
    assert cfg["strategy"] == "zero2" and cfg["world_size"] == 4 and cfg["mixed_precision"] and cfg["dtype"] == "bf16"
    assert doc["measured"] == [] and any("profile_memory=false" in n for n in doc["notes"])


def test_manifest_unknown_optimizer_is_input_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest_for(1000, profile_memory=False, optimizer=None)))
    r = cli(str(tmp_path))
    assert r.returncode == 2 and "model.optimizer" in r.stderr and len(error_lines(r.stderr)) == 1
    assert cli(str(tmp_path), "--optimizer", "sgd").returncode == 0


def test_memory_peaks_synthetic_events():
    ev = [{"ph": "i", "name": "[memory]", "ts": t, "args": {"Total Allocated": ta, "Bytes": b, "Device Type": dt,
                                                             "Device Id": di}}
          for t, ta, b, dt, di in [(1, 100, 100, 0, -1), (2, 50, -50, 0, -1), (3, 5000, 1000, 1, 0),
                                   (4, 9000, 4000, 1, 0), (5, 3000, -6000, 1, 0)]]
    peaks = mem.memory_peaks({"traceEvents": ev})
    cuda = mem.pick_device_peak(peaks, "cuda:0")
    assert (cuda.peak_allocated, cuda.start_allocated, cuda.end_allocated) == (9000, 4000, 3000)
    assert mem.pick_device_peak(peaks, "cpu").peak_allocated == 100


# ------------------------------------------------------------ real torch.profiler capture

CAPTURE = r"""
import sys, torch
from torch.profiler import profile, ProfilerActivity
out = sys.argv[1]
torch.manual_seed(0)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    # built inside the profiled window: on CPU, earlier allocations are invisible to the profiler
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 512)
    for _ in range(3):
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()
prof.export_chrome_trace(out)
print(sum(p.numel() for p in model.parameters()))
"""


@pytest.mark.torch
def test_measured_peak_real_torch_profiler(tmp_path):
    pytest.importorskip("torch", reason="needs the [capture] extra (torch): a real profiler trace is captured")
    script = tmp_path / "capture.py"
    script.write_text(CAPTURE)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "rank0.json")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    n_params = int(run.stdout.strip().splitlines()[-1])
    (tmp_path / "manifest.json").write_text(json.dumps(manifest_for(n_params, profile_memory=True)))
    r = cli(str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    predicted = doc["estimate"]["per_rank_bytes"]["model_state"]
    assert predicted == n_params * 16  # fp32 weights + grads + AdamW m, v
    (row,) = doc["measured"]
    assert row["device_type"] == "cpu" and row["rank"] == 0
    assert row["peak_allocated"] >= predicted
    assert row["peak_allocated"] <= 4 * predicted  # activations/temporaries of a tiny model are small
    assert any("only counts allocations made while" in n for n in doc["notes"])
    # the rich table also renders
    t = cli(str(tmp_path))
    assert t.returncode == 0 and "Measured allocator peak" in t.stdout
