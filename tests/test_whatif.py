"""``fsdpdoctor whatif``: one model per fix with two callers (the rule and the verb), the world-size model, the
text at 80 columns, the JSON document and bad input (docs/whatif.md)."""

from __future__ import annotations

import json

import pytest
from bundled import TRACES
from conftest import error_lines
from shared_data import PUBLIC, needs_public
from synthetic import analysis, collectives

from fsdpdoctor.analysis.host import STARVED_WAIT, starved
from fsdpdoctor.cli import main
from fsdpdoctor.diagnose.whatif import Setting, what_if_fix, what_if_set
from fsdpdoctor.diagnose.worldsize import factor, predict_world_size, transfers
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.results import DataLoaderInfo, Signals

MS = 1e3


def _json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------ --fix: the finding's own number
@pytest.mark.parametrize("run, fid", [
    ("dataloader_slow", "input-bound"), ("grad_accum_sync_every", "grad-accum-without-no-sync"),
    ("straggler", "straggler"), ("ddp_tiny_buckets", "ddp-tiny-buckets"),
    ("ddp_find_unused", "ddp-find-unused-unneeded"), ("periodic_checkpoint", "periodic-stall"),
    ("fsdp1_no_backward_prefetch", "fsdp1-no-backward-prefetch"), ("gcn_zero", "latency-bound-collectives"),
])
def test_fix_is_the_findings_saving_and_interval(capsys, run, fid):
    """whatif --fix X says what analyze said about X: the same saving and interval, to the microsecond."""
    found = [f for f in _json(capsys, ["analyze", str(TRACES / run), "--no-progress"])["findings"]
             if f["id"] == fid and not f["caused_by"]]
    assert found, (run, fid)
    w = _json(capsys, ["whatif", str(TRACES / run), "--fix", fid, "--no-progress"])
    saving = sum(f["impact_us"] for f in found)
    assert w["change_us"] == pytest.approx(-saving, abs=1e-6)
    assert w["predicted_step_us"] == pytest.approx(w["step_us"] - saving, abs=1e-6)
    if found[0]["impact_interval_us"]:
        lo, hi = found[0]["impact_interval_us"]
        assert w["change_interval_us"] == pytest.approx([-hi, -lo], abs=1e-6)
    # the parts add up to the step, now and after
    assert sum(p["now_us"] for p in w["parts"]) == pytest.approx(w["step_us"], abs=1.0)
    assert sum(p["then_us"] for p in w["parts"]) == pytest.approx(w["predicted_step_us"], abs=1.0)


@pytest.mark.parametrize("run, setting, fid", [
    ("dataloader_slow", "num_workers=4", "input-bound"),            # the rule's fix: 4 workers per rank
    ("grad_accum_sync_every", "no_sync=true", "grad-accum-without-no-sync"),
    ("fsdp1_no_backward_prefetch", "backward_prefetch=BACKWARD_PRE", "fsdp1-no-backward-prefetch"),
    ("fsdp1_backward_post", "backward_prefetch=BackwardPrefetch.BACKWARD_PRE", "fsdp1-backward-post"),
    ("ddp_tiny_buckets", "bucket_cap_mb=25", "ddp-tiny-buckets"),   # its fix: buckets of the default size
    ("ddp_find_unused", "find_unused_parameters=False", "ddp-find-unused-unneeded"),
])
def test_set_calls_the_rules_model(run, setting, fid):
    """The setting the rule's fix names, asked through --set, gives the rule's saving: one model, two callers."""
    a = open_analysis(TRACES / run)
    f = next(f for f in a.findings if f.id == fid)
    name, _, value = setting.partition("=")
    w = what_if_set(a, Setting(name, value))
    assert w.withheld is None and w.finding == fid
    assert -w.change_us == pytest.approx(f.impact_us, abs=1e-6)
    assert (w.change_interval_us is None) == (f.impact_interval_us is None)
    if f.impact_interval_us:
        assert w.change_interval_us == pytest.approx([-f.impact_interval_us[1], -f.impact_interval_us[0]], abs=1e-6)


@pytest.mark.parametrize("run", ["dataloader_slow", "grad_accum_sync_every", "ddp_tiny_buckets", "ddp_find_unused",
                                 "fsdp1_no_backward_prefetch", "fsdp1_backward_post", "ddp_one_bucket"])
def test_a_findings_own_setting_gives_its_saving(run):
    """Each finding's fix as data (its settings: "loader.num_workers" = 4, "ddp.bucket_cap_mb" = None, ...), asked
    through --set by those names and values, predicts the finding's own saving."""
    a = open_analysis(TRACES / run)
    checked = 0
    for f in a.findings:
        for s in f.settings[:1]:
            w = what_if_set(a, Setting(s.name, str(s.value)))
            assert w.withheld is None and w.finding == f.id, (f.id, s.name, w.withheld)
            assert -w.change_us == pytest.approx(f.impact_us, abs=1e-6), (f.id, s.name)
            checked += 1
    assert checked


def test_fix_absent_or_unknown(capsys):
    w = _json(capsys, ["whatif", str(TRACES / "ddp_default"), "--fix", "straggler", "--no-progress"])
    assert w["change_us"] is None and "no straggler finding" in w["withheld"]
    with pytest.raises(Exception, match="unknown finding id"):
        what_if_fix(open_analysis(TRACES / "ddp_default"), "no-such-finding")


# ------------------------------------------------------------------ --set on runs whose answer is known by hand
def _loader_run(load_ms: float, sleep_ms: float, step_ms: float = 100.0, **kw):
    return analysis(step_ms=step_ms, data_loading_us=load_ms * MS, loader_sleep_us=sleep_ms * MS,
                    signals=Signals(dataloader=[DataLoaderInfo(rank=r, iterator="_SingleProcessDataLoaderIter",
                                                               calls_per_step=1, mean_call_us=load_ms * MS,
                                                               stall_frac=load_ms / step_ms,
                                                               exposed_frac=load_ms / step_ms) for r in range(2)]),
                    **kw)


def test_workers_by_hand():
    """80 ms of loading (all of it sleep) in a 100 ms step, ranks sharing the host's cores: workers hide the
    waiting, but K of them deliver a batch only every 80/K ms against the 20 ms left of the step."""
    a = _loader_run(80, 80)
    a.job.has_stacks = True
    one = what_if_set(a, Setting("num_workers", "1"))
    assert -one.change_us == pytest.approx(20 * MS)        # 80 hidden, less the wait 80/1 - 20 = 60
    two = what_if_set(a, Setting("num_workers", "2"))
    assert -two.change_us == pytest.approx(60 * MS)        # 80 - (40 - 20)
    four = what_if_set(a, Setting("num_workers", "4"))
    assert -four.change_us == pytest.approx(80 * MS)       # 20 per batch: they keep up
    assert what_if_set(a, Setting("num_workers", "0")).change_us == 0.0
    parts = {p.key: p for p in four.parts}
    assert parts["data_loading"].then_us == pytest.approx(0.0, abs=1e-6)


def test_workers_beyond_the_free_cores_do_not_help():
    """30 ms of loading, 10 of it sleep, 20 of computing: on a host with cores to spare the computing runs on
    at most the spare cores per rank, however many workers."""
    a = _loader_run(30, 10, step_ms=40)
    a.job.has_stacks = True
    a.job.manifest = {"hosts": {"0": "h", "1": "h"}, "host": {"cores": 3}}  # 1 spare core for 2 ranks
    w = what_if_set(a, Setting("num_workers", "8"))
    # every batch: max(30/8, 20/0.5) = 40 ms against the 10 ms left: the loop still waits 30 -> saves nothing
    assert w.change_us == pytest.approx(0.0)
    a.job.manifest["host"]["cores"] = 4                                      # 1 spare core per rank
    w = what_if_set(a, Setting("num_workers", "8"))
    assert -w.change_us == pytest.approx(20 * MS)         # max(30/8, 20/1) = 20 ms against 10 left: 30 - 10
    assert any("4 (manifest)" in s for s in w.assumptions)
    a.job.manifest["host"]["cores"] = 6                                      # 2 spare cores per rank
    w = what_if_set(a, Setting("num_workers", "8"))
    assert -w.change_us == pytest.approx(30 * MS)         # max(30/8, 20/2) = 10 ms: they keep up


@needs_public
def test_workers_on_the_public_resnet_pair():
    """The public ResNet-50 pair (one GPU, num_workers=0 and the same job with 4): the loader model's step
    with 4 workers against the step the second recording measured, within 15 %."""
    w = what_if_set(open_analysis(PUBLIC / "resnet50_loader_num_workers_0"), Setting("num_workers", "4"))
    measured = open_analysis(PUBLIC / "resnet50_loader_num_workers_4").mean.duration_us
    assert w.change_us < 0 and abs(w.predicted_step_us - measured) / measured < 0.15, (w.predicted_step_us, measured)


def test_no_collective_no_world_size():
    """A one-rank FSDP2 run holds no collective: what it would communicate at 64 ranks is not in it."""
    w = predict_world_size(open_analysis(TRACES / "cuda" / "fsdp2_default"), 64)
    assert w.change_us is None and "no collective" in w.withheld


def test_settings_without_a_model(capsys):
    a = open_analysis(TRACES / "ddp_default")
    w = what_if_set(a, Setting("learning_rate", "3e-4"))
    assert w.change_us is None and w.withheld.startswith("no model for learning_rate")
    w = what_if_set(open_analysis(TRACES / "dataloader_fixed"), Setting("num_workers", "8"))
    assert w.change_us is None and "worker processes already" in w.withheld
    tiny = open_analysis(TRACES / "ddp_tiny_buckets")
    w = what_if_set(tiny, Setting("bucket_cap_mb", "0.5"))
    assert w.change_us is None and "per backward pass" in w.withheld
    assert main(["whatif", str(TRACES / "ddp_default"), "--set", "lr=1", "--no-progress"]) == 0
    assert "no model for lr" in capsys.readouterr().out


def test_bucket_cap_passed_keeps_one_bucket():
    """bucket_cap_mb=25 passed caps the first bucket too: 3.7 MB of gradients stay in one bucket, so nothing
    can overlap; a cap of 1 MiB forms four buckets (and on these shared cores still saves nothing)."""
    a = open_analysis(TRACES / "ddp_one_bucket")
    w = what_if_set(a, Setting("bucket_cap_mb", "25"))
    assert w.change_us == 0.0 and any("1 bucket of" in s for s in w.assumptions)
    w = what_if_set(a, Setting("bucket_cap_mb", "1"))
    assert any("4 buckets of" in s for s in w.assumptions) and w.change_us == 0.0


# ------------------------------------------------------------------ --world-size
def test_factors():
    assert factor("all_reduce", 1) == 0.0
    assert factor("all_reduce", 2) == 1.0 and factor("all_reduce", 64) == pytest.approx(2 * 63 / 64)
    assert factor("all_gather", 4) == pytest.approx(0.75) and factor("reduce_scatter", 2) == 0.5
    assert factor("all_reduce", 64, tree=True) == 2.0


def test_world_size_by_hand():
    """2 ranks, 4 MB all-reduced per step in 10 ms (5 of them exposed): 4 MB x 1.0 / 10 ms = 0.4 GB/s. At 4
    ranks the ring moves 1.5x: 15 ms, 5 ms more, all exposed; with a stated 400 Gbit/s link at 64 ranks:
    2 x 63/64 x 4 MB / 50 GB/s = 0.1575 ms, 9.84 ms less, of which only the 5 exposed ms come off the step."""
    ar = collectives(2, 4, "all_reduce", "backward", dur_us=10 * MS, exposed_us=5 * MS, size_bytes=4_000_000)
    a = analysis(exposed_comm_us=5 * MS, collective_events=ar, traits=__import__("synthetic").GPU)
    for r in a.ranks:
        r.mean.comm_by_kind = {"all_reduce": __import__("fsdpdoctor.results", fromlist=["KindTime"]).KindTime(
            count=1, busy_us=10 * MS, exposed_us=5 * MS, overlapped_us=5 * MS, size_bytes=4_000_000)}
    (t,) = transfers(a)
    assert t.gbps == pytest.approx(0.4) and t.bytes_per_step == 4_000_000
    w = predict_world_size(a, 4)
    assert w.withheld is None
    assert w.change_us == pytest.approx(5 * MS) and w.predicted_step_us == pytest.approx(105 * MS)
    w = predict_world_size(a, 64, link_gbps=400)
    assert w.change_us == pytest.approx(-5 * MS)           # the exposed 5 ms go, no more
    assert any("0.2 ms per step at 64 ranks" in s for s in w.assumptions)


def _step(run: str) -> float:
    return open_analysis(TRACES / run).mean.duration_us


def test_world_size_on_the_bundled_scaling_pair():
    """1 -> 2 ranks of the bundled pair: the 1-rank run moves no bytes between ranks, so it says it cannot
    read a bandwidth; with the link figure the 2-rank run of the same host shows (its bus bandwidth) the
    predicted step is within 15 % of the measured one."""
    one = open_analysis(TRACES / "scaling_1proc")
    w = predict_world_size(one, 2, per_host=2, cores=2)
    assert w.change_us is None and "--link-gbps" in w.withheld
    (t,) = transfers(open_analysis(TRACES / "scaling_2proc"))
    w = predict_world_size(one, 2, link_gbps=t.gbps * 8, per_host=2, cores=2)
    measured = _step("scaling_2proc")
    assert abs(w.predicted_step_us - measured) / measured < 0.15, (w.predicted_step_us, measured)
    # and back: 2 -> 1 rank, the exposed all-reduce goes (the wait is kept as measured): within 15 % too
    w = predict_world_size(open_analysis(TRACES / "scaling_2proc"), 1)
    assert abs(w.predicted_step_us - _step("scaling_1proc")) / _step("scaling_1proc") < 0.15
    # without the host's cores the ranks added to its host cannot be told from ranks sharing cores
    w = predict_world_size(one, 2, link_gbps=t.gbps * 8, per_host=2)
    assert w.change_us is None and "--host-cores" in w.withheld


def test_world_size_withheld_where_ranks_share_cores_or_starved():
    """The weak-scaling runs recorded here carry the capture's schedstat reading: 2 cores, so 4 ranks on that
    host share cores (withheld, with the reason); their threads waited for a core most of the time they could
    run (the host was loaded), so a prediction from them is withheld as well."""
    two = open_analysis(TRACES / "weak_2rank")
    assert two.contention.cpus == 2
    w = predict_world_size(two, 4, per_host=4)
    assert w.change_us is None and "host of 2 cores" in w.withheld
    assert two.contention.wait_share > STARVED_WAIT
    w = predict_world_size(two, 8)
    assert w.change_us is None and "re-profile on an idle host" in w.withheld
    # a run recorded on a quiet host carries the same reading, and is not starved
    quiet = open_analysis(TRACES / "gru_lm_amp_accum")
    assert quiet.contention.wait_share < 0.1 and starved(quiet) is None


# ------------------------------------------------------------------ the verb
def test_text_json_and_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["whatif", str(TRACES / "dataloader_slow"), "--set", "num_workers=2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "data loading" in out and "step" in out and "interval" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    d = _json(capsys, ["whatif", str(TRACES / "scaling_2proc"), "--world-size", "64", "--link-gbps", "400",
                       "--no-progress"])
    assert d["schema_version"] and d["question"] == "--world-size 64"
    assert {p["key"] for p in d["parts"]} >= {"compute", "comm:all_reduce", "data_loading", "idle"}
    assert all(set(p) == {"key", "label", "now_us", "then_us", "change_us"} for p in d["parts"])


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("fsdpdoctor: error:"), err
    return err[0]


def test_bad_input(capsys):
    run = str(TRACES / "ddp_default")
    assert "NAME=VALUE" in _error(capsys, ["whatif", run, "--set", "num_workers"])
    assert "whole number" in _error(capsys, ["whatif", run, "--set", "num_workers=two"])
    assert "--world-size" in _error(capsys, ["whatif", run, "--world-size", "0"])
    assert "--world-size" in _error(capsys, ["whatif", run, "--world-size", "x"])
    assert "unknown finding id" in _error(capsys, ["whatif", run, "--fix", "no-such-id"])
    assert "go with --world-size" in _error(capsys, ["whatif", run, "--fix", "straggler", "--link-gbps", "4"])
    for argv in (["whatif", run], ["whatif", run, "--fix", "straggler", "--world-size", "4"]):
        with pytest.raises(SystemExit) as e:      # argparse: no question, or two
            main(argv)
        assert e.value.code == 2
        err = error_lines(capsys.readouterr().err)
        assert len(err) == 1 and "fsdpdoctor whatif: error:" in err[0]


def test_the_docs_example_is_the_verbs_output(capsys, monkeypatch):
    """docs/whatif.md's example: its table rows are what the verb prints on the bundled run (the interval
    line is left out of the comparison: how a finding's interval is computed may change)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "whatif.md").read_text()
    block = doc.split("$ fsdpdoctor whatif traces/dataloader_slow --set num_workers=2\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["whatif", str(TRACES / "dataloader_slow"), "--set", "num_workers=2", "--no-progress"]) == 0
    out = capsys.readouterr().out

    def rows(text: str) -> list[str]:
        return [" ".join(line.split()) for line in text.splitlines()
                if line.strip() and line.split()[0] in ("compute", "exposed", "waiting", "data", "idle", "step")]

    assert rows(block) and rows(block) == rows(out)


def test_world_size_from_a_saved_analysis(capsys, tmp_path):
    """A saved --json holds the per-call collectives only with --events: without them the verb says so. (On
    ddp_default: a saved scaling_2proc or ddp_one_bucket is refused on reopening since 1be5656, its straggler
    report holding a negative extra_each_us.)"""
    for events in ((), ("--events",)):
        assert main(["analyze", str(TRACES / "ddp_default"), "--json", "--no-progress", *events]) == 0
        saved = tmp_path / f"saved{len(events)}.json"
        saved.write_text(capsys.readouterr().out)
        w = _json(capsys, ["whatif", str(saved), "--world-size", "4"])
        direct = predict_world_size(open_analysis(TRACES / "ddp_default"), 4)
        if events:
            assert w["predicted_step_us"] == pytest.approx(direct.predicted_step_us, rel=1e-6)
        else:
            assert w["predicted_step_us"] is None and "--events" in w["withheld"]


def test_a_starved_window_gives_no_number(capsys):
    """Where the ranks waited for a CPU past the contention the predictions were calibrated for
    (prediction_wait_calibrated, set to 0.5 here: weak_1rank's threads waited 88 % of the window, weak_2rank's
    73 %), analyze gives no saving, and whatif neither for the finding nor for a setting: the same reason."""
    bar = ["--threshold", "prediction_wait_calibrated=0.5"]
    run = str(TRACES / "weak_1rank")
    d = _json(capsys, ["analyze", run, "--no-progress", *bar])
    f = next(f for f in d["findings"] if f["id"] == "wrapper-world-size-1")
    assert f["impact_withheld"]
    w = _json(capsys, ["whatif", run, "--fix", "wrapper-world-size-1", "--no-progress", *bar])
    assert w["change_us"] is None and w["withheld"] == f["impact_withheld"]
    w = what_if_set(open_analysis(TRACES / "weak_2rank", thresholds={"prediction_wait_calibrated": 0.5}),
                    Setting("num_workers", "2"), {"prediction_wait_calibrated": 0.5})
    assert w.change_us is None and "re-profile on an idle host" in w.withheld


def test_tree_where_the_trace_names_it():
    """An all-reduce whose recorded name says TREE costs 2 x size / bandwidth at any N > 1: from 2 ranks to 64
    its transfer stays 10 ms; the same calls without the name are a ring, 1 -> 2 x 63/64 of the size: 19.7 ms."""
    from dataclasses import replace

    from synthetic import GPU

    ring = collectives(2, 4, "all_reduce", "backward", dur_us=10 * MS, exposed_us=10 * MS, size_bytes=4_000_000)
    tree = [replace(c, raw_name="ncclKernel_AllReduce_TREE_LL_Sum_float") for c in ring]
    a = analysis(exposed_comm_us=10 * MS, collective_events=tree, traits=GPU)
    (t,) = transfers(a)
    assert t.tree and t.gbps == pytest.approx(0.8)          # 4 MB x 2 / 10 ms
    w = predict_world_size(a, 64)
    assert w.change_us == pytest.approx(0.0, abs=1e-6)
    assert not any("ring algorithm" in s for s in w.assumptions)
    w = predict_world_size(analysis(exposed_comm_us=10 * MS, collective_events=ring, traits=GPU), 64)
    assert w.change_us == pytest.approx(10 * MS * (2 * 63 / 64 - 1))
    assert any("ring algorithm" in s for s in w.assumptions)
