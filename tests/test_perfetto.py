"""`fsdpdoctor export --perfetto`: the merged timeline follows the Trace Event Format
(what Perfetto's and chrome://tracing's JSON importers read)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from fsdpdoctor.cli import main

from trace_edit import rewrite_times

REQUIRED = {"X": {"name", "ts", "dur", "pid", "tid"}, "M": {"name", "pid", "args"},
            "s": {"name", "cat", "id", "ts", "pid", "tid"}, "f": {"name", "cat", "id", "ts", "pid", "tid"},
            "i": {"name", "ts", "pid", "tid"}}
METADATA = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}


def export(capsys, tmp_path, run, *extra) -> dict:
    out = tmp_path / "merged.json"
    assert main(["export", str(run), "--perfetto", str(out), "--no-progress", *extra]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def validate(doc: dict) -> list[dict]:
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    for e in ev:
        assert e["ph"] in REQUIRED, e
        assert REQUIRED[e["ph"]] <= set(e), e
        assert isinstance(e["pid"], int) and e["pid"] > 0
        if e["ph"] == "M":
            assert e["name"] in METADATA
        else:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    # slices on one track must nest (never partly overlap): what Perfetto needs to build its slice stacks
    tracks = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], e["ts"] + e["dur"]))
    for key, sl in tracks.items():
        stack: list[float] = []
        for ts, _, end in sorted(sl):
            while stack and stack[-1] <= ts + 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, (key, ts, end, stack[-1])
            stack.append(end)
    # flows pair up: one start and one finish per id, with the same name and category,
    # each bound to a slice on its track
    flows = defaultdict(list)
    for e in ev:
        if e["ph"] in "sf":
            flows[e["id"]].append(e)
    for fid, pair in flows.items():
        assert sorted(p["ph"] for p in pair) == ["f", "s"], fid
        s, f = sorted(pair, key=lambda p: p["ph"], reverse=True)
        assert s["name"] == f["name"] and s["cat"] == f["cat"]
        assert s["ts"] <= f["ts"]
        for p in pair:
            assert any(ts <= p["ts"] <= end for ts, _, end in tracks[(p["pid"], p["tid"])]), p
    return ev


def test_structure_ranks_flows_findings(capsys, tmp_path, traces_dir):
    doc = export(capsys, tmp_path, traces_dir / "straggler")
    ev = validate(doc)
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [1, 2] and names[1].startswith("rank 0") and names[2].startswith("rank 1")
    # every collective call of the run is on the timeline; matched calls are linked
    import fsdpdoctor

    a = fsdpdoctor.analyze(traces_dir / "straggler")
    colls = [e for e in ev if e.get("cat") == "collective"]
    assert len(colls) == len(a.collective_events)
    assert sum(1 for e in ev if e["ph"] == "s") == len(a.collective_events) // 2
    # each finding is a range with its title, severity and fix on the ranks and steps it concerns
    fr = [e for e in ev if e.get("cat") == "finding"]
    assert {e["args"]["id"] for e in fr} == {f.id for f in a.findings}
    for e in fr:
        f = next(f for f in a.findings if f.id == e["args"]["id"])
        assert e["name"] == f.title and e["args"]["severity"] == f.severity and e["args"]["fix"] == f.fix
    straggler = next(f for f in a.findings if f.id == "straggler")
    assert {e["pid"] - 1 for e in fr if e["args"]["id"] == "straggler"} == set(straggler.ranks)
    # the original events come along
    assert sum(1 for e in ev if e["ph"] == "X" and e.get("cat") not in ("step", "collective", "finding")) > 1000


def test_ranks_are_on_the_aligned_clock(capsys, tmp_path, traces_dir):
    shifted = rewrite_times(traces_dir / "straggler", tmp_path / "shifted", shift_us=5e6, ranks={1})
    a = validate(export(capsys, tmp_path, traces_dir / "straggler", "--no-ops"))
    b = validate(export(capsys, tmp_path, shifted, "--no-ops"))

    def step_starts(ev):
        return {(e["pid"], e["name"]): e["ts"] for e in ev if e.get("cat") == "step"}

    sa, sb = step_starts(a), step_starts(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        # the 5 s shift is gone: the same step starts where it did (up to the two offsets' difference)
        assert sb[k] == pytest.approx(sa[k], abs=1.0)


def test_export_of_a_saved_json(capsys, tmp_path, traces_dir):
    assert main(["analyze", str(traces_dir / "ddp_default"), "--json"]) == 0
    saved = tmp_path / "a.json"
    saved.write_text(capsys.readouterr().out)
    ev = validate(export(capsys, tmp_path, saved))
    assert any(e.get("cat") == "step" for e in ev)


def test_unwritable_output_is_input_error(capsys, tmp_path, traces_dir):
    rc = main(["export", str(traces_dir / "straggler"), "--perfetto", str(tmp_path / "no" / "x.json"),
               "--no-progress", "--no-ops"])
    assert rc == 2
