"""Collectives fixed by their issuer, on recordings (reference_jobs/lightning_metrics.py, unet_syncnorm.py):
metrics synced every step through Lightning's self.log(..., sync_dist=True) and torchmetrics' compute() are a
metric-sync finding in those libraries' own terms, holding the exposed communication they cause; synchronised
norms' exchanges get the norms' fix, and calls the trace does not name are never offered DDP's bucket size
unless they could be its buckets."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from bundled import TRACES  # the committed traces, in a pristine copy
from fsdpdoctor.pipeline import open_analysis

needs = pytest.mark.skipif(not (TRACES / "widedeep_lightning_sync_dist" / "rank0.json.gz").exists(),
                           reason="traces/ absent")


def _by_id(a) -> dict:
    return {f.id: f for f in a.findings}


@needs
def test_lightning_sync_dist_is_a_metric_sync_in_lightning_terms():
    f = _by_id(open_analysis(TRACES / "widedeep_lightning_sync_dist"))["metric-sync"]
    assert "framework (lightning: _sync_ddp)" in f.summary
    assert "self.log(name, value, on_step=False, on_epoch=True, sync_dist=True)" in f.fix
    assert "log_dict" in f.fix and "bucket_cap_mb" not in f.fix and "dist_sync_on_step" not in f.fix
    # the fix as data, in the job's framework (diagnose/settings.py)
    assert f.framework == "lightning" and [(s.name, s.value, s.now) for s in f.settings] == [("log.sync_dist", False,
                                                                                               True)]
    assert f.settings[0].where == "LightningModule.log" and f.fix.startswith("self.log(..., sync_dist=False")
    assert f.source and f.source.startswith("lightning_metrics.py(") and "training_step" in f.source
    assert f.impact_us > 0 and f.impact_frac >= 0.05


@needs
def test_torchmetrics_compute_every_step_is_a_metric_sync_that_holds_the_exposed_communication():
    fs = _by_id(open_analysis(TRACES / "widedeep_torchmetrics_compute"))
    f = fs["metric-sync"]
    assert "metrics (torchmetrics: compute)" in f.summary and "wrapped_func" not in f.summary
    assert "compute() once" in f.fix and "sync_on_compute=False" in f.fix and "self.log" not in f.fix
    assert f.settings == []   # calling compute() less often is no setting
    assert f.severity in ("warning", "error") and f.impact_us > 0
    # the gathers are the exposed communication: where that finding is made, it is this one's effect,
    # and its fix is the metrics', not FSDP units' (a DDP job) or buckets'
    if "exposed-comm-high" in fs:
        e = fs["exposed-comm-high"]
        assert e.caused_by == "metric-sync" and "FSDP" not in e.fix and "bucket_cap_mb" not in e.fix


@needs
def test_logging_on_epoch_has_no_metric_sync():
    assert "metric-sync" not in _by_id(open_analysis(TRACES / "widedeep_lightning_epoch"))


def _small_collectives_fix(a) -> str:
    fs = _by_id(a)
    return " ".join(fs[i].fix for i in ("latency-bound-collectives", "exposed-comm-high") if i in fs)


@needs
def test_synchronised_norms_get_the_norms_fix_not_a_bucket_size():
    a = open_analysis(TRACES / "unet_syncnorm_ddp")
    f = _by_id(a)["latency-bound-collectives"]
    assert "norm statistics (GlooSyncBatchNorm)" in f.summary
    assert f.fix.startswith("fewer synchronised norm layers") and "bucket_cap_mb" not in f.fix
    # the exposed communication they make (gloo blocks the host) gets their fix too, not gradient accumulation
    # or a bf16 gradient hook, and it does not gate: a chosen accuracy trade, reported with its cost
    e = _by_id(a).get("exposed-comm-high")
    if e is not None:
        assert e.fix.startswith("fewer synchronised norm layers") and "no_sync" not in e.fix
        assert e.severity == "info" and "exchanged by design" in e.summary


@needs
def test_unnamed_forward_exchanges_are_not_offered_bucket_cap_mb(tmp_path):
    # the same recording without its Python frames (a capture with with_stack=False): the forward all-gathers
    # have no issuer the trace can name; DDP's buckets are all-reduces in backward, so no bucket size is offered
    out = tmp_path / "unet_no_stack"
    out.mkdir()
    src = TRACES / "unet_syncnorm_ddp"
    shutil.copy(src / "manifest.json", out / "manifest.json")
    for r in (0, 1):
        with gzip.open(src / f"rank{r}.json.gz", "rt") as fh:
            doc = json.load(fh)
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
        with gzip.open(out / f"rank{r}.json.gz", "wt") as fh:
            json.dump(doc, fh)
    a = open_analysis(out)
    unnamed = [c for c in a.collective_events if c.issuer is None]
    assert unnamed and all(c.kind == "all_gather" and c.phase == "forward" for c in unnamed)
    assert "bucket_cap_mb" not in _small_collectives_fix(a)
