"""`diff`, `scaling`, `tui` and `export` take the engine options (`--jobs N`, `--dask ADDRESS|local`,
`--no-summaries`) like `analyze`: the flags reach the engine that runs the per-rank map, and the
result does not depend on where the map ran (docs/scale-out.md).

`--no-summaries` keeps a `rank<N>.summary.msgpack` left beside a bundled trace from standing in
for the map (no engine would run at all)."""

from __future__ import annotations

import json

import pytest

from fsdpdoctor import pipeline
from fsdpdoctor.cli import main
from bundled import TRACES  # the committed traces, in a pristine copy

BASE, NEW = TRACES / "straggler", TRACES / "ddp_default"              # diff: two runs of 2 ranks
RUN1, RUN2 = TRACES / "scaling_1proc", TRACES / "scaling_2proc"        # scaling: one job at 1 and 2 ranks


@pytest.fixture
def engines(monkeypatch) -> list[tuple[str | None, int | None, int, str]]:
    """Every engine the pipeline makes: (dask, workers, ranks to map, engine class); the real engine runs."""
    made = []
    real = pipeline.make_engine

    def spy(dask=None, workers=None, total_bytes=None, n_units=0):
        engine = real(dask, workers, total_bytes, n_units)
        made.append((dask, workers, n_units, type(engine).__name__))
        return engine

    monkeypatch.setattr(pipeline, "make_engine", spy)
    return made


def cli_json(capsys, *argv: str) -> dict:
    rc = main(list(argv))
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


# ------------------------------------------------------------------ diff
def test_diff_same_json_with_one_and_two_jobs(capsys, engines):
    argv = ("diff", str(BASE), str(NEW), "--json", "--no-summaries")
    serial = cli_json(capsys, *argv, "--jobs", "1")
    assert engines == [(None, 1, 2, "SerialEngine")] * 2               # both sides, in this process
    engines.clear()
    pool = cli_json(capsys, *argv, "--jobs", "2")
    assert engines == [(None, 2, 2, "LocalEngine")] * 2                # both sides, in a pool of 2
    assert pool == serial
    assert serial["verdict"] == "improvement" and serial["base_step_us"] > serial["new_step_us"] > 0


def test_diff_saved_json_side_needs_no_engine(capsys, engines, tmp_path):
    saved = tmp_path / "base.json"
    assert main(["analyze", str(BASE), "--json", "--jobs", "1", "--no-summaries"]) == 0
    saved.write_text(capsys.readouterr().out)
    engines.clear()
    from_json = cli_json(capsys, "diff", str(saved), str(NEW), "--json", "--jobs", "2", "--no-summaries")
    assert engines == [(None, 2, 2, "LocalEngine")]                   # the trace side only
    from_trace = cli_json(capsys, "diff", str(BASE), str(NEW), "--json", "--jobs", "1", "--no-summaries")
    from_json.pop("base"), from_trace.pop("base")                     # the side's name: a file vs a folder
    assert from_json == from_trace


def test_diff_on_dask_equals_one_job(capsys, engines, dask_address):
    argv = ("diff", str(BASE), str(NEW), "--json", "--no-summaries")
    on_dask = cli_json(capsys, *argv, "--dask", dask_address)
    assert engines == [(dask_address, None, 2, "DaskEngine")] * 2
    assert on_dask == cli_json(capsys, *argv, "--jobs", "1")


# ------------------------------------------------------------------ scaling
def test_scaling_same_json_with_one_and_two_jobs(capsys, engines):
    argv = ("scaling", str(RUN1), str(RUN2), "--json", "--no-summaries")
    serial = cli_json(capsys, *argv, "--jobs", "1")
    assert engines == [(None, 1, 1, "SerialEngine"), (None, 1, 2, "SerialEngine")]
    engines.clear()
    pool = cli_json(capsys, *argv, "--jobs", "2")
    # one rank needs no pool; the 2-rank run is mapped by 2 processes
    assert engines == [(None, 2, 1, "SerialEngine"), (None, 2, 2, "LocalEngine")]
    assert pool == serial
    assert [r["world_size"] for r in serial["runs"]] == [1, 2] and len(serial["waterfalls"]) == 1


def test_scaling_on_dask_equals_one_job(capsys, engines, dask_address):
    argv = ("scaling", str(RUN1), str(RUN2), "--json", "--no-summaries")
    on_dask = cli_json(capsys, *argv, "--dask", dask_address)
    assert engines == [(dask_address, None, 1, "DaskEngine"), (dask_address, None, 2, "DaskEngine")]
    assert on_dask == cli_json(capsys, *argv, "--jobs", "1")


# ------------------------------------------------------------------ --jobs 0
@pytest.mark.parametrize("argv", [["tui", str(BASE)], ["analyze", str(BASE), "--tui"],
                                  ["diff", str(BASE), str(NEW)], ["scaling", str(RUN1), str(RUN2)]],
                         ids=["tui", "analyze-tui", "diff", "scaling"])
def test_jobs_0_is_one_line_and_exit_2_before_any_work(argv, capsys, engines, monkeypatch):
    started = []
    if argv[0] in ("tui", "analyze"):
        tui_app = pytest.importorskip("fsdpdoctor.tui.app")
        monkeypatch.setattr(tui_app.FsdpDoctorApp, "run", lambda self: started.append(self) or 0)
    assert main(argv + ["--jobs", "0"]) == 2
    out = capsys.readouterr()
    assert out.err == "fsdpdoctor: error: --jobs expects a positive number, got 0\n" and out.out == ""
    assert engines == [] and started == []                            # no analysis, no screen


# ------------------------------------------------------------------ check --baseline, notebook API
def test_check_baseline_runs_on_the_engine_asked_for(capsys, engines):
    rc = main(["check", str(NEW), "--baseline", str(BASE), "--jobs", "2", "--no-summaries", "--json"])
    assert rc in (0, 1), capsys.readouterr().err
    # the run and its baseline: both mapped in a pool of 2
    assert engines == [(None, 2, 2, "LocalEngine")] * 2


def test_notebook_api_takes_the_engine_options(engines):
    import fsdpdoctor

    one = fsdpdoctor.analyze(BASE, workers=1, use_summaries=False)
    two = fsdpdoctor.analyze(BASE, workers=2, use_summaries=False)
    assert engines == [(None, 1, 2, "SerialEngine"), (None, 2, 2, "LocalEngine")]
    assert one.to_json() == two.to_json()


# ------------------------------------------------------------------ export
def _export(tmp_path, name: str, *flags: str) -> dict:
    out = tmp_path / name
    assert main(["export", str(BASE), "--perfetto", str(out), "--no-progress", *flags]) == 0
    doc = json.loads(out.read_text())
    doc["otherData"].pop("source", None)
    return doc


def test_export_without_events_maps_the_ranks_where_the_options_say(tmp_path, engines, capsys):
    serial = _export(tmp_path, "a.json", "--no-ops", "--no-summaries", "--jobs", "1")
    assert engines == [(None, 1, 2, "SerialEngine")]
    engines.clear()
    pooled = _export(tmp_path, "b.json", "--no-ops", "--no-summaries", "--jobs", "2")
    assert engines == [(None, 2, 2, "LocalEngine")]
    assert pooled == serial and serial["traceEvents"]


def test_export_with_events_parses_with_jobs_and_refuses_dask(tmp_path, capsys):
    one = _export(tmp_path, "a.json", "--jobs", "1")
    two = _export(tmp_path, "b.json", "--jobs", "2")
    assert one == two and len(one["traceEvents"]) > len(_export(tmp_path, "c.json", "--no-ops")["traceEvents"])
    capsys.readouterr()
    assert main(["export", str(BASE), "--perfetto", str(tmp_path / "d.json"), "--dask", "local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-ops" in err[0]
    assert not (tmp_path / "d.json").exists()
