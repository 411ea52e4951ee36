"""Regression cases of the session-11 fuzzing campaign: structured mutations that a byte or field
mutation (tests/test_fuzz.py) does not reach, each on a small synthetic run built here. The contract is
the fuzzer's: exit 0, 1 (check's gate) or 2; on 2 one line naming the problem, never a traceback or an
internal error; inputs unchanged; every figure finite and within its bounds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fsdpdoctor.cli import main
from conftest import error_lines


def rank_doc(rank: int = 0, world: int = 2, steps: int = 4, step_us: float = 10_000.0, t0: float = 1.0e6) -> dict:
    """A tiny Kineto CPU trace of one rank: ``steps`` ProfilerStep annotations, each holding a matmul
    and a gloo all_reduce with its record's arguments."""
    pid = 100 + rank
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "python"}}]
    for s in range(steps):
        ts = t0 + s * step_us
        ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": pid, "tid": 1,
                "ts": ts, "dur": step_us - 10},
               {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 1, "ts": ts + 100, "dur": 6000},
               {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": pid, "tid": 1, "ts": ts + 6200,
                "dur": 2000, "args": {"Collective name": "all_reduce", "In msg nelems": 1024,
                                      "Out msg nelems": 1024, "dtype": "Float", "Group size": world}}]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
            "traceEvents": ev}


def write_run(folder: Path, docs: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, doc in enumerate(docs):
        (folder / f"rank{r}.json").write_text(json.dumps(doc))
    return folder


def digest(root: Path) -> dict[str, str]:
    paths = [root] if root.is_file() else sorted(root.rglob("*"))
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def run(capsys, *argv: str, ok=(0, 2)) -> tuple[int, str, str]:
    """One verb under the contract."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc in ok, (rc, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        assert len(error_lines(err)) == 1, err
    return rc, out, err


def test_step_number_beyond_64_bits_is_no_step_marker(tmp_path, capsys):
    """``ProfilerStep#`` followed by 31 digits was an internal error (the per-rank summary's encoder
    cannot hold the number); no step counter torch keeps reaches it, so the annotation is not read as
    a step."""
    docs = [rank_doc(r) for r in range(2)]
    for d in docs:
        for i, e in enumerate(e for e in d["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")):
            e["name"] = f"ProfilerStep#{10 ** 30 + i}"
    run_dir = write_run(tmp_path / "run", docs)
    before = digest(run_dir)
    rc, out, _ = run(capsys, "analyze", "--json", "--no-progress", str(run_dir))
    assert rc == 0
    assert all(s.get("step") is None or s["step"] < 2 ** 63 for r in json.loads(out)["ranks"] for s in r["steps"])
    run(capsys, "check", "--no-progress", str(run_dir), ok=(0, 1))
    assert digest(run_dir) == before


def _saved(tmp_path: Path, capsys) -> tuple[Path, dict]:
    run_dir = write_run(tmp_path / "run", [rank_doc(r) for r in range(2)])
    _, out, _ = run(capsys, "analyze", "--json", "--no-progress", str(run_dir))
    saved = tmp_path / "saved.json"
    saved.write_text(out)
    return saved, json.loads(out)


def test_saved_json_reads_back_unchanged(tmp_path, capsys):
    saved, doc = _saved(tmp_path, capsys)
    _, out, _ = run(capsys, "analyze", "--json", "--no-progress", str(saved))
    assert json.loads(out) == doc


def test_saved_json_with_impossible_figures_is_refused(tmp_path, capsys):
    """A saved ``--json`` was shown, gated on and compared as it was: an edited document with a share of
    2.5, a negative idle time or an infinite step (1e400) came out of analyze, check and diff as
    figures. It is held to the invariants every fresh analysis is held to, and refused naming the
    first figure."""
    saved, doc = _saved(tmp_path, capsys)
    cases = [("ranks", 0, "steps", 0, "idle_us", -1.0, "idle_us is -1.0"),
             ("ranks", 1, "steps", 1, "duration_us", "1e400", "duration_us is inf"),
             ("straggler", "last_fraction", 2.5, "last-arrival share is 2.5"),
             ("straggler", "spread_frac", 1e300, "spread_frac is 1e+300"),
             ("ranks", 0, "mean", "compute_us", 1e300, "step-adds-up")]
    for *where, value, said in cases:
        d = json.loads(json.dumps(doc))
        t = d
        for k in where[:-1]:
            t = t[k]
        t[where[-1]] = "@@" if value == "1e400" else value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(d).replace('"@@"', "1e400"))
        before = digest(bad)
        for argv in (["analyze", "--json", "--no-progress"], ["check", "--no-progress"]):
            rc, _, err = run(capsys, *argv, str(bad))
            assert rc == 2 and "edited?" in err and said in err, (where, err)
        rc, _, err = run(capsys, "diff", "--json", str(saved), str(bad), ok=(2,))
        assert "edited?" in err
        assert digest(bad) == before


def test_selection_flags_read_as_numbers_or_refused(tmp_path, capsys):
    """``--rank ²`` was an internal error ("²".isdigit() holds, int("²") raises); ``--steps`` with a step
    number past 2^64 was one too (the per-rank summary's encoder); ``--steps 0-99999999999`` built a set
    of 10^11 step numbers (memory and time without bound). Each is one line and exit 2 now."""
    run_dir = write_run(tmp_path / "run", [rank_doc(r) for r in range(2)])
    for flag, value, said in [("--rank", "²", "--rank"), ("--steps", "99999999999999999999", "--steps"),
                              ("--steps", "0-99999999999", "more than 1,000,000 steps"), ("--steps", "٣", "--steps")]:
        rc, _, err = run(capsys, "analyze", "--json", "--no-progress", flag, value, str(run_dir))
        assert rc == 2 and said in err, (flag, value, err)
    rc, out, _ = run(capsys, "analyze", "--json", "--no-progress", "--steps", " 2-3 ,4", str(run_dir))
    assert rc == 0 and {s["step"] for r in json.loads(out)["ranks"] for s in r["steps"]} == {2, 3, 4}


def test_thresholds_outside_their_meaning_are_refused(tmp_path, capsys):
    """``--threshold severity_warning_frac=0`` was an internal error (ZeroDivisionError); NaN or inf made
    every comparison false or true. A bar is a finite number above 0, a share at most 1, a probability
    below 1: from the command line and from a --config file alike."""
    run_dir = write_run(tmp_path / "run", [rank_doc(r) for r in range(2)])
    for item in ["severity_warning_frac=0", "severity_warning_frac=nan", "exposed_comm_frac=1.5",
                 "impact_confidence=1", "straggler_noise_z=inf", "small_message_bytes=-1"]:
        rc, _, err = run(capsys, "check", "--no-progress", "--threshold", item, str(run_dir), ok=(2,))
        assert item.split("=")[0] in err, err
    cfg = tmp_path / "th.json"
    cfg.write_text(json.dumps({"thresholds": {"severity_warning_frac": 0}}))
    rc, _, err = run(capsys, "check", "--no-progress", "--config", str(cfg), str(run_dir), ok=(2,))
    assert "severity_warning_frac" in err
    run(capsys, "check", "--no-progress", "--threshold", "severity_error_frac=1", "--threshold",
        "scaling_efficiency_low=10", str(run_dir), ok=(0, 1))


def test_step_series_records_off_the_writers_sequence_are_left_out(tmp_path, capsys):
    """A step-series file doubled (written twice over) or with one step number damaged crashed the plot
    (IndexError: it takes the steps as ascending). The writer numbers records one step apart, each
    starting where the previous ended; a record off that sequence is left out and counted in a note."""
    from fsdpdoctor.capture.series import encode_header, encode_records, read_series

    ends = [int(1e9 + i * 5e7) for i in range(1, 41)]
    good = encode_header(0, 2, 1_700_000_000 * 10 ** 9, 1) + encode_records(1, ends, int(1e9), 0, {})
    damaged = bytearray(good)
    damaged[40 + 20 * 10:40 + 20 * 10 + 4] = (4_000_000_000).to_bytes(4, "little")  # step of record 10
    for name, data, dropped in [("doubled", good + good[40:], 40), ("damaged", bytes(damaged), 1)]:
        run_dir = tmp_path / name
        (run_dir / "steps").mkdir(parents=True)
        (run_dir / "steps" / "rank0.steps").write_bytes(data)
        s = read_series(run_dir / "steps" / "rank0.steps")
        assert s.dropped == dropped and s.steps == sorted(set(s.steps)) and len(s.steps) == 40 - (name == "damaged")
        before = digest(run_dir)
        run(capsys, "steps", "--width", "80", str(run_dir), ok=(0,))
        rc, out, _ = run(capsys, "steps", "--json", str(run_dir), ok=(0,))
        assert f"{dropped} record(s) out of the writer's step sequence" in out
        assert digest(run_dir) == before


def test_scaling_work_per_step_is_a_finite_positive_number(tmp_path, capsys):
    """``scaling --samples-per-step nan`` (or inf, 1e400) printed NaN/Infinity as work per step and
    throughput in --json (``nan <= 0`` is false, so the check let it through)."""
    one = write_run(tmp_path / "w1", [rank_doc(0, world=1)])
    two = write_run(tmp_path / "w2", [rank_doc(r, world=2) for r in range(2)])
    for value in ("nan", "inf", "1e400", "0"):
        rc, _, err = run(capsys, "scaling", "--json", "--samples-per-step", value, str(one), str(two), ok=(2,))
        assert "positive number" in err
    rc, out, _ = run(capsys, "scaling", "--json", "--samples-per-step", "8", str(one), str(two), ok=(0,))
    assert [r["work_per_step"] for r in json.loads(out)["runs"]] == [8.0, 16.0]


def test_hang_dump_counters_are_whole_non_negative_numbers(tmp_path, capsys):
    """A flight-recorder entry with collective_seq_id -5 was shown as the collective where the ranks
    diverge (``"seq": -5`` in --json); 2^70, true and 1.5 were read as numbers too. The dump's counters,
    ids and clock readings are whole numbers in [0, 2^63): anything else is no reading, and an entry
    without its sequence number is refused in one line."""
    def dump(seq) -> str:
        return json.dumps({"fsdpdoctor_hang": 1, "rank": 0, "world_size": 1, "flight_recorder": {"entries": [
            {"collective_seq_id": seq, "profiling_name": "gloo:all_reduce", "process_group": ["0", "default_pg"],
             "state": "scheduled"}]}})
    for seq in (-5, 2 ** 70, True, 1.5, "x"):
        run_dir = tmp_path / f"run{seq}"
        (run_dir / "hang").mkdir(parents=True)
        (run_dir / "hang" / "rank0.json").write_text(dump(seq))
        rc, _, err = run(capsys, "hang", "--json", str(run_dir), ok=(2,))
        assert "collective_seq_id" in err
    (run_dir / "hang" / "rank0.json").write_text(dump("7"))
    rc, out, _ = run(capsys, "hang", "--json", str(run_dir), ok=(0,))   # as text: read
    assert json.loads(out)["ranks"][0]["current"]["seq"] == 7


def test_outputs_never_replace_a_device_a_pipe_or_a_link_to_one(tmp_path, capsys):
    """``export --perfetto /dev/full`` (run as root by the campaign) renamed the trace over the machine's
    /dev/full, leaving a regular file there and exit 0; /dev/null or /dev/stdout would have gone the same
    way. Every output goes through trace/io.write_atomic, which now replaces only a regular file (or a
    link to one) and writes into a device or pipe as it stands; a pipe nobody reads is refused at once.
    Checked on a named pipe and a link to it, never on /dev itself (tests/test_harmless.py: devices)."""
    import os
    import stat

    from fsdpdoctor.api import analyze, save_json

    run_dir = write_run(tmp_path / "run", [rank_doc(r) for r in range(2)])
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "out.json"
    link.symlink_to(fifo)
    for target in (fifo, link):
        rc, _, err = run(capsys, "export", "--no-progress", "--perfetto", str(target), str(run_dir), ok=(2,))
        assert "named pipe that nobody reads" in err
    rc, _, err = run(capsys, "check", "--no-progress", "--junit", str(fifo), str(run_dir), ok=(2,))
    assert "named pipe" in err
    try:
        save_json(analyze(run_dir), link)
    except Exception as exc:  # the notebook API raises the same InputError
        assert "named pipe" in str(exc)
    else:
        raise AssertionError("save_json replaced a link to a named pipe")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    # a link to a regular file is still replaced (never written through), as before
    regular = tmp_path / "target.json"
    regular.write_text("{}")
    other = tmp_path / "other.json"
    other.symlink_to(regular)
    run(capsys, "export", "--no-progress", "--perfetto", str(other), str(run_dir), ok=(0,))
    assert not other.is_symlink() and regular.read_text() == "{}"


def test_a_wrong_flag_or_value_is_one_line(capsys):
    """argparse printed its usage block before the error (``trigger --steps 1e3``: two lines and more);
    a wrong flag, value or verb is one line and exit 2, as every other bad input, its text made visible."""
    import pytest

    for argv, said in [(["trigger", "--steps", "1e3", "x"], "invalid int value: '1e3'"),
                       (["diff", "--base-window", "a", "x", "y"], "--base-window"),
                       (["anlyze", "x"], "invalid choice: 'anlyze'"),
                       (["analyze", "--bogus", "x"], "unrecognized arguments: --bogus"),
                       (["analyze", "--jobs", "\x1b]0;t\x07", "x"], "\\x1b"),
                       (["analyze"], "required")]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(error_lines(err)) == 1 and said in err, (argv, err)
        assert "\x1b" not in err and "--help" in err


def test_a_step_series_under_another_ranks_name_is_skipped(tmp_path, capsys):
    """rank7.steps holding rank 0's series (a copy) was plotted as a second rank 0, without a word; the
    writer names each file by its rank, so a file whose header says otherwise is skipped and named."""
    from fsdpdoctor.capture.series import encode_header, encode_records

    (tmp_path / "steps").mkdir()
    for r in (0, 1):
        data = encode_header(r, 2, 1_700_000_000 * 10 ** 9, 1) + encode_records(1, [2 * 10 ** 9, 3 * 10 ** 9],
                                                                                 10 ** 9, 0, {})
        (tmp_path / "steps" / f"rank{r}.steps").write_bytes(data)
    (tmp_path / "steps" / "rank7.steps").write_bytes((tmp_path / "steps" / "rank0.steps").read_bytes())
    rc, out, _ = run(capsys, "steps", "--json", str(tmp_path), ok=(0,))
    doc = json.loads(out)
    assert [s["rank"] for s in doc["ranks"]] == [0, 1]
    assert any("rank7.steps" in n and "says rank 0" in n for n in doc["notes"])
