"""A run folder is owned by one job, a trigger request is honoured once, and a window the job ends
before leaves nothing (issue 33 items 2, 3, 6). Single processes and forked ones, no torchrun."""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import queue
import subprocess
import sys
import re
import threading
import time
import warnings
from pathlib import Path

import fsdpdoctor
from capture_kit import tiny_training
from conftest import requires_torch

REPO = Path(__file__).resolve().parents[1]
JOBS = 12


def cli(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _fresh_context():
    """Processes started by a fork server (a fresh process that imported torch and ran nothing), never
    forked from this one: a test before may have run torch here, and a fork of a process whose OpenMP
    pool is started inherits the pool's state but not its threads; the child's first matrix product
    then waits for them forever (gomp_team_barrier_wait: the two-rank tests' ranks that never answered)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "fsdpdoctor.capture"])
    return ctx


def _gather(procs: list, results, timeout: float = 600.0) -> list:
    """One result per process; fails at once when a process ends with an error (its traceback is on
    stderr) instead of waiting for an answer that cannot come. No process outlives the call."""
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(procs):
            try:
                got.append(results.get(timeout=0.5))
                continue
            except queue.Empty:
                pass
            failed = {p.name: p.exitcode for p in procs if p.exitcode not in (None, 0)}
            assert not failed, f"processes failed: {failed}"
            assert time.monotonic() < deadline, f"{len(procs) - len(got)} processes silent after {timeout:.0f} s"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return got


def _claimant(out: str, start, hold, results) -> None:
    from fsdpdoctor.capture import capture

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(out, fixed_window=False)
        start.wait(timeout=300)      # every job starts at the same instant
        cap.start()
        hold.wait(timeout=300)       # and holds its folder until all have claimed one
        cap.close()
    results.put((str(cap.out_dir), [str(w.message) for w in caught]))


@requires_torch
def test_jobs_claiming_one_folder_at_the_same_instant_get_one_each(tmp_path):
    ctx = _fresh_context()
    start, hold, results = ctx.Barrier(JOBS), ctx.Barrier(JOBS), ctx.Queue()
    out = tmp_path / "run"
    procs = [ctx.Process(target=_claimant, args=(str(out), start, hold, results)) for _ in range(JOBS)]
    for p in procs:
        p.start()
    got = _gather(procs, results)
    folders = [f for f, _ in got]
    assert folders.count(str(out)) == 1 and len(set(folders)) == JOBS, sorted(folders)
    for folder, caught in got:
        moved = [m for m in caught if "in use by another running job" in m]
        assert (folder == str(out)) == (not moved), (folder, caught)
        assert not moved or moved[0].endswith(f"this job writes to {folder}")


@requires_torch
def test_a_request_the_job_cannot_remove_is_taken_once_and_named(tmp_path, monkeypatch):
    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture.windows import TAKEN_NAME, TRIGGER_NAME, write_request

    real_unlink = pathlib.Path.unlink

    def sticky(self, *args, **kwargs):  # another user's file in a sticky (1777) folder: not ours to remove
        if self.name == TRIGGER_NAME:
            raise PermissionError(1, "Operation not permitted", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "unlink", sticky)
    _, _, train_step = tiny_training(torch)

    def job(steps: int):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with capture(tmp_path, fixed_window=False) as cap:
                for i in range(steps):
                    train_step(0.005)
                    if i == 3 and not (tmp_path / TRIGGER_NAME).exists():
                        write_request(tmp_path, 2)
                    cap.step()
        return [str(w.message) for w in caught]

    caught = job(300)   # 1.5 s or more: the request is seen at three polls or more
    assert len(list(tmp_path.glob("window-*"))) == 1
    named = [m for m in caught if "cannot be removed" in m]
    assert len(named) == 1 and TRIGGER_NAME in named[0] and "not taken again" in named[0]
    # the request stays (nobody here may remove it) and so does the record that it was taken:
    # the next job on the folder does not take it either
    assert (tmp_path / TRIGGER_NAME).exists() and (tmp_path / TAKEN_NAME).exists()
    job(150)
    assert len(list(tmp_path.glob("window-*"))) == 1


def test_a_second_request_while_one_waits_is_refused_to_its_caller(tmp_path):
    from fsdpdoctor.capture.windows import TRIGGER_NAME, read_request, write_request, write_taken

    first = cli("trigger", tmp_path, "--steps", "2")
    assert first.returncode == 0, first.stderr
    pending, _ = read_request(tmp_path / TRIGGER_NAME)
    second = cli("trigger", tmp_path, "--steps", "5")
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1
    assert "a request for 2 steps" in second.stderr and "not replaced" in second.stderr
    assert read_request(tmp_path / TRIGGER_NAME)[0] == pending      # the first one stands
    # a request the job took but could not remove is replaced, and the caller is told
    write_taken(tmp_path, [pending.id])
    third = cli("trigger", tmp_path, "--steps", "5")
    assert third.returncode == 0 and "replacing a request the job took" in third.stdout
    assert read_request(tmp_path / TRIGGER_NAME)[0].steps == 5
    # two callers at the same instant: exactly one request is written, the other caller is refused
    (tmp_path / TRIGGER_NAME).unlink()
    go, outcome = threading.Barrier(8), []

    def caller():
        go.wait()
        try:
            write_request(tmp_path, 3)
            outcome.append("written")
        except FileExistsError:
            outcome.append("refused")

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcome) == ["refused"] * 7 + ["written"]


@requires_torch
def test_a_window_the_job_ends_before_leaves_no_folder(tmp_path, monkeypatch):
    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture.windows import POLL_S, write_request

    # rank 0 of two (no process group: plans go through files): a window starts a few steps after the
    # decision, time for the other ranks to learn of it, so one decided at the last step is never reached
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _, _, train_step = tiny_training(torch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(tmp_path, fixed_window=False) as cap:
            write_request(tmp_path, 2)           # a window early in the run, profiled whole
            for _ in range(4000):                # until that window is written (a loaded machine polls late)
                train_step(0.005)
                cap.step()
                if any((w / "rank0.json.gz").exists() for w in tmp_path.glob("window-*")):
                    break
            assert len(list(tmp_path.glob("window-*"))) == 1
            write_request(tmp_path, 3)           # a window planned at the last step: the job ends first
            time.sleep(1.2 * POLL_S)             # the next step() polls, plans, and the job ends
            train_step()
            cap.step()
    windows = sorted(tmp_path.glob("window-*"))
    assert len(windows) == 1 and sorted(p.name for p in windows[0].iterdir() if "summary" not in p.name) == [
        "manifest.json", "rank0.json.gz"], [p.name for p in tmp_path.rglob("*")]
    assert any(re.search(r"not profiled: the job ended at step \d+, before it", str(w.message)) for w in caught)
    assert json.loads((windows[0] / "manifest.json").read_text())["profiled_steps"]


def _window_rank(rank: int, out: str, scenario: str, barrier, go, stop, results) -> None:
    """One rank of a two-rank job without a process group (plans and reports go through files); a
    barrier per step stands for the collectives that keep ranks in step. ``late``: rank 1 learns of the
    plan only after the window's first step; ``slow-write``: rank 1's trace reaches the disk only after
    rank 0 wrote its own and looked at the folder."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", FSDPDOCTOR_NO_SUMMARY="1")
    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture import windows as _win
    from fsdpdoctor.capture.windows import write_request

    run = Path(out)
    _, _, train_step = tiny_training(torch)
    listed_absent: list[str] = []   # rank 0: files a window's manifest listed that were not on disk
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(run, fixed_window=False)
        if rank == 1 and scenario == "late":
            read = _win.Board.read
            _win.Board.read = lambda board, seq: (lambda p: p if p is None or cap.step_num > p.first else None)(
                read(board, seq))
        if rank == 1 and scenario == "slow-write":
            export = type(cap)._export

            def slow_export(self, prof, path):
                go.wait(300)
                return export(self, prof, path)

            type(cap)._export = slow_export
        with cap:
            if rank == 0:
                write_request(run, 3)
            i = 0
            while i < stop.value:
                train_step(0.005)
                barrier.wait(300)
                cap.step()
                i += 1
                if rank != 0:
                    continue
                for m in run.glob("window-*/manifest.json"):
                    listed_absent += [f for f in json.loads(m.read_text())["files"].values()
                                      if not (m.parent / f).exists()]
                    stop.value = min(stop.value, i + 20)   # both ranks see it before then (a step apart)
                if any(run.glob("window-*/rank0.json.gz")):
                    go.set()
    results.put((rank, listed_absent, [str(w.message) for w in caught]))


def _two_ranks(out: Path, scenario: str) -> dict:
    ctx = _fresh_context()
    barrier, go, stop, results = ctx.Barrier(2), ctx.Event(), ctx.Value("i", 5000), ctx.Queue()
    procs = [ctx.Process(target=_window_rank, args=(r, str(out), scenario, barrier, go, stop, results),
                         name=f"rank{r}") for r in (0, 1)]
    for p in procs:
        p.start()
    return {r: (absent, caught) for r, absent, caught in _gather(procs, results)}


@requires_torch
def test_a_window_manifest_lists_only_traces_on_disk_and_names_a_late_rank(tmp_path):
    out = tmp_path / "run"
    got = _two_ranks(out, "late")
    (win,) = out.glob("window-*")
    manifest = json.loads((win / "manifest.json").read_text())
    assert manifest["files"] == {"0": "rank0.json.gz"} and not (win / "rank1.json.gz").exists()
    first = manifest["window"]["first_step"]
    (why,) = manifest["missing_ranks"].values()
    late = re.fullmatch(rf"learned of the window at step (\d+), after its warm-up step {first - 1}", why)
    assert list(manifest["missing_ranks"]) == ["1"] and late and int(late.group(1)) > first, why
    assert any(f"learned of window-{first} at step" in w for w in got[1][1])
    assert got[0][0] == []
    notes = fsdpdoctor.analyze(win).data_quality.notes   # what analyze shows about the folder
    assert any("rank 1 profiled but its trace is missing: learned of the window" in n for n in notes), notes


@requires_torch
def test_a_window_manifest_appears_only_after_every_rank_wrote_its_trace(tmp_path):
    out = tmp_path / "run"
    got = _two_ranks(out, "slow-write")
    assert got[0][0] == [], f"a manifest listed {got[0][0]} before they were on disk"
    (win,) = out.glob("window-*")
    manifest = json.loads((win / "manifest.json").read_text())
    assert manifest["files"] == {"0": "rank0.json.gz", "1": "rank1.json.gz"} and manifest["missing_ranks"] == {}
    assert (win / "rank1.json.gz").exists() and not list(out.glob(".fsdpdoctor-plan-*"))


@requires_torch
def test_a_demand_window_waits_its_lead_in_the_fastest_recent_steps(tmp_path, monkeypatch):
    """Steps slowed by a passing load (the trigger's own start-up on a small machine) get fast again
    within the lead: counted in slow steps, the lead would end before the other ranks' next poll (the
    fresh-clone CI run's window-56 lacked rank 1's trace)."""
    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture.windows import lead_steps, write_request

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with capture(tmp_path, fixed_window=False) as cap:
        cap._coordinate(0, [0.007] * 60)        # a poll of healthy steps: no request, no plan
        assert cap._plan is None
        write_request(tmp_path, 4)
        cap.step_num = 100
        cap._coordinate(60, [0.025] * 20)       # the next poll: steps 3.5x slower while the trigger started
        assert cap._plan.first - 100 == lead_steps(0.007) > lead_steps(0.025)
        cap._plan, cap._window_at = None, -1    # the job ends here: nothing to profile
