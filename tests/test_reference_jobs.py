"""Reference scenarios: the table, the committed traces, and `fsdpdoctor reference`."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from conftest import error_lines, requires_torch
from fsdpdoctor.cli import main
from fsdpdoctor.commands.reference import load_scenarios, reference_dir

REFERENCE = reference_dir()

REQUIRED = [
    "fsdp1_backward_pre", "fsdp1_backward_post", "fsdp1_no_backward_prefetch", "fsdp1_forward_prefetch",
    "fsdp2_default", "fsdp2_no_backward_prefetch", "fsdp2_empty_prefetch_list",
    "ddp_default", "ddp_one_bucket", "ddp_tiny_buckets", "ddp_find_unused",
    "dataloader_slow", "dataloader_fixed", "straggler", "host_sync",
    "grad_accum_no_sync", "grad_accum_sync_every",
    # user-style jobs: a transformers Qwen2 decoder and a ResNet-style CNN
    "hf_ddp", "hf_fsdp1", "hf_fsdp2", "hf_accelerate", "hf_accelerate_unsynchronized",
    "hf_straggler_matmul", "hf_straggler_sleep", "hf_fsdp1_checkpoint_wrapper",
    "hf_ddp_gradient_checkpointing", "hf_dataloader_slow", "cnn_ddp", "cnn_no_process_group",
    # a sleeper beside each prefetch fault; a Transformer encoder with and without length skew
    "fsdp1_no_backward_prefetch_sleeper", "fsdp1_backward_post_sleeper", "fsdp2_no_backward_prefetch_sleeper",
    "seq_ddp", "seq_length_skew",
    # a mixture of experts exchanging tokens with all_to_all, balanced and with a skewed router
    "moe_balanced", "moe_routing_skew",
    # one MLP-Mixer under a plain loop, Lightning, LBFGS's closure and the HF Trainer
    "mixer_plain", "mixer_lightning", "mixer_lbfgs", "mixer_hf_trainer",
    # synchronised BatchNorm; periodic work on rank 0
    "syncbn_ddp", "periodic_checkpoint", "periodic_eval",
    # FSDP units: per block, one unit (FSDP2 root only, FSDP1 without a policy), two faults at once
    "wrap_fsdp2_per_block", "wrap_fsdp2_root_only", "wrap_fsdp1_no_policy", "wrap_fsdp1_no_prefetch_slow_collate",
    # loops written otherwise: FSDP2 mixed precision with checkpoint() in the forward, DDP autocast and
    # gradient_as_bucket_view with and without no_sync(), a per-step loss all_reduce beside DDP's
    "vit_fsdp2_bf16_ckpt", "gru_lm_amp_accum", "gru_lm_amp_accum_sync_every", "mlp_loss_allreduce",
    # the same loss all_reduce under torch.compile(DDP(model)); DDP static_graph=True
    "mlp_compiled_loss_allreduce", "gru_lm_static_graph",
    # periodic work seen twice in the window, and done by every rank; loader workers started every epoch
    "periodic_checkpoint_short", "periodic_eval_all_ranks", "loader_epoch_restart", "loader_epoch_persistent",
    # FSDP2 HSDP on a (2, 2) mesh, one rank with twice the tokens; metrics synced through Lightning's
    # self.log(sync_dist=True) and torchmetrics' compute() every step, and the healthy logging
    "hsdp_balanced", "hsdp_token_skew", "widedeep_lightning_sync_dist", "widedeep_torchmetrics_compute",
    "widedeep_lightning_epoch", "unet_syncnorm_ddp",
]
MUST = {
    # forward_prefetch=False in every FSDP1 scenario but fsdp1_forward_prefetch (the on/off pair)
    "fsdp1_backward_pre": ["fsdp-forward-prefetch-off"],
    "fsdp1_backward_post": ["fsdp1-backward-post", "fsdp-forward-prefetch-off"],
    "fsdp1_no_backward_prefetch": ["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off"],
    "fsdp2_no_backward_prefetch": ["fsdp2-backward-prefetch-ineffective"],
    "fsdp2_empty_prefetch_list": ["fsdp2-explicit-prefetch-noop"],
    "ddp_one_bucket": ["ddp-single-bucket"],
    "ddp_tiny_buckets": ["ddp-tiny-buckets"],
    "ddp_find_unused": ["ddp-find-unused-unneeded"],
    "dataloader_slow": ["input-bound"],
    "straggler": ["straggler"],
    "host_sync": ["host-sync"],
    "grad_accum_sync_every": ["grad-accum-without-no-sync"],
    # FSDP1 with its defaults: forward_prefetch is off
    "hf_fsdp1": ["fsdp-forward-prefetch-off"],
    "hf_accelerate_unsynchronized": ["ranks-never-communicate"],
    "hf_straggler_matmul": ["straggler"],
    "hf_straggler_sleep": ["straggler", "fsdp-forward-prefetch-off"],
    "hf_fsdp1_checkpoint_wrapper": ["activation-recompute", "fsdp-forward-prefetch-off"],
    "hf_ddp_gradient_checkpointing": ["activation-recompute"],
    "hf_dataloader_slow": ["input-bound"],
    "cnn_no_process_group": ["ranks-never-communicate"],
    "fsdp1_no_backward_prefetch_sleeper": ["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off", "straggler"],
    "fsdp1_backward_post_sleeper": ["fsdp1-backward-post", "fsdp-forward-prefetch-off", "straggler"],
    "fsdp2_no_backward_prefetch_sleeper": ["fsdp2-backward-prefetch-ineffective", "straggler"],
    "seq_length_skew": ["straggler"],
    "moe_routing_skew": ["straggler"],
    "mixer_hf_trainer": ["ddp-find-unused-unneeded"],
    "periodic_checkpoint": ["periodic-stall"],
    "periodic_eval": ["periodic-stall"],
    "periodic_checkpoint_short": ["periodic-stall"],
    "periodic_eval_all_ranks": ["periodic-stall"],
    # the workers' start at every epoch is data loading (persistent_workers), not a periodic stall
    "loader_epoch_restart": ["input-bound"],
    "wrap_fsdp2_root_only": ["fsdp-single-unit"],
    "wrap_fsdp1_no_policy": ["fsdp-single-unit"],
    "wrap_fsdp1_no_prefetch_slow_collate": ["fsdp1-no-backward-prefetch", "fsdp-forward-prefetch-off", "straggler",
                                            "input-bound"],
    "gcn_metric_sync_step": ["metric-sync"],
    "gcn_clip_fsdp1": ["fsdp-forward-prefetch-off"],
    "vit_fsdp2_bf16_ckpt": ["activation-recompute"],
    "gru_lm_amp_accum_sync_every": ["grad-accum-without-no-sync"],
    # the log's .item() after the loss all_reduce: a host sync, named (free on CPU); the all_reduce itself
    # is neither gradient sync nor a metric-sync finding
    "mlp_loss_allreduce": ["host-sync"],
    "mlp_compiled_loss_allreduce": ["host-sync"],
    "hsdp_token_skew": ["straggler"],
    "widedeep_lightning_sync_dist": ["metric-sync"],
    "widedeep_torchmetrics_compute": ["metric-sync"],
}
HEALTHY = ["fsdp1_backward_pre", "fsdp2_default", "ddp_default", "dataloader_fixed", "grad_accum_no_sync"]
HEALTHY_USER_JOBS = ["hf_ddp", "hf_fsdp2", "hf_accelerate", "cnn_ddp", "seq_ddp", "moe_balanced", "mixer_plain",
                     "mixer_lightning", "mixer_lbfgs", "syncbn_ddp", "wrap_fsdp2_per_block",
                     "gru_lm_amp_accum", "gru_lm_static_graph", "loader_epoch_persistent",
                     "hsdp_balanced", "widedeep_lightning_epoch", "unet_syncnorm_ddp"]
UNSYNCHRONIZED = {"hf_accelerate_unsynchronized", "cnn_no_process_group"}


def _group(scenario: dict) -> str:
    return "train" if scenario["script"] == "train.py" else "user"


def test_scenario_table():
    sc = load_scenarios()
    assert set(REQUIRED) <= set(sc)
    for name, s in sc.items():
        assert (s["wrap"] == "none") == (name in UNSYNCHRONIZED), name
        assert s["wrap"] in {"ddp", "fsdp1", "fsdp2", "none"}
        assert (REFERENCE / s["script"]).is_file(), name
        assert s["must"] == MUST.get(name, []), name
        assert not set(s["must"]) & set(s["must_not"]), name
        # every rule of a problem another scenario injects is forbidden here (the user-style jobs are
        # judged on the train.py problems too; train.py scenarios on theirs only)
        family = {r for n, o in sc.items() if _group(o) == _group(s) or _group(s) == "user" for r in MUST.get(n, [])}
        assert family - set(s["must"]) <= set(s["must_not"]), name
    for name in HEALTHY:
        assert sc[name]["params"]["host_sync"] is False and not sc[name]["params"]["delay_ms"]
        assert not sc[name]["params"]["item_sleep_ms"] or sc[name]["params"]["num_workers"] > 0
    for name in HEALTHY_USER_JOBS:
        p = sc[name]["params"]
        assert p["straggler"] == "none" and p["act_ckpt"] == "none" and not p["item_sleep_ms"], name
        assert p["length_skew"] == 1.0 and p["expert_skew"] == 1.0, name
        assert p["launch"] in {"torchrun", "accelerate"}, name


def test_reference_list(capsys):
    assert main(["reference", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["scenario", "wrap", "injects"]
    # a row starts at the left edge; what a scenario injects wraps onto indented lines below it
    rows = {line.split()[0]: line.split()[1] for line in out[2:] if line[:1].strip()}
    assert set(REQUIRED) <= set(rows)
    assert rows["fsdp2_default"] == "fsdp2" and rows["ddp_one_bucket"] == "ddp"


def test_reference_run_unknown_scenario(capsys):
    assert main(["reference", "run", "no_such_scenario", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1
    assert "unknown scenario 'no_such_scenario'" in err and "ddp_default" in err


def test_reference_dir_missing(monkeypatch, tmp_path):
    import fsdpdoctor
    from fsdpdoctor.errors import InputError

    monkeypatch.setattr(fsdpdoctor, "__file__", str(tmp_path / "pkg" / "fsdpdoctor" / "__init__.py"))
    with pytest.raises(InputError, match="needs the source checkout"):
        load_scenarios()


@pytest.mark.parametrize("argv", [["reference", "list"], ["reference", "run", "ddp_default", "--out", "x"]])
def test_reference_outside_a_checkout_says_so_in_one_line(monkeypatch, tmp_path, capsys, argv):
    """An installed package (site-packages, no reference_jobs/ beside it), run from another folder: one
    line that says the verb needs the source checkout, exit 2, nothing started."""
    import fsdpdoctor

    monkeypatch.setattr(fsdpdoctor, "__file__", str(tmp_path / "site-packages" / "fsdpdoctor" / "__init__.py"))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert error_lines(captured.err) == [
        "fsdpdoctor: error: `fsdpdoctor reference` needs the source checkout: its jobs (reference_jobs/) are not in "
        "an installed package; run it from a clone (pip install -e .)"]
    assert not (tmp_path / "x").exists()


def test_no_committed_copy_of_the_expectations(repo_root):
    """What a recording must and must not show is derived from the scenario tables
    (reference_jobs/expectations.py): a copy beside the traces would freeze the rule list, and a rule
    added as docs/adding-a-rule.md says would then fail against it."""
    copies = [p for p in (repo_root / "traces").rglob("*.json") if b'"must_not"' in p.read_bytes()[:100_000]]
    assert not copies, copies


def test_committed_traces(traces_dir):
    sc = load_scenarios()
    runs = list(sc) + ["scaling_1proc", "scaling_2proc"]
    total = 0
    for name in runs:
        folder = traces_dir / name
        m = json.loads((folder / "manifest.json").read_text())
        nproc = 1 if name == "scaling_1proc" else sc.get(name, {}).get("nproc", 2)
        assert m["world_size"] == nproc and m["profiled_ranks"] == list(range(nproc))
        base = name if name in sc else "ddp_default"
        assert m["scenario"]["name"] == base
        assert m["wrapping"]["kind"] == sc[base]["wrap"]
        assert (m["tokens_per_step"] or m["samples_per_step"]) and m["options"]["with_stack"] is True
        size = sum(f.stat().st_size for f in folder.iterdir())
        assert size < 2e6 * max(nproc, 2), (name, size)  # a few MB: few steps, small models, stacks on
        total += size
        unsynchronized = name in UNSYNCHRONIZED
        # ranks that never synchronise: no process group, or Accelerate's "undefined" one
        assert m["backend"] in ((None, "undefined") if unsynchronized else ("gloo",)), name
        for r in range(nproc):
            with gzip.open(folder / f"rank{r}.json.gz", "rb") as f:
                raw = f.read()  # scan the bytes: parsing ~200 MB of JSON is slow on CI
            if not unsynchronized:
                assert re.search(rb'"distributedInfo": \{"backend": "gloo", "rank": %d,' % r, raw), name
            steps = sorted({int(n) for n in re.findall(rb'"name": "ProfilerStep#(\d+)"', raw)})
            assert steps == m["profiled_steps"], name
    assert total < 3e6 * len(runs)


@requires_torch
@pytest.mark.slow
@pytest.mark.xdist_group("ddp_reference_run")
def test_reference_run_ddp(ddp_reference_run):
    # the job tests/test_scaling.py's end-to-end test measures too (one torchrun job for both: conftest)
    rc, out = ddp_reference_run
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["scenario"]["name"] == "ddp_default" and m["profiled_steps"] == [2, 3, 4]
    assert (out / "rank0.json.gz").is_file() and (out / "rank1.json.gz").is_file()


@requires_torch
@pytest.mark.slow
def test_reference_run_failure_is_one_line(tmp_path, capfd):
    # a negative wait makes the capture constructor raise in every rank
    rc = main(["reference", "run", "ddp_default", "--nproc", "1", "--out", str(tmp_path / "x"), "--wait", "-1"])
    assert rc == 1
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("fsdpdoctor: error: reference job ddp_default failed: torchrun exited with status")


@requires_torch
@pytest.mark.slow
def test_reference_run_never_synchronized_job(tmp_path):
    """cnn.py without init_process_group under torchrun: the capture still writes both ranks'
    traces and a manifest that says 2 processes and no backend; the traces hold no collective."""
    import importlib.util
    import subprocess
    import sys

    out = tmp_path / "run"
    for _attempt in range(2):
        rc = main(["reference", "run", "cnn_no_process_group", "--nproc", "2", "--out", str(out),
                   "--steps", "3", "--wait", "0", "--warmup", "1", "--active", "2"])
        if rc == 0:
            break
    assert rc == 0
    # capture also writes each rank's summary beside its trace, and every rank's step series in steps/
    assert sorted(p.name for p in out.iterdir() if ".summary.msgpack" not in p.name) == [
        "manifest.json", "rank0.json.gz", "rank1.json.gz", "steps"]
    from fsdpdoctor.capture.series import read_series

    for r in (0, 1):
        assert read_series(out / "steps" / f"rank{r}.steps").steps == [0, 1, 2]
    m = json.loads((out / "manifest.json").read_text())
    assert m["world_size"] == 2 and m["backend"] is None and m["wrapping"] == {"kind": "none"}
    assert m["profiled_ranks"] == [0, 1] and m["profiled_steps"] == [1, 2]
    spec = importlib.util.spec_from_file_location("verify_traces", REFERENCE / "verify_traces.py")
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    text, ok = verify.check_run(out)
    assert ok, text
    assert "communication events 0" in text
    # the analyzer takes the folder (its verdict is the diagnosis rules' business)
    proc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", str(out), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def qwen2_parameters(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int) -> int:
    """Parameters of an untied Qwen2 causal LM, from its architecture (q/k/v with bias, o without,
    gated MLP, two RMSNorms per layer and one at the end, input embedding and LM head)."""
    kv = hidden // heads * kv_heads
    per_layer = (hidden * hidden + hidden) + 2 * (hidden * kv + kv) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * per_layer + hidden


def test_user_job_manifests_describe_the_whole_model(traces_dir):
    """Every wrapping of the same Qwen2 decoder reports the same full parameter count (FSDP1 and
    FSDP2 unsharded), the optimizer under Accelerate's wrapper, and activation checkpointing."""
    sc = load_scenarios()
    hf = [n for n, s in sc.items() if s["script"] == "hf_decoder.py"]
    assert len(hf) >= 8
    src = (REFERENCE / "hf_decoder.py").read_text()
    sizes = {k: int(re.search(rf"{k}=(\d+)", src).group(1)) for k in
             ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")}
    vocab = int(re.search(r"SEQ, BATCH, VOCAB = \d+, \d+, (\d+)", src).group(1))
    want = qwen2_parameters(vocab, sizes["hidden_size"], sizes["intermediate_size"], sizes["num_hidden_layers"],
                            sizes["num_attention_heads"], sizes["num_key_value_heads"])
    for name in hf:
        m = json.loads((traces_dir / name / "manifest.json").read_text())
        assert m["model"]["parameters"] == want, (name, m["wrapping"]["kind"])
        assert m["model"]["param_bytes"] == 4 * want, name
        assert m["model"]["optimizer"] == "AdamW", name
        accelerate = sc[name]["params"]["launch"].startswith("accelerate")
        assert m["model"]["optimizer_wrappers"] == (["AcceleratedOptimizer"] if accelerate else []), name
        ckpt = sc[name]["params"]["act_ckpt"]
        ac = m["model"]["activation_checkpointing"]
        if ckpt == "none":
            assert ac is None, name
        else:
            assert ac["method"] == {"checkpoint_wrapper": "checkpoint_wrapper", "hf": "gradient_checkpointing"}[ckpt]
            assert ac["modules"] == sizes["num_hidden_layers"], name
