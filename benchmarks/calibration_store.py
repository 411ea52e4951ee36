"""The calibration's record, ``benchmarks/calibration.json``, and the CPU hogs it is measured beside.

``calibrate.py --calibration benchmarks/calibration.json`` adds its pairs' results to the file under the run's
label ("quiet": no hog started by the script, whatever the machine's own load; "hog N": N spinning processes
beside the pairs), replacing earlier results of the same pair under that label, and writes docs/impact.md from
the whole file: the quiet table, then one table per hog count. ``calibrate.py --rerender
benchmarks/calibration.json`` writes the document again from the file alone.

Each result keeps the fault capture's contention (``wait_share``: the share of the profiled window the ranks'
training threads waited for a CPU, analysis/contention.py) beside P, M and the step, which is what
``residuals.py`` derives the prediction-error table of fsdpdoctor/diagnose/thresholds.py from.
"""

from __future__ import annotations

import json
import os
import statistics
import signal
import subprocess
import sys
from pathlib import Path

# A hog spins and looks at its parent every ~50 ms: orphaned (the script killed without its cleanup), it
# ends by itself instead of spinning on.
_HOG = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
        "    for _ in range(200000):\n        pass\n")


class Hogs:
    """``n`` processes spinning on the CPU for as long as the ``with`` block runs: started and killed here,
    by their own ids (on SIGTERM too), never left behind."""

    def __init__(self, n: int):
        self.n, self.procs = n, []
        self._old_term = None

    def __enter__(self) -> Hogs:
        if self.n:
            self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def _on_term(self, signum, frame):
        raise SystemExit(128 + signum)   # the with block's exit kills the hogs

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


def label(hogs: int) -> str:
    return "quiet" if not hogs else f"hog {hogs}"


def wait_share(analysis: dict) -> float | None:
    """The fault capture's contention (``analyze --json``'s ``contention.wait_share``), None when not recorded."""
    c = analysis.get("contention") or {}
    w = c.get("wait_share")
    return float(w) if isinstance(w, (int, float)) else None


def load(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"runs": {}}


def merge(path: Path, run_label: str, meta: dict, pairs: list[dict]) -> dict:
    """Add one run's results under ``run_label`` (a pair timed again replaces its earlier result there)."""
    data = load(path)
    run = data["runs"].setdefault(run_label, {"meta": meta, "pairs": []})
    # a table made in pieces (--pairs): each piece's date, load and command
    piece = {"date": meta["date"], "load": meta["load"], "command": meta["command"]}
    run["meta"] = meta | {"pieces": [*run["meta"].get("pieces", []), piece]}
    new = {r["pair"] for r in pairs if "error" not in r}
    # the run folders are this machine's temporary paths: not kept in the record
    kept = [{k: v for k, v in r.items() if k not in ("fault_run", "fix_run")} for r in pairs if "error" not in r]
    run["pairs"] = [r for r in run["pairs"] if r["pair"] not in new] + kept
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return data


def records(data: dict) -> list[dict]:
    """Every timed result of the file, each with its run's label: what the residual table is derived from."""
    out = []
    for run_label, run in data["runs"].items():
        for r in run["pairs"]:
            if r.get("measured_us") is not None:
                out.append(r | {"label": run_label})
    return out


def _ms(us) -> str:
    return "n/a" if us is None else f"{us / 1e3:.1f}"


def _iv(iv) -> str:
    return "" if not iv else f" [{_ms(iv[0])}, {_ms(iv[1])}]"


def as_printed(r: dict, level: float = 0.90) -> dict:
    """P's interval (or the reason it is withheld) as ``analyze`` prints it with the current error table, from
    the record's step noise and contention: a run recorded before a change of the table shows the table's
    interval, not the one of its day."""
    from fsdpdoctor.diagnose.prediction import interval_for, withheld

    why = withheld(r.get("wait_share"))
    noise = r.get("predicted_noise_interval_us") or r.get("predicted_interval_us")
    hw = (noise[1] - noise[0]) / 2 if noise else 0.0
    step = r.get("captured_step_us") or 0.0
    iv = None if why or not step else list(interval_for(r["rule"], r.get("predicted_us") or 0.0, hw, step,
                                                        r.get("wait_share"), level))
    return r | {"impact_withheld": why, "predicted_interval_us": iv}


def loaded_verdict(r: dict, plain_verdict: str) -> str:
    """Beside hogs a prediction holds as on a quiet host, or says what the contention allows: its number
    withheld ("re-profile on an idle host"), or its interval widened so that it holds M. It fails where P is
    outside M's interval (beyond the tolerance) and its own interval excludes M."""
    if r.get("impact_withheld"):
        return "withheld"
    if plain_verdict in ("holds", "undecided"):
        return plain_verdict
    piv, m = r.get("predicted_interval_us"), r["measured_us"]
    if piv and piv[0] <= m <= piv[1]:
        return "holds (M inside P's interval)"
    return plain_verdict


def loaded_record(run_label: str, run: dict) -> list[str]:
    """When and under what load one hog count's pieces ran (benchmarks/calibration/, not the page)."""
    meta = run["meta"]
    pieces = meta.get("pieces") or [{"date": meta["date"], "load": meta["load"], "command": meta["command"]}]
    lines = [f"## Beside {run_label.split()[1]} CPU hog(s)", ""]
    lines += [f"- {p['date']}, load average (1 min) {p['load']}: `{p['command']}`" for p in pieces]
    lines += ["", "| pair | rule | load average over its runs |", "|---|---|---|"]
    for r in run["pairs"]:
        runs = r.get("load_runs") or []
        lines.append(f"| {r['pair']} | {r['rule']} | " + (f"{min(runs):.1f}-{max(runs):.1f}" if runs else "n/a") + " |")
    return lines + [""]


def render_loaded(run_label: str, run: dict, verdict) -> list[str]:
    """The table of one hog count's run: what the contention fact said, P as printed, M and the verdict
    (``verdict``: the quiet table's rule, calibrate.verdict, judged on P as printed now)."""
    meta, lines = run["meta"], []
    lvl = round(meta["level"] * 100)
    pieces = meta.get("pieces") or [{"date": meta["date"], "load": meta["load"], "command": meta["command"]}]
    lines += [f"## Beside {run_label.split()[1]} CPU hog(s)", "",
              f"The same pairs with {run_label.split()[1]} processes spinning beside them (started and killed by "
              f"`calibrate.py --hog`), on {meta['machine']}, measured in {len(pieces)} piece(s): "
              + "; ".join(f"`{p['command']}`" for p in pieces)
              + " (when, and under what load: benchmarks/calibration/). *wait* is the fault capture's contention "
              "(the share of its profiled window the ranks' training threads waited for a CPU); P is as `analyze` "
              "printed it, its interval widened by that contention, or withheld beyond the contention calibrated.",
              "", f"| rule | case | wait | P ms [{lvl} %] | M ms [{lvl} %] | verdict | step ms fault / fix |",
              "|---|---|---|---|---|---|---|"]
    run = run | {"pairs": [as_printed(r, meta["level"]) for r in run["pairs"]]}
    for r in run["pairs"]:
        step = statistics.median(r["fault_step_us"]) if r.get("fault_step_us") else None
        plain = verdict(r["predicted_us"], r["predicted_interval_us"], r["measured_us"], r["measured_interval_us"],
                        r["found_on_fault"], meta["tolerance"], step)
        r["loaded_verdict"] = loaded_verdict(r, plain)
    for r in run["pairs"]:
        w = "n/a" if r.get("wait_share") is None else f"{r['wait_share']:.0%}"
        p = "withheld" if r.get("impact_withheld") else _ms(r["predicted_us"]) + _iv(r.get("predicted_interval_us"))
        fs = statistics.median(r["fault_step_us"]) if r.get("fault_step_us") else None
        xs = statistics.median(r["fix_step_us"]) if r.get("fix_step_us") else None
        lines.append(f"| {r['rule']} | {r['case']} | {w} | {p} | {_ms(r['measured_us'])}{_iv(r['measured_interval_us'])} "
                     f"| {r['loaded_verdict']} | {_ms(fs)} / {_ms(xs)} |")
    for r in run["pairs"]:
        if r.get("impact_withheld"):
            lines += ["", f"- {r['pair']}: {r['impact_withheld']}"]
    return lines + [""]
