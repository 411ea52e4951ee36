"""Capture armed for the whole run: step series, windows on demand and on anomaly, interrupted windows,
two jobs in one folder. Single process (fast) and the drift reference job under torchrun (slow)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from capture_kit import run_captured, tiny_training
from conftest import error_lines, requires_torch
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

REPO = Path(__file__).resolve().parents[1]


def cli(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "fsdpdoctor", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def step_numbers(path: Path) -> list[int]:
    doc = json.loads(gzip.open(path).read())
    return sorted({int(e["name"].split("#")[1]) for e in doc["traceEvents"]
                   if str(e.get("name", "")).startswith("ProfilerStep#")})


# ------------------------------------------------------------------ the step series and `steps`
@requires_torch
def test_step_series_holds_every_step_and_steps_plots_it(tmp_path):
    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture.series import read_series

    m, opt, train_step = tiny_training(torch)
    with capture(tmp_path, model=m, fixed_window=False) as cap:
        for i in cap.batches(range(40)):
            train_step(0.002 if i < 30 else 0.02)
            cap.step()
    s = read_series(tmp_path / "steps" / "rank0.steps")
    assert s.steps == list(range(40)) and not s.cut
    # the change at step 30 is in the series, on the right steps: each of them sleeps 20 ms (a lower
    # bound whatever the machine's load; no comparison with the faster steps, which a busy machine slows)
    assert min(s.duration_s[30:]) >= 0.02
    assert all(w is not None and w >= 0 for w in s.wait_s)
    assert all(b >= a for a, b in zip(s.start_s, s.start_s[1:]))
    out = cli("steps", tmp_path)
    assert out.returncode == 0, out.stderr
    assert max(map(len, out.stdout.splitlines())) <= 80
    doc = json.loads(cli("steps", tmp_path, "--json").stdout)
    assert doc["ranks"][0]["steps"] == list(range(40))
    # a series cut mid-record (killed while writing) keeps its whole records and says so
    with open(tmp_path / "steps" / "rank0.steps", "ab") as fh:
        fh.write(b"\x01\x02\x03")
    cut = read_series(tmp_path / "steps" / "rank0.steps")
    assert cut.cut and cut.steps == list(range(40))
    assert "ends inside a record" in cli("steps", tmp_path).stdout


def test_steps_and_trigger_refuse_bad_input_in_one_line(tmp_path):
    for argv in (("steps", tmp_path), ("steps", tmp_path / "nope"), ("trigger", tmp_path / "nope"),
                 ("trigger", tmp_path, "--steps", "0"), ("analyze", BUNDLED / "straggler", "--window", "3")):
        out = cli(*argv)
        assert out.returncode == 2 and len(error_lines(out.stderr)) == 1, (argv, out.stderr)
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "rank0.steps").write_bytes(b"not a series" * 10)
    out = cli("steps", tmp_path)
    assert out.returncode == 2 and "not a step series" in out.stderr


# ------------------------------------------------------------------ windows on demand / on anomaly
@requires_torch
def test_trigger_and_anomaly_windows_in_one_process(tmp_path):
    import torch

    from fsdpdoctor.capture import capture

    m, opt, train_step = tiny_training(torch)
    # min_rise=3: only steps 4x slower in their own time count, so that the load of a shared test machine on
    # 10 ms steps does not open a window before the 10x change at step 100 (at min_rise=2 a busy machine's
    # step 96 once did)
    with capture(tmp_path, model=m, optimizer=opt, fixed_window=False, auto=True, window_steps=2,
                 min_rise=3.0) as cap:
        for i in range(150):
            train_step(0.01 if i < 100 else 0.1)
            if i == 10:
                assert cli("trigger", tmp_path, "--steps", "3").returncode == 0
            cap.step()
    wins = sorted(tmp_path.glob("window-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(wins) == 2, [p.name for p in wins]
    demand, anomaly = (json.loads((w / "manifest.json").read_text()) for w in wins)
    first = demand["window"]["first_step"]
    assert demand["window"]["trigger"] == "demand" and first > 10
    assert step_numbers(wins[0] / "rank0.json.gz") == [first, first + 1, first + 2] == demand["profiled_steps"]
    assert anomaly["window"]["trigger"] == "anomaly" and anomaly["window"]["first_step"] > 100
    assert "x its median" in anomaly["window"]["reason"] and "its own time" in anomaly["window"]["reason"]
    assert not (tmp_path / "fsdpdoctor.trigger").exists()
    # analyze RUN_DIR takes the latest window and lists the other; --window picks one
    out = cli("analyze", tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["job"]["steps"] == anomaly["profiled_steps"]
    assert any("--window" in n and f"window-{first}" in n for n in doc["notes"])
    doc = json.loads(cli("analyze", tmp_path, "--window", first, "--json").stdout)
    assert doc["job"]["steps"] == demand["profiled_steps"]


@requires_torch
def test_malformed_trigger_is_set_aside_and_training_goes_on(tmp_path):
    import torch

    from fsdpdoctor.capture import capture

    m, opt, train_step = tiny_training(torch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(tmp_path, model=m, fixed_window=False) as cap:
            for i in range(150):  # 0.75 s: the trigger file is looked at every half second
                train_step(0.005)
                if i == 5:
                    (tmp_path / "fsdpdoctor.trigger").write_text('{"fsdpdoctor_trigger": 1, "steps": "many"')
                cap.step()
    assert cap.step_num == 150 and not list(tmp_path.glob("window-*"))
    assert (tmp_path / "fsdpdoctor.trigger.rejected").exists()
    assert sum("fsdpdoctor.trigger ignored" in str(w.message) for w in caught) == 1


# the slowdown rule's own tests: tests/test_capture_slowdown.py


# ------------------------------------------------------------------ interrupted windows (#25 item 5)
@requires_torch
def test_cut_step_is_partial_in_the_manifest_and_left_out_of_the_analysis(tmp_path):
    import torch

    from fsdpdoctor.capture import capture

    _, _, train_step = tiny_training(torch)
    with pytest.raises(KeyboardInterrupt):
        with capture(tmp_path, wait=1, warmup=1, active=4) as cap:
            for i in range(8):
                train_step(0.01)
                cap.step()
                if i == 3:  # Ctrl-C in the middle of step 4 (the window is steps 2..5)
                    train_step(0.03)
                    raise KeyboardInterrupt
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["profiled_steps"] == [2, 3] and manifest["partial_steps"] == [4]
    assert 4 in step_numbers(tmp_path / "rank0.json.gz")  # the trace has it, cut
    out = cli("analyze", tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["job"]["steps"] == [2, 3]
    assert any("step 4 cut short" in n for n in doc["data_quality"]["notes"])


@requires_torch
def test_second_sigint_inside_the_export_still_writes_the_trace(tmp_path, monkeypatch):
    """torchrun delivers SIGINT again while the rank exports: the trace is still written, the job ends
    with the first KeyboardInterrupt, nothing is raised from inside the capture."""
    import torch
    from torch.profiler import profile

    from fsdpdoctor.capture import capture

    real = profile.export_chrome_trace

    def interrupted_export(self, path):
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C lands inside the export
        return real(self, path)

    monkeypatch.setattr(profile, "export_chrome_trace", interrupted_export)
    _, _, train_step = tiny_training(torch)
    with pytest.raises(KeyboardInterrupt) as info:
        with capture(tmp_path, wait=1, warmup=1, active=4) as cap:
            for i in range(8):
                train_step()
                cap.step()
                if i == 3:
                    raise KeyboardInterrupt("first")
    assert str(info.value) == "first"
    assert step_numbers(tmp_path / "rank0.json.gz")[:2] == [2, 3]
    assert not list(tmp_path.glob(".*partial*"))


@requires_torch
def test_ctrl_c_inside_the_capture_bookkeeping_is_held_and_points_at_the_job(tmp_path, monkeypatch):
    """A Ctrl-C landing while the capture polls its folder (file work between two steps) is held until
    that work is whole, then raised as the job's own interrupt: the manifest is written and the
    traceback ends at the job's ``cap.step()`` line, not inside the capture's files."""
    import traceback

    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.capture.coordinator import WindowCoordinator

    real, calls = WindowCoordinator._poll, []

    def interrupted_poll(self, now):
        calls.append(now)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # lands inside the poll
        return real(self, now)

    monkeypatch.setattr(WindowCoordinator, "_poll", interrupted_poll)
    monkeypatch.setattr("fsdpdoctor.capture.coordinator._POLL_NS", 0)   # a poll at every step
    _, _, train_step = tiny_training(torch)
    with pytest.raises(KeyboardInterrupt) as info:
        with capture(tmp_path, wait=1, warmup=1, active=6) as cap:
            for _ in range(8):
                train_step()
                cap.step()
    assert len(calls) == 2   # raised at the end of the step whose poll it landed in, not later
    files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert files and not any(os.sep + "capture" + os.sep in f and "fsdpdoctor" in f for f in files), files
    assert files[-1] == __file__
    assert json.loads((tmp_path / "manifest.json").read_text())["partial_steps"]


# ------------------------------------------------------------------ two jobs, one folder (#25 item 6)
JOB_A = """
import sys, time
from fsdpdoctor.capture import capture
with capture(sys.argv[1], fixed_window=False) as cap:
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[2]):
        time.sleep(0.01)
        cap.step()
"""


@requires_torch
def test_second_job_on_a_used_folder_writes_beside_it_with_a_warning(tmp_path):
    import torch

    from fsdpdoctor.capture import capture

    _, _, train_step = tiny_training(torch)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    job_a = subprocess.Popen([sys.executable, "-c", JOB_A, str(out), "6"], env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (out / "steps" / "rank0.steps").exists():
            time.sleep(0.1)
        b, caught = run_captured(out, train_step, wait=0, warmup=1, active=2)
        assert job_a.poll() is None, "job A ended before job B started: the test proves nothing"
    finally:
        job_a.wait(timeout=120)
    assert b.out_dir == tmp_path / "run-2"
    assert any("in use by another running job" in str(w.message) and "run-2" in str(w.message) for w in caught)
    assert step_numbers(tmp_path / "run-2" / "rank0.json.gz") == [1, 2]
    assert json.loads((tmp_path / "run-2" / "manifest.json").read_text())["profiled_steps"] == [1, 2]
    assert not (out / "rank0.json.gz").exists()   # job A's folder holds only job A's files
    # the claims are released at the end: a later job takes the folder as given
    with capture(out, fixed_window=False) as c:
        c.step()
    assert c.out_dir == out


@requires_torch
def test_temp_names_are_per_writer_and_a_full_disk_leaves_none(tmp_path, monkeypatch):
    import errno

    import torch
    from torch.profiler import profile

    from fsdpdoctor.capture import capture

    seen = []

    def full(self, path):
        seen.append(Path(path).name)
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(profile, "export_chrome_trace", full)
    _, _, train_step = tiny_training(torch)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with capture(tmp_path, wait=0, warmup=1, active=2) as cap:
            for _ in range(4):
                train_step()
                cap.step()
    assert seen and str(os.getpid()) in seen[0] and seen[0].startswith(".rank0.")
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".") and p.is_file()]


# ------------------------------------------------------------------ the drift reference job, 2 ranks
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drift(out: Path, *args, wait=True):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(REPO / "reference_jobs" / "drift.py"), "--out", str(out), *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)


def check_ok(rc: int, stderr: str, stdout: str):
    # torch 2.13 + gloo: about 1 run in 20 aborts at interpreter exit with this message, also with no
    # profiler (see test_capture.py); after rank 0 printed its last line the job's work is all done
    if rc != 0 and "terminate called without an active exception" in stderr and "steps on 2 ranks" in stdout:
        return
    assert rc == 0, "\n".join(ln for ln in stderr.splitlines() if "USDT" not in ln)[-4000:]


@requires_torch
@pytest.mark.slow
@pytest.mark.parametrize("change,cause", [("lag", ("straggler", [1])), ("loader", ("input-bound", None))])
def test_change_mid_run_opens_a_window_that_names_it(tmp_path, change, cause):
    out = tmp_path / "run"
    # a 4x slower step from step 60 (rank 1 sleeps, or its loader takes, 3 healthy steps); min_rise 1.0 so
    # that the load of a shared test machine (steps 1.5x slower for seconds) does not open a window first;
    # six profiled steps: enough for the straggler rule to tell a rank that is always last from chance.
    # The window starts a lead after the decision (by step 80, asserted below): 1.5 poll periods counted
    # in the slow steps (4x a healthy one) plus three, ~30 steps where healthy ones take 7 ms, ~10 under
    # load (window-78 of a run at load 6); with its 6 steps it ends by ~step 116 on an idle machine.
    # 180 steps leave room for healthy steps down to 4 ms (the job's steps after the window only add
    # time: 300 steps took 73 s at load 6, 240 of them 4x slow)
    proc = drift(out, "--change", change, "--change-at", 60, "--min-rise", 1.0, "--window-steps", 6,
                 "--steps", 180)
    check_ok(proc.returncode, proc.stderr, proc.stdout)
    wins = list(out.glob("window-*"))
    assert len(wins) == 1, proc.stdout
    manifest = json.loads((wins[0] / "manifest.json").read_text())
    assert manifest["window"]["trigger"] == "anomaly" and manifest["window"]["first_step"] > 60
    # the slow steps that decided end after the change and within 20 steps of it (issue 28); under load the
    # span may begin a step or two before it (a loaded step counts as slow too)
    span = re.match(r"steps (\d+)-(\d+)", manifest["window"]["reason"])
    assert span and 60 <= int(span[2]) <= 80 and int(span[1]) <= int(span[2]), manifest["window"]["reason"]
    doc = json.loads(cli("analyze", out, "--json").stdout)
    names = [(f["id"], f.get("ranks") if cause[1] else None) for f in doc["findings"]]
    assert cause in names, (names, cli("analyze", out).stdout)


@requires_torch
@pytest.mark.slow
def test_trigger_from_another_process_and_a_second_job_on_the_folder(tmp_path):
    """One healthy 2-rank job A, two checks on it (each took a 600-step job of its own):

    - the trigger: ``fsdpdoctor trigger`` from another process while A runs profiles the same steps on
      both ranks. The trigger's CLI starts while the job runs (a second or more on a loaded machine),
      then the window waits a lead of two poll periods in steps (~150 steps of 7 ms on an idle machine
      here: window-246 of 400): 600 steps leave room for both (160 did not: no window before the end).
    - a second torchrun job B aimed at A's folder: B's rank 0 finds the folder held and moves to run-2;
      its rank 1 learns that through the store, so both of its ranks write beside A's files, never
      over them. B starts as soon as A's rank 1 has a series, as it did alone."""
    out = tmp_path / "run"
    job = drift(out, "--change", "none", "--no-auto", "--steps", 600, wait=False)
    b = None
    try:
        series = out / "steps" / "rank0.steps"
        deadline = time.time() + 200
        while time.time() < deadline and not (out / "steps" / "rank1.steps").exists():
            time.sleep(0.2)
        b = drift(out, "--change", "none", "--no-auto", "--steps", 60, wait=False)
        while time.time() < deadline and (not series.exists() or series.stat().st_size < 40 + 20 * 20):
            time.sleep(0.2)
        assert series.exists(), "the job wrote no step series"
        trig = cli("trigger", out, "--steps", 4)
        assert trig.returncode == 0 and "rank 0 takes it" in trig.stdout, trig.stdout + trig.stderr
        b_out, b_err = b.communicate(timeout=400)
        assert job.poll() is None, "job A ended before job B did: the second-job check proves nothing"
        stdout, stderr = job.communicate(timeout=400)
    finally:
        for p in (job, b):
            if p is not None and p.poll() is None:
                p.kill()
    check_ok(job.returncode, stderr, stdout)
    # the trigger: one window, the same steps on both ranks
    wins = list(out.glob("window-*"))
    assert len(wins) == 1
    first = int(wins[0].name.split("-")[1])
    steps = list(range(first, first + 4))
    manifest = json.loads((wins[0] / "manifest.json").read_text())
    # the manifest lists the traces on disk and names a rank whose trace is not (why it has none)
    assert manifest["missing_ranks"] == {} and sorted(manifest["files"]) == ["0", "1"], (manifest, stderr[-2000:])
    assert step_numbers(wins[0] / "rank0.json.gz") == steps == step_numbers(wins[0] / "rank1.json.gz")
    assert manifest["profiled_steps"] == steps
    # the second job: beside the first, each job's series whole
    check_ok(b.returncode, b_err, b_out)
    assert "in use by another running job" in b_err
    from fsdpdoctor.capture.series import read_series

    for r in (0, 1):
        assert len(read_series(out / "steps" / f"rank{r}.steps").steps) == 600
        assert len(read_series(tmp_path / "run-2" / "steps" / f"rank{r}.steps").steps) == 60
    assert not list((tmp_path / "run-2").glob("window-*"))   # the trigger reached job A only


CTRL_C_JOB = """
import sys, time, torch, torch.distributed as dist
from fsdpdoctor.capture import capture
dist.init_process_group("gloo")
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
with capture(sys.argv[1], model=m, optimizer=opt, wait=1, warmup=1, active=40) as cap:
    for i in range(100):
        m(torch.randn(32, 64)).sum().backward(); opt.step(); opt.zero_grad()
        time.sleep(0.1)
        cap.step()
        if i == 5:
            print(f"rank {dist.get_rank()} in window", flush=True)
"""


@requires_torch
@pytest.mark.slow
def test_ctrl_c_to_torchrun_inside_the_window(tmp_path):
    """The terminal's Ctrl-C reaches every process; torchrun then sends the ranks a second SIGINT. Both
    ranks write the steps recorded so far, the cut step is partial, no traceback runs through the capture."""
    script = tmp_path / "job.py"
    script.write_text(CTRL_C_JOB)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(script), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, start_new_session=True)
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if "in window" in line:
                break
        time.sleep(1.0)
        os.killpg(p.pid, signal.SIGINT)
        seen.append(p.communicate(timeout=180)[0])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = "".join(seen)
    assert "fsdpdoctor/capture" not in text, text[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    (cut,) = manifest["partial_steps"]
    assert manifest["profiled_steps"] == list(range(2, cut))
    for r in (0, 1):
        assert set(manifest["profiled_steps"]) <= set(step_numbers(out / f"rank{r}.json.gz"))
    doc = json.loads(cli("analyze", out, "--json").stdout)
    assert doc["job"]["steps"] == manifest["profiled_steps"]


@requires_torch
def test_full_disk_for_the_step_series_warns_once_and_training_goes_on(tmp_path):
    import torch

    from fsdpdoctor.capture import capture

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "rank0.steps").symlink_to("/dev/full")  # every write: ENOSPC
    _, _, train_step = tiny_training(torch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(tmp_path, fixed_window=False) as cap:
            for _ in range(120):
                train_step(0.01)
                cap.step()
    assert cap.step_num == 120
    assert sum("cannot write the step series" in str(w.message) for w in caught) == 1
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]


# ------------------------------------------------------------------ the TUI moves between windows
TRACES = BUNDLED


@pytest.mark.skipif(not (TRACES / "straggler" / "rank0.json.gz").exists(), reason="bundled traces not present")
@pytest.mark.asyncio
async def test_tui_moves_between_the_windows_of_a_run(tmp_path):
    import shutil

    pytest.importorskip("textual")
    from fsdpdoctor.tui.app import FsdpDoctorApp

    run = tmp_path / "run"
    shutil.copytree(TRACES / "straggler", run / "window-20")
    shutil.copytree(TRACES / "fsdp1_no_backward_prefetch", run / "window-300")
    for w in ("window-20", "window-300"):
        (run / w / "expected.json").unlink(missing_ok=True)
    app = FsdpDoctorApp(run)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert Path(str(app.analysis.source)).name == "window-300"   # the latest first
        await pilot.press("left_square_bracket")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.error is None and Path(str(app.analysis.source)).name == "window-20"
        assert "window-20" in app.label
        await pilot.press("left_square_bracket")   # already the first: stays
        await pilot.pause()
        assert Path(str(app.analysis.source)).name == "window-20"
        await pilot.press("right_square_bracket")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert Path(str(app.analysis.source)).name == "window-300"
        await pilot.press("s")   # no step series in this folder: a notice, no screen
        await pilot.pause()
        assert type(app.screen).__name__ != "StepsScreen"


@requires_torch
@pytest.mark.asyncio
async def test_tui_shows_the_step_series_with_its_windows(tmp_path):
    pytest.importorskip("textual")
    import torch

    from fsdpdoctor.capture import capture
    from fsdpdoctor.tui.app import FsdpDoctorApp
    from fsdpdoctor.tui.screens import StepsScreen

    m, opt, train_step = tiny_training(torch)
    with capture(tmp_path, model=m, wait=0, warmup=1, active=2) as cap:
        for _ in range(30):
            train_step(0.002)
            cap.step()
    app = FsdpDoctorApp(tmp_path)
    async with app.run_test(size=(100, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, StepsScreen)
        text = "\n".join(app.screen.lines)
        assert "step time of 1 rank" in text and "fixed schedule (top level): steps 1-2" in text


def test_a_run_with_only_its_step_series_points_at_steps_and_trigger(tmp_path):
    from fsdpdoctor.capture.series import SeriesWriter, encode_records, series_path

    w = SeriesWriter(series_path(tmp_path, 0), 0, 1, time.time_ns())
    w.append(encode_records(0, [10_000_000, 20_000_000], 0, 0, {}))
    w.close()
    out = cli("analyze", tmp_path)
    assert out.returncode == 2 and "fsdpdoctor steps" in out.stderr and len(error_lines(out.stderr)) == 1
    assert cli("steps", tmp_path).returncode == 0


@pytest.mark.skipif(not (TRACES / "straggler" / "rank0.json.gz").exists(), reason="bundled traces not present")
def test_a_window_the_job_died_in_is_named_and_skipped(tmp_path):
    import shutil

    shutil.copytree(TRACES / "straggler", tmp_path / "window-20")
    (tmp_path / "window-90").mkdir()   # killed while exporting: only a temp file of its writer
    (tmp_path / "window-90" / ".rank0.123.abcd1234.partial.json.gz").write_bytes(b"\x1f\x8b")
    out = cli("analyze", tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    note = json.loads(out.stdout)["notes"][0]
    assert "window-20" in note and "without a trace (the job ended first): window-90" in note
    out = cli("analyze", tmp_path, "--window", 90)
    assert out.returncode == 2 and "holds no trace" in out.stderr


@pytest.mark.skipif(not (TRACES / "ab" / "conv1d_sleep").is_dir(), reason="bundled traces not present")
def test_diff_compares_two_windows_of_one_run(tmp_path):
    """A healthy window and a later one where rank 1 sleeps, in one run folder: `diff RUN RUN
    --base-window A --new-window B` is the regression, as diff of the two folders is."""
    import shutil

    shutil.copytree(TRACES / "ab" / "conv1d_healthy", tmp_path / "window-20")
    shutil.copytree(TRACES / "ab" / "conv1d_sleep", tmp_path / "window-300")
    by_window = cli("diff", tmp_path, tmp_path, "--base-window", 20, "--new-window", 300, "--json",
                    "--fail-on-regression")
    by_folder = cli("diff", tmp_path / "window-20", tmp_path / "window-300", "--json", "--fail-on-regression")
    assert by_window.returncode == by_folder.returncode == 1, by_window.stderr
    a, b = json.loads(by_window.stdout), json.loads(by_folder.stdout)
    assert a["verdict"] == b["verdict"] and a["step"] == b["step"]
    # the latest window by default on both sides: the same run, nothing to tell
    same = cli("diff", tmp_path, tmp_path, "--json")
    assert same.returncode == 0 and not json.loads(same.stdout)["regressed"]
    bad = cli("diff", tmp_path, tmp_path, "--base-window", 21)
    assert bad.returncode == 2 and len(error_lines(bad.stderr)) == 1 and "windows start at: 20, 300" in bad.stderr
