"""Fuzzing the CLI with mutated copies of real bundled traces (hypothesis).

Every example writes a run folder (two ranks and a manifest, cut from a bundled recording to keep each
example fast), mutates it (fields dropped, retyped or set to extreme values; events duplicated, dropped
or reordered; files truncated; odd manifests and document fields) and runs ``analyze --json`` and
``check`` in-process. The contract: exit 0, 1 or 2; on 2 exactly one stderr line and no traceback;
inputs unchanged; no negative or non-finite number anywhere in the JSON; and no raw control or escape
character from a file on stdout or stderr (the text mutation puts ``ESC[2J``, OSC 0/52, C1, NUL, BS, DEL,
bidirectional overrides and lone surrogates into every string field and the folder name).

Quick profile (CI): a few hundred examples. Long profile, by hand::

    FSDPDOCTOR_FUZZ_EXAMPLES=10000 python -m pytest -q -s -p no:cacheprovider tests/test_fuzz.py

(three quarters of the examples on run folders, one quarter on single files). Both profiles are
reproducible: the seed is ``FSDPDOCTOR_FUZZ_SEED`` (default 13; the single-file test uses seed + 1), so
a long run can be split into shards with different seeds. docs/fuzzing.md records the long run's result.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import io
import json
import math
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path

import msgspec
import pytest

# hypothesis is in the [test] extra: a missing install fails here, it is never skipped
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fsdpdoctor.cli import main
from bundled import TRACES, shared_rank_steps  # the committed traces, in a pristine copy

SCENARIO = TRACES / "ddp_default"
EXAMPLES = int(os.environ.get("FSDPDOCTOR_FUZZ_EXAMPLES", "0"))
SEED = int(os.environ.get("FSDPDOCTOR_FUZZ_SEED", "13"))
FULL_CHECK = not EXAMPLES  # the quick profile runs `check` on every example; the long one where analyze passed
# the overall mean's rank is documented as -1 ("all ranks"): the one negative number the schema has
ALLOWED_NEGATIVE = {("$.mean.rank", -1)}
# signed by definition: a rank's clock offset (its bounds, its drift) against the reference rank; the low end
# of a saving's interval (a fix may cost time: diagnose/prediction.py); the straggler's excess in a step where
# it was quicker than the others' median
SIGNED = re.compile(r"^\$\.clock\.ranks\[\d+\]\.(offset_us|drift_ppm|bound_lo_us|bound_hi_us)$"
                    r"|^\$\.findings\[\d+\]\.impact_interval_us\[0\]$|^\$\.straggler\.extra_each_us\[\d+\]$")

pytestmark = pytest.mark.skipif(not (SCENARIO / "rank0.json.gz").exists(), reason="bundled traces not present")


@lru_cache(maxsize=1)
def _base_bytes() -> tuple[bytes, bytes, bytes]:
    """rank 0, rank 1 (one profiler step each, ~600 events) and the manifest of a real 2-rank DDP run."""
    docs = []
    for r in (0, 1):
        doc = json.loads(gzip.decompress((SCENARIO / f"rank{r}.json.gz").read_bytes()))
        step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#3")
        lo, hi = step["ts"], step["ts"] + step["dur"]
        # one step; of the ops and Python frames only every eighth (they are 95 % of the events and each
        # kind is well represented by a sample); every annotation and communication event: keeps each
        # example fast while every code path of the loader and the analysis still runs
        kept, sampled = [], 0
        for e in doc["traceEvents"]:
            if e.get("ph") == "M":
                kept.append(e)
            elif lo <= e.get("ts", -1) <= hi:
                name = e.get("name", "")
                if e.get("cat") in ("cpu_op", "python_function") and not name.startswith(("c10d", "gloo", "aten::mm")):
                    sampled += 1
                    if sampled % 8:
                        continue
                kept.append(e)
        doc["traceEvents"] = kept
        docs.append(doc)
    manifest = json.loads((SCENARIO / "manifest.json").read_text())
    manifest["profiled_steps"] = [3]
    return tuple(msgspec.json.encode(d) for d in (*docs, manifest))


def base_run() -> tuple[dict, dict, dict]:
    """Fresh (mutable) copies of the base run: decoding is ~5x faster than copy.deepcopy."""
    return tuple(msgspec.json.decode(b) for b in _base_bytes())


# a real NCCL recording of a public project (../shared beside the repository; never copied into it)
SHARED = Path(os.environ.get("FSDPDOCTOR_SHARED", Path(__file__).resolve().parents[2] / "shared"))
GPU_TRACE = SHARED / "traces-public" / "ddp_a100_rank0" / "nccl_data.json.gz"


def _comm_related(e: dict) -> bool:
    name, args = str(e.get("name", "")), e.get("args") if isinstance(e.get("args"), dict) else {}
    return "nccl" in name.lower() or "Collective name" in args or name.startswith(("c10d", "record_param_comms"))


@lru_cache(maxsize=1)
def _gpu_base_bytes() -> tuple[bytes, bytes]:
    """Two ranks of a GPU/NCCL recording (the other dialect: kernels on streams, runtime launches and
    their flows, record_param_comms and NCCL kernels): one step of rank 0 of a public 2-rank A100 DDP
    run, every collective with its launch and kernel, one in eight of the other launches (with their
    kernels and flows, by correlation id), ops and frames (about 2,000 events); rank 1 is a copy of
    rank 0 that says it is rank 1."""
    doc = json.loads(gzip.decompress(GPU_TRACE.read_bytes()))
    step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5")
    lo, hi = step["ts"], step["ts"] + 1.3 * step["dur"]  # the step's last kernels run after its host side
    comm_corr = {e["args"].get("correlation") for e in doc["traceEvents"]
                 if isinstance(e.get("args"), dict) and "nccl" in str(e.get("name", "")).lower()}
    kept, sampled = [], 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "M":
            kept.append(e)
            continue
        if not lo <= e.get("ts", -1) <= hi:
            continue
        corr = (e.get("args") or {}).get("correlation") if e.get("ph") == "X" else e.get("id")
        if isinstance(corr, int):
            if corr in comm_corr or corr % 8 == 0:
                kept.append(e)
        elif _comm_related(e) or e.get("cat") not in ("cpu_op", "python_function"):
            kept.append(e)
        else:
            sampled += 1
            if sampled % 8 == 0:
                kept.append(e)
    doc["traceEvents"] = kept
    docs = [doc, copy.deepcopy(doc)]
    docs[1]["distributedInfo"] = dict(docs[1]["distributedInfo"], rank=1)
    return tuple(msgspec.json.encode(d) for d in docs)


def encode(doc) -> bytes:
    """JSON bytes; NaN/Infinity and integers beyond 64 bits as Python's json writes them (a case of their own)."""
    try:
        data = msgspec.json.encode(doc)
    except (OverflowError, TypeError, ValueError, RecursionError):
        return json.dumps(doc).encode()
    return data if b"null" not in data or not _has_non_finite(doc) else json.dumps(doc).encode()


def _has_non_finite(x, depth: int = 0) -> bool:
    if isinstance(x, float):
        return not math.isfinite(x)
    if depth > 80:
        return False
    if isinstance(x, dict):
        return any(_has_non_finite(v, depth + 1) for v in x.values())
    if isinstance(x, list):
        return any(_has_non_finite(v, depth + 1) for v in x)
    return False


# ---------------------------------------------------------------- mutations

def _deep(depth: int):
    v: object = 1
    for _ in range(depth):
        v = {"a": v} if depth % 2 else [v]
    return v


EXTREMES = st.sampled_from([
    None, 0, -1, -61.4, -1e40, 1e40, 1e300, 2 ** 63, 2 ** 64 + 1, 10 ** 30, -(2 ** 63), 1e-300, True, False,
    "", "x", "123", "ProfilerStep#3", "gloo:all_reduce", [], [1, 2], {}, {"a": 1}, float("nan"), float("inf"),
    float("-inf"), "nan", 3.5, 7,
    # GPU recordings: a record_param_comms' arguments, a kernel's, a category or a flow's
    {"Collective name": "all_reduce", "In msg nelems": -5, "Group size": 0, "Seq": 2 ** 64 + 1},
    {"stream": -1, "correlation": 1, "device": "x"}, "kernel", "cuda_runtime", "ac2g", "ncclDevKernel_AllReduce",
]) | st.builds(_deep, st.integers(1, 60))
FIELDS = ["ph", "ts", "dur", "name", "cat", "pid", "tid", "args"]
TOP_FIELDS = ["distributedInfo", "deviceProperties", "host_name", "baseTimeNanoseconds", "traceEvents"]
DIST_FIELDS = ["rank", "world_size", "backend", "pg_config", "pg_count"]
COMM_ARGS = ["Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Seq", "Process Group Name",
             "In split size", "Out split size", "Process Group Ranks"]
# what a count, a size, an id or a stream may be in a file written by anyone
NUMERIC_EDGES = [-1, -5, -2.5, 0, 3.5, 2 ** 63, 2 ** 64 + 1, 1e300, float("nan"), float("inf"), "12", None, True]
DEVICE_ARGS = ["stream", "correlation", "device", "External id", "context", "queued", "grid", "block"]
# text a hostile file holds: clear screen, window title, clipboard write, C1 CSI, NUL, BS, DEL, CR, bidirectional
# override, a lone surrogate (an undecodable file-name byte), a bracketed-paste end
CONTROL_TEXTS = ["\x1b[2J", "\x1b]0;pwned\x07", "\x1b]52;c;cHduZWQ=\x07", "\x9b31m", "\x00", "\x08", "\x7f", "\r",
                 "\u202e", "\udc9b", "\x1b[201~", "\x1bP+q\x1b\\"]
# what must never reach a terminal raw (tab and newline are layout)
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
MANIFEST_FIELDS = ["fsdpdoctor_manifest", "world_size", "backend", "files", "cycle_files", "hosts", "devices",
                   "profiled_steps", "samples_per_step", "tokens_per_step", "options", "model", "wrapping",
                   "schedule", "versions", "profiled_ranks"]


@st.composite
def mutation(draw):
    kind = draw(st.sampled_from(["event_field", "event_field", "event_field", "many_events", "drop_events",
                                 "duplicate_events", "reorder", "top_field", "dist_field", "manifest_field",
                                 "manifest_raw", "truncate", "extra_file", "bom", "comm_arg", "comm_arg",
                                 "device_arg", "text", "text"]))
    return kind, draw(st.integers(0, 2 ** 31)), draw(EXTREMES), draw(st.integers(0, 1)), draw(st.floats(0, 1))


def _set_or_drop(d: dict, key: str, value, drop: bool) -> None:
    if drop:
        d.pop(key, None)
    else:
        d[key] = copy.deepcopy(value)


def with_text(x, payload: str, share: float, rnd):
    """``x`` with ``payload`` appended to its strings: every one (``share`` 1) or about that share of them."""
    if isinstance(x, str):
        return x + payload if share >= 1 or rnd.random() < share else x
    if isinstance(x, list):
        return [with_text(v, payload, share, rnd) for v in x]
    if isinstance(x, dict):
        return {k: with_text(v, payload, share, rnd) for k, v in x.items()}
    return x


def apply(docs: list, manifest: dict | None, muts: list) -> tuple[list, dict | str | None, dict]:
    """Mutated (rank docs, manifest or raw manifest text, file options) from the clean ones."""
    import random

    opts = {"truncate": None, "extra": False, "bom": False, "folder": ""}
    for kind, r, value, which, frac in muts:
        rnd = random.Random(r)
        doc = docs[which]
        events = doc.get("traceEvents") if isinstance(doc, dict) else None
        if kind in ("event_field", "many_events") and isinstance(events, list) and events:
            n = 1 if kind == "event_field" else max(1, int(frac * len(events)))
            field = rnd.choice(FIELDS)
            for i in rnd.sample(range(len(events)), min(n, len(events))):
                if isinstance(events[i], dict):
                    _set_or_drop(events[i], field, value, rnd.random() < 0.3)
        elif kind == "drop_events" and isinstance(events, list):
            k = int(frac * len(events))
            start = rnd.randrange(max(1, len(events) - k + 1))
            del events[start:start + k]
        elif kind == "duplicate_events" and isinstance(events, list) and events:
            events.extend(copy.deepcopy(rnd.sample(events, min(len(events), 1 + int(frac * 50)))))
        elif kind == "reorder" and isinstance(events, list):
            rnd.shuffle(events)
        elif kind in ("comm_arg", "device_arg") and isinstance(events, list):
            # one argument of every collective's record (record_param_comms, c10d ops) or every kernel
            # and launch: what the analysis reads sizes, kinds, streams and correlations from
            keys, pick = ((COMM_ARGS, lambda e: "Collective name" in e["args"]) if kind == "comm_arg" else
                          (DEVICE_ARGS, lambda e: e.get("cat") in ("kernel", "cuda_runtime", "gpu_memcpy")))
            key, value = rnd.choice(keys), rnd.choice(NUMERIC_EDGES + [value])
            for e in events:
                if isinstance(e, dict) and isinstance(e.get("args"), dict) and pick(e):
                    _set_or_drop(e["args"], key, value, which == 1)
        elif kind == "top_field" and isinstance(doc, dict):
            _set_or_drop(doc, rnd.choice(TOP_FIELDS), value, rnd.random() < 0.3)
        elif kind == "dist_field" and isinstance(doc, dict) and isinstance(doc.get("distributedInfo"), dict):
            _set_or_drop(doc["distributedInfo"], rnd.choice(DIST_FIELDS), value, rnd.random() < 0.3)
        elif kind == "manifest_field" and isinstance(manifest, dict):
            key = rnd.choice(MANIFEST_FIELDS)
            target = manifest
            if key in ("model", "wrapping") and isinstance(manifest.get(key), dict) and rnd.random() < 0.7:
                target = manifest[key]
                key = rnd.choice(sorted(target) or ["x"])
            _set_or_drop(target, key, value, rnd.random() < 0.3)
        elif kind == "manifest_raw":
            manifest = rnd.choice([None, "", "{", "[1, 2]", '{"fsdpdoctor_manifest": 1, "world_size": NaN}',
                                   "\ufeff" + json.dumps(manifest) if isinstance(manifest, dict) else "{}",
                                   "[" * 5000 + "]" * 5000])
        elif kind == "text":
            # escape and control characters in every string field of a rank's file and the manifest
            # (which 0), or in a share of them (1: the analysis still recognises most events), and the
            # folder's name
            payload = "".join(rnd.sample(CONTROL_TEXTS, rnd.randint(1, 4)))
            share = 1.0 if which == 0 else max(frac, 0.05)
            docs[rnd.randrange(len(docs))] = with_text(doc, payload, share, rnd)
            if isinstance(manifest, dict):
                manifest = with_text(manifest, payload, share, rnd)
            opts["folder"] = payload.replace("\x00", "").replace("/", "").replace("\udc9b", "")
        elif kind == "truncate":
            opts["truncate"] = (which, frac)
        elif kind == "extra_file":
            opts["extra"] = True
        elif kind == "bom":
            opts["bom"] = True
    return docs, manifest, opts


def write_run(folder: Path, docs: list, manifest, opts: dict) -> list[Path]:
    for r, doc in enumerate(docs):
        data = encode(doc)
        if opts["bom"] and r == 0:
            data = b"\xef\xbb\xbf" + data
        if opts["truncate"] and opts["truncate"][0] == r:
            data = data[: int(len(data) * opts["truncate"][1])]
        if r == 0:  # one file gzip-compressed, one plain: both readers run
            (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(data, compresslevel=1))
        else:
            (folder / f"rank{r}.json").write_bytes(data)
    if opts["extra"]:
        (folder / "worker0.json").write_bytes(encode(docs[0]))
    if isinstance(manifest, dict):
        (folder / "manifest.json").write_bytes(encode(manifest))
    elif isinstance(manifest, str):
        (folder / "manifest.json").write_text(manifest)
    return sorted(folder.iterdir())


# ---------------------------------------------------------------- the contract

def bad_numbers(x, path: str = "$"):
    """(path, value) of every negative or non-finite number in a JSON document."""
    if isinstance(x, bool) or x is None:
        return
    if isinstance(x, (int, float)):
        if not math.isfinite(x) or (x < 0 and (path, x) not in ALLOWED_NEGATIVE and not SIGNED.match(path)):
            yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from bad_numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from bad_numbers(v, f"{path}[{i}]")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse; never expected here
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def check_contract(target: Path, gate: bool = True) -> dict[str, int]:
    """The contract for ``analyze --json`` and (``gate``) ``check`` on ``target``: their exit codes."""
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    codes = {}
    err = ""
    # check reads each rank as analyze did (the same files, unchanged, and options): it takes analyze's
    # per-rank answer (bundled.shared_rank_steps, within this example only) and runs its own reduce,
    # rules, invariants and gate on it; a rank analyze refused is read again
    with shared_rank_steps({}):
        for verb in (["analyze", "--json"], ["check"]) if gate else (["analyze", "--json"],):
            codes[verb[0]], err = _one_verb(verb, target, codes, err)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    assert after == before, "input modified"
    return codes


def _one_verb(verb: list[str], target: Path, codes: dict[str, int], err: str) -> tuple[int, str]:
    """One verb of the contract on ``target``: its exit code and stderr."""
    if codes.get("analyze") == 2:
        # the same input is refused by the same loader: check's answer is analyze's (saves half the time)
        rc, out, err = run_cli("check", "--no-progress", str(target)) if FULL_CHECK else (2, "", err)
    else:
        rc, out, err = run_cli(*verb, "--no-progress", str(target))
    assert rc in ((0, 2) if verb[0] == "analyze" else (0, 1, 2)), (verb, rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fsdpdoctor: error: "), err
    elif verb[0] == "analyze":
        bad = list(bad_numbers(json.loads(out)))
        assert not bad, bad[:5]
    for stream in (out, err):  # text from the file is shown, never obeyed
        raw = RAW_CONTROL.search(stream)
        assert raw is None, (verb, stream[max(0, raw.start() - 80):raw.end() + 20])
    return rc, err


HISTOGRAM: dict[str, dict[int, int]] = {"analyze": {}, "check": {}}


def _settings(default: int, share: float):
    """``default`` examples in the quick profile; ``share`` of FSDPDOCTOR_FUZZ_EXAMPLES in the long one."""
    return settings(max_examples=max(1, round(EXAMPLES * share)) if EXAMPLES else default, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@seed(SEED)
@_settings(150, 0.75)
@given(muts=st.lists(mutation(), min_size=1, max_size=4))
def test_fuzz_mutated_run_folder(muts):
    r0, r1, manifest = base_run()
    fuzz_folder(*apply([r0, r1], manifest, muts))


def fuzz_folder(docs: list, manifest, opts: dict, gate: bool = True) -> None:
    """Write one mutated run folder, hold it to the contract, count its exit codes."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / ("run" + opts.get("folder", ""))
        folder.mkdir()
        write_run(folder, docs, manifest, opts)
        codes = check_contract(folder, gate)
    for verb, rc in codes.items():
        HISTOGRAM[verb][rc] = HISTOGRAM[verb].get(rc, 0) + 1


@pytest.mark.skipif(not GPU_TRACE.is_file(), reason="../shared/traces-public absent")
@seed(SEED + 2)
@_settings(40, 0.25)
@given(muts=st.lists(mutation(), min_size=1, max_size=4))
def test_fuzz_mutated_gpu_run_folder(muts):
    """The same contract on a GPU/NCCL recording: kernel and launch fields, flows, record_param_comms
    arguments (the EXTREMES include a negative element count and integers past 64 bits) mutated."""
    fuzz_folder(*apply([msgspec.json.decode(b) for b in _gpu_base_bytes()], None, muts))


@pytest.mark.skipif(not GPU_TRACE.is_file(), reason="../shared/traces-public absent")
@pytest.mark.parametrize("key", COMM_ARGS + DEVICE_ARGS)
def test_every_edge_value_of_a_gpu_argument(key):
    """Each argument the GPU reading takes a count, a size, an id or a stream from, set on every collective
    record (or every kernel and launch) to each edge value in turn: the contract holds for each. A
    random sample meets a given (argument, value) pair rarely; this meets them all."""
    for value in NUMERIC_EDGES + ["x", [1], {"a": 1}]:
        docs = [msgspec.json.decode(b) for b in _gpu_base_bytes()]
        docs, _, opts = apply(docs, None, [("comm_arg" if key in COMM_ARGS else "device_arg", 0, value, 0, 0.0)])
        for doc in docs:  # the key under test, on both ranks (apply picks a key at random)
            for e in doc["traceEvents"]:
                if isinstance(e.get("args"), dict) and (("Collective name" in e["args"]) if key in COMM_ARGS else
                                                        e.get("cat") in ("kernel", "cuda_runtime", "gpu_memcpy")):
                    e["args"][key] = value
        # analyze only: check reads the same analysis (the random tests run both)
        fuzz_folder(docs, None, opts, gate=False)


@seed(SEED + 1)
@_settings(100, 0.25)
@given(muts=st.lists(mutation(), min_size=1, max_size=3), as_list=st.booleans())
def test_fuzz_single_file(muts, as_list):
    """One rank's file alone, as a Kineto document or as a bare event list."""
    r0, r1, _ = base_run()
    docs, _, opts = apply([r0, r1], None, muts)
    doc = docs[0]
    if as_list and isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        doc = doc["traceEvents"]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "trace.json"
        data = encode(doc)
        if opts["truncate"]:
            data = data[: int(len(data) * opts["truncate"][1])]
        p.write_bytes((b"\xef\xbb\xbf" if opts["bom"] else b"") + data)
        codes = check_contract(p)
    for verb, rc in codes.items():
        HISTOGRAM[verb][rc] = HISTOGRAM[verb].get(rc, 0) + 1


def test_fuzz_report_histogram():
    """Prints the exit-code histogram of the examples above (read with -s; docs/fuzzing.md records it)."""
    if EXAMPLES:
        print(f"\nfuzz: seed {SEED}, exit codes {json.dumps(HISTOGRAM)}")


@pytest.mark.parametrize("payload", ["\x1b[2J\x1b]0;t\x07\x1b]52;c;eA==\x07", "\x9b31m\x00\x08\x7f\r\u202e",
                                     "\udc9b\x1b[201~\x1bP+q\x1b\\"])
def test_control_text_in_every_string_field(payload):
    """The text mutation on every string field of both ranks, the manifest and the folder name at once
    (the random tests meet it on one rank or a share of fields)."""
    r0, r1, manifest = base_run()
    docs, manifest, opts = apply([r0, r1], manifest, [("text", 0, None, 0, 1.0)])
    docs = [with_text(d, payload, 1.0, None) for d in docs]
    fuzz_folder(docs, with_text(manifest, payload, 1.0, None), dict(opts, folder=payload.replace("\x00", "")
                                                                    .replace("\udc9b", "")))
