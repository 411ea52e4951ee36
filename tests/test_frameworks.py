"""Jobs as frameworks run them (issue 31): phases from what ran (forward and backward inside
``optimizer.step(closure)``), collectives by who issued them, and the Lightning / Hugging Face callbacks
run with the real frameworks on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from capture_kit import HF_TOY_JOB_HEAD

from conftest import requires_torch
from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.analysis.context import RankContext
from fsdpdoctor.analysis.dialects import detect
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.trace.loader import load_file

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _analysis(name: str):
    return open_analysis(TRACES / name)


@pytest.mark.parametrize("run", ["mixer_lightning", "mixer_lbfgs"])
def test_closure_work_is_compute_not_optimizer(run):
    """Lightning and LBFGS run forward and backward inside optimizer.step(closure): that work is the model's
    compute and the gradient all-reduce is backward's, as in the plain loop of the same model."""
    a = _analysis(run)
    for r in a.ranks:
        m = r.mean
        # the update of 370k parameters is a few element-wise ops; forward and backward are the step
        assert m.optimizer_us < 0.1 * m.compute_us, (r.rank, m.optimizer_us, m.compute_us)
    grads = [c for c in a.collective_events if c.kind == "all_reduce"]
    assert grads and {c.phase for c in grads} == {"backward"}
    assert {c.issuer for c in grads} == {"gradient buckets"}
    plain = _analysis("mixer_plain")
    assert {(c.kind, c.phase) for c in plain.collectives} <= {(c.kind, c.phase) for c in a.collectives}


def test_closure_set_on_lbfgs_trace():
    """One closure call per step span (max_iter=1), holding every backward op of the span; the optimizer's own
    set is what is left of the span: nothing of it runs backward."""
    t = load_file(TRACES / "mixer_lbfgs" / "rank0.json.gz")
    ctx = RankContext(t, detect(t))
    spans = ctx.set_of(ctx.optimizer_rows)
    closures = ctx.closure_set
    assert len(spans) and len(closures) == len(spans)
    for (a, b), (s, e) in zip(spans, closures):
        assert a <= s < e <= b
        assert iv.total(iv.clip(ctx.backward_set, a, b)) == pytest.approx(iv.total(iv.clip(ctx.backward_set, s, e)))
    assert iv.total(iv.intersect(ctx.optimizer_set, ctx.backward_set)) == 0
    assert iv.total(ctx.optimizer_set) > 0


def test_plain_loop_optimizer_unchanged():
    """Without a closure the optimizer set is the Optimizer.step spans, as before."""
    t = load_file(TRACES / "mixer_plain" / "rank1.json.gz")
    ctx = RankContext(t, detect(t))
    assert len(ctx.closure_set) == 0
    np.testing.assert_array_equal(ctx.optimizer_set, ctx.set_of(ctx.optimizer_rows))


def test_syncbn_collectives_by_issuer():
    """A healthy DDP ResNet with synchronised BatchNorm: the small exchanges are the norms' statistics and
    DDP's buffer broadcast, and the fix that reaches them is never the bucket size."""
    a = _analysis("syncbn_ddp")
    by = {}
    for c in a.collective_events:
        by.setdefault(c.issuer, set()).add((c.kind, c.phase))
    assert by.pop("DDP buffer broadcast") == {("broadcast", "forward")}
    assert by.pop("gradient buckets") == {("all_reduce", "backward")}
    norms = {k: v for k, v in by.items() if k and k.startswith("norm statistics")}
    assert set().union(*norms.values()) == {("all_gather", "forward"), ("all_reduce", "backward")}
    assert not set(by) - set(norms)
    for f in a.findings:
        assert "bucket_cap_mb" not in (f.fix or ""), f.id
        if f.id == "latency-bound-collectives":
            assert "SyncBatchNorm" in f.fix and "norm statistics" in f.summary


_LIGHTNING_JOB = """
import sys, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
from fsdpdoctor.capture.lightning import FsdpdoctorCallback

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.lin(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

ds = TensorDataset(torch.randn(64, 8), torch.randint(2, (64,)))
trainer = L.Trainer(accelerator="cpu", devices=1, strategy="ddp", max_steps=5, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    accumulate_grad_batches=2,
                    callbacks=[FsdpdoctorCallback(sys.argv[1], wait=0, warmup=1, active=2)])
trainer.fit(Net(), DataLoader(ds, batch_size=4))
"""

_HF_JOB = HF_TOY_JOB_HEAD + """
with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, max_steps=4, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             gradient_accumulation_steps=2, optim="sgd")
    trainer = Trainer(model=Net(), args=args, train_dataset=Data())
    trainer.add_callback(FsdpdoctorCallback(sys.argv[1], trainer=trainer, wait=0, warmup=1, active=2))
    trainer.train()
"""


def _run_job(src: str, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(src), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


@requires_torch
def test_lightning_callback(tmp_path):
    """One callback in Trainer(callbacks=[...]) captures the fit: one step per optimizer step (accumulation's
    micro-batches are not steps), the manifest from the strategy (its DDP wrapper, the optimizer, samples)."""
    pytest.importorskip("lightning", reason="needs the [lightning] extra (lightning)")
    out = tmp_path / "run"
    m = _run_job(_LIGHTNING_JOB, out)
    assert m["wrapping"]["kind"] == "ddp"
    assert m["model"]["optimizer"] == "SGD" and m["model"]["parameters"] == 18
    assert m["samples_per_step"] == 8           # batch 4 x 1 rank x 2 accumulated micro-batches
    assert m["framework"]["name"] == "lightning" and m["host"]["cores"] == len(os.sched_getaffinity(0))
    assert m["profiled_steps"] == [1, 2]
    a = open_analysis(out)
    assert [s.step for s in a.ranks[0].steps] == [1, 2]
    assert a.ranks[0].mean.optimizer_us < a.ranks[0].mean.compute_us


@requires_torch
def test_hf_trainer_callback(tmp_path):
    """trainer.add_callback(FsdpdoctorCallback(out, trainer=trainer)) captures Trainer.train()."""
    pytest.importorskip("transformers", reason="needs the [hf] extra (transformers)")
    out = tmp_path / "run"
    m = _run_job(_HF_JOB, out)
    assert m["model"]["parameters"] == 18 and m["model"]["optimizer"] == "SGD"
    assert m["samples_per_step"] == 8           # per-device batch 4 x 1 process x 2 accumulation steps
    assert m["profiled_steps"] == [1, 2]
    assert m["framework"]["name"] == "hf-trainer" and m["warnings"] == []
    a = open_analysis(out)
    assert (a.job.framework, a.job.framework_source) == ("hf-trainer", "manifest")
    assert [s.step for s in a.ranks[0].steps] == [1, 2]


def test_run_folder_with_user_json(tmp_path):
    """A trainer state and a config beside the traces: what manifest.json lists is read, the rest named."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(TRACES / "mixer_plain", run)
    (run / "trainer_state.json").write_text('{"global_step": 6, "log_history": []}')
    (run / "config.json").write_text('{"lr": 0.1}')
    a = open_analysis(run, use_summaries=False)
    assert [r.rank for r in a.ranks] == [0, 1]
    assert any("config.json, trainer_state.json skipped" in n for n in a.data_quality.notes)


def test_run_folder_with_user_json_named_for_ranks(tmp_path):
    """The user's own per-rank JSON (a step log per rank) beside the traces manifest.json lists: its name gives
    a rank, but that rank's listed trace is here, so it is skipped with a note, not read as a trace."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(TRACES / "mixer_plain", run)
    (run / "job_steps_rank0.json").write_text('{"steps": [1, 2, 3], "loss": [2.3, 2.1, 2.0]}')
    (run / "job_steps_rank1.json").write_text('[{"step": 1, "ms": 61.0}]')
    a = open_analysis(run, use_summaries=False)
    assert [r.rank for r in a.ranks] == [0, 1]
    note = next(n for n in a.data_quality.notes if "job_steps_rank0.json" in n)
    assert "rank 0's listed trace is rank0.json.gz" in note and "job_steps_rank1.json" in note
    # a renamed copy of a rank's trace whose listed file is absent is still read
    (run / "rank1.json.gz").rename(run / "copy_rank1.json.gz")
    (run / "job_steps_rank1.json").unlink()
    assert [r.rank for r in open_analysis(run, use_summaries=False).ranks] == [0, 1]


def test_metric_sync_named_and_found():
    """torchmetrics with dist_sync_on_step=True (gcn_metric_sync_step): every step's 6 barriers and 10 all-gathers
    are the metrics library's, found as metric-sync with the metrics' fix; synced at the epoch's end
    (gcn_metric_sync_epoch), the steps hold the gradient all-reduce only."""
    a = _analysis("gcn_metric_sync_step")
    steps = [c for c in a.collective_events if c.step is not None]
    sync = [c for c in steps if c.kind in ("all_gather", "barrier")]
    assert {c.issuer for c in sync} == {"metrics (torchmetrics: forward)"}
    nrs = len(a.job.steps) * len(a.ranks)
    assert sum(c.kind == "all_gather" for c in sync) == 10 * nrs and sum(c.kind == "barrier" for c in sync) == 6 * nrs
    assert {c.issuer for c in steps if c.kind == "all_reduce"} == {"gradient buckets"}
    f = next(f for f in a.findings if f.id == "metric-sync")
    assert "dist_sync_on_step=False" in f.fix and "bucket" not in f.fix
    assert f.source and f.source.startswith("metric_sync.py(")
    healthy = _analysis("gcn_metric_sync_epoch")
    assert {c.issuer for c in healthy.collective_events if c.step is not None} == {"gradient buckets"}
    assert not any(f.id == "metric-sync" for f in healthy.findings)


def test_clip_grad_norm_and_zero_collectives_by_issuer():
    """FSDP1's model.clip_grad_norm_ all-reduces the norm of the shards once a step; ZeroRedundancyOptimizer
    broadcasts each rank's updated parameters after its step: each named by its issuer, neither taken for a
    metric sync, and no fix names the bucket size."""
    clip = _analysis("gcn_clip_fsdp1")
    steps = [c for c in clip.collective_events if c.step is not None]
    assert {c.issuer for c in steps if c.kind == "all_reduce"} == {"clip_grad_norm_"}
    assert {c.issuer for c in steps if c.kind in ("all_gather", "reduce_scatter")} == {"fsdp"}
    zero = _analysis("gcn_zero")
    bcast = [c for c in zero.collective_events if c.step is not None and c.kind == "broadcast"]
    assert bcast and {c.issuer for c in bcast} == {"optimizer-state sharding"} and {c.phase for c in bcast} == {"optimizer"}
    for a in (clip, zero):
        for f in a.findings:
            assert f.id != "metric-sync" and "bucket_cap_mb" not in f.fix, (f.id, f.fix)
    small = [f for f in zero.findings if f.id == "latency-bound-collectives"]
    if small:   # the broadcasts are small: their fix is ZeRO's bucket view, not DDP's one bucket of gradients
        assert "parameters_as_bucket_view=True" in small[0].fix and "optimizer-state sharding" in small[0].summary
