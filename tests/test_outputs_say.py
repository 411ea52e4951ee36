"""What the outputs say where a user would be misled otherwise: a severity filter is a bar (at least),
scaling refuses runs on different hardware, memory says whether the per-rank total fits a device, and
a CPU/gloo run's note speaks of every wrapping (not of FSDP only)."""

from __future__ import annotations

import json

from bundled import TRACES
from conftest import error_lines
from fsdpdoctor.analysis.dialects.gloo_cpu import GlooCpu
from fsdpdoctor.cli import main
from fsdpdoctor.results import Finding
from fsdpdoctor.tui.findings import matches


def _finding(severity: str) -> Finding:
    return Finding(id="x", title="t", severity=severity, confidence=1.0, impact_us=1.0, impact_frac=0.1,
                   summary="", fix="")


def test_severity_filter_means_at_least():
    assert [s for s in ("info", "warning", "error") if matches(_finding(s), "sev:warning")] == ["warning", "error"]
    assert [s for s in ("info", "warning", "error") if matches(_finding(s), "sev:err")] == ["error"]
    assert all(matches(_finding(s), "sev:info") for s in ("info", "warning", "error"))
    assert not matches(_finding("error"), "sev:nonsense")


def test_scaling_refuses_runs_on_different_hardware(capsys):
    rc = main(["scaling", str(TRACES / "cuda" / "ddp_default"), str(TRACES / "scaling_2proc"), "--json"])
    err = error_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "different hardware" in err[0], err


def test_memory_says_whether_it_fits(capsys):
    argv = ["memory", "--params", "7B", "--strategy", "ddp", "--world-size", "4"]
    assert main(argv + ["--gpu-memory", "80GB", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["device"]
    assert d == {"bytes": 80_000_000_000, "source": "--gpu-memory", "fits": False}
    assert main(argv + ["--gpu-memory", "80GB"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(argv) == 0
    assert "--gpu-memory" in capsys.readouterr().out  # unknown device: says how to tell
    # the manifest's device names its memory (cuda:0 (NVIDIA H100 80GB HBM3))
    assert main(["memory", str(TRACES / "cuda" / "ddp_default"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["device"]
    assert d["bytes"] == 80_000_000_000 and d["fits"] is True and "H100" in d["source"]
    assert main(argv + ["--gpu-memory", "80XB"]) == 2


def test_cpu_note_does_not_speak_of_fsdp_only():
    assert "FSDP" not in GlooCpu.note


def test_steps_plot_fits_80_columns_words_wrapped_not_cut():
    """The legend and the window lines were 90-114 columns at COLUMNS=80; they wrap now, whole."""
    from pathlib import Path

    from fsdpdoctor.capture.series import StepSeries
    from fsdpdoctor.report.steps_plot import render
    from fsdpdoctor.trace.windows import Window

    s = StepSeries(rank=0, world_size=2, origin_unix_s=0.0, pid=1, steps=list(range(40)),
                   start_s=[0.01 * i for i in range(40)], duration_s=[0.01] * 30 + [0.5] * 10, wait_s=[0.0] * 40)
    why = "step time 4.2x the median of the last 20 steps (anomaly trigger, threshold 3x, 8 steps profiled)"
    wins = [Window(folder=Path("windows/step_000031_anomaly"), first=31, last=38, trigger="anomaly", reason=why,
                   partial=[])]
    lines = render([s], wins, width=80, height=8)
    assert max(map(len, lines)) <= 80, [ln for ln in lines if len(ln) > 80]
    assert why.split()[-1] in " ".join(lines) and "windows: S schedule" in " ".join(lines)
