"""Calibrate the predicted savings against measured ones: every fault/fix pair of reference_jobs/pair_table.py.

    python benchmarks/calibrate.py                                  # every pair, 5 timed runs a variant
    python benchmarks/calibrate.py --pairs straggler_sleep,host_sync --reps 3 --steps 10
    python benchmarks/calibrate.py --pairs ddp_single_bucket,host_sync --until-decided 300   # rounds until decided

For each pair:

1. the fault variant is captured and analysed (``fsdpdoctor analyze --json``): the predicted saving P is
   the ``impact_us`` of the pair's expected finding (0 when it is not found: nothing was promised), with
   the finding's own interval when it carries one; the fix variant is captured and analysed too, to show
   that the finding went away;
2. both variants run bare (no profiler), interleaved fault, fix, fault, fix, ... ``--reps`` times each,
   ``--steps`` steps a run; a run's step time is the median of its steps after the first ``--skip``
   (``--mode alternate``, the default: one launch holds both variants and runs them in alternating blocks;
   ``--mode processes``: a launch per run);
   the pairs of runs alternate which variant goes first (ABBA), so that a steady drift does not always
   land on one of them; the measured saving M is the mean of the paired differences (fault run i minus
   fix run i, which cancels load that drifts between pairs of runs), with a Student-t ``--level`` interval
   whose sample size is the effective one under the differences' lag-1 autocorrelation, the launch the
   unit where launches scatter more than their pairs (benchmarks/drift_stats.py says why, from the recorded
   runs: the percentile bootstrap over 5 pairs covered about 78 % at a nominal 90 %);
   with ``--until-decided SECONDS`` a pair whose M decides nothing (``undecided``) gets further rounds of
   ``--reps`` runs a variant, pooled, until M decides, ``--max-rounds`` K rounds are done or its timed runs
   have taken SECONDS; every look is then at level 1 - (1 - L) / K (Bonferroni), so that stopping once M
   decides does not raise the chance of a false decision above 1 - L.
3. ``--aa JSON...``: the A/A check of the interval on earlier ``--json`` files (pseudo-A/A comparisons of
   blocks of one variant, nearest in time: the true saving is 0), old rule against this one.

Verdict (``basis``): where M's interval holds 0 the fix saves nothing measurable here, and P holds only
inside M's interval (or with no finding); otherwise "holds" when P is within ``--tolerance`` (35 %) of M, inside
M's interval, or when P's interval (as tight as the tolerance) overlaps M's; "over" / "under" otherwise;
"missed" when the fault run does not show the finding. It writes ``docs/impact.md`` (and
``--json`` when asked), and the machine's load average (os.getloadavg) over the runs, with the date, in
``benchmarks/calibration/impact-runs.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "reference_jobs"
sys.path.insert(0, str(JOBS))
sys.path.insert(1, str(ROOT))
sys.path.insert(2, str(ROOT / "benchmarks"))

from drift_stats import AA_NOTE, aa_rates, abba, drift_interval, look_level  # noqa: E402
from pair_table import ALL_PAIRS, CUDA_PAIRS, PAIRS  # noqa: E402
import calibration_store as store  # noqa: E402

TOLERANCE = 0.35


def warning_frac() -> float:
    """The severity scale's warning band (a share of the step): "no measurable saving" says something only
    where M's interval rules out a saving that large; a wider one decides nothing."""
    # imported when used: the record stage runs on a GPU machine without fsdpdoctor's dependencies
    from fsdpdoctor.diagnose.thresholds import defaults

    return defaults()["severity_warning_frac"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(pair: str, variant: str, extra: list[str], timeout: float = 600) -> None:
    """One torchrun of reference_jobs/pairs.py; raises with the ranks' own errors when it fails."""
    world = ALL_PAIRS[pair]["world"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for _attempt in range(2):
        job = [str(JOBS / "pairs.py"), "--pair", pair, "--variant", variant, *extra]
        if world == 1:  # torchrun's environment without its agent process: one interpreter less to start
            cmd = [sys.executable, *job]
            env |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
                   "--master_port", str(free_port()), *job]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        # torch + gloo: now and then a run aborts at interpreter exit (test_capture.py says 1 in 20); retry once
        if proc.returncode == 0:
            return
    lines = [ln for ln in proc.stderr.splitlines() if "USDT" not in ln]
    raise RuntimeError(f"{pair}/{variant}: torchrun rc {proc.returncode}\n" + "\n".join(lines[-40:]))


def analyze(run: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", str(run), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"analyze {run}: rc {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def diff_fixes(fault_run: Path, fix_run: Path) -> list[dict]:
    """``fsdpdoctor diff FAULT FIX --json``'s fixes: each finding gone with its predicted saving beside the
    step change measured between the two captures (their profiled steps)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "fsdpdoctor", "diff", str(fault_run), str(fix_run), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode not in (0, 1):
        return [{"text": f"diff failed: {proc.stderr.strip()[-300:]}"}]
    return json.loads(proc.stdout).get("fixes", [])


def predicted_interval(f: dict) -> tuple[float, float] | None:
    """The finding's own interval of its saving (µs), when the analysis gives one."""
    iv = f.get("impact_interval_us")
    if isinstance(iv, (list, tuple)) and len(iv) == 2 and None not in iv:
        return float(iv[0]), float(iv[1])
    lo, hi = f.get("impact_lo_us"), f.get("impact_hi_us")
    if lo is not None and hi is not None:
        return float(lo), float(hi)
    return None


def finding(a: dict, fid: str) -> dict | None:
    return next((f for f in a.get("findings", []) if f["id"] == fid), None)


def run_step_s(times: dict, skip: int) -> float:
    steps = times["step_s"][skip:] or times["step_s"]
    return statistics.median(steps)


def undecided(m_iv, step_us: float | None) -> bool:
    """M's interval holds 0 and reaches above the warning band of the step: it can neither show a saving
    nor rule out one that matters, so it tests no prediction."""
    return (m_iv is not None and m_iv[0] <= 0 <= m_iv[1] and bool(step_us)
            and m_iv[1] > warning_frac() * step_us)


def basis(p_us: float, p_iv, m_us: float, m_iv, found: bool, tolerance: float,
          step_us: float | None = None) -> str | None:
    """Why a prediction holds, or None when it does not (or when M decides nothing: ``undecided``).

    - M's interval holds 0: the fix saves nothing measurable at this machine's noise. The right prediction
      is then one that promises no more than the measurement allows: P inside M's interval, or no finding;
      this counts only where M's upper end is below the warning band of the step (``step_us``), so that
      "nothing measurable" rules out a saving worth a warning.
    - otherwise P holds within ``tolerance`` of M, or inside M's interval, or when the two intervals overlap
      and P's own is as tight as the tolerance (its half-width at most ``tolerance`` of P): two estimates of
      one saving that agree within their stated uncertainty. A P interval wider than that would agree with
      anything near it, so it does not count."""
    if undecided(m_iv, step_us):
        return None
    no_saving = m_iv is not None and m_iv[0] <= 0 <= m_iv[1]
    if not found:
        return "no measurable saving, none predicted" if no_saving else None
    if no_saving:
        return "no measurable saving, P inside M's interval" if m_iv[0] <= p_us <= m_iv[1] else None
    if abs(p_us - m_us) <= tolerance * abs(m_us):
        return f"within {round(tolerance * 100)} % of M"
    if m_iv is not None and m_iv[0] <= p_us <= m_iv[1]:
        return "inside M's interval"
    if (p_iv is not None and m_iv is not None and p_iv[0] <= m_iv[1] and m_iv[0] <= p_iv[1]
            and (p_iv[1] - p_iv[0]) / 2 <= tolerance * p_us):
        return "the intervals overlap"
    return None


def verdict(p_us: float | None, p_iv, m_us: float, m_iv, found: bool, tolerance: float,
            step_us: float | None = None) -> str:
    if undecided(m_iv, step_us):
        return "undecided"
    if basis(p_us or 0.0, p_iv, m_us, m_iv, found, tolerance, step_us):
        return "holds"
    if not found:
        return "missed"
    return "over" if p_us > m_us else "under"


def timed_runs(pair: str, work: Path, reps: int, steps: int, skip: int, mode: str, log=print, record: bool = True,
               tag: str = ""):
    """Per-run step times (µs) of each variant, interleaved fault, fix, fault, ..., and the load at each run.

    ``processes``: each run its own launch. ``alternate``: one launch holds both variants and runs them in
    alternating blocks of ``steps`` steps (on a loaded machine a launch costs far more than its steps, and
    load that drifts between blocks hits neighbouring blocks of both variants alike). ``tag``: the round's
    suffix of the times files (``--until-decided`` adds rounds)."""
    runs: dict[str, list[float]] = {"fault": [], "fix": []}
    loads: list[float] = []
    if mode == "alternate":
        tf = work / pair / f"times_alternate{tag}.json"
        if record:
            run_job(pair, "alternate", ["--blocks", str(reps), "--block-steps", str(steps), "--times", str(tf)])
        for b in json.loads(tf.read_text())["blocks"]:
            runs[b["variant"]].append(run_step_s(b, skip) * 1e6)
            loads.append(b["loadavg"][0])
        return runs, loads
    for i in range(reps):
        for v in abba(i):
            tf = work / pair / f"times_{v}_{i}{tag}.json"
            if record:
                run_job(pair, v, ["--no-profile", "--steps", str(steps), "--times", str(tf)])
            t = json.loads(tf.read_text())
            runs[v].append(run_step_s(t, skip) * 1e6)
            loads.append(t["loadavg"][0])
        log(f"{pair}: rep {i + 1}/{reps}: fault {runs['fault'][-1] / 1e3:.1f} ms, fix {runs['fix'][-1] / 1e3:.1f} ms")
    return runs, loads


def calibrate_pair(pair: str, work: Path, reps: int, steps: int, skip: int, level: float,
                   tolerance: float, active: int = 6, mode: str = "alternate", log=print,
                   stage: str = "all", until_decided_s: float = 0.0, max_rounds: int = 4) -> dict:
    """One pair: captures, analyses and timed runs. ``stage`` "record": the captures and the timed runs only
    (on a machine without fsdpdoctor's dependencies: a lent GPU), "analyse": the analyses of what an earlier
    "record" left in ``work``, "all": both. ``until_decided_s`` (stage "all"): while M decides nothing
    (``undecided``: its interval holds 0 and reaches the warning band), time another round of ``reps`` runs a
    variant and pool its paired differences with the earlier rounds', until it decides or the pair's timed
    runs have taken this many seconds (a round already begun is finished), at most ``max_rounds`` rounds,
    every look at the Bonferroni level over them (``look_level``)."""
    spec = ALL_PAIRS[pair]
    fid = spec["expect"]
    if spec.get("mode", mode) != mode:  # a pair that cannot be timed in alternating blocks (its table says why)
        mode, steps, skip = spec["mode"], max(steps, 12), max(skip, 3)
    out: dict = {"pair": pair, "rule": fid, "case": spec["case"], "model": spec["model"], "world": spec["world"],
                 "device": spec.get("device", "cpu"), "mode": mode, "load_start": os.getloadavg()}
    if stage != "analyse":
        for v in ("fault", "fix"):
            log(f"{pair}: capturing {v}")
            run_job(pair, v, ["--out", str(work / pair / v), "--active", str(active)])
    if stage == "record":
        runs, loads = timed_runs(pair, work, reps, steps, skip, mode, log) if reps else ({}, [])
        return out | {"fault_step_us": runs.get("fault", []), "fix_step_us": runs.get("fix", []),
                      "load_runs": loads, "load_end": os.getloadavg()}
    analyses = {v: analyze(work / pair / v) for v in ("fault", "fix")}
    f = finding(analyses["fault"], fid)
    out |= {"fault_run": str(work / pair / "fault"), "fix_run": str(work / pair / "fix"),
            "found_on_fault": f is not None, "found_on_fix": finding(analyses["fix"], fid) is not None,
            "captured_step_us": (analyses["fault"].get("mean") or {}).get("duration_us"),
            "captured_fix_step_us": (analyses["fix"].get("mean") or {}).get("duration_us"),
            "predicted_us": f["impact_us"] if f else 0.0, "predicted_interval_us": predicted_interval(f) if f else None,
            # the step noise's part of P's interval, the number withheld (a starved capture), the contention
            "predicted_noise_interval_us": f.get("impact_noise_interval_us") if f else None,
            "impact_withheld": f.get("impact_withheld") if f else None,
            "wait_share": store.wait_share(analyses["fault"]),
            "contention": (analyses["fault"].get("contention") or {}).get("text"),
            "severity": f["severity"] if f else None,
            "evidence": [e["text"] for e in f.get("evidence", [])] if f else [],
            "other_findings_fault": [[g["id"], g["severity"], g["impact_us"]] for g in analyses["fault"]["findings"]
                                     if g["id"] != fid],
            "findings_fix": [[g["id"], g["severity"], g["impact_us"]] for g in analyses["fix"]["findings"]]}
    out["diff_fixes"] = [x["text"] for x in diff_fixes(work / pair / "fault", work / pair / "fix")]
    t0 = time.monotonic()
    runs, loads = (timed_runs(pair, work, reps, steps, skip, mode, log, record=stage != "analyse") if reps
                   else ({"fault": [], "fix": []}, []))
    p, rounds, per_round = out["predicted_us"], 1, [len(runs["fault"])]
    sequential = until_decided_s > 0 and stage == "all" and bool(reps)
    lvl = look_level(level, max_rounds) if sequential else level

    def measure():
        diffs = [a - b for a, b in zip(runs["fault"], runs["fix"])]
        return (diffs, statistics.fmean(diffs) if diffs else None, drift_interval(diffs, lvl, per_round),
                statistics.median(runs["fault"]) if runs["fault"] else None)

    diffs, m, m_iv, step = measure()
    while (sequential and rounds < max_rounds and undecided(m_iv, step)
           and time.monotonic() - t0 < until_decided_s):
        log(f"{pair}: M {_ms(m)}{_iv(m_iv)} ms undecided after {len(diffs)} pairs: round {rounds + 1}")
        more, more_loads = timed_runs(pair, work, reps, steps, skip, mode, log, tag=f"_{rounds}")
        for v in ("fault", "fix"):
            runs[v] += more[v]
        loads += more_loads
        rounds += 1
        per_round.append(len(more["fault"]))
        diffs, m, m_iv, step = measure()
    out |= {"rounds": rounds, "round_pairs": per_round, "max_rounds": max_rounds if sequential else 1,
            "interval": "t-drift", "interval_level": lvl}
    out |= {"fault_step_us": runs["fault"], "fix_step_us": runs["fix"], "paired_diff_us": diffs,
            "measured_us": m, "measured_interval_us": m_iv, "level": level,
            "ratio": (p / m) if m else None,
            "verdict": verdict(p, out["predicted_interval_us"], m, m_iv, out["found_on_fault"], tolerance, step)
            if m is not None else "not timed",
            "basis": basis(p, out["predicted_interval_us"], m, m_iv, out["found_on_fault"], tolerance, step)
            if m is not None else None,
            "load_runs": loads, "load_end": os.getloadavg()}
    if m is not None:
        out["loaded_verdict"] = store.loaded_verdict(out, out["verdict"])
    return out


# --------------------------------------------------------------------------- document
def _ms(us: float | None, nd: int = 1) -> str:
    return "n/a" if us is None else f"{us / 1e3:.{nd}f}"


def _iv(iv) -> str:
    return "" if iv is None else f" [{_ms(iv[0])}, {_ms(iv[1])}]"


def _inside_note(results: list[dict], n_ok: int, n_undecided: int) -> str:
    """The undecided pairs against the looser test, P inside M's interval: said apart, never counted as holding."""
    inside = sum(r.get("verdict") == "undecided" and r["measured_interval_us"] is not None
                 and r["measured_interval_us"][0] <= (r["predicted_us"] or 0.0) <= r["measured_interval_us"][1]
                 for r in results)
    if not n_undecided:
        return ""
    return (f" Of the undecided, {inside} have P inside M's interval: against 'within 35 % of M or inside its "
            f"interval' alone, {n_ok + inside} of {len(results)} would pass, but an interval that reaches the "
            "warning band cannot tell a prediction of no saving from a saving worth a warning.")


def render(results: list[dict], meta: dict) -> str:
    lvl = round(meta["level"] * 100)
    lines = [
        "# Predicted against measured savings",
        "",
        "Every finding's `impact_us` is a prediction: the time per step its fix saves. This page checks it on",
        "fault/fix pairs (`reference_jobs/pair_table.py`, run by `reference_jobs/pairs.py`): the fault run",
        "captured and analysed gives the predicted saving **P** of the pair's expected finding; both variants",
        f"then run bare, interleaved, {meta['reps']} times each, {meta['steps']} steps a run (a run's step time: the",
        f"median of its steps after the first {meta['skip']}; " + (
            "the runs are alternating blocks of one launch that holds both variants, in ABBA order" if meta["mode"] == "alternate"
            else "each run its own launch, pairs in ABBA order") + "); the measured saving **M** is the mean of the paired",
        "differences (fault run i minus fix run i) with " + (
            f"a bootstrap {lvl} % interval (this file's runs predate the drift-aware interval)"
            if meta.get("interval") != "t-drift" else
            f"a Student-t {lvl} % interval whose sample size is the effective one under the differences' lag-1 "
            "autocorrelation (taken as 0 when negative), over the launch means instead where launches scatter more "
            "than their pairs (`benchmarks/drift_stats.py`). " + AA_NOTE
            + (f" With --until-decided every look at M (after each round, at most {meta['max_rounds']}) is at level "
               f"{look_level(meta['level'], meta['max_rounds']) * 100:.1f} % (Bonferroni: 1 - (1 - {meta['level']:g}) / "
               f"{meta['max_rounds']}), so that stopping once M decides keeps the chance of any false decision "
               f"within {round((1 - meta['level']) * 100)} %; the intervals shown are at that level."
               if meta.get("max_rounds", 1) > 1 else "")) + ".",
        ("P's interval is as the rows' runs printed it: these runs predate the prediction-error interval, so it is "
         "the step noise alone (the t-interval of the per-step values the saving rests on); `analyze` now prints "
         "the prediction's own error (docs/savings.md)." if any("doc_row" in r for r in results) else
         "P's interval is as `analyze` printed it (`impact_interval_us`: the prediction's own error, docs/savings.md)."),
        "",
        "Verdict. Where M's interval holds 0 the fix saves nothing measurable at this machine's noise: the",
        "prediction *holds* only if it promises no more than that (P inside M's interval, or no finding).",
        f"Otherwise P *holds* when it is within {round(meta['tolerance'] * 100)} % of M, or inside M's interval, or when P's interval",
        f"overlaps M's and is itself as tight as the tolerance (half-width at most {round(meta['tolerance'] * 100)} % of P): two",
        "estimates of one saving that agree within their stated uncertainty (a wider P interval would agree with",
        "anything near it, so it does not count). *over* / *under* otherwise; *missed* when the fault run does",
        "not show the finding and M is measurable. *undecided* where M's interval holds 0 and its upper end",
        f"is above the warning band ({round(warning_frac() * 100)} % of the fault step): such a measurement neither shows a saving nor rules",
        "out one worth a warning, so it tests no prediction (it is counted apart, not as holding).",
        "",
        f"Regenerate: `{meta['command']}` (see benchmarks/README.md).",
        "",
        f"Measured on {meta['machine']} (when, and under what load: benchmarks/calibration/).",
        "",
        f"| rule | case | P ms | M ms [{lvl} %] | P/M | verdict | step ms fault / fix | fix clears it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "doc_row" in r:  # a result kept as its page wrote it (residuals.py --seed-from-doc)
            lines.append(r["doc_row"])
            continue
        if "error" in r:
            lines.append(f"| {r['rule']} | {r['case']} | | | | error: {r['error']} | | |")
            continue
        fs = statistics.median(r["fault_step_us"]) if r["fault_step_us"] else None
        xs = statistics.median(r["fix_step_us"]) if r["fix_step_us"] else None
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        said = r["verdict"]
        why = r.get("basis") if "basis" in r else None
        if said == "holds":
            if why is None:  # a --json written before the basis was kept
                why = ("within" if abs(r["predicted_us"] - r["measured_us"]) <= meta["tolerance"] * abs(r["measured_us"])
                       else "inside M's interval")
            if not why.startswith("within"):
                said = f"holds ({why})"
        p = _ms(r["predicted_us"]) + _iv(r["predicted_interval_us"]) + ("" if r["found_on_fault"] else " (not found)")
        lines.append(f"| {r['rule']} | {r['case']} | {p} | {_ms(r['measured_us'])}{_iv(r['measured_interval_us'])} "
                     f"| {ratio} | {said} | {_ms(fs)} / {_ms(xs)} | "
                     f"{'no (still found)' if r['found_on_fix'] else 'yes' if r['found_on_fault'] else 'n/a'} |")
    n_ok = sum(r.get("verdict") == "holds" for r in results)
    n_tight = sum(r.get("verdict") == "holds" and abs(r["predicted_us"] - r["measured_us"])
                  <= meta["tolerance"] * abs(r["measured_us"]) for r in results)
    n_undecided = sum(r.get("verdict") == "undecided" for r in results)
    lines += ["", f"{n_ok} of {len(results)} predictions hold: {n_tight} within {round(meta['tolerance'] * 100)} % "
              f"of M, {n_ok - n_tight} on M's or both intervals (see the verdict column)"
              + (f"; {n_undecided} undecided (M too noisy to test them)" if n_undecided else "") + "."
              + _inside_note(results, n_ok, n_undecided),
              *[f"\n{x}" for x in meta.get("notes", [])], "", "## Per pair", ""]
    for r in results:
        if "doc_section" in r:
            lines += r["doc_section"]
            continue
        lines.append(f"### {r['pair']} ({r['rule']})")
        lines.append("")
        if "error" in r:
            lines += [f"error: {r['error']}", ""]
            continue
        lines.append(f"- case: {r['case']}; model `{r['model']}`, {r['world']} process(es)")
        lines.append(f"- fault capture: step {_ms(r['captured_step_us'])} ms, finding "
                     + (f"{r['severity']}, P {_ms(r['predicted_us'])} ms" if r["found_on_fault"] else "not found"))
        for e in r["evidence"]:
            lines.append(f"  - {e}")
        if r["other_findings_fault"]:
            lines.append("- other findings on the fault: " + ", ".join(
                f"{i} ({s}, {_ms(u)} ms)" for i, s, u in r["other_findings_fault"]))
        lines.append(f"- fix capture: step {_ms(r['captured_fix_step_us'])} ms, findings: " + (", ".join(
            f"{i} ({s}, {_ms(u)} ms)" for i, s, u in r["findings_fix"]) or "none"))
        for t in r.get("diff_fixes", []):
            lines.append(f"- `fsdpdoctor diff FAULT FIX` on the captures: {t}")
        if r.get("rounds", 1) > 1:
            lines.append(f"- timed in {r['rounds']} rounds of {meta['reps']} runs a variant (--until-decided: "
                         "rounds added while M's interval held 0 and reached the warning band), pooled, "
                         + (f"every look at {r['interval_level'] * 100:.1f} % (Bonferroni over "
                            f"{r.get('max_rounds')} rounds)" if r.get("max_rounds", 1) > 1 else
                            "without a per-look correction (these runs predate it): a rule that stops once M "
                            "decides favours deciding, so this interval covers less than its nominal level"))
        lines.append("- timed runs (ms), fault: " + ", ".join(_ms(x) for x in r["fault_step_us"])
                     + "; fix: " + ", ".join(_ms(x) for x in r["fix_step_us"]))
        lines.append("")
    return "\n".join(lines) + "\n"


def reinterval(data: dict) -> None:
    """M's interval of an earlier --json again by the current rule (one look at the file's level, its
    rounds of ``reps`` pairs as launches), for runs timed before it."""
    meta = data["meta"]
    for r in data["pairs"]:
        if r.get("measured_us") is None or r.get("interval") == "t-drift":
            continue
        diffs = [a - b for a, b in zip(r["fault_step_us"], r["fix_step_us"])]
        k = meta["reps"] if len(diffs) % meta["reps"] == 0 else len(diffs)
        r["measured_interval_us"] = drift_interval(diffs, meta["level"], [k] * (len(diffs) // k))
        r |= {"interval": "t-drift", "interval_level": meta["level"]}
    meta["interval"] = "t-drift"


def run_record(results: list[dict], meta: dict) -> str:
    """When and under what load a page's runs were made: beside the measurements (benchmarks/), not on the
    user's page."""
    lines = [f"# The runs behind {meta.get('page', 'the page')}", "",
             f"Measured {meta['date']} on {meta['machine']}; load average (1 min) {meta['load']}.", "",
             "| pair | rule | load average over its runs |", "|---|---|---|"]
    for r in results:
        runs = r.get("load_runs") or []
        lines.append(f"| {r['pair']} | {r['rule']} | "
                     + (f"{min(runs):.1f}-{max(runs):.1f}" if runs else "n/a") + " |")
    return "\n".join(lines) + "\n"


def write_page(doc: str, results: list[dict], meta: dict) -> None:
    """The page, and its run record: benchmarks/calibration/<page>-runs.md for a page of docs/, else beside it."""
    page = Path(doc)
    page.write_text(render(results, meta))
    record = (ROOT / "benchmarks" / "calibration" if page.resolve().parent == ROOT / "docs" else page.parent)
    record.mkdir(parents=True, exist_ok=True)
    (record / f"{page.stem}-runs.md").write_text(run_record(results, {**meta, "page": f"docs/{page.name}"}))


def write_page_all(doc: str, data: dict) -> None:
    """docs/impact.md from the calibration record, and its run record (every run's dates and loads)."""
    page = Path(doc)
    page.write_text(render_all(data))
    record = (ROOT / "benchmarks" / "calibration" if page.resolve().parent == ROOT / "docs" else page.parent)
    record.mkdir(parents=True, exist_ok=True)
    runs = data["runs"]
    text = run_record(runs["quiet"]["pairs"], {**runs["quiet"]["meta"], "page": f"docs/{page.name}"}) \
        if "quiet" in runs else f"# The runs behind docs/{page.name}\n"
    for label in sorted((k for k in runs if k != "quiet"), key=lambda k: int(k.split()[1])):
        text += "\n" + "\n".join(store.loaded_record(label, runs[label]))
    (record / f"{page.stem}-runs.md").write_text(text)


def rerender(path: Path, doc: str, again: bool = False) -> int:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"calibrate: {path}: {e}", file=sys.stderr)
        return 2
    if "runs" in data:  # the calibration record: every run's table
        if doc != "-":
            write_page_all(doc, data)
        return 0
    tol = data["meta"]["tolerance"]
    if again:
        reinterval(data)
    for r in data["pairs"]:
        if "diff_fixes" not in r and "fault_run" in r and Path(r["fault_run"]).is_dir():
            r["diff_fixes"] = [x["text"] for x in diff_fixes(Path(r["fault_run"]), Path(r["fix_run"]))]
        if r.get("measured_us") is not None:  # the verdict again, by this file's rule
            step = statistics.median(r["fault_step_us"]) if r.get("fault_step_us") else None
            args = (r["predicted_us"], r["predicted_interval_us"], r["measured_us"], r["measured_interval_us"],
                    r["found_on_fault"], tol, step)
            r["verdict"], r["basis"] = verdict(*args), basis(*args)
    path.write_text(json.dumps(data, indent=1))
    if doc != "-":
        write_page(doc, data["pairs"], data["meta"])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=None, help="comma-separated pair names (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs (blocks) per variant")
    ap.add_argument("--mode", choices=["alternate", "processes"], default="alternate",
                    help="alternate: both variants in one launch, alternating blocks; processes: a launch per run")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed run (default: 7 alternate, 12 processes)")
    ap.add_argument("--skip", type=int, default=None,
                    help="first steps of a timed run left out (default: 1 alternate, 3 processes: start-up)")
    ap.add_argument("--active", type=int, default=6, help="profiled steps of the captured runs")
    ap.add_argument("--level", type=float, default=0.90)
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one, removed)")
    ap.add_argument("--doc", default=None,
                    help="markdown out ('-': none; default docs/impact.md, docs/impact-cuda.md with --device cuda)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--rerender", default=None, metavar="JSON",
                    help="write the document again from an earlier --json (adding the diff lines of runs kept with "
                         "--work when it lacks them, the verdicts by the current rule), running nothing else")
    ap.add_argument("--reinterval", action="store_true",
                    help="with --rerender: M's interval again by the current rule (for files timed before it)")
    ap.add_argument("--aa", nargs="+", default=None, metavar="JSON",
                    help="the A/A check on earlier --json files: how often the old and the current interval exclude "
                         "0 on pseudo-A/A pairs (blocks of one variant nearest in time), running nothing else")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="the pair set: cpu (gloo, 2 processes) or cuda (one GPU, NCCL; where a GPU is lent)")
    ap.add_argument("--stage", choices=["all", "record", "analyse"], default="all",
                    help="record: captures and timed runs only, into --work (on a GPU machine without fsdpdoctor's "
                         "dependencies); analyse: the analyses and the document from a recorded --work")
    ap.add_argument("--until-decided", type=float, default=0.0, metavar="SECONDS",
                    help="per pair: while M is undecided (its interval holds 0 and reaches the warning band), add "
                         "rounds of --reps timed runs a variant, pooled, until decided or the pair's timed runs "
                         "have taken SECONDS (stage all only; default 0: one round)")
    ap.add_argument("--max-rounds", type=int, default=4,
                    help="--until-decided: at most this many rounds K, every look at level 1 - (1 - level) / K")
    ap.add_argument("--hog", type=int, default=0, metavar="N",
                    help="N processes spinning on the CPU beside the pairs (started and killed by this script)")
    ap.add_argument("--calibration", default=None, metavar="JSON",
                    help="add the results to this calibration record (benchmarks/calibration.json) under 'quiet' or "
                         "'hog N' and write the document from the whole record (both tables)")
    ap.add_argument("--machine", default=None, help="the machine named in the document (default: this one's cores)")
    ap.add_argument("--note", action="append", default=[], help="a paragraph for the document (repeatable)")
    args = ap.parse_args(argv)
    if args.aa:
        try:
            res = aa_rates([Path(p) for p in args.aa], args.level)
        except (OSError, ValueError, KeyError) as e:
            print(f"calibrate: --aa: {e}", file=sys.stderr)
            return 2
        print(f"{res['cases']} launches, {res['pairs']} pseudo-A/A pairs; {round(args.level * 100)} % intervals "
              "excluding 0 (truth 0): " + "; ".join(f"{k}: old (bootstrap) {v['old']}, new (t-drift) {v['new']}"
                                                    for k, v in res["rates"].items()))
        return 0
    if args.rerender:  # the document of the device the runs were made on, unless --doc names one
        return rerender(Path(args.rerender), args.doc or str(ROOT / "docs" / (
            "impact-cuda.md" if args.device == "cuda" else "impact.md")), args.reinterval)
    table = CUDA_PAIRS if args.device == "cuda" else PAIRS
    names = list(table) if not args.pairs else [p.strip() for p in args.pairs.split(",") if p.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"calibrate: unknown pair(s) {', '.join(unknown)}; known {args.device} pairs: {', '.join(table)}",
              file=sys.stderr)
        return 2
    if args.doc is None:
        args.doc = "-" if args.stage == "record" else str(ROOT / "docs" / (
            "impact-cuda.md" if args.device == "cuda" else "impact.md"))
    if args.until_decided < 0 or (args.until_decided and args.stage != "all") or args.max_rounds < 1:
        print("calibrate: --until-decided takes seconds >= 0 and needs --stage all (the verdict needs the analyses)",
              file=sys.stderr)
        return 2
    if args.stage != "all" and not args.work:
        print("calibrate: --stage record/analyse needs --work", file=sys.stderr)
        return 2
    if args.hog < 0:
        print("calibrate: --hog takes a count >= 0", file=sys.stderr)
        return 2
    if args.steps is None:
        args.steps = 7 if args.mode == "alternate" else 12
    if args.skip is None:
        args.skip = 1 if args.mode == "alternate" else 3
    if args.skip >= args.steps:
        print("calibrate: --skip must be below --steps", file=sys.stderr)
        return 2
    tmp = None
    if args.work:
        work = Path(args.work)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="fsdpdoctor-calibrate-")
        work = Path(tmp.name)
    load0 = os.getloadavg()[0]
    results = []
    with store.Hogs(args.hog):   # spinning through every pair's captures and timings, killed on the way out
        _run_pairs(args, names, table, work, results)
    load1 = os.getloadavg()[0]
    _write(args, results, load0, load1)
    if tmp is not None:
        tmp.cleanup()
    return 0


def _run_pairs(args, names: list[str], table: dict, work: Path, results: list[dict]) -> None:
    for name in names:
        try:
            results.append(calibrate_pair(name, work, args.reps, args.steps, args.skip, args.level, args.tolerance,
                                          args.active, args.mode, log=lambda s: print(s, file=sys.stderr, flush=True),
                                          stage=args.stage, until_decided_s=args.until_decided,
                                          max_rounds=args.max_rounds))
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
            results.append({"pair": name, "rule": table[name]["expect"], "case": table[name]["case"],
                            "error": str(e).splitlines()[0]})
        r = results[-1]
        if args.stage == "record" and "error" not in r:
            med = {v: statistics.median(r[f"{v}_step_us"]) if r[f"{v}_step_us"] else None for v in ("fault", "fix")}
            print(f"{name}: recorded; step fault {_ms(med['fault'])} ms, fix {_ms(med['fix'])} ms", flush=True)
            continue
        print(f"{name}: P {_ms(r.get('predicted_us'))} ms, M {_ms(r.get('measured_us'))}"
              f"{_iv(r.get('measured_interval_us'))} ms, {r.get('verdict', r.get('error'))}"
              + (f", wait {r['wait_share']:.0%}" if r.get("wait_share") is not None else ""), flush=True)


def _write(args, results: list[dict], load0: float, load1: float) -> None:
    defaults = {"mode": "alternate", "reps": 5, "steps": 7 if args.mode == "alternate" else 12,
                "skip": 1 if args.mode == "alternate" else 3, "pairs": None, "until-decided": 0.0,
                "max-rounds": 4 if args.until_decided else args.max_rounds, "hog": 0,
                "calibration": None}
    cmd = " ".join(["python benchmarks/calibrate.py", *(f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}"
                                                        for k, v in (
        ("mode", args.mode), ("reps", args.reps), ("steps", args.steps), ("skip", args.skip), ("pairs", args.pairs),
        ("until-decided", args.until_decided), ("max-rounds", args.max_rounds), ("hog", args.hog),
        ("calibration", args.calibration)) if v != defaults[k])])
    if args.device == "cuda":
        cmd = (cmd.replace("calibrate.py", "calibrate.py --device cuda --stage record --work W") + " on the GPU "
               "machine, then `python benchmarks/calibrate.py --device cuda --stage analyse --work W` here")
    loads = [x for r in results for x in r.get("load_runs", [])]
    load = (f"{min(loads):.1f}-{max(loads):.1f} over the timed runs" if args.stage == "analyse" and loads
            else f"{load0:.1f} at the start, {load1:.1f} at the end")
    meta = {"mode": args.mode, "reps": args.reps, "steps": args.steps, "skip": args.skip, "level": args.level,
            "tolerance": args.tolerance, "command": cmd, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": args.machine or f"{os.cpu_count()} CPU cores, gloo, torch CPU", "load": load,
            "device": args.device, "stage": args.stage, "notes": args.note, "interval": "t-drift",
            "max_rounds": args.max_rounds if args.until_decided else 1, "hogs": args.hog}
    if args.calibration:
        data = store.merge(Path(args.calibration), store.label(args.hog), meta, results)
        if args.doc != "-":
            write_page_all(args.doc, data)
    elif args.doc != "-":
        write_page(args.doc, results, meta)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "pairs": results}, indent=1))


def render_all(data: dict) -> str:
    """docs/impact.md from the calibration record: the quiet table, then one per hog count."""
    runs = data["runs"]
    quiet = runs.get("quiet")
    text = render(quiet["pairs"], quiet["meta"]) if quiet else "# Predicted against measured savings\n"
    for run_label in sorted((k for k in runs if k != "quiet"), key=lambda k: int(k.split()[1])):
        text += "\n" + "\n".join(store.render_loaded(run_label, runs[run_label], verdict))
    return text


if __name__ == "__main__":
    sys.exit(main())
