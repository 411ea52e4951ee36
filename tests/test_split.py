"""A large trace decoded in pieces (trace/split.py), in this process or in forked workers, reads
exactly as the whole file does, and anything the byte search cannot vouch for falls back to the
whole-file reading."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

import fsdpdoctor.engines.forking as forking
import fsdpdoctor.trace.split as split
from fsdpdoctor.engines import SerialEngine, make_engine
from fsdpdoctor.pipeline import open_analysis
from fsdpdoctor.trace.loader import load_file
from fsdpdoctor.trace.table import RankTrace
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
CUDA_FSDP2 = BUNDLED / "cuda" / "fsdp2_default" / "rank0.json.gz"   # 17 MB of JSON, 65 k events
CPU_RANK = BUNDLED / "straggler" / "rank1.json.gz"


def _same(a: RankTrace, b: RankTrace) -> None:
    assert a.names == b.names
    for col in ("name_id", "cat", "ts", "dur", "track", "corr"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert [(t.pid, t.tid, t.name, t.n_events, t.is_device) for t in a.tracks] == \
           [(t.pid, t.tid, t.name, t.n_events, t.is_device) for t in b.tracks]
    assert a.args == b.args
    assert a.memory_events == b.memory_events
    assert (a.rank, a.world_size, a.backend, a.host, a.device_name) == (b.rank, b.world_size, b.backend, b.host,
                                                                        b.device_name)
    assert a.quality == b.quality


@pytest.fixture
def split_small(monkeypatch):
    """Split files of any size (the bundled ones are below the production floors)."""
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(split, "PIECES_MIN_BYTES", 0)


REAL_OTHER_THREADS = forking.other_threads


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    """The pieces are tested here whatever else this test process holds (an OpenMP pool of an earlier
    torch test, OpenBLAS's thread): forking is taken to be safe, except in the tests of when it is."""
    monkeypatch.setattr(forking, "other_threads", lambda: 0)


def _whole(path: Path) -> RankTrace:
    """The reference: the file inflated and decoded whole, as below ``PIECES_MIN_BYTES`` and
    ``STREAM_MIN_BYTES``."""
    floors = split.PIECES_MIN_BYTES, split.STREAM_MIN_BYTES
    split.PIECES_MIN_BYTES = split.STREAM_MIN_BYTES = 1 << 62
    try:
        return load_file(path, 1)
    finally:
        split.PIECES_MIN_BYTES, split.STREAM_MIN_BYTES = floors


def _count_forks(monkeypatch) -> list:
    """Shares of the array decoded in this process as ``(begin, end)``, each followed by
    ``("pieces", n)`` when it was decoded in n small pieces, and ``"joined"`` once the shares'
    columns (this process's and the workers') were joined."""
    seen = []
    in_share = []
    real, real_join = split._piece_columns, split.join_columns

    def share(data, begin, end, columns, *rest):
        seen.append((begin, end))
        in_share.append(True)
        try:
            return real(data, begin, end, columns, *rest)
        finally:
            in_share.pop()

    def join(parts):
        seen.append(("pieces", len(parts)) if in_share else "joined")
        return real_join(parts)

    monkeypatch.setattr(split, "_piece_columns", share)
    monkeypatch.setattr(split, "join_columns", join)
    return seen


@pytest.mark.parametrize("path", [CUDA_FSDP2, CPU_RANK], ids=["cuda-fsdp2", "gloo-cpu"])
@pytest.mark.parametrize("pieces", [2, 3])
def test_pieces_read_exactly_as_the_whole_file(path, pieces, split_small, monkeypatch):
    whole = _whole(path)
    seen = _count_forks(monkeypatch)
    parts = load_file(path, pieces)
    shares = [x for x in seen if isinstance(x, tuple) and x[0] != "pieces"]
    assert len(shares) == 1 and seen[-1] == "joined"  # one share here, the others in forked workers
    _same(whole, parts)


@pytest.mark.parametrize("path", [CUDA_FSDP2, CPU_RANK], ids=["cuda-fsdp2", "gloo-cpu"])
def test_small_pieces_in_this_process_read_exactly_as_the_whole_file(path, monkeypatch):
    whole = _whole(path)
    monkeypatch.setattr(split, "PIECE_BYTES", 64 << 10)       # the CPU trace too is cut in several pieces
    monkeypatch.setattr(split, "PIECES_MIN_BYTES", 128 << 10)
    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 1 << 62)   # the JSON in memory (the stream: below)
    seen = _count_forks(monkeypatch)
    one_process = load_file(path, 1)
    assert len(seen) == 2 and seen[1][0] == "pieces" and seen[1][1] > 3   # one share, several pieces, no fork
    _same(whole, one_process)


def test_analysis_of_pieces_equals_the_whole(split_small, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json.gz").write_bytes(CUDA_FSDP2.read_bytes())
    a = open_analysis(run, use_summaries=False, workers=1)          # one core: whole file
    b = open_analysis(run, use_summaries=False, workers=2)          # one rank, two cores: pieces
    assert a.to_json() == b.to_json()


def test_one_rank_gets_the_cores_as_pieces(machine_cores):
    assert make_engine(None, None, 100 << 20, 1).pieces > 1 or machine_cores == 1
    assert make_engine(None, 1, 100 << 20, 1).pieces == 1          # --jobs 1: this process only
    assert make_engine(None, 3, 100 << 20, 1).pieces == 3
    assert isinstance(make_engine(None, 1, 100 << 20, 4), SerialEngine)


def _write(tmp_path: Path, doc: dict | list, name="rank0.json", text: str | None = None) -> Path:
    p = tmp_path / name
    p.write_text(text if text is not None else json.dumps(doc, indent=1))
    return p


def _events(n: int, args_of=lambda i: {}) -> list[dict]:
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    for i in range(n):
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1 + i % 2,
                   "ts": 1000.0 + 10 * i, "dur": 5.0, "args": args_of(i)})
        if i % 50 == 0:
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i // 50}", "pid": 1, "tid": 1,
                       "ts": 1000.0 + 10 * i, "dur": 500.0, "args": {}})
    return ev


def test_metadata_after_the_events_with_a_bracket_in_a_string(tmp_path, split_small):
    doc = {"schemaVersion": 1, "traceEvents": _events(400),
           "traceName": "/tmp/a]b.json", "deviceProperties": [{"name": "x]"}], "baseTimeNanoseconds": 5}
    p = _write(tmp_path, doc)
    data = p.read_bytes()
    start, end = split.events_span(data)
    assert data[start:start + 1] == b"[" and data[end:end + 1] == b"]"
    assert json.loads(data[start:end + 1]) == doc["traceEvents"]
    _same(_whole(p), load_file(p, 2))


def test_log_lines_after_the_events_do_not_hide_the_array_end(tmp_path, stream_small, monkeypatch):
    """HTA's traces end with an "INFO" array of profiler log lines, many holding a "]" (``...cpp:1058]``):
    the array's end is still found, so the file is read in pieces, streamed or not, not whole."""
    info = [f"W1127 CuptiActivityProfiler.cpp:{1000 + i}] line {i} [x]" for i in range(60)]
    doc = {"schemaVersion": 1, "traceEvents": _events(300), "INFO": info, "traceName": "t"}
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc, indent=1).encode()))
    data = gzip.decompress(p.read_bytes())
    start, end = split.events_span(data)
    assert json.loads(data[start:end + 1]) == doc["traceEvents"]
    got = []
    real = split._last_piece
    monkeypatch.setattr(split, "_last_piece", lambda *a, **k: got.append(real(*a, **k)) or got[-1])
    streamed = load_file(p, 1)
    assert got and got[0] is not None   # the stream read it: no second reading of the whole file
    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 1 << 62)
    _same(_whole(p), streamed)


def test_cut_inside_nested_objects_falls_back(tmp_path, split_small, monkeypatch):
    # every event's args hold a list of objects: the byte search may cut inside one; a cut piece is not
    # valid JSON on its own, and the file is then read whole with the same result
    doc = {"traceEvents": _events(300, lambda i: {"shapes": [{"a": k} for k in range(20)]})}
    p = _write(tmp_path, doc, text=json.dumps(doc, separators=(",", ":")))
    whole = _whole(p)
    seen = _count_forks(monkeypatch)
    for pieces in (2, 3, 5):
        _same(whole, load_file(p, pieces))
    assert seen.count("joined") < 3  # most "},{" here are inside args: some cut landed in one


def test_unreadable_events_in_a_later_piece_are_counted_as_in_the_whole(tmp_path, split_small, monkeypatch):
    ev = _events(400)
    ev[-10]["ts"] = "late"          # a text time: dropped and counted by the tolerant reading
    ev[-20]["dur"] = -5.0
    p = _write(tmp_path, {"traceEvents": ev})
    whole, parts = _whole(p), load_file(p, 2)
    assert whole.quality is not None and whole.quality.dropped >= 1
    _same(whole, parts)
    # and where every event is readable, the same file is read in pieces
    ev[-10]["ts"], ev[-20]["dur"] = 1.0e6, 5.0
    p = _write(tmp_path, {"traceEvents": ev}, name="clean.json")
    seen = _count_forks(monkeypatch)
    _same(_whole(p), load_file(p, 2))
    assert "joined" in seen


def test_a_worker_that_dies_or_hangs_leaves_the_whole_reading(tmp_path, split_small, monkeypatch):
    p = _write(tmp_path, {"traceEvents": _events(400)})
    whole = _whole(p)

    def die(*a):
        os._exit(3)

    monkeypatch.setattr(forking, "_share", die)
    _same(whole, load_file(p, 2))

    def hang(*a):
        import time
        time.sleep(60)

    monkeypatch.setattr(forking, "_share", hang)
    monkeypatch.setattr(forking, "_WORKER_MIN_WAIT_S", 0.5)
    _same(whole, load_file(p, 2))


def test_event_list_and_gzip_and_bom_inputs(tmp_path, split_small):
    ev = _events(300)
    lst = _write(tmp_path, ev, name="list.json")                       # a bare event list: read whole
    assert split.events_span(lst.read_bytes()) is None
    _same(_whole(lst), load_file(lst, 2))
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    _same(_whole(gz), load_file(gz, 2))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"traceEvents": ev}).encode())
    _same(_whole(bom), load_file(bom, 2))


@pytest.mark.parametrize("kind", ["thread", "daemon", "unlisted"])
def test_no_fork_beside_another_thread(tmp_path, split_small, monkeypatch, kind):
    """Any other thread, a daemon too (a progress bar's refresher holding a stream's lock) or one that
    ``threading`` does not list (started by C code: an OpenMP pool, a test runner's I/O thread), may
    hold a lock at the fork that the worker then waits on forever: the file is read in this process."""
    import _thread
    import threading

    monkeypatch.setattr(forking, "other_threads", REAL_OTHER_THREADS)
    p = _write(tmp_path, {"traceEvents": _events(300)})
    before = forking.other_threads()
    stop, done = threading.Event(), threading.Event()

    def run():
        stop.wait()
        done.set()

    if kind == "unlisted":
        _thread.start_new_thread(run, ())
    else:
        threading.Thread(target=run, daemon=kind == "daemon").start()
    monkeypatch.setattr(split, "PIECES_MIN_BYTES", 0)
    try:
        if Path("/proc/self/stat").exists() or kind != "unlisted":   # elsewhere only threading's are known
            assert forking.other_threads() == before + 1
            assert not forking.can_fork()
            seen = _count_forks(monkeypatch)
            _same(_whole(p), load_file(p, 2))
            shares = [x for x in seen if isinstance(x, tuple) and x[0] != "pieces"]
            assert len(shares) == 1 and "joined" not in seen  # the whole array in this process, no worker
    finally:
        stop.set()
        done.wait(10)


def test_pieces_read_any_events_as_the_whole_file_does(tmp_path, monkeypatch):
    """Generated events with odd phases, times, names and args, cut into pieces of a few events (of
    the JSON, and of its gzip copy inflated a piece at a time): the same tables, data-quality notes and
    errors as the whole-file reading."""
    from hypothesis import given, settings, strategies as st

    from fsdpdoctor.errors import InputError

    odd = st.sampled_from([None, 3, "t", [1], {"a": 1}, -1.0, 1e308, True])
    event = st.fixed_dictionaries(
        {"ph": st.sampled_from(["X", "X", "X", "M", "i", "s", "f"]),
         "ts": st.one_of(st.floats(0, 1e6), odd), "dur": st.one_of(st.floats(0, 100), odd),
         "pid": st.one_of(st.integers(0, 2), odd), "tid": st.integers(0, 2),
         "name": st.one_of(st.sampled_from(["ProfilerStep#1", "aten::mm", "c10d::allreduce_", "thread_name",
                                            "cudaLaunchKernel", "ncclKernel_AllReduce"]), odd),
         "cat": st.one_of(st.sampled_from(["cpu_op", "user_annotation", "kernel", "cuda_runtime"]), odd),
         "args": st.one_of(st.just({"name": "t", "correlation": 7}), st.just({"Collective name": "allreduce"}),
                           odd)})

    def tables(p):
        try:
            t = load_file(p, 1)
        except InputError as exc:
            return str(exc).replace(str(p), "<file>")
        quality = dataclasses.replace(t.quality, file="") if t.quality is not None else None
        return (t.names, t.ts.tolist(), t.dur.tolist(), t.track.tolist(), t.corr.tolist(), t.args, quality)

    @settings(max_examples=80, deadline=None)
    @given(st.lists(event, min_size=1, max_size=40))
    def check(events):
        text = json.dumps({"traceEvents": events, "deviceProperties": [{"name": "x"}]})
        p = tmp_path / "rank0.json"
        p.write_text(text)
        gz = tmp_path / "gz" / "rank0.json.gz"
        gz.parent.mkdir(exist_ok=True)
        gz.write_bytes(gzip.compress(text.encode()))
        for floor in ("PIECES_MIN_BYTES", "STREAM_MIN_BYTES"):
            monkeypatch.setattr(split, floor, 1 << 62)
        whole = tables(p)
        monkeypatch.setattr(split, "PIECE_BYTES", 300)  # a few events a piece
        monkeypatch.setattr(split, "_STREAM_CHUNK", 200)
        monkeypatch.setattr(split, "PIECES_MIN_BYTES", 0)
        assert tables(p) == whole
        monkeypatch.setattr(split, "STREAM_MIN_BYTES", 0)  # the gzip copy, inflated a piece at a time
        assert tables(gz) == whole

    check()


# ------------------------------------------------------------------ gzip inflated a piece at a time
@pytest.fixture
def stream_small(monkeypatch):
    """Stream files of any size, in pieces of a few events."""
    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(split, "PIECE_BYTES", 4 << 10)
    monkeypatch.setattr(split, "_STREAM_CHUNK", 3 << 10)


@pytest.mark.parametrize("path", [CUDA_FSDP2, CPU_RANK], ids=["cuda-fsdp2", "gloo-cpu"])
def test_streamed_gzip_reads_exactly_as_the_whole_file(path, stream_small, monkeypatch):
    whole = _whole(path)
    real, used = split.stream_columns, []
    monkeypatch.setattr(split, "stream_columns", lambda *a: used.append(real(*a)) or used[-1])
    _same(whole, load_file(path, 1))
    assert used and used[0] is not None  # it was read by the stream, not whole


@pytest.mark.parametrize("shape", ["two members", "bytes after the member", "truncated", "event list",
                                   "cuts inside args", "bracket in a string after the events", "no events key"])
def test_streamed_gzip_of_any_shape_reads_as_the_whole_file(tmp_path, stream_small, monkeypatch, shape):
    """A shape the stream cannot vouch for is read whole: the same tables, or the same error."""
    from fsdpdoctor.errors import InputError

    ev = _events(300, (lambda i: {"shapes": [{"a": k} for k in range(5)]}) if shape == "cuts inside args"
                 else (lambda i: {}))
    doc = {"traceEvents": ev, "traceName": "a]b}", "baseTimeNanoseconds": 1}
    body = json.dumps(ev if shape == "event list" else {"events": ev} if shape == "no events key" else doc,
                      separators=(",", ":") if shape == "cuts inside args" else (", ", ": ")).encode()
    data = gzip.compress(body)
    data = {"two members": data + gzip.compress(b" "), "bytes after the member": data + b"junk",
            "truncated": data[: len(data) // 2]}.get(shape, data)
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(data)

    def read(path):
        try:
            t = load_file(path, 1)
        except InputError as exc:
            return str(exc)
        return (t.names, t.ts.tolist(), t.dur.tolist(), t.track.tolist(), t.args, t.quality)

    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 1 << 62)
    whole = read(p)
    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 0)
    assert read(p) == whole


def test_streamed_gzip_with_a_frame_held_by_another_thread(stream_small, monkeypatch):
    """A profiler thread (Dask workers run one) may hold a reference to the decoding frame, and so
    to the view of the piece it decodes, while the stream's buffer is resized: the stream releases
    its views itself, and reads the file as the whole reading does."""
    import sys

    from fsdpdoctor.trace.columns import from_events as _columns_fast

    held = []

    def columns_while_sampled(events):
        held.append(sys._getframe(1))  # the frame of the piece's decode, kept alive as a sampler would
        return _columns_fast(events)

    whole = _whole(CPU_RANK)
    got = split.stream_columns(CPU_RANK.read_bytes(), CPU_RANK, columns_while_sampled)
    assert got is not None and len(held) > 3
    assert got[1][0] == whole.names and np.array_equal(got[1][3], whole.ts)
