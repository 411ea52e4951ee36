"""Fixes in the job's own terms (issue 44 items 1-2): the framework read from the manifest or the trace's
frames, each fix's settings written as that framework takes them, sized to the host the manifest records,
with their side effects; and nothing offered for a saving of 0."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from capture_kit import HF_TOY_JOB_HEAD

from fsdpdoctor.capture.host import host_facts
from fsdpdoctor.diagnose.rules import diagnose
from fsdpdoctor.diagnose.settings import FRAMEWORK_WORDS, SPELLINGS, fix_text
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.results import Analysis, Setting
from fsdpdoctor.trace.manifest import validate

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
_CACHE: dict[str, Analysis] = {}


def _analysis(name: str) -> Analysis:
    if name not in _CACHE:
        _CACHE[name] = open_analysis(TRACES / name)
    return copy.deepcopy(_CACHE[name])


def _finding(a: Analysis, fid: str):
    return next((f for f in a.findings if f.id == fid), None)


def _rediagnosed(name: str, framework: str | None = None, host: dict | None = None) -> Analysis:
    """The bundled run diagnosed again as if the manifest said ``framework``/``host``."""
    a = _analysis(name)
    if framework:
        a.job.framework, a.job.framework_source = framework, "manifest"
    if host is not None:
        a.job.manifest = {**(a.job.manifest or {}), "host": host}
    a.findings = diagnose(a)
    return a


@pytest.mark.parametrize("run, framework", [("mixer_hf_trainer", "hf-trainer"), ("mixer_lightning", "lightning"),
                                            ("hf_accelerate", "accelerate"), ("hf_ddp", "plain"),
                                            ("mixer_plain", "plain")])
def test_framework_from_the_trace_frames(run, framework):
    """The bundled runs' manifests predate the framework record: the framework's own loop on the stack says it
    (a Hugging Face model in a plain loop runs transformers/models/..., never transformers/trainer.py)."""
    a = _analysis(run)
    assert a.job.framework == framework, (a.job.framework, a.job.framework_source)
    assert a.job.framework_source.startswith("trace frames")


def test_hf_trainer_find_unused_fix_is_a_training_argument():
    """The Trainer's default ddp_find_unused_parameters (True) is fixed where a Trainer user can write it."""
    f = _finding(_analysis("mixer_hf_trainer"), "ddp-find-unused-unneeded")
    assert f is not None and f.framework == "hf-trainer"
    assert f.fix.startswith("TrainingArguments(..., ddp_find_unused_parameters=False)  # now True")
    assert "DDP(model" not in f.fix
    s = f.settings[0]
    assert (s.name, s.value, s.now, s.where, s.spelled) == (
        "ddp.find_unused_parameters", False, True, "TrainingArguments", "ddp_find_unused_parameters")
    assert "raises" in s.side_effect and "raises" in f.fix   # its side effect said beside it


def test_plain_find_unused_fix_is_ddp():
    f = _finding(_analysis("ddp_find_unused"), "ddp-find-unused-unneeded")
    assert f is not None and f.framework == "plain" and f.fix.startswith("DDP(model, find_unused_parameters=False)")


@pytest.mark.parametrize("framework, code, where", [
    ("plain", "DataLoader(..., num_workers=", "DataLoader"),
    ("hf-trainer", "TrainingArguments(..., dataloader_num_workers=", "TrainingArguments"),
    ("lightning", "DataLoader(..., num_workers=", "DataLoader"),
    ("accelerate", "DataLoader(..., num_workers=", "DataLoader"),
])
def test_loader_fix_in_each_framework(framework, code, where):
    """One rule, one generic setting, each framework's spelling (dataloader_slow: num_workers=0, a sleeping
    __getitem__)."""
    a = _rediagnosed("dataloader_slow", framework)
    f = _finding(a, "input-bound")
    assert f.framework == framework and f.fix.startswith(code), f.fix
    workers = next(s for s in f.settings if s.name == "loader.num_workers")
    assert workers.where == where and workers.now == 0
    assert "memory" in workers.side_effect and "persistent" in " ".join(s.name for s in f.settings)
    if framework == "lightning":
        assert "train_dataloader()" in f.fix
    if framework == "accelerate":
        assert "accelerator.prepare()" in f.fix
    assert "pin_memory" not in f.fix   # a CPU job: nothing to pin for


@pytest.mark.parametrize("cores, per_host, waiting, needed, workers", [
    (2, 2, False, 4, 0), (8, 2, False, 4, 3), (64, 2, False, 4, 4), (64, 2, False, 2, 2),
    (2, 2, True, 3, 3), (2, 2, True, 9, 4), (None, None, False, 4, 4)])
def test_loader_workers_sized_to_the_host(cores, per_host, waiting, needed, workers):
    """Workers per rank from the cores the manifest records: a loader that computes gets the cores per rank less
    the rank's main thread (none free: no worker), no more than keep up with the step, at most 4; a loader that
    waits (sleep, I/O) needs no core of its own: as many as keep up, at most 4; without the host, the usual 4 and
    words that say it is not sized."""
    from fsdpdoctor.diagnose.sizing import loader_workers

    a = _analysis("dataloader_slow")
    a.job.manifest = {**(a.job.manifest or {}), "host": {"cores": cores, "ranks_per_host": per_host} if cores else {}}
    n, sized = loader_workers(a, waiting, needed)
    assert n == workers
    assert sized.startswith("Not sized") if cores is None else f"{cores} cores" in sized


@pytest.mark.parametrize("cores, per_host", [(2, 2), (16, 2), (None, None)])
def test_loader_fix_on_a_sleeping_loader(cores, per_host):
    """dataloader_slow's __getitem__ sleeps (32 ms of its 34 ms): workers overlap it without cores of their own,
    so the same value on any host, sized from the step (one worker delivers a batch within the rest of it)."""
    host = {"cores": cores, "ranks_per_host": per_host} if cores else {}
    f = _finding(_rediagnosed("dataloader_slow", "plain", host), "input-bound")
    s = next(s for s in f.settings if s.name == "loader.num_workers")
    assert s.value == (1 if cores else 4) and f"num_workers={s.value}" in f.fix
    assert ("waits" in s.sized and f"{cores} cores" in s.sized) if cores else s.sized.startswith("Not sized")


def test_no_fix_for_no_saving():
    """A loader that computes on a host whose cores the ranks fill: workers would save nothing, so no setting is
    offered, the title does not call it input-bound and the fix says what would help and where."""
    a = _analysis("dataloader_slow")
    for r in a.ranks:
        for st in r.steps + [r.mean]:
            st.loader_sleep_us = 0.0
    a.mean.loader_sleep_us = 0.0
    a.job.manifest = {**(a.job.manifest or {}), "host": {"cores": 2, "ranks_per_host": 2}}
    a.findings = diagnose(a)
    f = _finding(a, "input-bound")
    assert f.impact_us < 50 and f.settings == [] and f.severity == "info"
    assert not f.title.startswith(("Highly", "Moderately")) and "would not shorten" in f.title
    assert "num_workers" not in f.fix and "4 cores" in f.fix


def test_prefetch_fix_in_each_framework():
    """FSDP1 BACKWARD_POST -> BACKWARD_PRE: FSDP's enum in plain PyTorch and Lightning, fsdp_config's string in
    the Trainer, the plugin's string in Accelerate; the memory cost beside it."""
    want = {"plain": "FSDP(model, ..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)",
            "hf-trainer": 'TrainingArguments(..., fsdp_config={"backward_prefetch": "backward_pre"})',
            "lightning": "Trainer(strategy=FSDPStrategy(backward_prefetch=BackwardPrefetch.BACKWARD_PRE))",
            "accelerate": 'Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(backward_prefetch="BACKWARD_PRE"))'}
    for fw, code in want.items():
        f = _finding(_rediagnosed("fsdp1_backward_post", fw), "fsdp1-backward-post")
        assert f.fix.startswith(code + "  # now BACKWARD_POST"), f.fix
        assert "unsharded unit in memory" in f.fix


def test_every_setting_has_a_spelling_or_says_how_around():
    """Every generic setting is written in every framework: its own spelling, or the plain way from inside it."""
    for name, table in SPELLINGS.items():
        assert set(table) == set(FRAMEWORK_WORDS), name
        for fw in FRAMEWORK_WORDS:
            settings, text = fix_text([Setting(name, True)], fw)
            if table[fw] is None and table.get("plain") is not None:
                assert "has no setting for" in text and settings[0].spelled is None
            assert settings[0].code and text


def test_manifest_host_and_framework():
    """The capture's host block reads this process's affinity; the reader keeps good blocks, drops bad ones."""
    facts = host_facts({"0": "a", "1": "a", "2": "b"}, 0)
    assert facts["cores"] == len(os.sched_getaffinity(0))
    assert facts["ranks_per_host"] in (2, int(os.environ.get("LOCAL_WORLD_SIZE", "2")))
    doc = {"fsdpdoctor_manifest": 1, "host": facts, "framework": {"name": "lightning", "versions": {}}}
    out, notes = validate(doc)
    assert out["host"] == facts and out["framework"]["name"] == "lightning" and not notes
    out, notes = validate({"fsdpdoctor_manifest": 1, "host": {"cores": "many"}, "framework": {"name": "keras"}})
    assert "host" not in out and "framework" not in out and len(notes) == 2


_HF_NATURAL = HF_TOY_JOB_HEAD + """
with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, max_steps=4, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, optim="sgd")
    Trainer(model=Net(), args=args, train_dataset=Data(),
            callbacks=[FsdpdoctorCallback(sys.argv[1], wait=0, warmup=1, active=2)]).train()
"""


def test_hf_callback_in_its_natural_form(tmp_path):
    """Trainer(..., callbacks=[FsdpdoctorCallback(out)]) without trainer=: the callback finds the Trainer that
    calls it, so the manifest has Accelerate's DDP wrapper (a launcher's one-rank process group makes the Trainer
    wrap), the framework and the host; the Trainer's default ddp_find_unused_parameters=True is then found and
    fixed as a TrainingArguments field."""
    pytest.importorskip("transformers")
    out = tmp_path / "run"
    with socket.socket() as sock:   # a port no other job on this machine holds
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, "-c", _HF_NATURAL, str(out)], capture_output=True, text=True, env=env, check=False,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["wrapping"]["kind"] == "ddp" and m["wrapping"]["find_unused_parameters"] is True
    assert m["framework"]["name"] == "hf-trainer" and m["warnings"] == []
    assert m["host"]["ranks_per_host"] == 1 and m["host"]["cores"] == len(os.sched_getaffinity(0))
    a = open_analysis(out)
    f = _finding(a, "ddp-find-unused-unneeded")
    assert f is not None and f.fix.startswith("TrainingArguments(..., ddp_find_unused_parameters=False)")
    assert "ddp_static_graph=True" in f.fix


def test_diff_names_the_base_fix_behind_a_new_finding():
    """dataloader_slow -> dataloader_fixed (num_workers added): a straggler appearing in the new run (here the
    one recorded in hf_straggler_sleep, put into the new run's findings) is named with the base's loader fix
    and its CPU cost, and the new run's worker processes say it was applied; a finding no fix of the base can
    bring is not explained."""
    from fsdpdoctor.diagnose.compare import compare
    from fsdpdoctor.report.diff_view import fix_lines

    base, new = _analysis("dataloader_slow"), _analysis("dataloader_fixed")
    assert any(s.name == "loader.num_workers" for f in base.findings for s in f.settings)
    late = _finding(_analysis("hf_straggler_sleep"), "straggler")
    assert late is not None
    new.findings = [f for f in new.findings if f.id != "straggler"] + [late]
    c = compare(base, new)
    ch = next(f for f in c.findings if f.id == "straggler")
    assert ch.status == "new" and "input-bound" in ch.explained_by and "num_workers=" in ch.explained_by
    assert "CPU contention" in ch.explained_by and "so it was applied" in ch.explained_by
    assert any(ln.startswith("new straggler: may be a side effect") for ln in fix_lines(c))
    assert all(f.explained_by is None for f in c.findings if f.id != "straggler")


def test_hf_callback_without_a_trainer_refuses_loudly(tmp_path):
    """Called outside a Trainer's loop (no Trainer on the stack, no trainer=) in a job of several ranks, the
    callback cannot find the wrapper: it says so on stderr and in the manifest, never records the unwrapped
    model in silence."""
    pytest.importorskip("transformers")
    import types
    import warnings

    import torch

    from fsdpdoctor.capture.hf import FsdpdoctorCallback

    cb = FsdpdoctorCallback(tmp_path / "run", wait=0, warmup=1, active=1)
    args = types.SimpleNamespace(per_device_train_batch_size=4, world_size=2, gradient_accumulation_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_train_begin(args, None, None, model=torch.nn.Linear(2, 2))
    try:
        assert any("found no Trainer" in str(w.message) for w in caught)
        assert any("trainer=trainer" in t for t in cb.cap.warnings)
        assert cb.cap.framework["name"] == "hf-trainer"
    finally:
        cb.on_train_end(args, None, None)


def test_unwrapped_model_in_a_multi_rank_job_is_said():
    """capture(model=...) given the bare model while several ranks run: a warning on stderr and in the manifest;
    nothing said for one rank, a wrapped model, or no model at all."""
    import warnings

    from fsdpdoctor.capture.manifest_writer import _unwrapped_warning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = _unwrapped_warning({"kind": "none"}, 2, True)
    assert said and "not wrapped in DDP or FSDP though 2 ranks run" in said[0] and caught
    assert _unwrapped_warning({"kind": "ddp"}, 2, True) == []
    assert _unwrapped_warning({"kind": "none"}, 1, True) == []
    assert _unwrapped_warning({"kind": "none"}, 2, False) == []


_ACCELERATE_LOOP = """
import sys, torch
from accelerate import Accelerator
from fsdpdoctor.capture import capture

acc = Accelerator(cpu=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
with capture(sys.argv[1], model=model, optimizer=opt, wait=0, warmup=1, active=2) as cap:
    for _ in range(4):
        loss = model(torch.randn(4, 8)).sum()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        cap.step()
"""


def test_accelerate_loop_records_its_framework(tmp_path):
    """A loop of the user's own over Accelerate's prepared objects, captured by capture(): the manifest says
    accelerate, so its fixes are written as kwargs handlers and the FSDP plugin."""
    pytest.importorskip("accelerate")
    out = tmp_path / "run"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, "-c", _ACCELERATE_LOOP, str(out)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["framework"]["name"] == "accelerate" and m["wrapping"]["kind"] == "ddp"
    assert open_analysis(out).job.framework == "accelerate"


def test_a_straggler_on_shared_cores_names_the_jobs_own_workers():
    """dataloader_fixed loads in worker processes on the cores the CPU ranks compute on: a rank slower at the
    same work there is told to look at them first; dataloader_slow (no workers) is not."""
    from fsdpdoctor.diagnose.framework import RuleContext
    from fsdpdoctor.diagnose.host_rules import _own_workers_words
    from fsdpdoctor.diagnose.thresholds import resolve

    fixed = _analysis("dataloader_fixed")
    fixed.job.manifest = {**(fixed.job.manifest or {}), "host": {"cores": 2, "ranks_per_host": 2}}
    words = _own_workers_words(RuleContext(fixed, resolve(None)))
    assert "DataLoader worker processes" in words and "2 cores" in words
    assert _own_workers_words(RuleContext(_analysis("dataloader_slow"), resolve(None))) == ""


def test_single_unit_fix_in_each_framework():
    """FSDP1 without an auto_wrap_policy: one unit per block, as each framework's FSDP setting takes it."""
    want = {"plain": "FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))",
            "hf-trainer": 'fsdp_config={"transformer_layer_cls_to_wrap": ["Block"]}',
            "lightning": "Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}))",
            "accelerate": 'transformer_cls_names_to_wrap=["Block"]'}
    for fw, code in want.items():
        f = _finding(_rediagnosed("wrap_fsdp1_no_policy", fw), "fsdp-single-unit")
        assert f is not None and code in f.fix and f.settings[0].name == "fsdp.wrap_per_block", (fw, f.fix)
        assert "one block unsharded at a time" in f.fix
