"""Bad inputs: exit code 2, exactly one line on stderr naming the file, no traceback, input untouched."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", "--no-progress", *args],
                          capture_output=True, text=True, timeout=120)


def assert_input_error(target: Path, named: str | None = None) -> None:
    """Run analyze on ``target``; check the error contract and that every file under it is unchanged."""
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file()) if target.exists() else []
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    for extra in ([], ["--json"]):
        proc = run_cli(str(target), *extra)
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        assert (named or target.name) in lines[0], lines[0]
        assert proc.stdout == ""
    for p, (data, mtime) in before.items():
        assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime, f"{p} was modified"


def small_trace(rank: int, world: int) -> dict:
    return {"distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl"},
            "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                             "ts": 0.0, "dur": 100.0},
                            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0}]}


def write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_missing_file(tmp_path):
    assert_input_error(tmp_path / "nope.json.gz")


def test_directory_without_traces(tmp_path):
    d = tmp_path / "empty_run"
    d.mkdir()
    (d / "notes.txt").write_text("no traces here")
    assert_input_error(d)


def test_truncated_gz(tmp_path):
    good = gzip.compress(json.dumps(small_trace(0, 1) | {"pad": "x" * 20000}).encode())
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(good[: len(good) // 2])
    assert_input_error(p)


def test_corrupt_gz(tmp_path):
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(200))
    assert_input_error(p)


def test_gz_of_invalid_json(tmp_path):
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", '))
    assert_input_error(p)


@pytest.mark.parametrize("content", ['{"a": 1}', "[1,2]", "", "   \n", '{"traceEvents": []}', "null", '"text"',
                                     '{"traceEvents": {"ph": "X"}}', "{not json"])
def test_not_a_trace(tmp_path, content):
    p = tmp_path / "trace.json"
    p.write_text(content)
    assert_input_error(p)


def test_two_world_sizes_in_one_folder(tmp_path):
    write(tmp_path / "rank0.json", small_trace(0, 2))
    write(tmp_path / "rank1.json", small_trace(1, 4))
    assert_input_error(tmp_path, named=tmp_path.name)


def test_duplicate_rank(tmp_path):
    """Rank 0 twice with different content (an identical copy is read once: tests/test_hostile_input.py)."""
    other = small_trace(0, 2)
    other["traceEvents"][1]["dur"] = 60.0
    write(tmp_path / "a.json", small_trace(0, 2))
    write(tmp_path / "b.json", other)
    proc = run_cli(str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert "a.json" in line or "b.json" in line
    assert "rank 0" in line
    assert_input_error(tmp_path, named=".json")


def test_good_input_is_not_modified(tmp_path):
    """Analysis of a valid folder leaves its files' bytes and mtimes alone."""
    write(tmp_path / "rank0.json", small_trace(0, 2))
    write(tmp_path / "rank1.json", small_trace(1, 2))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    proc = run_cli(str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("event", [{"ph": "X", "name": ["a"], "ts": 1, "dur": 1},
                                   {"ph": "X", "name": "a", "ts": "soon", "dur": 1},
                                   {"ph": "X", "name": "a", "ts": 1, "dur": "long"}])
def test_malformed_event(tmp_path, event):
    p = write(tmp_path / "trace.json", {"traceEvents": [event]})
    assert_input_error(p)


@pytest.mark.parametrize("shape", ["one member", "two members", "bytes after the member", "trailer size too small",
                                   "trailer size too large", "forged huge trailer size", "empty member"])
def test_gunzip_reads_every_gzip_shape_as_the_standard_library_does(shape):
    """The one-call inflate is taken only when its result is certain; any other shape gives what
    ``gzip.decompress`` gives, or an error where it raises."""
    from fsdpdoctor.trace.io import gunzip

    body = json.dumps(small_trace(0, 1)).encode()
    one = gzip.compress(body)
    data = {"one member": one, "two members": one + gzip.compress(b" "),
            "bytes after the member": one + b"junk",
            "trailer size too small": one[:-4] + (len(body) - 1).to_bytes(4, "little"),
            "trailer size too large": one[:-4] + (len(body) + 1).to_bytes(4, "little"),
            "forged huge trailer size": one[:-4] + (2**32 - 1).to_bytes(4, "little"),
            "empty member": gzip.compress(b"")}[shape]
    try:
        expected = gzip.decompress(data)
    except (OSError, EOFError):
        with pytest.raises(Exception):  # noqa: B017 - whatever the inflater raises on damaged data
            gunzip(data)
    else:
        assert gunzip(data) == expected


def _refusal(path: Path) -> str:
    assert_input_error(path)
    return run_cli(str(path)).stderr.strip()


def test_begin_end_only_file_is_refused_as_another_tools_trace(tmp_path):
    """A Chrome file of duration events as begin/end pairs (x2trace's bpftrace output) or async b/e events
    (a serving system's request trace): phases torch.profiler never writes, so another tool's file,
    not an empty recording; a file of metadata and instants only stays an empty trace."""
    be = [{"ph": ph, "name": f"sys_read{i}", "pid": 42, "tid": 42, "ts": 10.0 * i + (3 if ph == "E" else 0)}
          for i in range(3) for ph in ("B", "E")]
    line = _refusal(write(tmp_path / "x2trace.json", {"traceEvents": be, "displayTimeUnit": "ns"}))
    assert "not a torch.profiler recording" in line and "6 begin/end events" in line, line
    assert "empty trace" not in line
    async_be = [{"ph": ph, "cat": "request", "id": 1, "name": "resnet50", "pid": 1, "tid": 1, "ts": t}
                for ph, t in (("b", 0.0), ("e", 90.0))]
    line = _refusal(write(tmp_path / "server.json", async_be))
    assert "not a torch.profiler recording" in line and "2 async begin/end events" in line, line
    meta_only = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
                 {"ph": "i", "name": "Record Window End", "pid": 1, "tid": 1, "ts": 5.0, "s": "t"}]
    line = _refusal(write(tmp_path / "meta.json", {"traceEvents": meta_only, "schemaVersion": 1}))
    assert "empty trace" in line, line
