"""Issue 12: stragglers decided from evidence, root cause first, one severity scale, check on
gloo traces, fixes written for this job. Synthetic inputs for each mechanism, then the real
bundled traces and (slow) freshly recorded moderate stragglers."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_torch
from fsdpdoctor.analysis import stragglers
from fsdpdoctor.cli import main
from fsdpdoctor.analysis.context import is_user_frame
from fsdpdoctor.diagnose.facts import straggler_verdict
from fsdpdoctor.diagnose.framework import RuleContext, fold_consequences, severity_for
from fsdpdoctor.diagnose.thresholds import defaults, resolve
from fsdpdoctor.results import (
    Analysis, Finding, JobInfo, RankSummary, StepBreakdown, StragglerReport,
)
from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES, analysed, expectations, shared_rank_steps  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = expectations()
ALL = sorted(p for p in EXPECTED if p.parent == TRACES)
needs_traces = pytest.mark.skipif(not (TRACES / "straggler" / "rank0.json.gz").exists(), reason="traces/ absent")


# ------------------------------------------------------------------ synthetic: straggler evidence
def test_chance_last_matches_brute_force():
    for nranks, n in [(2, 3), (2, 5), (4, 4), (8, 3)]:
        for k in range(n + 1):
            # every sequence of "who was last", equally likely under the null
            seqs = list(itertools.product(range(nranks), repeat=n))
            hits = sum(1 for s in seqs if any(s.count(r) >= k for r in range(nranks)))
            exact = hits / len(seqs)
            bound = stragglers.chance_last(k, n, nranks)
            assert bound >= exact - 1e-12  # the Bonferroni bound never understates the chance
            assert bound <= min(1.0, nranks * exact) + 1e-12


def _rank(rank: int, durations: list[float]) -> RankSummary:
    steps = [StepBreakdown(rank=rank, step=i, start_us=0.0, duration_us=d) for i, d in enumerate(durations)]
    return RankSummary(rank=rank, file="", dialect="cpu", steps=steps, mean=steps[0])


def test_step_noise_ignores_a_constant_delay_and_sees_jitter():
    jitter = [100.0, 104.0, 98.0, 103.0, 99.0]
    base = stragglers.step_time_noise([_rank(0, jitter), _rank(1, jitter)])
    delayed = stragglers.step_time_noise([_rank(0, [x + 300 for x in jitter]), _rank(1, [x + 300 for x in jitter])])
    assert base == pytest.approx(delayed)
    diffs = sorted(abs(b - a) for a, b in zip(jitter, jitter[1:]))
    expected = 1.4826 * (diffs[1] + diffs[2]) / 2 / math.sqrt(2)  # median of 4 pooled twice = same median
    assert base == pytest.approx(expected)
    assert stragglers.step_time_noise([_rank(0, [100.0]), _rank(1, [100.0])]) == 0.0


def test_saving_is_the_next_latest_ranks_wait_with_three_ranks():
    from fsdpdoctor.results import Collective

    colls, ranks = [], []
    # per step one collective; rank 2 arrives last, rank 1 100 ms before it, rank 0 300 ms before it
    for r, dur in ((0, 300e3), (1, 100e3), (2, 1e3)):
        for st in range(4):
            t0 = st * 1e6
            colls.append(Collective(rank=r, index=st, step=st, kind="all_reduce", raw_name="allreduce",
                                    phase="backward", start_us=t0, end_us=t0 + dur + st * 10.0))
        ranks.append(_rank(r, [1e6, 1e6 + 50, 1e6 - 50, 1e6]))
    rep = stragglers.analyze(colls, ranks, same_clock=False)
    assert rep.straggler == 2 and rep.steps_last == rep.steps_total == 4
    assert rep.wait_us == pytest.approx(299e3, rel=1e-3)    # the earliest rank's wait
    assert rep.saving_us == pytest.approx(99e3, rel=1e-3)   # the step ends when rank 1 arrives
    assert rep.chance == pytest.approx(3 * (1 / 3) ** 4)


def test_two_d_mesh_straggler_is_priced_by_the_waits_it_causes():
    """HSDP on a (2, 2) mesh (shard groups {0, 1} {2, 3}, replicate groups {0, 2} {1, 3}); rank 1 is 150 ms
    late. Collective 0 (shard group): rank 0 waits 150 ms for it, ranks 2 and 3 nothing; collective 1
    (replicate group): rank 3 waits for it, rank 2 waits for rank 0, late by its wait. At one collective the
    next-latest rank waits nothing (the 0.4 % the issue saw); per rank over the step every other rank waits
    about 150 ms, and rank 1 never."""
    from fsdpdoctor.results import Collective

    waits = {0: (150e3, 0.0), 1: (0.0, 0.0), 2: (0.0, 148e3), 3: (0.0, 150e3)}   # rank -> wait in call 0, 1
    colls, ranks = [], []
    for r, ws in waits.items():
        for st in range(4):
            for k, (kind, w) in enumerate(zip(("all_gather", "all_reduce"), ws)):
                t0 = st * 1e6 + k * 2e5
                colls.append(Collective(rank=r, index=2 * st + k, step=st, kind=kind, raw_name=kind,
                                        phase="backward", start_us=t0, end_us=t0 + 1e3 + w + st * 10.0))
        ranks.append(_rank(r, [1e6, 1e6 + 50, 1e6 - 50, 1e6]))
    flat = stragglers.analyze(colls, ranks, same_clock=False)
    assert flat.saving_us == pytest.approx(0.0, abs=100)   # the old pricing: next-latest at one collective
    rep = stragglers.analyze(colls, ranks, same_clock=False, sub_groups=True)
    assert rep.straggler == 1 and rep.steps_last == 4 and rep.through_groups
    assert rep.wait_us == pytest.approx(150e3, rel=1e-3)
    assert rep.saving_us == pytest.approx(148e3, rel=1e-3)  # the least of the others' largest waits


def test_wait_is_a_share_of_the_waiting_ranks_step_never_more_than_it():
    """The waiting rank's step is longer than the late rank's (its steps hold the wait), and its
    collective runs past its step's end: the share is of the waiter's step and at most the whole of it
    (a median of the ranks' steps gave 1.07 in a hang trend)."""
    from fsdpdoctor.results import Collective

    colls = []
    for st in range(4):
        t0 = st * 1e6
        colls.append(Collective(rank=0, index=st, step=st, kind="all_reduce", raw_name="allreduce",
                                phase="backward", start_us=t0, end_us=t0 + 900e3 + 300e3 * (st == 3)))
        colls.append(Collective(rank=1, index=st, step=st, kind="all_reduce", raw_name="allreduce",
                                phase="backward", start_us=t0 + 899e3, end_us=t0 + 900e3))
    ranks = [_rank(0, [1e6] * 4), _rank(1, [0.2e6] * 4)]
    rep = stragglers.analyze(colls, ranks, same_clock=False)
    assert rep.straggler == 1
    fracs = [p["imbalance_frac"] for p in rep.per_step]
    assert fracs[:3] == pytest.approx([0.899] * 3)          # of rank 0's 1 s step, not the 0.6 s median
    assert fracs[3] == 1.0 and 0.0 <= rep.spread_frac <= 1.0


def _ctx(report: StragglerReport, step_us: float = 1000.0, nranks: int = 2) -> RuleContext:
    mean = StepBreakdown(rank=-1, step=None, start_us=0.0, duration_us=step_us)
    ranks = [RankSummary(rank=r, file="", dialect="cpu", steps=[mean], mean=mean) for r in range(nranks)]
    job = JobInfo(world_size=nranks, ranks_analyzed=list(range(nranks)), backend="gloo", dialect="cpu",
                  wrapping="ddp", wrapping_source="trace")
    a = Analysis(source="synthetic", job=job, ranks=ranks, mean=mean, collectives=[], prefetch=None,
                 straggler=report)
    return RuleContext(a, resolve(None))


def _report(last: int, total: int, wait: float, noise: float, extra: float = 0.0) -> StragglerReport:
    return StragglerReport(method="wait", straggler=1, spread_frac=wait / 1000.0, last_fraction=last / total,
                           steps_last=last, steps_total=total, chance=stragglers.chance_last(last, total, 2),
                           wait_us=wait, noise_us=noise, extra_us=extra)


def test_verdict_needs_consistency_materiality_and_signal_above_noise():
    th = defaults()
    # a moderate straggler: 300 us of a 1000 us step, every step, noise 20 us
    assert straggler_verdict(_ctx(_report(5, 5, 300.0, 20.0, extra=290.0))) > 0.8
    # the same wait inside the run's own noise is no verdict
    assert straggler_verdict(_ctx(_report(5, 5, 300.0, 300.0 / (th["straggler_noise_z"] - 0.5)))) == 0.0
    # a different rank last in most steps: no consistent culprit
    assert straggler_verdict(_ctx(_report(2, 5, 300.0, 20.0))) == 0.0
    # consistent and above noise but immaterial (under the warning band)
    assert straggler_verdict(_ctx(_report(5, 5, 0.5 * th["straggler_min_frac"] * 1000, 1.0))) == 0.0
    # confidence grows with the culprit's extra time explaining the wait
    assert straggler_verdict(_ctx(_report(5, 5, 300.0, 20.0, extra=300.0))) > \
        straggler_verdict(_ctx(_report(5, 5, 300.0, 20.0, extra=0.0)))
    # below 3 deviations of noise: a verdict only when an own-work frame holds the wait and the
    # consistency is unlikely by chance (two independent lines of evidence)
    weak = _report(5, 5, 150.0, 100.0, extra=150.0)
    assert weak.chance <= th["straggler_chance"] and straggler_verdict(_ctx(weak)) == 0.0
    weak.cause_frames = [{"frame": "job.py(9): only_rank1", "culprit_us": 150.0, "others_us": 0.0, "extra_us": 150.0}]
    assert straggler_verdict(_ctx(weak)) > 0
    shared = _report(5, 5, 150.0, 100.0, extra=150.0)  # the same frame on every rank, just slower
    shared.cause_frames = [{"frame": "job.py(3): forward", "culprit_us": 400.0, "others_us": 250.0, "extra_us": 150.0}]
    assert straggler_verdict(_ctx(shared)) == 0.0
    lucky = _report(4, 5, 150.0, 100.0, extra=150.0)  # 4 of 5 at 2 ranks happens by chance 3 in 8
    lucky.cause_frames = weak.cause_frames
    assert straggler_verdict(_ctx(lucky)) == 0.0
    # the culprit's own time measured as a cause (its sleep, loader or host syncs, excess over the others')
    # is the second line of evidence as a frame is; the same work done slower is not
    for cause, verdict in (("sleep", True), ("data loading", True), ("host sync", True),
                           ("same work, slower", False), (None, False)):
        r = _report(5, 5, 150.0, 100.0, extra=150.0)
        r.cause = cause
        assert (straggler_verdict(_ctx(r)) > 0) is verdict, cause
    small = _report(5, 5, 150.0, 100.0, extra=60.0)   # its sleep holds under half of the wait
    small.cause = "sleep"
    assert straggler_verdict(_ctx(small)) == 0.0
    # one step: no noise estimate, only a wait of a quarter of the step is trusted
    assert straggler_verdict(_ctx(_report(1, 1, 100.0, 0.0))) == 0.0
    assert straggler_verdict(_ctx(_report(1, 1, 400.0, 0.0))) > 0


def test_own_extra_work_is_named_and_the_same_work_slower_is_not():
    from fsdpdoctor.diagnose.host_rules import straggler

    own = _report(5, 5, 300.0, 20.0, extra=290.0)
    own.cause, own.cause_source = "compute", "job.py(10): rank_specific_eval"
    own.cause_frames = [{"frame": own.cause_source, "culprit_us": 290.0, "others_us": 0.0, "extra_us": 290.0}]
    f = straggler(_ctx(own))[0]
    assert f.source == own.cause_source and "(compute)" in f.title and own.cause_source in f.fix
    same = _report(5, 5, 300.0, 20.0, extra=290.0)
    same.cause, same.cause_source = "compute", "job.py(3): forward"
    # the extra time is spread over frames every rank runs: no frame holds half the wait
    same.cause_frames = [{"frame": "job.py(3): forward", "culprit_us": 900.0, "others_us": 800.0, "extra_us": 100.0}]
    f = straggler(_ctx(same))[0]
    assert f.source is None and "same work" in f.title and "cores" in f.fix  # CPU trait: no device words
    assert "GPU" not in f.fix


# ------------------------------------------------------------------ synthetic: severity and folding
def test_one_severity_scale_and_floor_never_makes_an_error():
    th = defaults()
    lo, hi = th["severity_warning_frac"], th["severity_error_frac"]
    assert severity_for(lo * 0.99, th) == "info"
    assert severity_for(lo, th) == "warning"
    assert severity_for(hi, th) == "error"
    assert severity_for(0.0, th, floor="warning") == "warning"
    assert severity_for(0.0, th, floor="error") == "warning"  # a floor is never an error by itself
    ctx = _ctx(_report(1, 1, 0.0, 0.0))
    # confidence weights the saving: 30 % of the step at confidence 0.5 is 15 % -> warning
    assert ctx.severity(300.0) == "error"
    assert ctx.severity(300.0, confidence=0.5) == "warning"


def _f(id: str, sev: str, impact: float, consequences=()) -> Finding:
    return Finding(id=id, title=id, severity=sev, confidence=0.9, impact_us=impact, impact_frac=impact / 1e3,
                   summary="", fix="", consequences=list(consequences))


def test_fold_puts_consequences_under_their_root_and_caps_them():
    comm = _f("exposed-comm-high", "error", 400.0)
    bw = _f("low-bus-bandwidth", "warning", 50.0)
    root = _f("straggler", "warning", 300.0, ["exposed-comm-high", "low-bus-bandwidth", "absent-id"])
    other = _f("input-bound", "warning", 100.0)
    out = fold_consequences([comm, other, bw, root])
    assert [f.id for f in out] == ["straggler", "exposed-comm-high", "low-bus-bandwidth", "input-bound"]
    assert comm.caused_by == bw.caused_by == "straggler" and other.caused_by is None
    assert comm.severity == bw.severity == "info"  # only the root gates check
    assert root.consequences == ["exposed-comm-high", "low-bus-bandwidth"]  # ids that exist


def test_fold_claims_once_more_severe_root_first_and_survives_cycles():
    setup = _f("gloo-on-cuda", "error", 10.0, ["exposed-comm-high", "straggler"])
    strag = _f("straggler", "warning", 300.0, ["exposed-comm-high"])
    comm = _f("exposed-comm-high", "error", 400.0, ["straggler"])
    out = fold_consequences([comm, strag, setup])
    assert out[0] is setup
    assert comm.caused_by == "gloo-on-cuda" and strag.caused_by == "gloo-on-cuda"
    assert strag.consequences == [] and comm.consequences == []
    assert [f.severity for f in out] == ["error", "info", "info"]


def test_fold_flattens_chains_under_the_final_root():
    overlap = _f("low-overlap", "info", 400.0)
    comm = _f("exposed-comm-high", "error", 400.0, ["low-overlap"])
    strag = _f("straggler", "warning", 300.0, ["exposed-comm-high"])
    out = fold_consequences([overlap, comm, strag])
    assert [f.id for f in out] == ["straggler", "exposed-comm-high", "low-overlap"]
    assert comm.caused_by == overlap.caused_by == "straggler"
    assert strag.consequences == ["exposed-comm-high", "low-overlap"] and comm.consequences == []


# ------------------------------------------------------------------ user frames
def test_library_frames_are_not_user_code():
    assert not is_user_frame("transformers/models/qwen2/modeling_qwen2.py(210): forward")
    assert not is_user_frame("accelerate/accelerator.py(2150): backward")
    assert not is_user_frame("torch/nn/modules/module.py(1771): _call_impl")
    assert is_user_frame("train.py(96): straggler_sleep_before_forward")
    assert is_user_frame("my_project/model.py(12): forward")


# ------------------------------------------------------------------ real bundled traces
@needs_traces
def test_bundled_straggler_names_rank_frame_and_evidence():
    a = open_analysis(TRACES / "straggler")
    manifest = json.loads((TRACES / "straggler" / "manifest.json").read_text())
    f = next(f for f in a.findings if f.id == "straggler")
    assert f.ranks == [manifest["scenario"]["params"]["slow_rank"]]
    assert f.source and "straggler_sleep_before_forward" in f.source
    s = a.straggler
    # evidence recomputed independently from the per-step table
    per = [p for p in s.per_step if p["straggler"] == f.ranks[0]]
    assert s.steps_last == len(per) and s.steps_total == len(s.per_step)
    waits = sorted(p["imbalance_us"] for p in per)
    assert s.wait_us == pytest.approx(waits[len(waits) // 2] if len(waits) % 2 else
                                      (waits[len(waits) // 2 - 1] + waits[len(waits) // 2]) / 2)
    assert s.wait_us > 3 * s.noise_us
    assert [r.rank for r in a.ranks if r.is_straggler] == f.ranks


@needs_traces
def test_straggler_claims_the_exposed_comm_it_causes():
    # lower the gloo bar so the others' exposed communication is reported: it is waiting, so it folds
    a = open_analysis(TRACES / "straggler", thresholds={"exposed_comm_frac_sync": 0.1})
    strag = next(f for f in a.findings if f.id == "straggler")
    comm = next(f for f in a.findings if f.id == "exposed-comm-high")
    assert comm.caused_by == "straggler" and "exposed-comm-high" in strag.consequences
    assert comm.severity == "info" and strag.severity == "error"
    assert a.findings.index(comm) == a.findings.index(strag) + 1
    # its impact is what is left after the wait, which a comm fix could save
    assert comm.impact_us < 0.2 * a.mean.exposed_comm_us
    d = a.to_dict()
    assert next(f for f in d["findings"] if f["id"] == "exposed-comm-high")["caused_by"] == "straggler"


@needs_traces
def test_straggler_wait_is_located_and_never_counted_as_prefetch_cost():
    a = open_analysis(TRACES / "straggler")
    s = a.straggler
    mine = [p for p in s.per_step if p["straggler"] == s.straggler]
    # the wait lands in the DDP all-reduce in backward (the first collective after the delay, no buffers)
    assert {(p["kind"], p["phase"]) for p in mine} <= {(c.kind, c.phase) for c in a.collective_events}
    assert all(0 < p["mean_wait_us"] <= p["imbalance_us"] for p in mine)


# injected faults whose rule has no measurable cost on a CPU trace, so severity (cost) keeps them at info
# (the scorecard's list, with why)
sys.path.insert(0, str(ROOT / "reference_jobs"))
from scorecard import NOT_GATING_ON_CPU  # noqa: E402


def _gate(folder: Path) -> int:
    """``fsdpdoctor check``'s exit code, in this process (a subprocess per folder spent more CPU starting
    Python than checking; test_diagnose.py::test_check_exit_codes_and_junit runs the real command)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), shared_rank_steps():
        return main(["check", str(folder)])


@needs_traces
@pytest.mark.parametrize("folder", [p for p in ALL if not p.name.startswith("hang_")] + sorted(TRACES.glob("scaling_*")),
                         ids=lambda p: p.name)
def test_check_passes_healthy_and_fails_faults(folder):
    # hang_* folders are judged by `fsdpdoctor hang` (their profiled steps precede a deliberate hang)
    must = set(EXPECTED[folder]["must"]) if folder in EXPECTED else set()
    gating = must - NOT_GATING_ON_CPU if EXPECTED.get(folder, {}).get("gates", True) else set()
    assert _gate(folder) == (1 if gating else 0)
    if gating:
        a = analysed(folder)
        assert any(f.id in gating and f.severity in ("warning", "error") for f in a.findings)


@needs_traces
@pytest.mark.parametrize("folder", ALL, ids=lambda p: p.name)
def test_texts_fit_the_job(folder):
    a = analysed(folder, thresholds={"exposed_comm_frac_sync": 0.05})
    wrap = a.job.wrapping_details
    for f in a.findings:
        assert "the GPU" not in f.summary + f.fix or a.job.traits.device_timeline, (f.id, f.summary, f.fix)
        if f.id == "exposed-comm-high":
            if wrap.get("bucket_cap_mb") == 25:
                assert "bucket_cap_mb" not in f.fix  # already the default
            if wrap.get("backward_prefetch") == "BACKWARD_PRE":
                assert "backward_prefetch" not in f.fix
            if wrap.get("forward_prefetch") is False and a.prefetch and a.prefetch.forward_mode == "off":
                assert "forward_prefetch=True  # now False" in f.fix


@needs_traces
def test_backward_post_fix_says_what_to_change_from_what():
    a = open_analysis(TRACES / "fsdp1_backward_post")
    f = next(f for f in a.findings if f.id == "fsdp1-backward-post")
    assert "BACKWARD_PRE" in f.fix and "now BACKWARD_POST" in f.fix
    # away from the default, but on gloo a prefetch hides nothing: no saving predicted, so info (issue 28)
    assert f.severity == "info" and f.impact_us == 0 and "On a GPU" in f.summary


# ------------------------------------------------------------------ moderate stragglers, freshly recorded
COMPUTE_STRAGGLER = '''
import sys, time
sys.path.insert(0, {ref!r}); sys.path.insert(1, {root!r})
import torch
import train
_a = torch.randn(256, 256)
def extra_matmul_on_this_rank(ms):
    end = time.perf_counter() + ms / 1000.0
    x = _a
    while time.perf_counter() < end:
        x = torch.tanh(x @ _a)
train.straggler_sleep_before_forward = extra_matmul_on_this_rank
sys.exit(train.main())
'''


def _torchrun(script: Path, out: Path, delay_ms: float) -> None:
    import socket

    for _ in range(2):  # gloo occasionally aborts at exit after writing everything
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(port), str(script), "--scenario", "straggler", "--delay-ms", str(delay_ms),
                        "--active", "5", "--out", str(out)], capture_output=True, timeout=600)
        if (out / "manifest.json").exists() and (out / "rank1.json.gz").exists():
            return
    pytest.skip("torchrun did not complete")


@requires_torch
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sleep", "compute"])
def test_moderate_straggler_is_found_with_its_frame(tmp_path, kind):
    script = ROOT / "reference_jobs" / "train.py"
    if kind == "compute":
        script = tmp_path / "compute_straggler.py"
        script.write_text(COMPUTE_STRAGGLER.format(ref=str(ROOT / "reference_jobs"), root=str(ROOT)))
    out = tmp_path / "run"
    delay_ms = 100.0 if kind == "sleep" else 120.0
    _torchrun(script, out, delay_ms)
    a = open_analysis(out)
    f = next((f for f in a.findings if f.id == "straggler"), None)
    assert f is not None, (a.straggler, [x.id for x in a.findings])
    assert f.ranks == [1] and kind in f.title
    assert f.source and ("straggler_sleep_before_forward" if kind == "sleep" else "extra_matmul") in f.source
    # the impact is the time rank 0 waits for it: at least most of the injected delay, and inside rank 0's
    # exposed communication of some step (the wait is spent there). Its share of the step is not bounded
    # here: it depends on how fast this machine runs the rest of the step (0.82 on a fast CI machine)
    waiter = next(r for r in a.ranks if r.rank == 0)
    assert 0.5 * delay_ms * 1e3 <= f.impact_us <= max(s.exposed_comm_us for s in waiter.steps) * 1.001
    assert f.impact_us < a.mean.duration_us


# ------------------------------------------------------------------ rendering agrees with the finding
def _console_text(a) -> str:
    from rich.console import Console

    from fsdpdoctor.report.console import render

    con = Console(record=True, width=120)
    render(a, console=con)
    return con.export_text()


@needs_traces
def test_console_header_and_findings_agree_with_the_straggler_finding():
    a = open_analysis(TRACES / "straggler", thresholds={"exposed_comm_frac_sync": 0.1})
    f = next(f for f in a.findings if f.id == "straggler")
    text = _console_text(a)
    assert f"straggler: rank {f.ranks[0]} (last in" in text
    assert "caused by the above" in text and "explains: exposed-comm-high" in text
    # the effect is printed after its cause
    assert text.index("[straggler]") < text.index("[exposed-comm-high]")
    healthy = _console_text(open_analysis(TRACES / "ddp_default"))
    assert "no straggler: rank" in healthy and "slowest rank" not in healthy


@needs_traces
def test_tui_lists_effects_under_their_cause_and_marks_the_slow_rank():
    import asyncio

    pytest.importorskip("textual")
    from pilot import dump

    from fsdpdoctor.tui.app import FsdpDoctorApp
    from fsdpdoctor.tui.findings import FindingsPane

    a = open_analysis(TRACES / "straggler", thresholds={"exposed_comm_frac_sync": 0.1})

    async def run():
        app = FsdpDoctorApp(analysis=a)
        async with app.run_test(size=(100, 34)) as pilot:
            await pilot.pause()
            pane = app.query_one(FindingsPane)
            assert [f.id for f in pane.shown][:2] == ["straggler", "exposed-comm-high"]
            assert "↳" in dump(app) and "explains exposed-comm-high" in dump(app)
            await pilot.press("j")
            await pilot.pause()
            assert pane.current.id == "exposed-comm-high" and "caused by straggler" in dump(app)
            await pilot.press("2")
            await pilot.pause()
            assert "1 ◀ slow" in dump(app)

    asyncio.run(run())


@needs_traces
@pytest.mark.parametrize("folder", ALL, ids=lambda p: p.name)
def test_single_bucket_only_where_splitting_helps(folder):
    """One DDP bucket is a fault only when the cap was raised, or gradients are large enough that
    splitting them overlaps backward; a fix never asks for the value already set."""
    a = analysed(folder)
    cap = a.job.wrapping_details.get("bucket_cap_mb")
    for f in a.findings:
        if f.id != "ddp-single-bucket":
            continue
        assert f"bucket_cap_mb={cap:g}  " not in f.fix if isinstance(cap, (int, float)) else True
        grads = [c.nelems or 0 for c in a.collective_events if c.kind == "all_reduce"]
        raised = isinstance(cap, (int, float)) and cap > 25
        assert raised or max(grads) * 4 >= 1 << 20, (folder.name, f.fix)


def test_a_sleeping_straggler_under_load_is_found_by_its_sleep():
    """tests/data/straggler_sleep_loaded: the anomaly window of a real drift.py run (rank 1 sleeping 3
    healthy steps a step from step 60) recorded at load 4-5, where the wait (110 ms) stood 2.9 noise
    deviations above the run's step-to-step noise and no Python frame of rank 1's held it (the sleep is an
    op): the straggler was dropped, no finding at all. Its sleep, measured as rank 1's excess over the
    others, is the culprit's own time: with 6 of 6 steps last it makes the verdict."""
    a = open_analysis(str(ROOT / "tests" / "data" / "straggler_sleep_loaded"))
    s = a.straggler
    assert s.straggler == 1 and s.steps_last == s.steps_total == 6 and s.cause == "sleep"
    assert s.noise_us <= s.wait_us < 3 * s.noise_us   # under straggler_noise_z: the corroborated branch
    assert s.extra_us >= 0.5 * s.wait_us
    f = next(f for f in a.findings if f.id == "straggler")
    assert f.ranks == [1] and f.severity in ("warning", "error")
    # the saving is bounded by what the fix removes: rank 1's excess sleep, not more than the others wait
    assert 0 < f.impact_us <= s.wait_us
