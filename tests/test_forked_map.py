"""The local map in forked workers (``engines.local._forked_map``): the same results as one process and as
a process pool, errors and dead workers reported for the rank they hit, no worker left behind."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdpdoctor.analysis import rankresult
from fsdpdoctor.engines import SerialEngine, local, make_engine
from fsdpdoctor.engines import forking
from fsdpdoctor.errors import InputError
from fsdpdoctor.pipeline import RankUnit, rank_step
from bundled import TRACES  # the committed traces, in a pristine copy


pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    """The forked map itself is tested here, in whatever this test process holds (an OpenMP pool of an
    earlier torch test, OpenBLAS's thread): forking is taken to be safe; when it is, is tested in
    tests/test_split.py. The workers here run no OpenMP nor anything that locks."""
    monkeypatch.setattr(forking, "other_threads", lambda: 0)


def _units(*runs: str) -> list[RankUnit]:
    return [RankUnit((str(f),)) for run in runs for f in sorted((TRACES / run).glob("rank*.json.gz"))]


def _by_file(pairs) -> dict[str, list]:
    """unit -> decoded results (RankResult structs compare by value)."""
    return {u.files[0]: [rankresult.decode(o.result) for o in res] for u, res in pairs}


def _children() -> set[int]:
    """Process ids of this process's living children (Linux /proc)."""
    me = str(os.getpid())
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


@pytest.mark.parametrize("workers", [2, 3])
def test_forked_map_equals_serial_and_pool(workers):
    units = _units("straggler", "ddp_default", "fsdp2_default")  # 6 ranks: workers claim several each
    serial = _by_file(SerialEngine().map(rank_step, units))
    forked = list(local._forked_map(rank_step, units, workers))
    assert len(forked) == len(units)  # every rank once
    assert _by_file(forked) == serial
    assert _by_file(local._pool_map(rank_step, units, workers)) == serial


def test_small_runs_use_the_forked_workers_when_forking_is_safe(monkeypatch):
    assert isinstance(make_engine(None, None, 10_000, 2), local.LocalEngine)
    assert isinstance(make_engine(None, 1, 10_000, 2), SerialEngine)
    assert isinstance(make_engine(None, None, 10_000, 1), SerialEngine)
    monkeypatch.setattr(forking, "other_threads", lambda: 1)   # another thread: no fork, and no pool either
    assert isinstance(make_engine(None, None, 10_000, 2), SerialEngine)


def test_an_error_in_a_worker_is_raised_for_its_rank(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(TRACES / "ddp_default", run)
    (run / "rank1.json.gz").write_bytes(b"\x1f\x8b not gzip at all")
    units = [RankUnit((str(run / "rank0.json.gz"),)), RankUnit((str(run / "rank1.json.gz"),))]
    before = _children()
    with pytest.raises(InputError, match="rank1.json.gz: corrupt or truncated gzip"):
        list(local._forked_map(rank_step, units, 2))
    assert _children() == before


def test_a_worker_that_dies_is_named_and_nothing_hangs(monkeypatch):
    parent = os.getpid()
    real = rank_step

    def dies_in_a_worker(unit, pieces=1):
        if os.getpid() != parent:
            os._exit(9)  # what the kernel's OOM killer leaves: no reply, no traceback
        time.sleep(0.3)  # the worker claims a rank meanwhile
        return real(unit, pieces)

    units = _units("straggler", "ddp_default")
    before = _children()
    t0 = time.monotonic()
    with pytest.raises(InputError, match="a worker process died while analysing this rank"):
        list(local._forked_map(dies_in_a_worker, units, 2))
    # a bound on a hang, not on speed: the parent waiting on the dead worker would never return
    assert time.monotonic() - t0 < 600
    assert _children() == before


def test_stopping_early_stops_the_workers():
    units = _units("straggler", "ddp_default", "fsdp2_default")
    before = _children()
    it = local._forked_map(rank_step, units, 3)
    first_unit, first = next(it)
    assert first_unit in units and first
    it.close()
    assert _children() == before


def test_workers_never_write_to_the_terminal(monkeypatch, capfd):
    """A worker's stdout and stderr go nowhere (the parent's may be locked by another thread at the
    fork); what it computes still comes back."""
    import warnings

    parent = os.getpid()
    real = rank_step

    def noisy(unit, pieces=1):
        if os.getpid() != parent:
            print("worker output")
            warnings.warn("worker warning", stacklevel=1)
            time.sleep(0.2)  # the parent claims one rank, the worker the other
        else:
            time.sleep(0.3)
        return real(unit, pieces)

    units = _units("ddp_default")
    got = _by_file(local._forked_map(noisy, units, 2))
    out, err = capfd.readouterr()
    assert "worker" not in out + err
    assert got == _by_file(SerialEngine().map(rank_step, units))


def test_a_stuck_worker_is_killed_and_its_rank_analysed_here(monkeypatch):
    parent = os.getpid()
    real = rank_step

    def stuck_in_a_worker(unit, pieces=1):
        if os.getpid() != parent:
            time.sleep(3600)  # as if waiting on a lock another thread held at the fork
        time.sleep(0.2)       # the worker claims a rank meanwhile
        return real(unit, pieces)

    monkeypatch.setattr(local, "_STUCK_MIN_S", 1.0)
    monkeypatch.setattr(local, "_STUCK_FACTOR", 1.0)
    units = _units("straggler", "ddp_default")
    before = _children()
    t0 = time.monotonic()
    got = list(local._forked_map(stuck_in_a_worker, units, 2))
    # a bound on a hang, not on speed: far below the 3,600 s the stuck worker holds its rank
    assert time.monotonic() - t0 < 600
    assert sorted(u.files[0] for u, _ in got) == sorted(u.files[0] for u in units)  # every rank once
    assert _by_file(got) == _by_file(SerialEngine().map(rank_step, units))
    assert _children() == before


@pytest.mark.parametrize("n", [0, 1, 5, 20_000])
def test_the_rank_queue_hands_out_every_index_once(n):
    q = local._RankQueue.of(n)
    if q is None:  # more than this system lets a pipe hold: the caller uses a process pool
        assert n > 16_384
        return
    try:
        assert [q.claim() for _ in range(n)] == list(range(n))
        assert q.claim() is None and q.claim() is None
    finally:
        q.close()


# a parent that forks a worker, waits until the worker is on its rank (the worker then sleeps an
# hour), and then leaves without any clean-up (``exits``: os._exit) or waits to be killed (``killed``)
_PARENT = """
import os, sys, time
sys.path.insert(0, {root!r})
from fsdpdoctor.engines import forking, local
out, how = sys.argv[1], sys.argv[2]
forking.other_threads = lambda: 0
parent = os.getpid()

def step(unit, pieces=1):
    if os.getpid() != parent:
        open(os.path.join(out, "worker-%d" % os.getpid()), "w").close()
        time.sleep(3600)
    while not any(n.startswith("worker-") for n in os.listdir(out)):
        time.sleep(0.05)
    if how == "exits":
        os._exit(0)
    open(os.path.join(out, "parent-waits"), "w").close()
    time.sleep(3600)

list(local._forked_map(step, [0, 1], 2))
"""


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["exits", "killed"])
def test_a_worker_dies_with_its_parent(tmp_path, how):
    """The parent ends without a word to its worker (os._exit, SIGKILL: no finally block runs): the
    worker, an hour from done, ends too instead of living on as an orphan."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(root=str(ROOT)), str(tmp_path), how])
    worker = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (tmp_path / "parent-waits").exists() and parent.poll() is None:
            time.sleep(0.05)
        if how == "killed":
            assert (tmp_path / "parent-waits").exists()
            parent.kill()
        assert parent.wait(timeout=60) == (0 if how == "exits" else -signal.SIGKILL)
        (worker,) = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        deadline = time.monotonic() + 30
        while not _ended(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(worker), f"worker {worker} outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if worker is not None and not _ended(worker):
            os.kill(worker, signal.SIGKILL)


def test_beside_another_thread_a_pool_starts_from_a_fresh_process(monkeypatch):
    """Another thread alive: no fork of this process; a pool started by a fork server maps the ranks,
    and where multiprocessing cannot start one (a stderr stream whose fileno() is -1, as the TUI's), this
    process maps them itself."""
    import io

    monkeypatch.setattr(forking, "other_threads", lambda: 1)
    assert forking.pool_context().get_start_method() in ("forkserver", "spawn")
    units = _units("straggler")
    serial = _by_file(SerialEngine().map(rank_step, units))
    assert _by_file(local.LocalEngine(2).map(rank_step, units)) == serial

    class NoDescriptor(io.StringIO):
        def fileno(self):
            return -1

    monkeypatch.setattr(sys, "stderr", NoDescriptor())
    assert not local._pool_can_start()
    assert _by_file(local.LocalEngine(2).map(rank_step, units)) == serial
