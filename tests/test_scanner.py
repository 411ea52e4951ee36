"""The compiled scanner (fsdpdoctor/trace/_scan.c) against the decoding readings: on every trace, bundled
and public, it gives the same columns bit for bit, and on anything it is not sure of (escapes, fields
written twice, odd types, invalid JSON or UTF-8, deep nesting) it stands aside and the decoding reading
decides, as if it did not exist."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from fsdpdoctor.trace import columns, loader, split
from fsdpdoctor.trace.events import _events_decoder

from bundled import TRACES
from shared_data import PUBLIC, SHARED


def test_the_scanner_is_built():
    """`pip install -e .` compiles it (pyproject.toml, ext-modules); without it every trace is read by
    the decoding readings, correctly but ~3x slower per event."""
    from fsdpdoctor.trace import scanner

    assert columns._scan is not None, (f"trace scanner {scanner.state()}: rebuild it (pip install -e ., or cc -shared "
                                       "-fPIC -O3 -I<python include> fsdpdoctor/trace/_scan.c -o <its .so>)")


def _same_columns(a: columns.Columns, b: columns.Columns) -> None:
    assert a.names == b.names
    for field in ("name_id", "cat", "ts", "dur", "track", "corr"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), field   # bit for bit: -0.0 and NaN included
    assert [(t.pid, t.tid, type(t.pid), type(t.tid)) for t in a.tracks] == \
        [(t.pid, t.tid, type(t.pid), type(t.tid)) for t in b.tracks]
    assert (a.thread_names, a.args, a.memory_events, a.unreadable, a.categories) == \
        (b.thread_names, b.args, b.memory_events, b.unreadable, b.categories)


def _decoded(piece: bytes):
    """The decoding reading of a run of events (what ``split._one_piece`` does without the scanner)."""
    events = _events_decoder.decode(b"[" + piece + b"]")
    return columns.from_events(events) if events else None


def _trace_files() -> list[Path]:
    """One rank of every bundled run (the other ranks are the same job), every CUDA and public file."""
    found = sorted(TRACES.glob("*/rank0.json.gz")) + sorted(TRACES.glob("cuda/*/*.json.gz"))
    for base in (PUBLIC, SHARED / "traces-cuda"):
        if base is not None and base.is_dir():
            found += sorted(p for p in base.glob("*/*") if p.name.endswith((".json", ".json.gz"))
                            and "manifest" not in p.name and p.name != "expected.json")
    return found


def test_every_trace_reads_the_same_with_and_without_the_scanner(monkeypatch):
    """Whole files through the loader: pieces, streams, joins, metadata and allocator samples. Every file is
    read in pieces (small ones too: the loader reads a file of under 1 MB of JSON whole, without the scanner)."""
    monkeypatch.setattr(split, "PIECES_MIN_BYTES", 1)
    taken = []

    def counted(piece):
        got = columns.from_bytes(piece)
        if columns.SCANNER:
            taken.append(got)
        return got

    monkeypatch.setattr(loader, "from_bytes", counted)
    files = _trace_files()
    assert len(files) > 40
    for f in files:
        with monkeypatch.context() as m:
            m.setattr(columns, "SCANNER", False)
            plain = loader.load_file(f)
        scanned = loader.load_file(f)
        _same_columns(*(columns.Columns(t.names, t.name_id, t.cat, t.ts, t.dur, t.track, t.corr, t.tracks, {},
                                        t.args, t.memory_events, 0, t.categories) for t in (scanned, plain)))
        assert [(t.name, t.process, t.is_device) for t in scanned.tracks] == \
            [(t.name, t.process, t.is_device) for t in plain.tracks]
    read = [t for t in taken if t is not None]
    assert len(read) > 100 and len(read) == len(taken), "the scanner stood aside on real traces"


def _piece_of(path: Path) -> bytes:
    data = loader.inflate(path.read_bytes(), path)
    start, end = split.events_span(data)
    return data[start + 1:end]


def test_a_piece_of_a_real_trace_reads_the_same():
    piece = _piece_of(TRACES / "fsdp2_default" / "rank0.json.gz")
    got = columns.from_bytes(piece)
    assert got is not None
    _same_columns(got, _decoded(piece))


@pytest.mark.parametrize("text, why", [
    (b'{"ph": "X", "name": "a\\"b", "ts": 1, "dur": 2}', "an escaped name"),
    (b'{"ph": "X", "name": "a", "name": "b", "ts": 1}', "a field written twice"),
    (b'{"ph": "X", "name": "a", "ts": "1"}', "a time written as text"),
    (b'{"ph": "X", "name": "a"}', "no time"),
    (b'{"ph": "X", "name": 5, "ts": 1}', "a name that is a number"),
    (b'{"ph": "X", "name": "a", "ts": 1, "pid": true}', "a pid that is a boolean"),
    (b'{"ph": "X", "name": "a", "ts": 1, "pid": -0}', "-0 and 0: two texts, one value"),
    (b'{"ph": "X", "name": "a", "ts": 1, "pid": 1.5}', "a pid that is a float"),
    (b'{"ph": "X", "name": "a", "ts": 1, "args": null}', "args that are not an object"),
    (b'{"ph": "X", "name": "a", "ts": 1, "args": {"correlation": 99999999999999999999}}', "an id past int64"),
    (b'{"ph": "X", "name": "a", "ts": 1, "args": {"correlation": 1, "correlation": 2}}', "an id written twice"),
    (b'{"ph": "Q", "name": "a", "ts": 1}', "an unknown phase"),
    (b'{"name": "a", "ts": 1}', "no phase"),
    (b'{"ph": "X", "name": "a", "ts": 1e999}', "a time past a double"),
    (b'{"ph": "X", "name": "\xff", "ts": 1}', "invalid UTF-8"),
    (b'{"ph": "X", "name": "a", "ts": 1, "args": {"x": ' + b"[" * 100 + b"]" * 100 + b"}}", "deep nesting"),
    (b'{"ph": "X", "name": "a", "ts": 1} {"ph": "X", "name": "b", "ts": 2}', "a missing comma"),
    (b'{"ph": "X", "name": "a", "ts": 01}', "a number JSON does not allow"),
    (b'{"ph": "X", "name": "a", "ts": 1,}', "a trailing comma"),
    (b'{"ph": "X", "name": "a", "ts": 1', "a truncated event"),
    (b'{"ph": "X", "name": "a\x01", "ts": 1}', "a control character in a string"),
    (b'   ', "no event"),
])
def test_the_scanner_stands_aside(text, why):
    assert columns.from_bytes(text) is None, why


def test_what_the_scanner_reads_exactly():
    """Types, defaults and the correlation rules of the decoding reading, on one piece."""
    piece = (b'{"ph":"M","name":"thread_name","pid":1,"tid":7,"args":{"name":"worker"}},\n'
             b' {"ph": "X", "cat": "kernel", "name": "nccl\xc3\xa9Kernel", "pid": 1, "tid": 7, "ts": 10.5, "dur": 2,'
             b' "args": {"correlation": 12.9, "Collective name": "allreduce", "grid": [1, [2, {"a": null}]]}},'
             b'{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":"7","ts":-0.0,'
             b'"args":{"correlation":true}},'
             b'{"ph":"X","cat":"kernel","name":"gemm","pid":null,"tid":null,"ts":2,"args":{"correlation":7.6}},'
             b'{"ph":"X","name":"","ts":1700000000123.456,"dur":null,"args":{}},'
             b'{"ph":"s","id":1,"pid":1,"tid":7,"ts":3},'
             b'{"ph":"i","name":"[memory]","pid":1,"tid":7,"ts":4,"args":{"Total Allocated":5,"Bytes":5}},'
             b'{"ph":"X","cat":"cpu_op","name":"c10d::allreduce_","pid":1,"tid":7,"ts":5,"dur":1,'
             b'"args":{"correlation":3,"Input Dims":[[4]]}}')
    got = columns.from_bytes(piece)
    assert got is not None
    _same_columns(got, _decoded(piece))
    assert got.names == ["nccl\u00e9Kernel", "cudaLaunchKernel", "gemm", "", "c10d::allreduce_"]
    assert got.corr.tolist() == [12, -1, 7, -1, 3] and set(got.args) == {0, 4}
    assert [(t.pid, t.tid) for t in got.tracks] == [(1, 7), (1, "7"), (None, None)]
    assert got.thread_names == {(1, 7): "worker"} and len(got.memory_events) == 1 and str(got.ts[1]) == "-0.0"


# ------------------------------------------------------------------ numbers the fast path must not read

_BIG = b"9223372036854775808.0"   # 2^63: its 19-digit mantissa times 10 wraps uint64 to exactly 0
# 1e900000 written in 100 kB, whose exponent is past any the scanner holds (msgspec reads it as 0.0)
_HUGE = b"0." + b"0" * 99_999 + b"1e1000000"


@pytest.mark.parametrize("event", [
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": ' + _BIG + b', "dur": 1}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": ' + _BIG + b'}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 2, "args": {"correlation": ' + _BIG + b'}}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 18446744073709551616.5}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 12345678901234567890e-5}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": ' + _HUGE + b', "dur": 1}',
    b'{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": ' + _HUGE + b'}',
], ids=["ts 2^63", "dur 2^63", "correlation 2^63", "dur 2^64", "20 digits", "ts 100 kB", "dur 100 kB"])
def test_numbers_past_the_fast_path_are_left_to_msgspec(event):
    """More than 19 significant digits, or an exponent too long to hold: the scanner stands aside and the
    piece reads as msgspec reads it (it read 2^63 as 0.0, and the 100 kB number as 1.0)."""
    assert columns.from_bytes(event) is None
    expected = _decoded(event)
    got = split._one_piece(event, columns.from_events, columns.from_bytes)
    assert (got is None) == (expected is None)   # a correlation past int64: both leave it to the whole reading
    if got is not None:
        _same_columns(got, expected)
        times = msgspec.json.decode(event)
        assert (got.ts[0], got.dur[0]) == (float(times["ts"]), float(times["dur"]))


def test_a_real_trace_with_one_edited_duration_reads_as_msgspec_reads_it():
    piece = _piece_of(TRACES / "fsdp2_default" / "rank0.json.gz")
    i = piece.index(b'"dur":')
    edited = piece[:i] + re.sub(rb'^"dur": *[0-9.]+', b'"dur": ' + _BIG, piece[i:i + 40]) + piece[i + 40:]
    assert _BIG in edited and columns.from_bytes(piece) is not None
    got = split._one_piece(edited, columns.from_events, columns.from_bytes)
    _same_columns(got, _decoded(edited))
    assert float(_BIG) in got.dur


def test_numbers_the_fast_path_reads_exactly():
    """19 significant digits after leading zeros, exponents written long: read, as msgspec reads them."""
    for number in (b"0.000000000000000000000001234567890123456789", b"1234567890123456789", b"1e0000000000000001",
                   b"0." + b"0" * 99_999 + b"1e99999", b"1700000000123.456", b"-0.0", b"1e-400"):
        event = b'{"ph": "X", "name": "a", "ts": ' + number + b'}'
        got = columns.from_bytes(event)
        assert got is not None, number
        assert got.ts.tobytes() == _decoded(event).ts.tobytes(), number


def test_the_scanner_gives_a_named_result_its_stub_describes():
    """``_scan.scan`` returns ``Scanned``, whose fields are the properties ``_scan.pyi`` declares."""
    import ast

    from fsdpdoctor.trace import _scan

    got = _scan.scan(b'{"ph": "X", "name": "a", "ts": 1.5, "args": {"correlation": 7}}')
    assert isinstance(got, _scan.Scanned) and got.names == ["a"] and got.others == []
    stub = ast.parse((Path(_scan.__file__).parent / "_scan.pyi").read_text())
    scanned = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Scanned")
    declared = [f.name for f in scanned.body if isinstance(f, ast.FunctionDef)]
    assert declared == list(_scan.Scanned.__match_args__) and len(declared) == len(got) == 13


# ------------------------------------------------------------------ random events, written in odd ways

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=6))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=6)
_NAMES = st.one_of(st.sampled_from(["aten::mm", "ncclDevKernel_AllReduce", "cudaLaunchKernel", "ProfilerStep#3",
                                    "c10d::allreduce_", "", "é", "a\"b", "a\\b", "x\u2028y"]), st.text(max_size=8))
_FIELD = {
    "ph": st.sampled_from(["X", "X", "X", "M", "i", "s", "f", "B", "Q", 1]),
    "name": _NAMES | _SCALARS,
    "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "user_annotation", None, 3]),
    "ts": st.one_of(st.integers(-2**64, 2**64), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3)),
    "dur": st.one_of(st.none(), st.integers(0, 10**6), st.floats(0, 1e9)),
    "pid": st.one_of(st.none(), st.integers(-3, 2**64), st.sampled_from(["Spans", "1", "é"]), st.booleans(), st.floats(0, 3)),
    "tid": st.one_of(st.none(), st.integers(-3, 9), st.sampled_from(["stream 7", "7"])),
    "args": st.one_of(st.none(), _VALUES, st.fixed_dictionaries(
        {}, optional={"correlation": _SCALARS, "Collective name": _SCALARS, "name": st.text(max_size=5),
                      "Input Dims": _VALUES, "Total Allocated": st.integers(0, 9)})),
}
_ODD = st.fixed_dictionaries({}, optional=_FIELD)
# times and ids as writers write them: microseconds with three decimals, fractions either side of .5
_FRACTIONAL = st.builds(lambda i, f: i + f, st.integers(-10**6, 10**6), st.sampled_from([0.25, 0.5, 0.75, 0.999]))
_MICROS = st.integers(0, 2**60).map(lambda i: i / 1000)
# most events of a trace are complete events of ordinary shape: the scanner must read those, exactly
_PLAIN = st.fixed_dictionaries(
    {"ph": st.just("X"), "name": _NAMES, "ts": st.one_of(st.integers(0, 2**62), st.floats(0, 2e15), _MICROS),
     "cat": st.sampled_from(["kernel", "cuda_runtime", "gpu_memcpy", "cpu_op"])},
    optional={"dur": st.one_of(st.none(), st.integers(0, 10**6), st.floats(0, 1e9), _MICROS),
              "pid": st.one_of(st.none(), st.integers(0, 9)), "tid": st.one_of(st.none(), st.integers(0, 9)),
              "args": st.fixed_dictionaries({}, optional={
                  "correlation": st.one_of(st.integers(-2**63, 2**63 - 1), _FRACTIONAL, st.none(),
                                           st.booleans(), st.text(max_size=3)),
                  "Collective name": st.one_of(st.none(), st.just("allreduce"))})})
_EVENT = st.one_of(_ODD, _PLAIN)


def _write(events: list[dict], rnd: random.Random) -> bytes:
    """JSON as writers write it: keys in any order, whitespace anywhere, some keys twice, escapes."""
    parts = []
    for e in events:
        items = list(e.items())
        rnd.shuffle(items)
        if items and rnd.random() < 0.05:
            items.append(items[0])   # a key written twice
        ws = lambda: rnd.choice(["", " ", "\n    ", "\t"])  # noqa: E731
        members = [f'{ws()}{json.dumps(k, ensure_ascii=rnd.random() < 0.5)}{ws()}:{ws()}'
                   f'{json.dumps(v, ensure_ascii=rnd.random() < 0.5)}' for k, v in items]
        parts.append("{" + ",".join(members) + ws() + "}")
    return ("," + rnd.choice(["", " ", "\n  "])).join(parts).encode()


def _agree(piece: bytes) -> bool:
    """Whether the scanner read ``piece`` (then exactly as the decoding reading); it may stand aside, never
    read what the decoding reading refuses."""
    try:
        expected = _decoded(piece)
    except (msgspec.MsgspecError, RecursionError, ValueError, TypeError, OverflowError, AttributeError):
        expected = None   # the decoding reading refuses these events: so must the scanner
    try:
        got = columns.from_bytes(piece)
    except (msgspec.MsgspecError, ValueError, TypeError, OverflowError, AttributeError):
        got = None        # split._one_piece treats a raise as "decode it instead"
    if got is None:
        return False
    assert expected is not None, piece
    _same_columns(got, expected)
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(_PLAIN, min_size=1, max_size=4), st.integers(0, 2**32))
def test_random_plain_events_read_the_same(events, seed):
    _agree(_write(events, random.Random(seed)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENT, max_size=6), st.integers(0, 2**32))
def test_random_odd_events_read_the_same_or_are_left_to_msgspec(events, seed):
    _agree(_write(events, random.Random(seed)))


def test_random_bytes_never_crash_the_scanner():
    """Mutations of a real piece: the scanner returns None or columns equal to the decoding reading's."""
    piece = _piece_of(TRACES / "ddp_default" / "rank0.json.gz")
    base = bytearray(piece[:split._BOUNDARY.search(piece, 20000).start() + 1])   # whole events
    rnd = random.Random(7)
    agreed = 0
    for _ in range(300):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(b))
            b[i] = rnd.choice(b'{}[]",:\\ 0-e.\xc3\xff\x00Xa')
        cut = bytes(b[:rnd.randrange(len(b) // 2, len(b))]) if rnd.random() < 0.3 else bytes(b)
        try:
            expected = _decoded(cut)
        except Exception:  # noqa: BLE001
            expected = None
        try:
            got = columns.from_bytes(cut)
        except (msgspec.MsgspecError, ValueError, TypeError):
            got = None
        if got is not None:
            assert expected is not None
            _same_columns(got, expected)
            agreed += 1
    assert agreed > 10   # some mutations leave the events readable (a changed digit, a changed letter)


def test_without_the_scanner_a_trace_reads_the_same(tmp_path):
    """FSDPDOCTOR_NO_SCANNER=1 (as on an install without a compiler): the analysis is the same."""
    import os
    import subprocess
    import sys

    run = TRACES / "ddp_one_bucket"
    outs = []
    for off in ("", "1"):
        env = dict(os.environ, FSDPDOCTOR_NO_SCANNER=off)
        outs.append(subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", str(run), "--json"],
                                   capture_output=True, env=env, check=True).stdout)
    assert outs[0] == outs[1] and json.loads(outs[0])["findings"]
