"""Loading rank folders through the front door with their tables (as `export` does): parallel
reading gives the same tables, errors survive worker processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fsdpdoctor.errors import InputError
from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

TRACES = BUNDLED


def _tables_of(path, **kw):
    return open_analysis(path, tables=True, **kw)[1]


def test_parallel_load_matches_serial():
    a = _tables_of(TRACES / "fsdp2_default", workers=1)
    b = _tables_of(TRACES / "fsdp2_default", workers=2)
    assert [r.rank for r in a] == [r.rank for r in b] == [0, 1]
    for x, y in zip(a, b):
        assert x.names == y.names
        for col in ("name_id", "cat", "ts", "dur", "track", "corr"):
            assert np.array_equal(getattr(x, col), getattr(y, col)), col
        assert x.args.keys() == y.args.keys()


def test_error_in_worker_is_an_input_error(tmp_path):
    shutil.copy(TRACES / "ddp_default" / "rank0.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError, match="rank1.json.gz"):
        _tables_of(tmp_path, workers=2)


def test_rank_filter_skips_other_files():
    a, tables = open_analysis(TRACES / "straggler", ranks=[1], tables=True)
    assert [r.rank for r in tables] == [r.rank for r in a.ranks] == [1]
    with pytest.raises(InputError, match="no trace for rank"):
        _tables_of(TRACES / "straggler", ranks=[5])


def _split_by_step(src: Path, dst: Path, rank: int) -> None:
    """Write one rank's trace as two files (steps 2-3, steps 4-5), like two profiler cycles."""
    import gzip
    import json

    doc = json.loads(gzip.decompress(src.read_bytes()))
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                   if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
    cut = steps[2][0]
    for suffix, keep in (("", lambda e: e.get("ts", 0) < cut), (".cycle2", lambda e: e.get("ts", 0) >= cut)):
        part = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("ph") == "M" or keep(e)])
        (dst / f"rank{rank}{suffix}.json.gz").write_bytes(gzip.compress(json.dumps(part).encode(), 1))


def test_profiler_cycles_of_one_rank_are_merged(tmp_path):
    from fsdpdoctor.pipeline import open_analysis

    for r in (0, 1):
        _split_by_step(TRACES / "straggler" / f"rank{r}.json.gz", tmp_path, r)
    whole = open_analysis(TRACES / "straggler")
    split = open_analysis(tmp_path)
    assert split.job.steps == whole.job.steps == [2, 3, 4, 5]
    assert [r.rank for r in split.ranks] == [0, 1]
    assert len(split.collective_events) == len(whole.collective_events)
    assert {f.id for f in split.findings} == {f.id for f in whole.findings}


def test_same_rank_same_steps_is_an_error(tmp_path):
    """Two different recordings of rank 0 (same steps) are two jobs; an identical copy is the same one."""
    shutil.copy(TRACES / "ddp_default" / "rank0.json.gz", tmp_path / "rank0.json.gz")
    shutil.copy(TRACES / "ddp_find_unused" / "rank0.json.gz", tmp_path / "worker0.json.gz")
    with pytest.raises(InputError, match="appears twice"):
        _tables_of(tmp_path)
    shutil.copy(TRACES / "ddp_default" / "rank0.json.gz", tmp_path / "worker0.json.gz")
    a, tables = open_analysis(tmp_path, tables=True)
    assert [r.rank for r in tables] == [0] and "read once" in a.data_quality.notes[0]


# -- the tagged-union decode (phases the loader never reads are skipped unread) ----------------------

def _tables(path: Path, monkeypatch, generic: bool):
    import fsdpdoctor.trace.events as ev
    from fsdpdoctor.trace.loader import load_file

    if generic:  # what the loader read before the union: every event as the one ``Event`` struct
        monkeypatch.setattr(ev._doc_decoder, "tagged", ev._generic_doc_decoder)
        monkeypatch.setattr(ev._events_decoder, "tagged", ev._generic_events_decoder)
    t = load_file(path)
    monkeypatch.undo()
    return t


_BUNDLED = sorted(TRACES.glob("**/rank*.json.gz"))


@pytest.mark.parametrize("path", _BUNDLED[::4], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_tagged_decode_reads_what_the_generic_decode_reads(path, monkeypatch):
    a, b = _tables(path, monkeypatch, generic=True), _tables(path, monkeypatch, generic=False)
    assert a.names == b.names and a.args == b.args and a.memory_events == b.memory_events
    for col in ("name_id", "cat", "ts", "dur", "track", "corr"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert [(t.pid, t.tid, t.name) for t in a.tracks] == [(t.pid, t.tid, t.name) for t in b.tracks]


def test_tagged_decode_falls_back_on_odd_phases(tmp_path, monkeypatch):
    import json

    from hypothesis import given, settings, strategies as st

    phases = st.sampled_from(["X", "M", "i", "I", "s", "f", "C", "B", "Q", "x", "", None, 3, ["X"]])
    event = st.fixed_dictionaries(
        {"ts": st.one_of(st.floats(0, 1e6), st.just("t")), "dur": st.floats(0, 100), "pid": st.integers(0, 2),
         "tid": st.integers(0, 2), "name": st.sampled_from(["ProfilerStep#1", "aten::mm", "thread_name", None]),
         "cat": st.sampled_from(["cpu_op", "user_annotation", "kernel"]), "args": st.just({"name": "t"})},
        optional={"ph": phases})

    @settings(max_examples=60, deadline=None)
    @given(st.lists(event, min_size=1, max_size=30))
    def check(events):
        p = tmp_path / "rank0.json"
        p.write_text(json.dumps({"traceEvents": events}))
        got = []
        for generic in (True, False):
            try:
                t = _tables(p, monkeypatch, generic)
                got.append((t.names, t.ts.tolist(), t.dur.tolist(), t.track.tolist(), t.quality))
            except InputError as exc:
                got.append(str(exc))
        assert got[0] == got[1]

    check()


def test_allocator_samples_checked_as_defined(tmp_path):
    """The allocator samples ([memory] instants) kept and dropped, checked column by column, against
    the definition written per sample: a time a clock gives, numeric totals, integer device fields."""
    import json
    import math

    from hypothesis import given, settings, strategies as st

    from fsdpdoctor.trace.loader import allocator_samples, load_file
    from fsdpdoctor.trace.quality import MAX_CLOCK_US

    odd_values = [0, 7, -1, 2.5, 1e300, "12", "x", None, True, [1], {"a": 1}]
    odd = st.sampled_from(odd_values)
    # mostly usable values, so that one odd field decides whether a sample is kept
    sample = st.fixed_dictionaries(
        {"ph": st.sampled_from(["i", "I"]), "name": st.just("[memory]"),
         "ts": st.one_of(st.floats(0, 1e6), st.floats(0, 1e6), odd), "args": st.fixed_dictionaries(
             {"Total Allocated": st.one_of(st.integers(0, 2**40), st.integers(0, 2**40), odd)},
             optional={"Bytes": st.one_of(st.integers(-2**30, 2**30), odd), "Total Reserved": odd,
                       "Device Type": st.one_of(st.sampled_from([0, 1]), st.sampled_from([0, 1]), odd),
                       "Device Id": odd, "Addr": odd})})
    # enough complete events that a few dropped samples stay under the limit on dropped events
    ops = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10.0 * i, "dur": 5.0, "pid": 1, "tid": 1}
           for i in range(2000)]

    def number(v):
        # the definition over this test's values: a finite JSON number, or text that spells one ("12");
        # booleans, null, lists, objects and other text are not numbers
        if type(v) in (int, float):
            return float(v) if math.isfinite(v) else None
        return 12.0 if v == "12" else None

    def integer(v):
        return isinstance(v, int) and not isinstance(v, bool)

    def usable(e):
        a, ts = e["args"], number(e["ts"])
        return (ts is not None and 0 <= ts <= MAX_CLOCK_US and number(a["Total Allocated"]) is not None
                and integer(a.get("Device Type", 0)) and (a.get("Device Id", -1) is None or integer(a.get("Device Id", -1)))
                and not any(k in a and number(a[k]) is None for k in ("Bytes", "Total Reserved")))

    def check(samples, copies):
        p = tmp_path / "rank0.json"
        p.write_text(json.dumps({"traceEvents": ops * copies + samples}))
        t = load_file(p)
        is_sample = [e for e in samples if e["args"]["Total Allocated"] is not None]
        kept = [dict(e, ts=number(e["ts"])) for e in is_sample if usable(e)]
        assert allocator_samples(t) == kept
        assert t.quality.by_reason.get("allocator sample with bad fields", 0) == len(is_sample) - len(kept)

    # every odd value in every field, the others usable
    good = {"ph": "i", "name": "[memory]", "ts": 5.0, "args": {"Total Allocated": 512, "Bytes": 512,
                                                                 "Total Reserved": 2048, "Device Type": 1, "Device Id": 0}}
    edges = [good]
    for value in odd_values:
        edges.append(dict(good, ts=value))
        edges += [dict(good, args=dict(good["args"], **{k: value})) for k in good["args"]]
    check(edges, copies=4)  # enough events that the dropped ones stay under the limit
    settings(max_examples=80, deadline=None)(given(st.lists(sample, max_size=16), st.just(1))(check))()


@pytest.mark.parametrize("name", ["expected.json", "trainer_state.json"])
def test_a_json_document_that_is_not_a_trace_is_skipped_with_a_note(tmp_path, name):
    """Without a manifest to say which files are traces, a JSON object that never names traceEvents (a
    test's expectations, a trainer's state) is skipped by its content, whatever its name, and said; the
    analysis is the one of the traces alone."""
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        shutil.copy(TRACES / "ddp_one_bucket" / f"rank{rank}.json.gz", run / f"rank{rank}.json.gz")
    alone = open_analysis(run)
    (run / name).write_text('{"findings": ["host-sync"], "step_us": 5, "rank": 0}')
    a = open_analysis(run)
    assert f"{name} skipped: not a trace (a JSON object without traceEvents)" in a.data_quality.notes
    assert [r.rank for r in a.ranks] == [0, 1] and a.mean == alone.mean


def test_a_folder_of_one_json_that_is_not_a_trace_says_why(tmp_path):
    (tmp_path / "expected.json").write_text('{"findings": []}')
    with pytest.raises(InputError, match="expected.json: JSON is not a Chrome/Kineto trace"):
        open_analysis(tmp_path)
