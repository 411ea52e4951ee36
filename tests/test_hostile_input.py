"""Hostile input, case by case: never a crash (exit 3) and never a confident number from a bad value.

Each case mutates a real bundled run (2-rank DDP on gloo) the way a damaged file or a hostile tester
would, and checks what the user sees: exit 2 with one line naming the problem, or a report whose
figures leave the bad events out and say so in ``data_quality``.
"""

from __future__ import annotations

import gzip
import json
import marshal
import os
import shutil
from pathlib import Path

import pytest

from fsdpdoctor.cli import main
from shared_data import PUBLIC
from bundled import TRACES  # the committed traces, in a pristine copy
from conftest import error_lines

DDP = TRACES / "ddp_default"

pytestmark = pytest.mark.skipif(not (DDP / "rank0.json.gz").exists(), reason="bundled traces not present")


_PARSED: dict[tuple[Path, int], bytes] = {}


def load(scenario: Path, rank: int) -> dict:
    """A fresh copy of a bundled rank's document, for the test to change. Parsed once per process and
    kept marshalled: ``marshal.loads`` builds the same tree in about half the CPU of ``json.loads``
    (112 loads of traces/ddp_default's 4.8 MB documents in this file)."""
    key = (scenario, rank)
    if key not in _PARSED:
        _PARSED[key] = marshal.dumps(json.loads(gzip.decompress((scenario / f"rank{rank}.json.gz").read_bytes())))
    return marshal.loads(_PARSED[key])


def write_run(folder: Path, docs: list[dict], manifest: dict | str | None = "copy", names=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, doc in enumerate(docs):
        (folder / (names[r] if names else f"rank{r}.json")).write_text(json.dumps(doc))
    if manifest == "copy":
        shutil.copy(DDP / "manifest.json", folder / "manifest.json")
    elif isinstance(manifest, dict):
        (folder / "manifest.json").write_text(json.dumps(manifest))
    elif isinstance(manifest, str):
        (folder / "manifest.json").write_text(manifest)
    return folder


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        assert len(error_lines(err)) == 1, err
    return rc, out, err


def analyze_json(capsys, path: Path) -> dict:
    rc, out, err = cli(capsys, "analyze", "--json", "--no-progress", str(path))
    assert rc == 0, err
    return json.loads(out)


def events_named(doc: dict, prefix: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(prefix)]


def mutate_both(fn) -> list[dict]:
    docs = [load(DDP, 0), load(DDP, 1)]
    for d in docs:
        fn(d)
    return docs


def step_ms(report: dict) -> list[float]:
    return [s["duration_us"] / 1e3 for r in report["ranks"] for s in r["steps"]]


# ---------------------------------------------------------------- event fields

def test_negative_dur_on_communication_is_refused(tmp_path, capsys):
    """The issue's case: negative gloo spans gave 'step time -61.4 ms' and a false ddp-single-bucket."""
    def neg(d):
        for e in events_named(d, "gloo:"):
            e["dur"] = -e["dur"]
    run = write_run(tmp_path / "run", mutate_both(neg))
    for verb in ("analyze", "check"):
        rc, _, err = cli(capsys, verb, "--no-progress", str(run))
        assert rc == 2 and "negative time or duration" in err, err


def test_negative_dur_on_one_op_is_dropped_and_counted(tmp_path, capsys):
    clean = analyze_json(capsys, DDP)

    def neg(d):
        e = events_named(d, "aten::")[10]
        e["dur"] = -abs(e["dur"]) - 1.0
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(neg)))
    dq = report["data_quality"]
    assert dq["dropped_events"] == 2
    assert all(q["by_reason"] == {"negative time or duration": 1} for q in dq["ranks"])
    assert step_ms(report) == step_ms(clean)  # the step windows did not move
    assert all(v > 0 for v in step_ms(report))


def test_dur_1e40_drops_that_step(tmp_path, capsys):
    """dur = 1e40 gave a step of 3.3e36 ms: the step is left out, with a note."""
    def huge(d):
        events_named(d, "ProfilerStep#3")[0]["dur"] = 1e40
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(huge)))
    assert 3 not in report["job"]["steps"] and report["job"]["steps"]
    assert max(step_ms(report)) < 1e4
    assert all(q["by_reason"] == {"time beyond any clock": 1} for q in report["data_quality"]["ranks"])


def test_ts_far_outside_the_recording_is_dropped(tmp_path, capsys):
    """A start an hour after the rest of a 60 ms recording is no clock reading of that recording."""
    clean = analyze_json(capsys, DDP)

    def far(d):
        events_named(d, "aten::")[7]["ts"] += 3.6e9
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(far)))
    assert all(q["by_reason"] == {"outside the recording by more than 10x its length": 1}
               for q in report["data_quality"]["ranks"])
    assert step_ms(report) == step_ms(clean)


def test_step_numbers_out_of_order_are_dropped(tmp_path, capsys):
    def swap(d):
        events_named(d, "ProfilerStep#4")[0]["name"] = "ProfilerStep#1"
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(swap)))
    assert report["job"]["steps"] == [2, 3]
    assert "profiler step out of order or repeated" in report["data_quality"]["ranks"][0]["by_reason"]


def test_step_overlapping_the_next_is_dropped(tmp_path, capsys):
    def stretch(d):
        e = events_named(d, "ProfilerStep#2")[0]
        e["dur"] *= 3  # reaches over step 3
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(stretch)))
    assert 2 not in report["job"]["steps"]
    assert "profiler step overlaps the next step" in report["data_quality"]["ranks"][0]["by_reason"]


@pytest.mark.parametrize("field", ["ts", "ph"])
def test_missing_ts_or_ph_on_communication_is_refused(tmp_path, capsys, field):
    """Events missing ts/ph gave 0.0 ms of communication and a false warning."""
    def drop(d):
        for e in events_named(d, "gloo:"):
            del e[field]
    rc, _, err = cli(capsys, "check", "--no-progress", str(write_run(tmp_path / "run", mutate_both(drop))))
    assert rc == 2 and f"missing {field}" in err, err


def test_missing_ts_on_one_op_is_counted(tmp_path, capsys):
    def drop(d):
        del events_named(d, "aten::")[3]["ts"]
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(drop)))
    assert all(q["by_reason"] == {"missing ts": 1} and q["unlocated"] == 1 for q in report["data_quality"]["ranks"])


def test_null_names_are_refused_when_they_hide_communication(tmp_path, capsys):
    def null(d):
        for e in events_named(d, "gloo:"):
            e["name"] = None
    rc, _, err = cli(capsys, "check", "--no-progress", str(write_run(tmp_path / "run", mutate_both(null))))
    assert rc == 2 and "null name" in err, err


@pytest.mark.parametrize("name", [None, 7, ["a"], {"x": 1}])
def test_one_bad_name_is_dropped_and_counted(tmp_path, capsys, name):
    """An unnamed event with a known time is bounded by its share of the step: dropped and counted."""
    def bad(d):
        events_named(d, "aten::")[5]["name"] = name
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(bad)))
    q = report["data_quality"]["ranks"][0]
    assert q["dropped"] == 1 and q["by_kind"] == {"unnamed": 1} and q["dropped_unnamed"] == 1
    assert 0 < q["step_share_covered"] < 0.01


def test_deep_nesting_inside_args(tmp_path, capsys):
    """Deep nesting inside args was an internal error (RecursionError)."""
    deep = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    doc = load(DDP, 0)
    e = events_named(doc, "gloo:")[0]
    e["args"] = "DEEP"
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc).replace('"DEEP"', deep))
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(p))
    assert rc == 2 and "nested too deeply" in err


def test_moderately_nested_args_are_read(tmp_path, capsys):
    doc = load(DDP, 0)
    v: object = 1
    for _ in range(50):
        v = {"a": [v]}
    events_named(doc, "aten::")[0]["args"] = v
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    rc, _, _ = cli(capsys, "analyze", "--json", "--no-progress", str(p))
    assert rc == 0


@pytest.mark.parametrize("args", [[1, 2], "text", 5])
def test_non_object_args_on_a_read_event_are_dropped(tmp_path, capsys, args):
    def bad(d):
        events_named(d, "c10d::")[0]["args"] = args
    run = write_run(tmp_path / "run", mutate_both(bad))
    rc, out, err = cli(capsys, "check", "--json", "--no-progress", str(run))
    # a communication op lost: refused (one of ~12 per rank is more than the 1 % limit)
    assert rc == 2 and "args not an object" in err, err


# ---------------------------------------------------------------- document fields

@pytest.mark.parametrize("backend", [["gloo"], 5, {"a": 1}, True])
def test_non_string_backend(tmp_path, capsys, backend):
    """A distributedInfo.backend that is not a string was an internal error."""
    def bad(d):
        d["distributedInfo"]["backend"] = backend
    report = analyze_json(capsys, write_run(tmp_path / "run", mutate_both(bad)))
    assert report["job"]["backend"] == "gloo"  # from the manifest
    assert any("distributedInfo.backend" in n for q in report["data_quality"]["ranks"] for n in q["notes"])


@pytest.mark.parametrize("field,value", [("rank", "0"), ("rank", -1), ("rank", True), ("world_size", "2"),
                                         ("world_size", 0), ("pg_config", "x"), ("rank", 2 ** 40)])
def test_bad_distributed_info_fields(tmp_path, capsys, field, value):
    def bad(d):
        d["distributedInfo"][field] = value
    rc, out, err = cli(capsys, "analyze", "--json", "--no-progress",
                       str(write_run(tmp_path / "run", mutate_both(bad))))
    assert rc in (0, 2)
    if rc == 0:
        assert any(f"distributedInfo.{field}" in n for q in json.loads(out)["data_quality"]["ranks"] for n in q["notes"])


# ---------------------------------------------------------------- manifest

BAD_MANIFESTS = {
    "world_size text": {"world_size": "two"},
    "hosts list": {"hosts": ["vm", "vm"]},
    "wrapping list": {"wrapping": ["ddp"]},
    "bucket text": {"wrapping": {"kind": "ddp", "bucket_cap_mb": "25"}},
    "model text": {"model": "big"},
    "param_dtype number": {"model": {"parameters": 10, "param_dtype": 4}},
    "tokens negative": {"tokens_per_step": -5},
    "files list": {"files": ["rank0.json"]},
    "kind unknown": {"wrapping": {"kind": "zero9"}},
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_types_fall_back_to_the_trace(tmp_path, capsys, case):
    manifest = json.loads((DDP / "manifest.json").read_text()) | BAD_MANIFESTS[case]
    run = write_run(tmp_path / "run", [load(DDP, 0), load(DDP, 1)], manifest)
    report = analyze_json(capsys, run)
    assert report["data_quality"]["manifest"], case
    assert report["job"]["world_size"] == 2
    for verb in (["check"], ["memory"], ["scaling", str(DDP)]):
        rc, _, err = cli(capsys, *verb, str(run))
        assert rc in (0, 1, 2), (verb, rc, err)


@pytest.mark.parametrize("text", ["{", "[1]", "", '{"world_size": 2}', "\ufeff{]", "[" * 50_000 + "]" * 50_000,
                                  '{"fsdpdoctor_manifest": 1, "world_size": NaN}'])
def test_unreadable_manifest_is_ignored_with_a_note(tmp_path, capsys, text):
    run = write_run(tmp_path / "run", [load(DDP, 0), load(DDP, 1)], text)
    report = analyze_json(capsys, run)
    assert report["data_quality"]["manifest"] and report["job"]["wrapping_source"] == "trace"
    rc, _, err = cli(capsys, "memory", str(run))
    assert rc == 2 and "manifest.json" in err


def test_manifest_of_another_job_is_ignored(tmp_path, capsys):
    manifest = json.loads((DDP / "manifest.json").read_text()) | {"world_size": 8}
    report = analyze_json(capsys, write_run(tmp_path / "run", [load(DDP, 0), load(DDP, 1)], manifest))
    assert report["job"]["world_size"] == 2 and "another job" in report["data_quality"]["manifest"][0]


# ---------------------------------------------------------------- files and messages

def test_utf8_bom_is_read(tmp_path, capsys):
    p = tmp_path / "rank0.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(load(DDP, 0)).encode())
    assert analyze_json(capsys, p)["ranks"][0]["rank"] == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_not_called_truncated(tmp_path, capsys, literal):
    p = tmp_path / "rank0.json"
    text = json.dumps(load(DDP, 0))
    p.write_text(text.replace('"dur": ', f'"dur": {literal}, "x": ', 1))
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(p))
    assert rc == 2 and "NaN or Infinity" in err and "truncated" not in err, err


def test_truncated_is_still_called_truncated(tmp_path, capsys):
    p = tmp_path / "rank0.json"
    text = json.dumps(load(DDP, 0))
    p.write_text(text[: len(text) // 2])
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(p))
    assert rc == 2 and "truncated" in err


@pytest.mark.skipif(os.name != "posix", reason="symbolic links")
def test_symlink_loop(tmp_path, capsys):
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop.json")
    for verb in ("analyze", "check", "tui"):
        rc, _, err = cli(capsys, verb, "--no-progress", str(loop))
        assert rc == 2 and "symbolic link loop" in err and "no such file" not in err, err
    # inside a run folder: named in the data-quality notes, the other ranks analysed
    run = write_run(tmp_path / "run", [load(DDP, 0)], manifest=None)
    (run / "rank1.json").symlink_to(run / "rank1.json")
    report = analyze_json(capsys, run)
    assert any("rank1.json" in n and "symbolic link loop" in n for n in report["data_quality"]["notes"])


def test_directory_named_like_a_trace_is_not_skipped_silently(tmp_path, capsys):
    run = write_run(tmp_path / "run", [load(DDP, 0), load(DDP, 1)], names=["rank0.json", "rank1.json"])
    shutil.move(run / "rank1.json", tmp_path / "r1.json")
    (run / "rank1.json").mkdir()
    report = analyze_json(capsys, run)
    assert any("rank1.json" in n and "directory" in n for n in report["data_quality"]["notes"])
    (run / "rank0.json").unlink()
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(run))
    assert rc == 2 and "rank1.json" in err and "directory" in err


# ---------------------------------------------------------------- job identity

def test_two_jobs_in_one_folder(tmp_path, capsys):
    """rank 0 of one run and rank 1 of another (same world size, backend and host) are not one job."""
    other = TRACES / "ddp_find_unused"
    run = write_run(tmp_path / "run", [load(DDP, 0), load(other, 1)], manifest=None)
    for verb in ("analyze", "check"):
        rc, _, err = cli(capsys, verb, "--no-progress", str(run))
        assert rc == 2 and "do not belong together" in err and "apart" in err, err


def test_different_default_process_groups(tmp_path, capsys):
    docs = [load(DDP, 0), load(DDP, 1)]
    docs[1]["distributedInfo"]["pg_config"][0]["ranks"] = [1, 0]
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(write_run(tmp_path / "run", docs)))
    assert rc == 2 and "process groups" in err


def test_duplicate_rank_with_different_content(tmp_path, capsys):
    run = write_run(tmp_path / "run", [load(DDP, 0), load(TRACES / "ddp_find_unused", 0)], manifest=None,
                    names=["a.json", "b.json"])
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(run))
    assert rc == 2 and "rank 0" in err


def test_identical_copy_is_read_once(tmp_path, capsys):
    run = write_run(tmp_path / "run", [load(DDP, 0), load(DDP, 1), load(DDP, 1)],
                    names=["rank0.json", "rank1.json", "rank1.copy.json"])
    report = analyze_json(capsys, run)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert any("same trace" in n for n in report["data_quality"]["notes"])


def _single_process(doc: dict, pid_offset: int, step_offset: int) -> dict:
    doc = dict(doc)
    doc.pop("distributedInfo", None)
    evs = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if isinstance(e.get("pid"), int):
            e["pid"] += pid_offset
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + step_offset}"
        evs.append(e)
    doc["traceEvents"] = evs
    return doc


def test_two_single_process_recordings_are_not_merged(tmp_path, capsys):
    """Two worker0 files of different runs (different processes, disjoint steps) were joined into one rank."""
    one = TRACES / "scaling_1proc"
    run = write_run(tmp_path / "run", [_single_process(load(one, 0), 0, 0), _single_process(load(one, 0), 7, 10)],
                    manifest=None, names=["worker0.a.json", "worker0.b.json"])
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(run))
    assert rc == 2 and "two different recordings" in err, err


def test_profiler_cycles_of_one_process_are_still_joined(tmp_path, capsys):
    """The same process's later cycle (same pids, later steps) is joined, without a manifest too."""
    doc = load(TRACES / "scaling_1proc", 0)
    steps = events_named(doc, "ProfilerStep#")
    cut = sorted(e["ts"] for e in steps)[1]
    first = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) < cut])
    second = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) >= cut])
    run = write_run(tmp_path / "run", [first, second], manifest=None, names=["rank0.json", "rank0.cycle2.json"])
    report = analyze_json(capsys, run)
    assert len(report["ranks"]) == 1 and len(report["ranks"][0]["steps"]) == len(steps)


@pytest.mark.skipif(PUBLIC is None, reason="public traces not present")
def test_two_public_single_gpu_recordings_in_one_folder(tmp_path, capsys):
    for i, name in enumerate(("resnet50_loader_num_workers_0", "resnet50_loader_num_workers_4")):
        src = next((PUBLIC / name).glob("*.json.gz"))
        (tmp_path / f"worker0.run{i}.pt.trace.json.gz").write_bytes(src.read_bytes())
    rc, _, err = cli(capsys, "analyze", "--no-progress", str(tmp_path))
    assert rc == 2 and "two different recordings" in err, err


def test_every_bundled_run_loads_clean(capsys):
    """No bundled recording has anything dropped: the checks do not fire on real traces."""
    for run in sorted(p for p in TRACES.iterdir() if (p / "rank0.json.gz").exists())[:6]:
        assert analyze_json(capsys, run)["data_quality"] == {"dropped_events": 0, "ranks": [], "manifest": [],
                                                             "notes": [], "sources": []}, run.name
