"""``analyze --compare-hta``: HTA's comm/compute overlap beside ours.

HTA is an optional extra (``pip install fsdpdoctor[hta]``, i.e. ``pip install
traceinsight``: HTA's current release, whose import package is still ``hta``; the
older ``HolisticTraceAnalysis`` 0.5.0 also works); it is imported lazily and only here.

How HTA defines the overlap (``hta/analyzers/communication_analysis.py``,
``hta/common/trace.py``, ``hta/utils/utils.py``), see docs/overlap-vs-hta.md:

* one number per rank over the *whole trace*, not per iteration;
* kernels kept: device events (kernels, memcpy, memset) whose launching host
  event is in the trace and starts before the start of the latest
  ``ProfilerStep#`` event (so the last profiler step is dropped, kernels
  launched before the first step are kept, kernels without a launch record are
  dropped). In 0.5.0 the latest ``ProfilerStep#`` event may be a GPU-side
  ``gpu_user_annotation`` (ROCm/newer Kineto): then nothing is dropped. From
  0.6 (traceinsight) only host events count for that cut, and
  ``include_last_profiler_step=True`` keeps kernels launched up to the end of the
  last step instead: we then also show HTA over all steps beside our headline;
* communication = ``^nccl.*Kernel``; computation = every other kernel except
  names matching ``.*Memcpy``, ``^Memset`` or ``.*Sync``;
* overlap = |union(comm) ∩ union(comp)| / |union(comm)|, with timestamps
  truncated to whole microseconds by its parser.

Ours (fsdpdoctor/analysis/breakdown.py) is per ``ProfilerStep`` window by
execution time, all steps, float timestamps. We show both our headline figure
(all analysed steps) and the same per-step numbers restricted to the steps HTA
looks at, so a difference can be read as "definition" or "disagreement".
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import shutil
import tempfile
import warnings
from pathlib import Path

from fsdpdoctor.results import Analysis, RankSummary
from fsdpdoctor.trace.vocabulary import STEP_NAME
from fsdpdoctor.report.terminal import terminal_console

INSTALL_HINT = ("--compare-hta: HTA is not installed; `pip install traceinsight` "
                "(or `pip install 'fsdpdoctor[hta]'`) is needed")


def hta_release() -> tuple[str, str] | None:
    """(distribution, version) of the installed HTA: traceinsight (current) or HolisticTraceAnalysis (old)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("traceinsight", "HolisticTraceAnalysis"):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def _host_only_step_cut() -> bool:
    """HTA >= 0.6 (traceinsight) cuts at the latest *host* ProfilerStep; 0.5.0 at any category's."""
    rel = hta_release()
    return rel is not None and rel[0] == "traceinsight"


def overlap_pct(steps) -> float | None:
    """Per-rank overall overlap: Σ overlapped_comm_us / Σ comm_us over ``steps`` (percent)."""
    comm = sum(s.comm_us for s in steps)
    if comm <= 0:
        return None
    return 100.0 * sum(s.overlapped_comm_us for s in steps) / comm


def hta_steps(summary: RankSummary, last_step_start: float | None):
    """Our steps that HTA 0.5.0 also looks at: those starting before the latest ProfilerStep event."""
    if last_step_start is None:
        return list(summary.steps)
    return [s for s in summary.steps if s.start_us < last_step_start]


def last_profiler_step_start(path: Path, host_only: bool | None = None) -> float | None:
    """Start of the latest ``ProfilerStep#`` event (HTA's cut), None if < 2 distinct steps.

    ``host_only``: only host events count (HTA >= 0.6); default: as the installed HTA does.
    """
    from fsdpdoctor.trace.loader import load_file
    from fsdpdoctor.trace.table import DEVICE_CATEGORIES, GPU_ANNOTATION

    if host_only is None:
        host_only = _host_only_step_cut()
    t = load_file(path)
    rows = t.rows_named(lambda n: STEP_NAME.match(n) is not None)
    if host_only:
        device_tracks = set(t.device_tracks())
        rows = rows[[int(t.cat[r]) not in (*DEVICE_CATEGORIES, GPU_ANNOTATION) and int(t.track[r]) not in device_tracks
                     for r in rows]] if len(rows) else rows
    if len({t.name(r) for r in rows}) < 2:
        return None
    return float(t.ts[rows].max())


def _trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
                  and p.name != "manifest.json")


def run_hta(files: list[Path], include_last_step: bool = False) -> dict[int, float]:
    """HTA's ``comp_comm_overlap_pctg`` per rank (NaN where the trace has no GPU kernels).

    ``include_last_step`` asks HTA >= 0.6 to keep the last profiler step (TypeError on 0.5.0).

    HTA wants a folder: we give it a temporary folder of symlinks (copies where
    symlinks are not allowed); the input is never written to.
    """
    from hta.trace_analysis import TraceAnalysis  # noqa: PLC0415 - optional dependency

    tmp = Path(tempfile.mkdtemp(prefix="fsdpdoctor-hta-"))
    try:
        for f in files:
            dst = tmp / f.name
            try:
                dst.symlink_to(f.resolve())
            except OSError:
                shutil.copyfile(f, dst)
        sink = io.StringIO()
        hta_logger = logging.getLogger("hta")
        old_level = hta_logger.level
        hta_logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                warnings.simplefilter("ignore")
                kw = {"include_last_profiler_step": True} if include_last_step else {}
                ta = TraceAnalysis(trace_dir=str(tmp), **kw)
                df = ta.get_comm_comp_overlap(visualize=False)
        finally:
            hta_logger.setLevel(old_level)
        return {int(r): float(v) for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def supports_last_step() -> bool:
    import inspect

    from hta.trace_analysis import TraceAnalysis  # noqa: PLC0415 - optional dependency

    return "include_last_profiler_step" in inspect.signature(TraceAnalysis.__init__).parameters


def _pct(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v


def comparison_rows(path: str | Path, analysis: Analysis, hta: dict[int, float],
                    hta_all: dict[int, float] | None = None) -> list[dict]:
    """One row per analysed rank: HTA %, ours (all steps) %, ours on HTA's steps %, HTA on all steps %."""
    path = Path(path)
    by_file = {}
    rows = []
    for r in analysis.ranks:
        f = Path(r.file)
        if f not in by_file:
            try:
                by_file[f] = last_profiler_step_start(f)
            except Exception:  # noqa: BLE001 - the comparison is best effort
                by_file[f] = None
        h = hta.get(r.rank)
        rows.append({"rank": r.rank, "dialect": r.dialect,
                     "hta": None if h is None or math.isnan(h) else h,
                     "hta_nan": h is not None and math.isnan(h),
                     "ours": overlap_pct(r.steps),
                     "ours_hta_steps": overlap_pct(hta_steps(r, by_file[f])),
                     "steps": [s.step for s in r.steps],
                     "hta_step_list": [s.step for s in hta_steps(r, by_file[f])],
                     "hta_all": _pct((hta_all or {}).get(r.rank))})
    return rows


def print_comparison(path, analysis: Analysis, console=None) -> None:
    from rich.table import Table

    console = console or terminal_console()
    try:
        import hta  # noqa: F401,PLC0415
    except ImportError:
        console.print(INSTALL_HINT, highlight=False, markup=False)
        return
    path = Path(path)
    try:
        hta_result = run_hta(_trace_files(path))
        hta_all = run_hta(_trace_files(path), include_last_step=True) if supports_last_step() else None
    except Exception as exc:  # noqa: BLE001 - HTA failures must not break our report
        first = str(exc).splitlines()[0] if str(exc) else ""
        console.print(f"--compare-hta: HTA failed on {path}: {type(exc).__name__}: {first[:160]}",
                      highlight=False, markup=False)
        return
    rows = comparison_rows(path, analysis, hta_result, hta_all)
    rel = hta_release()
    title = "Comm/compute overlap: HTA vs fsdpdoctor" + (f" ({rel[0]} {rel[1]})" if rel else "")
    table = Table(title=title, title_justify="left")
    cols = ["rank", "HTA", "ours (HTA's steps)", "diff (HTA's steps)", "ours (all steps)"]
    if hta_all is not None:
        cols += ["HTA (all steps)", "diff (all steps)"]
    for col in cols:
        table.add_column(col, justify="right")

    def fmt(v):
        return "-" if v is None else f"{v:.1f} %"

    notes = set()
    for row in rows:
        if row["hta_nan"] or row["hta"] is None:
            hta_txt, diff = "n/a", "-"
            if row["hta_nan"] or row["dialect"] == "cpu":
                notes.add("n/a: HTA only measures GPU kernels (NCCL vs compute kernels); this trace has none "
                          "of one kind, so HTA has no overlap figure")
        else:
            hta_txt = fmt(row["hta"])
            o = row["ours_hta_steps"]
            diff = "-" if o is None else f"{o - row['hta'] + 0.0:+.1f} pp".replace("-0.0", "+0.0")
        if row["steps"] != row["hta_step_list"]:
            notes.add("HTA drops the last profiler step (kernels launched in it)")
        cells = [str(row["rank"]), hta_txt, fmt(row["ours_hta_steps"]), diff, fmt(row["ours"])]
        if hta_all is not None:
            ha = row["hta_all"]
            cells += [fmt(ha), "-" if ha is None or row["ours"] is None else f"{row['ours'] - ha + 0.0:+.1f} pp"]
        table.add_row(*cells)
    console.print(table)
    for n in sorted(notes):
        console.print(f"  note: {n}; see docs/overlap-vs-hta.md", highlight=False, markup=False)
