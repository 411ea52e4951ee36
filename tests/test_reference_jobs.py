"""Reference scenarios: the table, the committed traces, and `fsdpdoctor reference`."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from conftest import requires_torch
from fsdpdoctor.cli import main
from fsdpdoctor.commands.reference import load_scenarios

REQUIRED = [
    "fsdp1_backward_pre", "fsdp1_backward_post", "fsdp1_no_backward_prefetch", "fsdp1_forward_prefetch",
    "fsdp2_default", "fsdp2_no_backward_prefetch", "fsdp2_empty_prefetch_list",
    "ddp_default", "ddp_one_bucket", "ddp_tiny_buckets", "ddp_find_unused",
    "dataloader_slow", "dataloader_fixed", "straggler", "host_sync",
    "grad_accum_no_sync", "grad_accum_sync_every",
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
}
HEALTHY = ["fsdp1_backward_pre", "fsdp2_default", "ddp_default", "dataloader_fixed", "grad_accum_no_sync"]


def test_scenario_table():
    sc = load_scenarios()
    assert set(REQUIRED) <= set(sc)
    all_must = {r for rules in MUST.values() for r in rules}
    for name, s in sc.items():
        assert s["wrap"] in {"ddp", "fsdp1", "fsdp2"}
        assert s["must"] == MUST.get(name, []), name
        assert not set(s["must"]) & set(s["must_not"]), name
        # every rule of a problem the scenario does not contain is forbidden
        assert all_must - set(s["must"]) <= set(s["must_not"]), name
    for name in HEALTHY:
        assert sc[name]["params"]["host_sync"] is False and not sc[name]["params"]["delay_ms"]
        assert not sc[name]["params"]["item_sleep_ms"] or sc[name]["params"]["num_workers"] > 0


def test_reference_list(capsys):
    assert main(["reference", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["scenario", "wrap", "injects"]
    rows = {line.split()[0]: line.split()[1] for line in out[1:]}
    assert set(REQUIRED) <= set(rows)
    assert rows["fsdp2_default"] == "fsdp2" and rows["ddp_one_bucket"] == "ddp"


def test_reference_run_unknown_scenario(capsys):
    assert main(["reference", "run", "no_such_scenario", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "unknown scenario 'no_such_scenario'" in err and "ddp_default" in err


def test_reference_dir_missing(monkeypatch, tmp_path):
    import fsdpdoctor
    from fsdpdoctor.errors import InputError

    monkeypatch.setattr(fsdpdoctor, "__file__", str(tmp_path / "pkg" / "fsdpdoctor" / "__init__.py"))
    with pytest.raises(InputError, match="reference jobs not found"):
        load_scenarios()


def test_committed_traces(traces_dir):
    sc = load_scenarios()
    runs = list(sc) + ["scaling_1proc", "scaling_2proc"]
    total = 0
    for name in runs:
        folder = traces_dir / name
        m = json.loads((folder / "manifest.json").read_text())
        exp = json.loads((folder / "expected.json").read_text())
        nproc = 1 if name == "scaling_1proc" else 2
        assert m["world_size"] == nproc and m["profiled_ranks"] == list(range(nproc))
        base = name if name in sc else "ddp_default"
        assert m["scenario"]["name"] == base
        assert m["wrapping"]["kind"] == sc[base]["wrap"]
        assert exp["scenario"] == name
        assert exp["must"] == sc[base]["must"] and exp["must_not"] == sc[base]["must_not"]
        assert m["tokens_per_step"] and m["options"]["with_stack"] is True
        size = sum(f.stat().st_size for f in folder.iterdir())
        assert size < 3.2e6, (name, size)
        total += size
        for r in range(nproc):
            with gzip.open(folder / f"rank{r}.json.gz", "rb") as f:
                raw = f.read()  # scan the bytes: parsing ~200 MB of JSON is slow on CI
            assert re.search(rb'"distributedInfo": \{"backend": "gloo", "rank": %d,' % r, raw), name
            steps = sorted({int(n) for n in re.findall(rb'"name": "ProfilerStep#(\d+)"', raw)})
            assert steps == m["profiled_steps"], name
    assert total < 40e6


@requires_torch
@pytest.mark.slow
def test_reference_run_ddp(tmp_path, capsys):
    out = tmp_path / "run"
    for _attempt in range(2):  # gloo jobs occasionally abort at exit (see test_capture.torchrun)
        rc = main(["reference", "run", "ddp_default", "--nproc", "2", "--out", str(out),
                   "--steps", "3", "--wait", "0", "--warmup", "1", "--active", "1"])
        if rc == 0:
            break
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["scenario"]["name"] == "ddp_default" and m["profiled_steps"] == [1]
    assert (out / "rank0.json.gz").is_file() and (out / "rank1.json.gz").is_file()


@requires_torch
@pytest.mark.slow
def test_reference_run_failure_is_one_line(tmp_path, capfd):
    # a negative wait makes the capture constructor raise in every rank
    rc = main(["reference", "run", "ddp_default", "--nproc", "1", "--out", str(tmp_path / "x"), "--wait", "-1"])
    assert rc == 1
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("fsdpdoctor: error: reference job ddp_default failed: torchrun exited with status")
