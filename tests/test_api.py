"""The notebook API: fsdpdoctor.analyze, the DataFrames (checked against the --json figures) and the
JSON round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fsdpdoctor
from fsdpdoctor.cli import main
from fsdpdoctor.results import Analysis
from bundled import TRACES as BUNDLED  # the committed traces, in a pristine copy

pd = pytest.importorskip("pandas", reason="needs the [pandas] extra (pandas)")
RUN = "ddp_tiny_buckets"


@pytest.fixture(scope="module")
def analysis(traces_dir):
    return fsdpdoctor.analyze(traces_dir / RUN)


@pytest.fixture(scope="module")
def doc(traces_dir):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["analyze", str(traces_dir / RUN), "--json", "--no-progress"]) == 0
    return json.loads(buf.getvalue())


def test_import_is_light():
    code = ("import sys, fsdpdoctor; heavy = [m for m in ('numpy', 'pandas', 'msgspec', 'rich', 'textual') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="counts threads in /proc")
def test_cli_starts_numpy_on_one_thread():
    """The CLI loads numpy before its verbs do, with OpenBLAS on one thread (its default, a thread per
    core, costs CPU at every start and is never used); the setting is not left for the jobs it starts."""
    code = ("import os, fsdpdoctor.cli; print(open('/proc/self/status').read().split('Threads:')[1].split()[0], "
            "'OPENBLAS_NUM_THREADS' in os.environ)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["1", "False"]


def test_analyze_returns_the_typed_result(analysis):
    assert isinstance(analysis, Analysis)
    assert analysis.findings and all(f.id for f in analysis.findings)


def test_steps_df_matches_json(analysis, doc):
    df = analysis.steps_df()
    assert set(df.columns) >= {"rank", "step", "component", "us", "share"}
    n = 0
    for r in doc["ranks"]:
        for s in r["steps"]:
            sub = df[(df["rank"] == r["rank"]) & (df["step"] == s["step"])].set_index("component")
            for comp in ("compute", "optimizer", "exposed_comm", "data_loading", "idle", "overlapped_comm", "comm"):
                assert sub.loc[comp, "us"] == pytest.approx(s[f"{comp}_us"])
                assert sub.loc[comp, "share"] == pytest.approx(s[f"{comp}_us"] / s["duration_us"])
                n += 1
            for kind, kt in s["comm_by_kind"].items():
                assert sub.loc[f"comm[{kind}]", "us"] == pytest.approx(kt["busy_us"])
            # the five parts add up to the step
            parts = sub.loc[["compute", "optimizer", "exposed_comm", "data_loading", "idle"], "us"].sum()
            assert parts == pytest.approx(s["duration_us"], rel=1e-6)
    assert n == 7 * sum(len(r["steps"]) for r in doc["ranks"])


def test_ranks_collectives_findings_df_match_json(analysis, doc):
    rdf = analysis.ranks_df().set_index("rank")
    for r in doc["ranks"]:
        assert rdf.loc[r["rank"], "duration_us"] == pytest.approx(r["mean"]["duration_us"])
        assert rdf.loc[r["rank"], "wait_us"] == pytest.approx(r["wait_us"])
        assert rdf.loc[r["rank"], "steps"] == len(r["steps"])
    off = {c["rank"]: c["offset_us"] for c in doc["clock"]["ranks"]}
    assert rdf["clock_offset_us"].to_dict() == pytest.approx(off)
    cdf = analysis.collectives_df()
    assert len(cdf) == len(doc["collectives"])
    for c in doc["collectives"]:
        row = cdf[(cdf["kind"] == c["kind"]) & (cdf["phase"] == c["phase"])].iloc[0]
        assert row["count"] == c["count"] and row["total_us"] == pytest.approx(c["total_us"])
    fdf = analysis.findings_df()
    assert list(fdf["id"]) == [f["id"] for f in doc["findings"]]
    assert list(fdf["impact_us"]) == pytest.approx([f["impact_us"] for f in doc["findings"]])


def test_per_call_collectives_df(analysis):
    df = analysis.collectives_df(events=True)
    assert len(df) == len(analysis.collective_events)
    assert (df["duration_us"] == df["end_us"] - df["start_us"]).all()


def test_json_round_trip(analysis, doc, tmp_path):
    back = Analysis.from_json(analysis.to_json(include_events=True))
    assert back == analysis
    # the --json document (no events, no manifest) reads back to the same result less those
    from_doc = Analysis.from_dict(doc)
    assert from_doc.schema_version == doc["schema_version"]
    assert from_doc.ranks == analysis.ranks and from_doc.findings == analysis.findings
    assert from_doc.clock == analysis.clock and from_doc.collective_events == []
    # a saved document is accepted wherever a run is
    p = tmp_path / "a.json"
    p.write_text(analysis.to_json())
    assert fsdpdoctor.analyze(p).findings == analysis.findings


def test_other_major_schema_is_refused(doc):
    with pytest.raises(ValueError):
        Analysis.from_dict(doc | {"schema_version": "2.0"})


def test_missing_pandas_is_a_clear_error(analysis, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pandas(name, *a, **k):
        if name == "pandas":
            raise ImportError("no pandas")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"fsdpdoctor\[pandas\]"):
        analysis.steps_df()


def test_uncompressed_trace_is_not_taken_for_a_saved_json(traces_dir, tmp_path):
    import gzip

    from fsdpdoctor.pipeline import is_analysis_json

    raw = tmp_path / "rank0.json"
    raw.write_bytes(gzip.open(traces_dir / RUN / "rank0.json.gz").read())
    assert not is_analysis_json(raw)
    a = fsdpdoctor.analyze(raw)
    assert [r.rank for r in a.ranks] == [0] and a.ranks[0].steps
    saved = tmp_path / "a.json"
    saved.write_text(a.to_json())
    assert is_analysis_json(saved)


def test_readme_notebook_example_runs(repo_root, tmp_path, monkeypatch):
    text = (repo_root / "README.md").read_text()
    section = text.split("## From a notebook", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    code = code.replace('"traces/dataloader_slow"', repr(str(BUNDLED / "dataloader_slow")))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    a, b = ns["a"], ns["b"]
    assert [f.id for f in a.findings] == [f.id for f in b.findings]
    assert (tmp_path / "run.json").is_file()


@pytest.mark.parametrize("run", ["straggler", "fsdp2_default", "cuda/host_sync"])
def test_to_dict_is_asdict_without_the_dropped_calls(traces_dir, run):
    """The document is built without dataclasses.asdict (whose deep copies and per-call collectives
    cost more than the rest of the writing): the same dict, on real runs with and without the events."""
    import dataclasses

    a = fsdpdoctor.analyze(traces_dir / run)
    full = dataclasses.asdict(a)
    assert a.collective_events and a.to_dict(include_events=True) == full
    del full["collective_events"]
    assert a.to_dict() == full
    assert json.loads(a.to_json()) == json.loads(json.dumps({**full, "job": {k: v for k, v in full["job"].items()
                                                                              if k != "manifest"}}, default=str))


def test_result_types_compare_and_print_as_dataclasses_do(traces_dir):
    """The result types share one __repr__ and __eq__ (results.analysis.result) instead of a generated
    pair each: the same text as @dataclass writes, equal by fields, unequal to other types, unhashable."""
    import dataclasses

    a = fsdpdoctor.analyze(traces_dir / "straggler")
    f = a.findings[0]
    names = [x.name for x in dataclasses.fields(f)]
    assert repr(f) == f"Finding({', '.join(f'{n}={getattr(f, n)!r}' for n in names)})"
    assert f == dataclasses.replace(f) and f != dataclasses.replace(f, title=f.title + "!") and f != f.title
    with pytest.raises(TypeError):
        hash(f)
    assert a == fsdpdoctor.analyze(traces_dir / "straggler")   # a whole analysis, field by field
