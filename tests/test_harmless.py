"""Harmless and unfoolable: special files are never waited on or read without end, summaries are
believed only when intact and of this very trace, writes never land on an input or break a run
folder, and what a Dask cluster sends back is checked before use (docs/trust.md)."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpdoctor.analysis import rankresult
from fsdpdoctor.pipeline import RankOutput, open_analysis
from fsdpdoctor.pipeline import rank_step as _real_rank_step
from fsdpdoctor.errors import InputError
from fsdpdoctor.report.json_report import to_json
from fsdpdoctor.trace.io import read_raw, write_atomic
from bundled import TRACES  # the committed traces, in a pristine copy

REPO = Path(__file__).resolve().parents[1]
# a verb that waited on a FIFO would wait forever: this bounds the test, not the tool
PATIENCE_S = 120


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", *args], capture_output=True, text=True, env=env,
                          timeout=PATIENCE_S, cwd=cwd)


def doc(path, **kw) -> dict:
    d = json.loads(to_json(open_analysis(path, **kw), include_events=True))
    d.pop("source")
    return d


def figures(path, **kw) -> dict:
    """The analysis without its notes on where figures came from (the rest must not change)."""
    d = doc(path, **kw)
    d["data_quality"].pop("notes")
    d["data_quality"].pop("sources")
    return d


@pytest.fixture
def run(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "straggler", folder)
    return folder


# ------------------------------------------------------------------ special files
@pytest.mark.parametrize("verb", ["analyze", "check", "export"])
def test_a_fifo_named_like_a_summary_is_skipped_with_a_note(run, verb):
    os.mkfifo(run / "rank0.summary.msgpack")
    extra = {"analyze": ["--json"], "check": ["--json"], "export": ["--no-ops", "--perfetto",
                                                                      str(run.parent / "merged.json")]}[verb]
    r = cli(verb, str(run), *extra)
    assert r.returncode in (0, 1), r.stderr  # check exits 1 on findings
    if verb != "export":
        notes = json.loads(r.stdout)["data_quality"]
        notes = notes["notes"] if verb == "analyze" else notes
        assert any("rank0.summary.msgpack not used (not a regular file (a named pipe))" in n for n in notes)


def test_a_summary_linked_to_dev_zero_is_not_read(run):
    (run / "rank0.summary.msgpack").symlink_to("/dev/zero")
    r = cli("analyze", str(run), "--json")
    assert r.returncode == 0, r.stderr
    assert any("rank0.summary.msgpack not used (a symbolic link" in n
               for n in json.loads(r.stdout)["data_quality"]["notes"])


def test_the_reading_helper_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="named pipe"):
        read_raw(fifo)  # returns at once: never opened for reading
    with pytest.raises(InputError, match="a device"):
        read_raw(Path("/dev/zero"))
    with pytest.raises(InputError, match="a folder"):
        read_raw(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(InputError, match="larger than"):
        read_raw(big, limit=1024)
    link = tmp_path / "link"
    link.symlink_to(big)
    assert read_raw(link) == big.read_bytes()
    with pytest.raises(InputError, match="symbolic link"):
        read_raw(link, follow_links=False)


def test_a_fifo_hang_dump_is_refused_in_one_line(tmp_path):
    hang = tmp_path / "run" / "hang"
    hang.mkdir(parents=True)
    os.mkfifo(hang / "rank0.json")
    r = cli("hang", str(tmp_path / "run"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "named pipe" in r.stderr, r.stderr


def test_memory_reads_only_files_inside_the_run_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(TRACES / "straggler" / "rank0.json.gz", tmp_path / "x.json.gz")
    manifest = json.loads((TRACES / "straggler" / "manifest.json").read_text())
    manifest["options"]["profile_memory"] = True
    manifest["files"] = {"0": "../x.json.gz", "1": "/etc/hostname"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    r = cli("memory", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert "rank 0: manifest names '../x.json.gz', outside the run folder: not read" in notes
    assert "rank 1: manifest names '/etc/hostname', outside the run folder: not read" in notes


def test_a_file_name_that_is_not_utf8(run):
    os.rename(run / "rank0.json.gz", os.fsencode(run) + b"/rank0\xff.json.gz")
    expected = doc(TRACES / "straggler", use_summaries=False)
    for verb in (["analyze", "--json"], ["summarize"], ["analyze", "--json"], ["analyze"]):
        r = cli(*verb, str(run))
        assert r.returncode == 0 and not r.stderr, r.stderr
    got = json.loads(cli("analyze", "--json", str(run)).stdout)
    assert got["ranks"][0]["file"].endswith("rank0\\xff.json.gz")
    assert any("rank0\\xff.summary.msgpack" in n for n in got["data_quality"]["sources"])
    for d in (got, expected):
        for r in d["ranks"]:
            r.pop("file")
    assert got["ranks"] == expected["ranks"] and got["mean"] == expected["mean"]


# ------------------------------------------------------------------ summaries you can trust
def _flips(data: bytes, n: int, seed: int = 25):
    rng = random.Random(seed)
    for _ in range(n):
        bit = rng.randrange(8 * len(data))
        b = bytearray(data)
        b[bit // 8] ^= 1 << (bit % 8)
        yield bytes(b)


def test_no_bit_flip_of_a_summary_is_believed(run):
    assert cli("summarize", "-q", str(run)).returncode == 0
    sp = run / "rank0.summary.msgpack"
    good = sp.read_bytes()
    assert rankresult.read_current(run / "rank0.json.gz")[0] is not None
    alone = run.parent / "alone"
    alone.mkdir()
    shutil.copy(run / "rank1.summary.msgpack", alone)
    for flipped in _flips(good, 150):
        sp.write_bytes(flipped)
        r, why = rankresult.read_current(run / "rank0.json.gz")
        assert r is None and why, "a damaged summary was believed"
        shutil.copy(sp, alone / sp.name)  # a summaries-only folder: nothing to re-derive from, so refused
        with pytest.raises(InputError, match="unusable summary"):
            open_analysis(alone, diagnose=False)
    # end to end, one flip: the figures are the traces' and the report says why the summary was not used
    sp.write_bytes(next(_flips(good, 1, seed=7)))
    d = doc(run)
    assert "rank0.summary.msgpack not used (damaged (its content does not match its hash))" in \
        d["data_quality"]["notes"][0]
    assert figures(run) == figures(run, use_summaries=False)
    r = cli("analyze", str(alone))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unusable summary" in r.stderr, r.stderr


def test_a_summary_of_another_run_stamped_with_this_traces_size_and_mtime_is_refused(run):
    other = run.parent / "other"
    shutil.copytree(TRACES / "dataloader_slow", other)
    assert cli("summarize", "-q", str(other)).returncode == 0
    forged = rankresult.read_file(other / "rank0.summary.msgpack")
    trace = run / "rank0.json.gz"
    st = trace.stat()
    forged.files = [rankresult.TraceStamp(path=str(trace), size=st.st_size, mtime_ns=st.st_mtime_ns,
                                          sample=forged.files[0].sample)]
    rankresult.write(forged, run / "rank0.summary.msgpack")
    d = doc(run)
    assert any("rank0.summary.msgpack not used (made from another file" in n for n in d["data_quality"]["notes"])
    assert figures(run) == figures(run, use_summaries=False)


def test_a_stale_summary_that_passes_its_stamp_is_overruled_by_the_traces(run):
    """A summary of another job's rank 1, stamped as of this very trace (a copy that kept everything):
    the checks across ranks refuse the pair, so every rank is read again from its trace."""
    other = run.parent / "other"
    shutil.copytree(TRACES / "dataloader_slow", other)
    assert cli("summarize", "-q", str(other)).returncode == 0
    stale = rankresult.read_file(other / "rank1.summary.msgpack")
    stale.files = [rankresult.TraceStamp.of(run / "rank1.json.gz")]
    rankresult.write(stale, run / "rank1.summary.msgpack")
    assert rankresult.read_current(run / "rank1.json.gz")[0] is not None  # the stamp alone would pass
    d = doc(run)
    assert any(n.startswith("rank1.summary.msgpack disagreed with the other ranks (ranks do not belong together")
               and n.endswith("every rank was read again from its trace") for n in d["data_quality"]["notes"])
    assert figures(run) == figures(run, use_summaries=False)


def test_a_stale_summary_in_a_summaries_only_folder_is_named(run):
    other = run.parent / "other"
    shutil.copytree(TRACES / "dataloader_slow", other)
    assert cli("summarize", "-q", str(run)).returncode == 0
    assert cli("summarize", "-q", str(other)).returncode == 0
    alone = run.parent / "alone"
    alone.mkdir()
    shutil.copy(run / "rank0.summary.msgpack", alone)
    shutil.copy(other / "rank1.summary.msgpack", alone)
    r = cli("analyze", str(alone))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "rank0.summary.msgpack and " in r.stderr and "rank1.summary.msgpack were recorded" in r.stderr
    assert ".json.gz" not in r.stderr  # the traces are not to blame: they are not even here


# ------------------------------------------------------------------ writes
def test_export_never_overwrites_an_input_nor_breaks_the_run_folder(run):
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for out in (run / "rank0.json.gz", run / "merged.json", run / "merged.json.gz"):
        r = cli("export", str(run), "--perfetto", str(out))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    r = cli("export", str(run / "rank0.json.gz"), "--perfetto", str(run / "rank0.json.gz"))
    assert r.returncode == 2 and "is an input of this command" in r.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert cli("analyze", str(run)).returncode == 0


def test_export_replaces_a_link_it_was_given_instead_of_writing_through_it(run, tmp_path):
    target = tmp_path / "precious.json"
    target.write_text("keep me")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    r = cli("export", str(run), "--no-ops", "--perfetto", str(link))
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "keep me" and not link.is_symlink()
    assert json.loads(link.read_text())["otherData"]["producer"] == "fsdpdoctor export --perfetto"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    dest = tmp_path / "rank0.summary.msgpack"
    dest.write_bytes(b"old")

    def full_disk(fh):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(dest, full_disk)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.summary.msgpack"]
    assert dest.read_bytes() == b"old"


def test_an_output_on_a_device_is_written_into_never_replaced(run, tmp_path):
    """`--perfetto /dev/full` run as root replaced the system's /dev/full with a plain file (a rename over
    the device node). A character device, or a link to one, is written into: here the device says the
    disk is full, which is one line and exit 2; the link and the device are left as they were."""
    import stat

    out = tmp_path / "out.json"
    out.symlink_to("/dev/full")
    r = cli("export", str(run), "--perfetto", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "No space left on device" in r.stderr
    assert out.is_symlink() and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "run"]  # no temporary file left
    if os.geteuid() == 0:  # only root makes a device node of its own: the same, on the node itself
        node = tmp_path / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        write_atomic(node, b"{}")
        assert stat.S_ISCHR(os.stat(node).st_mode)


def test_an_output_on_a_named_pipe_goes_to_its_reader(tmp_path):
    import stat
    import threading
    import time

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="nobody reads"):  # refused at once, not waited on
        write_atomic(fifo, b"x")
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    for _ in range(400):  # the reader's open must come first, or the writer is refused as above
        try:
            write_atomic(fifo, b"hello")
            break
        except InputError:
            time.sleep(0.05)
    reader.join(timeout=PATIENCE_S)
    assert got == [b"hello"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_summarize_on_a_full_disk_leaves_no_temp_file(run, monkeypatch):
    from fsdpdoctor.trace import io

    real = io.os.fdopen

    def fdopen(fd, *a, **k):
        fh = real(fd, *a, **k)
        if "w" in (a[0] if a else k.get("mode", "r")):
            def write(_):
                raise OSError(errno.ENOSPC, "No space left on device")
            fh.write = write
        return fh

    monkeypatch.setattr(io.os, "fdopen", fdopen)
    with pytest.raises(OSError):
        from fsdpdoctor.pipeline import rank_results
        rank_results(run, write_summaries=True, workers=1)
    monkeypatch.undo()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ Dask
def _not_a_summary(unit, pieces=1):
    return {"rank": 0}


def test_what_a_dask_worker_sends_back_is_checked(run, dask_address, monkeypatch):
    from fsdpdoctor import pipeline

    monkeypatch.setattr(pipeline, "rank_step", _not_a_summary)
    with pytest.raises(InputError, match="a worker sent back dict, not rank summaries"):
        open_analysis(run, dask=dask_address, use_summaries=False)
    monkeypatch.setattr(pipeline, "rank_step", lambda unit, pieces=1: [RankOutput(b"\x93not a summary")])
    with pytest.raises(InputError, match="a worker sent back not a rank summary"):
        open_analysis(run, dask=dask_address, use_summaries=False)


SENT: list = []  # what the stand-in worker below was sent (the in-process cluster runs it in this process)


def _spy(unit, pieces=1):
    SENT.append(unit.files)
    return _real_rank_step(unit, pieces)


def test_dask_is_sent_absolute_paths(run, dask_address, monkeypatch):
    from fsdpdoctor import pipeline

    SENT.clear()
    monkeypatch.chdir(run.parent)
    expected = figures(Path("run"), workers=1, use_summaries=False)
    monkeypatch.setattr(pipeline, "rank_step", _spy)
    got = figures(Path("run"), dask=dask_address, use_summaries=False)
    assert sorted(SENT) == [(str(run / "rank0.json.gz"),), (str(run / "rank1.json.gz"),)]
    assert got == expected  # the files named as given here


# ------------------------------------------------------------------ progress
def _big_trace(tmp_path: Path, gz: bool) -> Path:
    """The straggler rank 0 trace, its JSON as it is (~5 MB: read in pieces) or gzip'd."""
    import gzip

    data = gzip.decompress((TRACES / "straggler" / "rank0.json.gz").read_bytes())
    p = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    p.write_bytes(gzip.compress(data, 1) if gz else data)
    return p


@pytest.mark.parametrize("gz", [False, True])
def test_reading_a_large_trace_reports_its_bytes_to_a_terminal_bar(tmp_path, monkeypatch, gz):
    from fsdpdoctor.trace import io, split
    from fsdpdoctor.trace.loader import load_file

    monkeypatch.setattr(split, "STREAM_MIN_BYTES", 1 << 20)  # the streamed reading of a gzip trace, at this size
    path = _big_trace(tmp_path, gz)
    seen = []
    with io.showing_bytes(lambda name, done, total: seen.append((name, done, total))):
        load_file(path)
    assert len(seen) > 2 and {s[0] for s in seen} == {path.name}
    done = [s[1] for s in seen]
    assert done == sorted(done) and done[-1] == seen[-1][2]  # it moves forward, and ends at the end
    seen.clear()
    load_file(path)  # nothing asked: nothing reported
    assert not seen


def test_the_bar_asks_for_bytes_only_on_a_terminal(monkeypatch):
    from fsdpdoctor.commands.common import progress_bar
    from fsdpdoctor.trace import io

    with progress_bar(True) as cb:  # stderr is a pipe under pytest
        assert cb is None and io._byte_progress is None

    class Terminal:
        def isatty(self):
            return True

        def write(self, s):
            return len(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Terminal())
    with progress_bar(True) as cb:
        assert cb is not None and io._byte_progress is not None
    assert io._byte_progress is None
    with progress_bar(False) as cb:
        assert cb is None and io._byte_progress is None


def test_the_rate_line_of_a_slow_rank_reads_in_seconds_per_rank():
    from fsdpdoctor.pipeline import _pace

    assert _pace(1, 35.2) == "35.2 s per rank"       # was "0.0 ranks/s"
    assert _pace(256, 3.1) == "82.6 ranks/s"


# ------------------------------------------------------------------ odd environments
@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="needs the [capture] extra (torch)")
def test_the_background_summary_ignores_a_folder_named_fsdpdoctor_in_the_jobs_working_folder(tmp_path, monkeypatch):
    import torch

    from capture_kit import run_captured, tiny_training, wait_for_summary

    shadow = tmp_path / "cwd" / "fsdpdoctor"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('a checkout in the working folder, not fsdpdoctor')\n")
    monkeypatch.chdir(shadow.parent)
    model, opt, train_step = tiny_training(torch)
    out = tmp_path / "run"
    run_captured(out, train_step, model=model, optimizer=opt, wait=0, warmup=1, active=2)
    wait_for_summary(out)
    assert rankresult.read_current(out / "rank0.json.gz")[0] is not None
