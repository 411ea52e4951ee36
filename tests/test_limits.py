"""Every limit of fsdpdoctor/trace/limits.py holds where input is read (issue 33 item 4): decompressed
size (relative to the file and to the memory left), nesting depth in every JSON/TOML/msgpack reader,
buffers sized from the file, and names bounded before any pattern sees them. Inputs are generated small
in tmp_path; memory limits are set on a child process (``ulimit -v``), never on the test process."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdpdoctor.cli import main
from fsdpdoctor.errors import InputError
from fsdpdoctor.trace import limits
from fsdpdoctor.trace.io import inflate, read_raw

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp_default"
needs_traces = pytest.mark.skipif(not (DDP / "rank0.json.gz").exists(), reason="bundled traces not present")
DEEP = 100_000


def cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    return rc, err


def one_line_refusal(capsys, *argv, says: str) -> None:
    rc, err = cli(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err, err


def child(code: str, address_space: int) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python whose address space is capped (``ulimit -v``)."""
    pre = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, env=env, timeout=300)


# ---------------------------------------------------------------- decompressed size

def _zero_members(n: int) -> bytes:
    """``n`` gzip members of 1 MiB of zeros each (~1 KB apiece on disk)."""
    return gzip.compress(bytes(1 << 20), 9) * n


def test_many_member_gzip_is_refused_after_the_cap(tmp_path, capsys):
    # the 16 MB file inflating to 16 GB, scaled down: 1,100 KB inflating to 1 GiB; refused once the
    # output passes 100x the file (~110 MB), never asking for the whole
    bomb = _zero_members(1024)
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json.gz").write_bytes(bomb)
    one_line_refusal(capsys, "analyze", "--no-progress", run / "rank0.json.gz", says="inflates to more than")
    with pytest.raises(InputError, match=f"{limits.INFLATE_RATIO}x its"):
        inflate(bomb, Path("x.json.gz"))


def test_one_member_too_large_is_refused_while_streaming(tmp_path, capsys):
    # one member whose trailer says 200 MiB: the streaming reader (traces over 16 MiB) counts what it inflates
    f = tmp_path / "rank0.json.gz"
    f.write_bytes(gzip.compress(b'{"traceEvents": [' + bytes(200 << 20), 9))
    one_line_refusal(capsys, "analyze", "--no-progress", f, says="inflates to more than")


def test_inflating_is_capped_by_the_memory_left(monkeypatch):
    monkeypatch.setattr(limits, "_meminfo_available", lambda: 40 << 20)
    monkeypatch.setattr(limits, "_address_space_left", lambda: None)
    assert limits.inflate_cap(10 << 20) == 20 << 20
    with pytest.raises(InputError, match="memory this process can still use"):
        inflate(_zero_members(30), Path("x.json.gz"))


def test_ordinary_gzip_still_reads():
    doc = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": i, "dur": 1} for i in range(2000)]}).encode()
    raw = gzip.compress(doc[:5000]) + gzip.compress(doc[5000:]) + bytes(8)  # two members and zero padding
    assert inflate(raw, Path("x.json.gz")) == doc
    assert inflate(gzip.compress(doc), Path("x.json.gz")) == doc


# ---------------------------------------------------------------- nesting depth

def _deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


def test_depth_is_measured_outside_strings():
    assert limits.nesting_depth(b'{"a": [1, {"b": "[[[[\\"[["}]}') == 3
    assert limits.nesting_depth('a = [[1], "[[["]  # [[[[\n[t]\nb = {x = [1]}', toml=True) == 2
    assert limits.nesting_depth(_deep_json()) == DEEP


@needs_traces
def test_deep_hang_dump_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "hang").mkdir(parents=True)
    (run / "hang" / "rank0.json").write_text('{"fsdpdoctor_hang": 1, "rank": 0, "x": ' + _deep_json() + "}")
    one_line_refusal(capsys, "hang", run, says="nested deeper than")


@needs_traces
def test_deep_saved_json_given_to_diff_and_check_baseline(tmp_path, capsys):
    saved = tmp_path / "base.json"
    saved.write_text('{"source": "x", "schema_version": "1.0", "notes": ' + _deep_json() + "}")
    one_line_refusal(capsys, "diff", saved, DDP, says="nested deeper than")
    one_line_refusal(capsys, "check", DDP, "--baseline", saved, "--no-progress", says="nested deeper than")


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_deep_config_is_refused(tmp_path, capsys, suffix):
    cfg = tmp_path / f"th{suffix}"
    cfg.write_text(("x = " if suffix == ".toml" else '{"x": ') + _deep_json() + ("" if suffix == ".toml" else "}"))
    one_line_refusal(capsys, "check", DDP, "--config", cfg, "--no-progress", says="nested deeper than")


def test_deep_msgpack_summary_is_not_a_summary():
    # a summary is decoded against its type, which stops at the first level deeper than the type: bounded by
    # the type (a RecursionError, were one raised, is refused the same way)
    import msgspec

    from fsdpdoctor.analysis.rankresult import BadSummary, decode

    for deep in (b"\x91" * DEEP + b"\xc0", msgspec.msgpack.encode({"rank": 0})[:-1] + b"\x91" * DEEP + b"\xc0"):
        with pytest.raises(BadSummary, match="not a rank summary"):
            decode(deep)


# ---------------------------------------------------------------- buffers sized from the file

def test_steps_reads_a_series_under_a_small_address_space(tmp_path):
    # `fsdpdoctor steps` asked for a 16 GiB buffer up front: MemoryError (exit 3) under `ulimit -v` < 16 GiB
    from fsdpdoctor.capture.series import SeriesWriter, encode_records, series_path

    w = SeriesWriter(series_path(tmp_path, 0), 0, 1, time.time_ns())
    w.append(encode_records(0, [10_000_000, 20_000_000, 30_000_000], 0, 0, {}))
    w.close()
    out = child(f"import sys; from fsdpdoctor.cli import main; sys.exit(main(['steps', {str(tmp_path)!r}]))", 3 << 30)
    assert out.returncode == 0, out.stderr


def test_a_bounded_read_asks_for_the_files_size(tmp_path):
    f = tmp_path / "small.json"
    f.write_text("{}")
    out = child(f"from fsdpdoctor.trace.io import read_raw; print(read_raw({str(f)!r}, 8 << 30))", 3 << 30)
    assert out.returncode == 0 and out.stdout.strip() == "b'{}'", out.stderr
    assert read_raw(f, 1 << 40) == b"{}"


# ---------------------------------------------------------------- string lengths

@needs_traces
def test_a_name_longer_than_any_profilers_is_bounded_before_analysis(tmp_path, capsys):
    doc = json.loads(gzip.open(DDP / "rank0.json.gz").read())
    long = "aten::" + "x" * (limits.MAX_NAME_CHARS * 4)
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    ops[len(ops) // 2]["name"] = long
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json").write_text(json.dumps(doc))
    from fsdpdoctor.trace.loader import load_file

    t = load_file(run / "rank0.json")
    assert max(map(len, t.names)) < limits.MAX_NAME_CHARS + 64
    assert any(n.startswith("aten::xxx") and n.endswith("more characters]") for n in t.names)
    rc, err = cli(capsys, "analyze", "--no-progress", run / "rank0.json")
    assert rc == 0, err
