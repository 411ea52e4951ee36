"""A run folder is owned by one job, a trigger request is honoured once, and a window the job ends
before leaves nothing (issue 33 items 2, 3, 6). Single processes and forked ones, no torchrun."""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import re
import threading
import time
import warnings
from pathlib import Path

from capture_kit import tiny_training
from conftest import requires_torch

REPO = Path(__file__).resolve().parents[1]
JOBS = 12


def cli(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _claimant(out: str, start, hold, results) -> None:
    from fsdpdoctor.capture import capture

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture(out, fixed_window=False)
        start.wait(timeout=60)       # every job starts at the same instant
        cap.start()
        hold.wait(timeout=60)        # and holds its folder until all have claimed one
        cap.close()
    results.put((str(cap.out_dir), [str(w.message) for w in caught]))


@requires_torch
def test_jobs_claiming_one_folder_at_the_same_instant_get_one_each(tmp_path):
    import torch  # noqa: F401  (imported before the fork: the children start at once)

    ctx = multiprocessing.get_context("fork")
    start, hold, results = ctx.Barrier(JOBS), ctx.Barrier(JOBS), ctx.Queue()
    out = tmp_path / "run"
    procs = [ctx.Process(target=_claimant, args=(str(out), start, hold, results)) for _ in range(JOBS)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
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
