"""`fsdpdoctor hang` on the bundled hang dumps (traces/hang_*), the dump reader without torch,
malformed dumps, the console/JSON/TUI views, and the watchdog in one process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsdpdoctor.analysis.hang import analyze_hang, is_library, user_frame
from fsdpdoctor.cli import main
from fsdpdoctor.diagnose.hang import diagnose_hang
from fsdpdoctor.trace.hang import Frame, load_hang_dumps, read_faulthandler
from bundled import TRACES, expectations  # the committed traces, in a pristine copy
from conftest import error_lines

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = expectations()
HANG_RUNS = sorted(p for p in EXPECTED if "hang" in EXPECTED[p])


@pytest.fixture(autouse=True)
def _restore_fr_env(monkeypatch):
    """The watch sets TORCH_FR_BUFFER_SIZE in this process: undo it after each test."""
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)


def check_verdict(rep, exp: dict) -> None:
    """The report's first verdict is the expected one (cause, ranks, collective, frame)."""
    assert rep.verdicts, "no verdict"
    v = rep.verdicts[0]
    assert v.cause == exp["cause"], (v.cause, v.summary)
    assert sorted(v.ranks) == sorted(exp["lagging"]), (v.ranks, v.summary)
    assert sorted(rep.silent) == sorted(exp["silent"])
    if exp["op"]:
        assert v.op == exp["op"], v.summary
    if exp["group"] and exp["cause"] in ("skipped-collective", "collective-order", "data-loader", "no-dump"):
        # the collective the ranks diverge on is in the named group
        assert exp["group"] in {d.label for d in rep.divergences} | {v.label}, v.summary
    if exp["function"]:
        assert v.frame is not None and v.frame.function == exp["function"], (v.frame, v.summary)
        # the source line is shown and exists in the job's source
        src = (ROOT / v.frame.file).read_text().splitlines() if (ROOT / v.frame.file).is_file() else None
        if src is not None:
            assert 1 <= v.frame.line <= len(src)


@pytest.mark.parametrize("run", HANG_RUNS, ids=[p.name for p in HANG_RUNS])
def test_bundled_dumps_verdict(run):
    exp = EXPECTED[run]["hang"]
    rep = diagnose_hang(analyze_hang(load_hang_dumps(run)))
    check_verdict(rep, exp)
    # the verdicts as findings, one each, on the one severity scale: a hang costs the whole step
    assert [f.id for f in rep.findings] == [f"hang-{v.cause}" for v in rep.verdicts]
    f = rep.findings[0]
    assert f.fix and f.severity == "error" and f.impact_frac == 1.0 and f.ranks == rep.verdicts[0].ranks


@pytest.mark.parametrize("run,activity,note", [
    ("hang_cut_short", "exception", "flight recorder and the exception were not saved"),
    ("hang_stopped_in_backward", "backward", "was sent SIGTERM (stacks only)"),
])
def test_a_rank_stopped_before_its_dump(run, activity, note):
    """Real runs of hang_skip_collective_default where the launcher, seeing rank 0 abort, stopped rank 1
    (SIGTERM) before its watchdog had dumped: while it wrote the dump of the exception the broken
    connection raised, or still in its backward. Rank 1's flight recorder is lost, so the verdict is
    rank 0's abort in its collective (no desync can be shown), and it says where rank 1 was and what
    is unknown; a dump being written is named as such, not as user code."""
    rep = analyze_hang(load_hang_dumps(ROOT / "tests" / "data" / run))
    v = rep.verdicts[0]
    assert (v.cause, v.ranks, v.frame.function) == ("aborted", [0], "log_metrics"), v.summary
    assert len(rep.verdicts) == 1, [x.summary for x in rep.verdicts]
    assert any(e.startswith("rank 1: stopped by the launcher") and "unknown" in e for e in v.evidence), v.evidence
    r1 = rep.ranks[1]
    assert (r1.dump, r1.trigger, r1.activity) == ("faulthandler", "sigterm", activity)
    assert note in r1.note


def test_killed_rank_with_its_peer_stopped_before_its_dump(tmp_path):
    """hang_killed_rank as it also ends under load (CI): rank 1 is SIGKILLed and torchrun stops rank 0
    before rank 0's watchdog dumped, so rank 0 leaves only SIGTERM stacks. The verdict is still rank 1
    vanished; it says where rank 0 was and that its collective is unknown. Built from the bundled run
    and the stacks of a real rank stopped that way."""
    run = tmp_path / "hang_killed_rank"
    shutil.copytree(TRACES / "hang_killed_rank", run)
    (run / "hang" / "rank0.json").unlink()
    stacks = (ROOT / "tests" / "data" / "hang_stopped_in_backward" / "hang" / "rank1.faulthandler.txt").read_text()
    (run / "hang" / "rank0.faulthandler.txt").write_text(stacks.replace("rank=1 ", "rank=0 ", 1))
    rep = analyze_hang(load_hang_dumps(run))
    v = rep.verdicts[0]
    assert (v.cause, v.ranks, rep.silent) == ("no-dump", [1], [1]), v.summary
    assert rep.ranks[0].trigger == "sigterm"
    assert any(e.startswith("rank 0: stopped by the launcher") and "unknown" in e for e in v.evidence), v.evidence


def test_bundled_scenarios_all_present():
    names = {p.name for p in HANG_RUNS}
    assert {"hang_loader", "hang_skip_collective", "hang_skip_collective_default", "hang_collective_order",
            "hang_dead_rank", "hang_rank_raises", "hang_killed_rank"} <= names


def test_reader_needs_no_torch():
    """Reading and analysing dumps works with torch unimportable."""
    run = TRACES / "hang_loader"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from fsdpdoctor.cli import main\n"
            f"rc = main(['hang', {str(run)!r}, '--json', '--no-trend'])\n"
            "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
            "raise SystemExit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["verdicts"][0]["cause"] == "data-loader" and doc["verdicts"][0]["ranks"] == [1]


def test_loader_trend_from_profiled_steps():
    """hang_loader's rank 1 slows down before it blocks: the profiled steps show it already late."""
    from fsdpdoctor.commands.hang import build_report

    rep = build_report(str(TRACES / "hang_loader"))
    assert rep.trend is not None and rep.trend.available
    assert rep.trend.straggler == 1 and rep.trend.lagging_was_straggler is True


def test_dead_rank_named_silent():
    rep = analyze_hang(load_hang_dumps(TRACES / "hang_dead_rank"))
    assert rep.silent == [1] and rep.dumped == [0]
    assert rep.ranks[1].dump is None
    # rank 0 waits inside the collective rank 1 never reached
    d = next(d for d in rep.divergences if d.label == "default_pg")
    assert d.entered == [0] and d.unknown == [1]


SIGTERM_STACKS = ("Thread 0x00007f0000000001 (most recent call first):\n"
                  '  File "/job/train.py", line 40 in wait_for_batch\n'
                  '  File "/job/train.py", line 99 in main\n'
                  '  File "/job/train.py", line 120 in <module>\n')


@pytest.mark.parametrize("header_world", [True, False], ids=["header-world-size", "older-header"])
def test_killed_rank_is_named_vanished_not_the_survivor(tmp_path, capsys, header_world):
    """SIGKILL of rank 1 (as the OOM killer does): no handler runs, its watchdog file keeps only its
    header; the launcher then sends rank 0 SIGTERM (stacks only, no world size). No manifest:
    the world comes from the files. Before: "1 of 1 ranks dumped" and rank 0 blamed."""
    from fsdpdoctor.hang_format import FaultHeader

    hang = tmp_path / "run" / "hang"
    hang.mkdir(parents=True)
    world = 2 if header_world else None
    (hang / "rank0.faulthandler.txt").write_text(FaultHeader(0, 5, 3.0, 1.0, world).line() + SIGTERM_STACKS)
    (hang / "rank1.faulthandler.txt").write_text(FaultHeader(1, 5, 3.0, 1.0, world).line())
    rep = analyze_hang(load_hang_dumps(tmp_path / "run"))
    assert rep.world_size == 2 and rep.dumped == [0] and rep.silent == [1]
    v = rep.verdicts[0]
    assert v.cause == "no-dump" and v.ranks == [1] and "vanished" in v.summary
    assert all(0 not in v.ranks for v in rep.verdicts)
    assert main(["hang", str(tmp_path / "run"), "--no-trend"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 of 2 ranks dumped, vanished: 1" in out and "rank 1: no dump" in out


def test_vanished_highest_rank_without_a_file_counted_from_the_header(tmp_path):
    """A rank that left not even a file is still in the world when another rank's header says how big it is."""
    from fsdpdoctor.hang_format import FaultHeader

    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "rank0.faulthandler.txt").write_text(FaultHeader(0, 5, 3.0, 1.0, 3).line() + SIGTERM_STACKS)
    rep = analyze_hang(load_hang_dumps(tmp_path))
    assert rep.world_size == 3 and rep.silent == [1, 2]
    assert sorted(r for v in rep.verdicts for r in v.ranks if v.cause == "no-dump") == [1, 2]


def test_header_written_and_read_by_one_format():
    from fsdpdoctor.hang_format import FaultHeader, parse_header

    h = FaultHeader(3, 12, 60.0, 1795577656.093, 8)
    assert parse_header(h.line()) == h
    # files written before the world size was in the header still read
    old = parse_header("# fsdpdoctor faulthandler rank=3 last_step=12 timeout_s=60 unix=1.0")
    assert old == FaultHeader(3, 12, 60.0, 1.0, None)
    assert parse_header("# something else") is None


def test_subset_of_dumps(tmp_path):
    """Only the waiting rank's dump: the other rank is named as silent, not guessed."""
    run = tmp_path / "run"
    (run / "hang").mkdir(parents=True)
    src = TRACES / "hang_loader" / "hang" / "rank0.json"
    (run / "hang" / "rank0.json").write_bytes(src.read_bytes())
    rep = analyze_hang(load_hang_dumps(run))
    assert rep.silent == [1]
    assert rep.verdicts[0].cause == "no-dump" and rep.verdicts[0].ranks == [1]


def test_console_and_json(capsys):
    run = TRACES / "hang_skip_collective"
    assert main(["hang", str(run), "--no-trend"]) == 0
    out = capsys.readouterr().out
    assert "skipped-collective" in out and "log_metrics" in out and "fix:" in out
    assert main(["hang", str(run), "--json", "--no-trend"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fsdpdoctor_hang_report"] == 1
    v = doc["verdicts"][0]
    assert v["cause"] == "skipped-collective" and v["ranks"] == [1] and v["frame"]["function"] == "log_metrics"


def test_analyze_mentions_hang_folder(capsys):
    assert main(["analyze", str(TRACES / "hang_loader"), "--no-progress"]) == 0
    assert "fsdpdoctor hang" in capsys.readouterr().out


# --------------------------------------------------------------------------- malformed input
def _one_line_error(capsys, path) -> str:
    rc = main(["hang", str(path), "--no-trend"])
    lines = error_lines(capsys.readouterr().err)
    assert rc == 2, lines
    assert len(lines) == 1 and lines[0].startswith("fsdpdoctor: error:"), lines
    return lines[0]


def _run_with(tmp_path, name: str, text: str) -> Path:
    run = tmp_path / "run"
    (run / "hang").mkdir(parents=True)
    (run / "hang" / name).write_text(text)
    return run


@pytest.mark.parametrize("name,text,needle", [
    ("rank0.json", '{"fsdpdoctor_hang": 1, "rank": 0, "threads": [', "not valid JSON"),
    ("rank0.json", '[1, 2]', "no fsdpdoctor_hang version"),
    ("rank0.json", '{"fsdpdoctor_hang": 9, "rank": 0}', "unsupported version"),
    ("rank0.json", '{"fsdpdoctor_hang": 1}', "rank missing"),
    ("rank0.json", '{"fsdpdoctor_hang": 1, "rank": 1}', "the file says rank 1"),
    ("rank0.json", '{"fsdpdoctor_hang": 1, "rank": 0, "flight_recorder": {"entries": [{"x": 1}]}}',
     "lacks collective_seq_id"),
    ("rank0.json", '{"fsdpdoctor_hang": 1, "rank": 0, "threads": [{"frames": [{"file": 3}]}]}', "frame lacks"),
    ("rank0.faulthandler.txt", "Thread 0x1 (most recent call first):\n", "no fsdpdoctor faulthandler header"),
    ("rank0.faulthandler.txt", "# fsdpdoctor faulthandler rank=0 last_step=3 timeout_s=5 unix=1\ngarbage\n",
     "no traceback"),
])
def test_malformed_dump_is_one_line(tmp_path, capsys, name, text, needle):
    err = _one_line_error(capsys, _run_with(tmp_path, name, text))
    assert needle in err and name in err


def test_missing_and_empty(tmp_path, capsys):
    assert "no such file" in _one_line_error(capsys, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert "no hang dumps" in _one_line_error(capsys, tmp_path / "empty")
    f = tmp_path / "file.json"
    f.write_text("{}")
    assert "not a folder" in _one_line_error(capsys, f)
    run = _run_with(tmp_path, "rank0.faulthandler.txt", "# fsdpdoctor faulthandler rank=0 last_step=3 timeout_s=5 u\n")
    assert "only empty faulthandler files" in _one_line_error(capsys, run)


def test_inputs_not_modified(capsys):
    run = TRACES / "hang_collective_order"
    before = {p: p.read_bytes() for p in (run / "hang").iterdir()}
    assert main(["hang", str(run), "--json", "--no-trend"]) == 0
    capsys.readouterr()
    assert before == {p: p.read_bytes() for p in (run / "hang").iterdir()}


# --------------------------------------------------------------------------- frames
def test_user_frame_skips_library_frames():
    frames = [Frame("train.py", 10, "<module>"), Frame("train.py", 40, "main"),
              Frame("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3000, "all_reduce"),
              Frame("/usr/lib/python3.11/threading.py", 300, "wait")]
    f, lib = user_frame(frames)
    assert (f.function, f.line, lib) == ("main", 40, "wait")
    assert is_library("/opt/venv/lib/python3.12/site-packages/x.py") and is_library("<frozen runpy>")
    assert not is_library("/home/me/project/lib/data.py")


def test_faulthandler_parse(tmp_path):
    p = tmp_path / "rank3.faulthandler.txt"
    p.write_text("# fsdpdoctor faulthandler rank=3 last_step=12 timeout_s=60 unix=1.0\n"
                 "Timeout (0:01:15)!\n"
                 "Thread 0x00007f0000000001 (most recent call first):\n"
                 '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
                 "Thread 0x00007f0000000002 (most recent call first):\n"
                 '  File "/job/native.py", line 7 in crunch\n'
                 '  File "/job/train.py", line 99 in main\n'
                 '  File "/job/train.py", line 120 in <module>\n')
    d = read_faulthandler(p)
    assert d.rank == 3 and d.last_step == 12 and d.trigger == "gil-timeout"
    main_t = d.main_thread
    assert [f.function for f in main_t.frames] == ["<module>", "main", "crunch"]


# --------------------------------------------------------------------------- the TUI
textual = pytest.importorskip("textual")


@pytest.mark.asyncio
async def test_tui_shows_verdict_and_ranks():
    from pilot import check_help_theme_quit, dump

    from fsdpdoctor.tui.hang_app import HangApp, HangHelpScreen

    rep = diagnose_hang(analyze_hang(load_hang_dumps(TRACES / "hang_loader")))
    app = HangApp(rep)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = dump(app)
        assert "data-loader" in screen and "read_shard" in screen and "fix:" in screen
        # the cursor starts on the lagging rank; moving up shows rank 0's state
        assert "rank 1:" in screen
        await pilot.press("up")
        await pilot.pause()
        assert "rank 0:" in dump(app)
        await check_help_theme_quit(app, pilot, HangHelpScreen, "pick a rank")


# --------------------------------------------------------------------------- the watchdog, in process
def test_watch_dumps_on_stall_and_not_while_stepping(tmp_path):
    from fsdpdoctor.capture.watch import watch

    out = tmp_path / "run"
    with watch(out, timeout_s=0.4) as w:
        for _ in range(10):  # 0.6 s of progress: no dump
            time.sleep(0.06)
            w.step()
        assert not (out / "hang" / "rank0.json").exists()
        deadline = time.time() + 10
        while not (out / "hang" / "rank0.json").exists() and time.time() < deadline:
            time.sleep(0.05)  # the stall (a sleep in user code)
    doc = json.loads((out / "hang" / "rank0.json").read_text())
    assert doc["trigger"] == "timeout" and doc["last_step"] == 10 and doc["seconds_since_step"] >= 0.4
    # the writer writes the document the format module declares, field for field
    from typing import get_type_hints

    from fsdpdoctor.hang_format import DumpDoc, ThreadDoc

    assert set(doc) == set(get_type_hints(DumpDoc)) and set(doc["threads"][0]) == set(get_type_hints(ThreadDoc))
    main_t = next(t for t in doc["threads"] if t["main"])
    assert any(f["function"] == "test_watch_dumps_on_stall_and_not_while_stepping" for f in main_t["frames"])
    assert not any(t["name"] == "fsdpdoctor-hang-watchdog" for t in doc["threads"])
    # close() removed the faulthandler file that held only its header
    assert not (out / "hang" / "rank0.faulthandler.txt").exists()


def test_watch_off_leaves_nothing(tmp_path):
    from fsdpdoctor.capture.watch import watch

    with watch(tmp_path / "run", timeout_s=5) as w:
        for _ in range(3):
            w.step()
    assert not (tmp_path / "run" / "hang").exists()


def test_watch_dumps_on_exception(tmp_path):
    from fsdpdoctor.capture.watch import watch

    def failing_step():
        raise KeyError("missing_batch_key")

    with pytest.raises(KeyError):
        with watch(tmp_path / "run", timeout_s=60) as w:
            w.step()
            failing_step()
    doc = json.loads((tmp_path / "run" / "hang" / "rank0.json").read_text())
    assert doc["trigger"] == "exception" and doc["exception"]["type"] == "KeyError"
    assert doc["exception"]["frames"][-1]["function"] == "failing_step"
    rep = analyze_hang(load_hang_dumps(tmp_path / "run"))
    assert rep.verdicts[0].cause == "crashed" and rep.verdicts[0].frame.function == "failing_step"


def _gil_holder_n() -> int:
    """A pattern length whose catastrophic regex backtracking (which holds the GIL) takes >= 1.5 s."""
    import re

    pat = re.compile(r"(a+)+$")
    n = 12
    while True:
        t0 = time.perf_counter()
        pat.match("a" * n + "b")
        if time.perf_counter() - t0 > 0.03:
            return n + 6  # x64
        n += 1


def test_watch_gil_held_faulthandler(tmp_path, monkeypatch):
    """A thread holding the GIL: the Python watchdog cannot run, faulthandler's C timer answers."""
    import re

    monkeypatch.setenv("RANK", "0")  # as under a launcher: the file is named by rank from the start

    from fsdpdoctor.capture.watch import watch

    n = _gil_holder_n()
    out = tmp_path / "run"
    with watch(out, timeout_s=0.3) as w:
        time.sleep(0.2)  # the watchdog arms the C timer at its first poll
        w.step()
        time.sleep(0.1)
        re.compile(r"(a+)+$").match("a" * n + "b")  # holds the GIL for seconds
        fh = (out / "hang" / "rank0.faulthandler.txt").read_text()
        time.sleep(0.5)
    assert "Timeout (" in fh and "test_watch_gil_held_faulthandler" in fh
    d = read_faulthandler(out / "hang" / "rank0.faulthandler.txt")
    assert d.trigger == "gil-timeout"
    assert threading.active_count() >= 1


def test_watch_sets_aside_a_dump_when_steps_resume(tmp_path):
    """A stall that ends (a slow checkpoint save) is not a hang: its dump is set aside."""
    from fsdpdoctor.capture.watch import watch

    out = tmp_path / "run"
    with watch(out, timeout_s=0.3) as w:
        w.step()
        deadline = time.time() + 10
        while not (out / "hang" / "rank0.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (out / "hang" / "rank0.json").exists()
        w.step()
        deadline = time.time() + 10
        while (out / "hang" / "rank0.json").exists() and time.time() < deadline:
            time.sleep(0.02)
            w.step()
    assert not (out / "hang" / "rank0.json").exists()
    assert json.loads((out / "hang" / "rank0.recovered.json").read_text())["last_step"] == 1


def test_busy_threshold_default_matches_table():
    from fsdpdoctor.analysis.hang import BUSY_RUNNABLE_SHARE
    from fsdpdoctor.diagnose.thresholds import defaults

    assert defaults()["hang_busy_runnable_share"] == BUSY_RUNNABLE_SHARE


def test_watch_tells_busy_loop_from_blocked(tmp_path):
    """A one-line spin (its line never moves) and a sleep: only the time runnable tells them apart."""
    from fsdpdoctor.analysis.hang import activity
    from fsdpdoctor.capture.watch import watch
    from fsdpdoctor.trace.hang import read_json_dump

    if not Path("/proc/self/task").is_dir():
        pytest.skip("per-thread scheduler statistics need /proc")

    def spin(out):
        while not (out / "hang" / "rank0.json").exists(): pass  # noqa: E701

    def block(out):
        while not (out / "hang" / "rank0.json").exists():
            time.sleep(0.01)

    kinds = {}
    for fn in (spin, block):
        out = tmp_path / fn.__name__
        with watch(out, timeout_s=0.3) as w:
            w.step()
            fn(out)
        d = read_json_dump(out / "hang" / "rank0.json")
        kinds[fn.__name__] = (activity(d)[0], activity(d)[1].function, d.main_runnable_share)
    assert kinds["spin"][:2] == ("busy-loop", "spin"), kinds
    assert kinds["block"][:2] == ("blocked", "block"), kinds


def _copy_run(src: Path, dst: Path) -> Path:
    (dst / "hang").mkdir(parents=True)
    for p in (src / "hang").iterdir():
        (dst / "hang" / p.name).write_bytes(p.read_bytes())
    return dst


def test_size_mismatch_at_same_seq_is_a_desync(tmp_path):
    """Change one rank's size at one recorded collective: a desync at that sequence number."""
    run = _copy_run(TRACES / "hang_collective_order", tmp_path / "run")
    p = run / "hang" / "rank1.json"
    doc = json.loads(p.read_text())
    entries = doc["flight_recorder"]["entries"]
    target = next(e for e in entries if e["profiling_name"].endswith("all_reduce") and e["collective_seq_id"] == 10
                  and e["process_group"][0] == "0")
    target["input_sizes"] = [[12345]]
    p.write_text(json.dumps(doc))
    rep = analyze_hang(load_hang_dumps(run))
    assert rep.mismatches and rep.mismatches[0].seq == 10 and rep.mismatches[0].group == "0"
    v = rep.verdicts[0]
    assert v.cause == "desync" and v.seq == 10 and "12345" in v.summary


def test_first_missing_collective_is_reported(tmp_path):
    """The waiting rank enqueued two more collectives (as NCCL's async issue allows): the divergence
    is the first one the lagging rank never entered, not the last one enqueued."""
    run = _copy_run(TRACES / "hang_loader", tmp_path / "run")
    p = run / "hang" / "rank0.json"
    doc = json.loads(p.read_text())
    fr = doc["flight_recorder"]
    last = max((e for e in fr["entries"] if e["process_group"][0] == "0"), key=lambda e: e["collective_seq_id"])
    first = last["collective_seq_id"]
    for k in (1, 2):
        fr["entries"].append({**last, "collective_seq_id": first + k, "input_sizes": [[7]]})
    fr["pg_status"]["0"]["last_enqueued_collective"] = first + 2
    p.write_text(json.dumps(doc))
    rep = analyze_hang(load_hang_dumps(run))
    d = next(d for d in rep.divergences if d.group == "0")
    assert d.seq == first and d.never_entered == [1] and d.sizes == last["input_sizes"]
    assert rep.verdicts[0].cause == "data-loader"


def test_all_ranks_stalled_outside_collectives(tmp_path):
    """Both ranks in the same user code and no divergence: the verdict names both and the frame."""
    run = _copy_run(TRACES / "hang_loader", tmp_path / "run")
    one = json.loads((run / "hang" / "rank1.json").read_text())
    zero = json.loads((run / "hang" / "rank0.json").read_text())
    one["rank"] = 0
    one["flight_recorder"] = zero["flight_recorder"]
    # rank 0 at the same point as rank 1: drop rank 0's last (unmatched) default-group collective
    fr = one["flight_recorder"]
    last = max(e["collective_seq_id"] for e in fr["entries"] if e["process_group"][0] == "0")
    fr["entries"] = [e for e in fr["entries"] if not (e["process_group"][0] == "0" and e["collective_seq_id"] == last)]
    fr["pg_status"]["0"]["last_enqueued_collective"] = last - 1
    (run / "hang" / "rank0.json").write_text(json.dumps(one))
    two = json.loads((run / "hang" / "rank1.json").read_text())
    two["flight_recorder"] = fr
    (run / "hang" / "rank1.json").write_text(json.dumps(two))
    rep = analyze_hang(load_hang_dumps(run))
    assert not rep.divergences
    v = rep.verdicts[0]
    assert v.cause == "data-loader" and v.ranks == [0, 1] and v.frame.function == "read_shard"


def test_watch_names_faulthandler_file_once_rank_known(tmp_path, monkeypatch):
    """Started before the rank is known (mp.spawn: no RANK yet), the file has a per-process name;
    the watchdog renames it to rank<N> once the rank is known, and the open descriptor follows."""
    from fsdpdoctor.capture.watch import watch

    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "run"
    w = watch(out, timeout_s=0.2).start()
    try:
        pid_files = list((out / "hang").glob(".pid*.faulthandler.txt"))
        assert len(pid_files) == 1
        monkeypatch.setenv("RANK", "3")
        w.step()
        deadline = time.time() + 5
        while not (out / "hang" / "rank3.faulthandler.txt").exists() and time.time() < deadline:
            time.sleep(0.02)
            w.step()
        assert (out / "hang" / "rank3.faulthandler.txt").exists() and not pid_files[0].exists()
    finally:
        w.close()
    assert not (out / "hang").exists()  # nothing happened: removed


def test_desync_tie_names_the_rank_with_a_new_call_site(tmp_path):
    """Two ranks disagree at one collective; the one whose collective comes from a call site it
    never used before (a barrier only it calls) is named, not both."""
    run = _copy_run(TRACES / "hang_collective_order", tmp_path / "run")
    p = run / "hang" / "rank0.json"
    doc = json.loads(p.read_text())
    e = next(e for e in doc["flight_recorder"]["entries"]
             if e["process_group"][0] == "0" and e["collective_seq_id"] == 10)
    e["profiling_name"] = "gloo:barrier"
    e["input_sizes"] = [[1]]
    e["frames"] = [{"name": "maybe_sync", "filename": "reference_jobs/hang_job.py", "line": 3},
                   *e["frames"][-2:]]  # innermost first, as torch writes them
    p.write_text(json.dumps(doc))
    rep = analyze_hang(load_hang_dumps(run))
    v = rep.verdicts[0]
    assert v.cause == "desync" and v.ranks == [0] and v.op == "barrier"
    assert v.frame.function == "maybe_sync"


def test_signature_ignores_sizes_where_ranks_may_differ():
    from fsdpdoctor.trace.hang import FrEntry

    def e(op, sizes):
        return FrEntry("0", 5, op, "nccl", sizes, sizes, ["Float"], "scheduled", False, None, [])

    assert e("all_reduce", [[8]]).signature() != e("all_reduce", [[9]]).signature()
    assert e("_allgather_base", [[8]]).signature() != e("_allgather_base", [[9]]).signature()
    assert e("reduce_scatter_tensor", [[8]]).signature() != e("reduce_scatter_tensor", [[9]]).signature()
    # uneven all-to-all splits and a gather's root are legitimate size differences
    assert e("all_to_all_single", [[8]]).signature() == e("all_to_all_single", [[9]]).signature()
    assert e("gather", [[8], [8]]).signature() == e("gather", [[8]]).signature()
    assert e("gather", [[8]]).signature() != e("all_reduce", [[8]]).signature()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="needs the [capture] extra (torch)")
def test_watch_says_when_flight_recorder_was_set_late(tmp_path, monkeypatch):
    """A process group created before the watch, with TORCH_FR_BUFFER_SIZE unset: the dump says so."""
    import socket

    import torch
    import torch.distributed as dist

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        from fsdpdoctor.capture.watch import watch

        with watch(tmp_path / "run", timeout_s=60) as w:
            dist.all_reduce(torch.ones(4))
            w.dump("timeout")
        doc = json.loads((tmp_path / "run" / "hang" / "rank0.json").read_text())
        fr = doc["flight_recorder"]
        assert fr["set_before_process_group"] is False
        assert "unset when the process group was created" in fr["note"]
        assert doc["groups"]["0"]["ranks"] == [0] and doc["groups"]["0"]["backend"] == "gloo"
        if fr["entries"]:  # torch 2.13 records by default: the all_reduce is there
            assert fr["entries"][-1]["profiling_name"].endswith("all_reduce")
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- a hang as a finding
def test_check_gates_on_a_hang_like_on_any_finding(tmp_path, capsys):
    """`check RUN` where RUN holds hang dumps: the verdict is a finding on the same scale, in the
    text, the JSON and the JUnit report."""
    run = TRACES / "hang_loader"
    junit = tmp_path / "check.xml"
    assert main(["check", str(run), "--json", "--no-progress"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert "hang-data-loader" in doc["failing"]
    (f,) = [f for f in doc["findings"] if f["id"].startswith("hang-")]
    assert f["severity"] == "error" and f["ranks"] == [1] and f["impact_frac"] == 1.0 and "read_shard" in f["source"]
    # the bar applies as to any finding: at --fail-on error the hang still fails the check
    assert main(["check", str(run), "--no-progress", "--fail-on", "error", "--junit", str(junit)]) == 1
    assert 'name="hang-data-loader"' in junit.read_text() and 'type="error"' in junit.read_text()
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL error hang-data-loader: a rank is stuck in its data loader (100% of the step)" in out


def test_check_names_unreadable_hang_dumps_and_still_checks_the_traces(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(TRACES / "ddp_default", run)
    (run / "hang").mkdir()
    (run / "hang" / "rank0.json").write_text("{not json")
    assert main(["check", str(run), "--no-progress", "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert not any(f["id"].startswith("hang-") for f in doc["findings"])
    assert len(doc["notes"]) == 1 and "hang dumps could not be read" in doc["notes"][0]


def test_hang_json_findings_replace_the_fix_in_verdicts(capsys):
    assert main(["hang", str(TRACES / "hang_skip_collective"), "--json", "--no-trend"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "fix" not in doc["verdicts"][0]
    assert [f["id"] for f in doc["findings"]] == [f"hang-{v['cause']}" for v in doc["verdicts"]]
    assert doc["findings"][0]["fix"].startswith("Make the collective unconditional")
