"""The one front door: any input -> ``Analysis`` (and, on request, the ranks' trace tables).

``open_analysis`` opens a trace file, a run folder, a folder of per-rank summaries or a saved
``--json``. A trace goes through one pipeline: find the ranks' files -> the per-rank step on each
rank (``rank_step``, mapped by an engine: this process, forked workers, a pool or Dask; or a current
summary read instead) -> the reduce (``analysis.map_reduce.reduce``) -> the rules -> the invariants
(``analysis/invariants.py``: nothing leaves that breaks them).
The main process only ever holds the ranks' compact results (unless the tables are asked for).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from fsdpdoctor.analysis import invariants, rankresult
from fsdpdoctor.analysis.map_reduce import analyze_rank, reduce, step_spec
from fsdpdoctor.analysis.map_reduce import param_dtype as model_dtype
from fsdpdoctor.analysis.rankresult import RankResult
from fsdpdoctor.diagnose import diagnose as run_rules
from fsdpdoctor.engines import make_engine
from fsdpdoctor.errors import InputError
from fsdpdoctor.options import Options
from fsdpdoctor.results import Analysis, DataQuality
import fsdpdoctor.trace.identity as identity
from fsdpdoctor.trace.io import read_head, read_raw, shown
from fsdpdoctor.trace.limits import parse_bounded
from fsdpdoctor.trace.loader import Progress, _merge_cycles, _trace_files, input_files, load_file, rank_from_filename
from fsdpdoctor.trace.manifest import read_manifest
from fsdpdoctor.trace.table import RankTrace
from fsdpdoctor.trace.windows import resolve_window, without_partial
from fsdpdoctor.visible_text import visible

# a saved ``--json`` starts with one of Analysis's keys (a trace starts with traceEvents/schemaVersion/...)
_ANALYSIS_HEAD = re.compile(rb'^\s*\{\s*"(source|job|schema_version)"\s*:')


@overload
def open_analysis(source: str | Path, options: Options | None = ..., *, tables: Literal[False] = ...,
                  **selection) -> Analysis: ...


@overload
def open_analysis(source: str | Path, options: Options | None = ..., *, tables: Literal[True],
                  **selection) -> tuple[Analysis, list[RankTrace]]: ...


def open_analysis(source, options=None, *, tables=False, **selection):
    """The ``Analysis`` of a trace file, a run folder, per-rank summaries or a saved ``--json``.

    ``options`` (``fsdpdoctor.options.Options``) carries every selection, from every door; keywords
    named like its fields change those of ``options`` (``ranks=[0]``). On a saved JSON only the
    ranks' and steps' samples asked for are kept (its findings and means stay as they were computed).
    ``tables=True`` returns ``(Analysis, per-rank tables)``, every trace read (no summaries; a saved
    JSON has no tables). A run folder with ``window-<step>`` folders (docs/capture.md): the latest
    window, or the one starting at step ``window``; a note names the others."""
    opts = (options or Options()).but(**selection)
    return _open_analysis(source, opts, tables)


def _open_analysis(source, opts: Options, tables: bool):
    path, window_note = resolve_window(Path(source), opts.window)
    if is_analysis_json(path):
        a = _read_saved(path, opts.ranks, opts.steps)
        return (a, []) if tables else a
    quality = DataQuality()
    manifest, results, traces = rank_results(path, opts.but(use_summaries=opts.use_summaries and not tables),
                                             quality=quality, keep_tables=tables)
    analysis = reduce(results, source=path, manifest=manifest)
    analysis.data_quality = quality
    if window_note:
        analysis.notes.insert(0, window_note)
    if opts.diagnose:
        analysis.findings = run_rules(analysis, thresholds=opts.thresholds)
    invariants.enforce(analysis)  # nothing is rendered that breaks them (analysis/invariants.py)
    return (analysis, traces) if tables else analysis


def is_analysis_json(path: str | Path) -> bool:
    """Whether ``path`` is a saved ``analyze --json`` document (read by its first bytes)."""
    p = Path(path)
    if not p.is_file() or p.name.endswith(".gz"):
        return False
    try:
        return _ANALYSIS_HEAD.match(read_head(p, 4096)) is not None
    except InputError:
        return False


def _read_saved(path: Path, ranks: list[int] | None, steps: set[int] | None) -> Analysis:
    try:
        a = parse_bounded(Analysis.from_json, read_raw(path), path, "--json document")
    except (ValueError, TypeError) as exc:  # msgspec.ValidationError is a ValueError
        raise InputError(str(path), f"not a readable fsdpdoctor --json document: {exc}") from None
    wrong = invariants.document_problems(a)
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise InputError(str(path), f"not an analysis as fsdpdoctor writes it (edited?): {wrong[0]}{more}")
    if ranks is not None:
        have = [r.rank for r in a.ranks]
        a.ranks = [r for r in a.ranks if r.rank in set(ranks)]
        if not a.ranks:
            raise InputError(str(path), f"no rank {', '.join(map(str, ranks))} in this document "
                                        f"(it has {', '.join(map(str, have)) or 'none'})")
    if steps is not None:
        have_steps = sorted({s.step for r in a.ranks for s in r.steps if s.step is not None})
        for r in a.ranks:
            r.steps = [s for s in r.steps if s.step in steps]
        if not any(r.steps for r in a.ranks):
            raise InputError(str(path), f"--steps {step_spec(sorted(steps))} matches no profiled step"
                                        + (f" (the document has steps {step_spec(have_steps)})" if have_steps else ""))
    return a


# ------------------------------------------------------------------------------ the per-rank step
@dataclass(frozen=True, slots=True)
class RankUnit:
    """The files of one rank (several when the profiler ran several cycles), and how to analyse them."""

    files: tuple[str, ...]
    steps: tuple[int, ...] | None = None
    param_dtype: str | None = None
    write_summary: bool = False          # `summarize`: write ``<trace>.summary.msgpack`` beside the trace
    summary_dir: str | None = None       # ... or into this folder
    cycle_files: tuple[str, ...] | None = None  # the manifest's profiler-cycle files of this rank (None: not listed)
    keep_tables: bool = False            # send the rank's tables back too (export)

    @property
    def label(self) -> str:
        """What an error about this unit names."""
        return self.files[0]


@dataclass(slots=True)
class RankOutput:
    """One rank found in a unit's files: its ``RankResult`` msgpack-encoded (small, so cheap to send
    back from a worker), and its tables when the unit asked for them."""

    result: bytes
    tables: RankTrace | None = None


def rank_step(unit: RankUnit, pieces: int = 1) -> list[RankOutput]:
    """Load, analyse and summarise one rank (what an engine maps). One output per rank found.

    ``pieces``: cores this rank may use to decode a large trace (``trace.split``)."""
    paths = [Path(f) for f in unit.files]
    traces = [load_file(p, pieces) for p in paths]
    # the manifest's word on which files are cycles of one process, for this rank only
    manifest = None if unit.cycle_files is None else {"cycle_files": {str(t.rank): list(unit.cycle_files)
                                                                      for t in traces}}
    traces = _merge_cycles(traces, manifest)
    steps = set(unit.steps) if unit.steps is not None else None
    out = []
    for t in traces:
        files = paths if len(traces) == 1 else [t.path]
        res = analyze_rank(t, steps, files=files, param_dtype=unit.param_dtype)
        if unit.write_summary:
            for p in files:  # one summary per trace file (a cycled rank gets the merged result once per file)
                dest = rankresult.summary_path(p)
                if unit.summary_dir:
                    dest = Path(unit.summary_dir) / dest.name
                rankresult.write(res, dest)
        out.append(RankOutput(rankresult.encode(res), t if unit.keep_tables else None))
        del t
    return out


# ------------------------------------------------------------------------------ inputs and the map
def find_inputs(path: Path, ranks: list[int] | None = None,
                quality: DataQuality | None = None) -> tuple[dict | None, list[list[Path]]]:
    """(manifest, trace files grouped by rank where file names tell the rank, else one file a group).

    What cannot be trusted (manifest fields, files that cannot be read) is noted in ``quality``."""
    dq = quality if quality is not None else DataQuality()
    manifest, files = input_files(path, dq)
    named = {f: rank_from_filename(f) for f in files}
    if len(files) > 1 and all(r is not None for r in named.values()):
        if ranks is not None:  # skip parsing files whose name says they are another rank
            files = [f for f in files if named[f] in set(ranks)]
        groups: dict[int, list[Path]] = {}
        for f in files:
            groups.setdefault(named[f], []).append(f)
        return manifest, list(groups.values())
    by_writer: dict[str, list[Path]] = {}
    for f in files:
        by_writer.setdefault(_writer(f), []).append(f)
    return manifest, list(by_writer.values())


_HANDLER_NAME = re.compile(r"^(?P<writer>.+)\.\d{9,}\.pt\.trace\.json(?:\.gz)?$")


def _writer(f: Path) -> str:
    """The process that wrote a trace, as torch.profiler's ``tensorboard_trace_handler`` names its files
    (``<host>_<pid>.<time ns>.pt.trace.json``): the profiler cycles of one process share it, and are
    analysed together (joined as separate runs of steps when they are one process's cycles)."""
    m = _HANDLER_NAME.match(f.name)
    return m.group("writer") if m else str(f)


def _cycle_files(manifest: dict | None, files: list[Path]) -> tuple[str, ...] | None:
    """The manifest's profiler-cycle files of this group's rank (None: the manifest lists none at all)."""
    cycles = (manifest or {}).get("cycle_files")
    if not isinstance(cycles, dict):
        return None
    rank = rank_from_filename(files[0])
    return tuple(cycles.get(str(rank), ())) if rank is not None else ()


def rank_results(path: Path, options: Options | None = None, *, write_summaries: bool = False,
                 summary_dir: Path | None = None, param_dtype: str | None = None, quality: DataQuality | None = None,
                 keep_tables: bool = False, **selection) -> tuple[dict | None, list[RankResult], list[RankTrace]]:
    """(manifest, every rank's ``RankResult``, the ranks' tables if ``keep_tables``): from current
    summaries where ``options`` allows, else from the per-rank step mapped by an engine (``options``:
    ranks, steps, engine, progress; keywords named like its fields change them).

    What the loader could not trust (manifest, files, dropped events, duplicates) goes into ``quality``,
    and which ranks' figures come from summaries. When the checks across ranks refuse a folder in which
    some ranks were read from summaries, every rank is read again from its trace: the traces decide."""
    opts = (options or Options()).but(**selection)
    dq = quality if quality is not None else DataQuality()
    kw = dict(write_summaries=write_summaries, summary_dir=summary_dir, param_dtype=param_dtype,
              keep_tables=keep_tables)
    used: list[Path] = []
    try:
        return _rank_results(path, opts, dq=dq, used=used, **kw)
    except _SummariesDisagree as exc:
        refused = str(exc)
    for f in dataclasses.fields(dq):  # start again: nothing the first reading noted stands
        setattr(dq, f.name, getattr(DataQuality(), f.name))
    out = _rank_results(path, opts.but(use_summaries=False), dq=dq, used=[], **kw)
    dq.notes.append(f"{_names(used)} disagreed with the other ranks ({refused}): every rank was read again "
                    "from its trace")
    return out



def summarize_beside(path: str | Path, *, param_dtype: str | None = None) -> int:
    """Write every rank's summary beside its trace in ``path``, in this process (one worker, no
    progress): what a capture starts in the background after each export. Returns the number of ranks."""
    _, results, _ = rank_results(Path(path), workers=1, write_summaries=True, param_dtype=param_dtype)
    return len(results)

class _SummariesDisagree(Exception):
    """The checks across ranks refused a folder in which some ranks were read from summaries."""


def _names(files: list[Path], most: int = 3) -> str:
    listed = ", ".join(shown(f.name) for f in files[:most])
    return listed + (f" and {len(files) - most} more" if len(files) > most else "")


def _rank_results(path: Path, opts: Options, *, write_summaries, summary_dir, param_dtype, keep_tables,
                  dq: DataQuality, used: list[Path]) -> tuple[dict | None, list[RankResult], list[RankTrace]]:
    if path.is_dir() and not _trace_files(path, []) and not write_summaries:
        only = _from_summaries_alone(path, opts, keep_tables, dq)
        if only is not None:
            return only
    manifest, groups = find_inputs(path, opts.ranks, dq)
    steps = _complete_steps(path, opts.steps, manifest, dq)
    if write_summaries:
        _check_writable(groups, summary_dir)
    dtype = param_dtype or model_dtype(manifest)
    results: list[RankResult] = []
    todo: list[RankUnit] = []
    given: dict[str, str] = {}  # absolute path sent to a worker -> the path as given here
    for files in groups:
        if opts.use_summaries and steps is None and len(files) == 1 and not write_summaries:
            r = _current_summary(files[0], dtype, dq)
            if r is not None:
                results.append(r)
                used.append(rankresult.summary_path(files[0]))
                continue
        if opts.dask:  # a worker's working folder is not ours
            given.update({shown(os.path.abspath(f)): shown(f) for f in files})
            files = [Path(os.path.abspath(f)) for f in files]
            summary_dir = Path(os.path.abspath(summary_dir)) if summary_dir else None
        todo.append(RankUnit(files=tuple(str(f) for f in files), steps=tuple(sorted(steps)) if steps else None,
                             param_dtype=dtype, write_summary=write_summaries,
                             summary_dir=str(summary_dir) if summary_dir else None,
                             cycle_files=_cycle_files(manifest, files) if len(files) > 1 else None,
                             keep_tables=keep_tables))
    tables = _run_units(todo, opts, len(groups), results, given) if todo else {}
    if used:
        dq.sources.append(f"figures of {len(used)} rank(s) read from {_names(used)}, made from these very traces "
                        "(--no-summaries re-reads the traces)")
    try:
        manifest, results = _one_job(path, results, opts.ranks, manifest, dq, "trace")
    except InputError as exc:
        if not used:
            raise
        raise _SummariesDisagree(exc.problem if exc.path == str(path) else str(exc)) from None
    return manifest, results, [tables[id(r)] for r in results if id(r) in tables]


def _from_summaries_alone(path: Path, opts: Options, keep_tables, dq: DataQuality):
    """A folder of per-rank summaries copied away from their traces: the job from them alone (nothing to
    check them against), or None when the folder holds none."""
    summaries = sorted(p for p in path.glob("*" + rankresult.SUMMARY_SUFFIX) if not p.name.startswith("."))
    if not summaries:
        return None
    if opts.steps is not None:
        raise InputError(path, "--steps needs the traces: this folder holds only per-rank summaries "
                               "(made for all steps)")
    if keep_tables:
        raise InputError(path, "this folder holds only per-rank summaries: the trace events are not in it")
    manifest, dq.manifest = read_manifest(path)
    return (*_only_summaries(path, summaries, opts.ranks, manifest, dq, opts.dask), [])


def _complete_steps(path: Path, asked, manifest, dq: DataQuality):
    """The asked steps less those the manifest names partial (a cut step is not a step's time)."""
    steps, cut_note = without_partial(asked, manifest)
    if asked is not None and not steps:  # an empty set would read as "no selection": every step
        raise InputError(path, f"--steps {step_spec(sorted(asked))} matches no complete profiled step"
                               + (f" ({cut_note})" if cut_note else ""))
    if cut_note:
        dq.notes.append(cut_note)
    return steps


def _current_summary(file: Path, dtype, dq: DataQuality) -> RankResult | None:
    """The rank's summary beside its trace when it is current and made for the same parameter dtype;
    a note says why one present was not used."""
    r, why = rankresult.read_current(file)
    if r is not None and r.param_dtype == dtype:
        r.summary.file = shown(file)  # the path as given now, as a re-read would report it
        return r
    if why:
        dq.notes.append(f"{shown(rankresult.summary_path(file).name)} not used ({why}): rank figures "
                        f"re-derived from {shown(file.name)}")
    return None


def _run_units(todo: list[RankUnit], opts: Options, n_groups: int, results: list[RankResult],
               given: dict[str, str]) -> dict[int, RankTrace]:
    """Each rank's analysis on the engine, its results appended to ``results``; id(result) -> its tables."""
    tables: dict[int, RankTrace] = {}
    total = sum(Path(f).stat().st_size for u in todo for f in u.files)
    engine = make_engine(opts.dask, opts.workers, total, len(todo))
    report = _Reporter(opts.progress, n_groups, len(results))
    try:
        for unit, outputs in engine.map(rank_step, todo):
            for r, t in _checked(unit, outputs, given):
                results.append(r)
                if t is not None:
                    tables[id(r)] = t
            report(Path(unit.files[0]).name)
    finally:
        engine.close()
    report.done()
    return tables


def _checked(unit: RankUnit, outputs, given: dict[str, str]) -> list[tuple[RankResult, RankTrace | None]]:
    """A worker's answer, checked before use (a Dask worker may be another machine): a list of
    ``RankOutput`` whose results decode to ``RankResult``s, tables only where asked for. Files are
    named as given here, not as a worker was sent them (absolute)."""
    if not isinstance(outputs, list) or not all(type(o) is RankOutput and type(o.result) is bytes and
                                                (o.tables is None or (unit.keep_tables and type(o.tables) is RankTrace))
                                                for o in outputs):
        raise InputError(unit.label, f"a worker sent back {type(outputs).__name__}, not rank summaries")
    try:
        results = [rankresult.decode(o.result) for o in outputs]
    except rankresult.BadSummary as exc:
        raise InputError(unit.label, f"a worker sent back {exc}") from None
    for r in results:
        r.summary.file = given.get(r.summary.file, r.summary.file)
        if r.quality is not None:
            r.quality.file = given.get(r.quality.file, r.quality.file)
    return [(r, o.tables) for r, o in zip(results, outputs)]


def _one_job(path: Path, results: list[RankResult], ranks: list[int] | None, manifest: dict | None,
             dq: DataQuality, what: str, names: list[str] | None = None) -> tuple[dict | None, list[RankResult]]:
    """The job's ranks (refused if they are not one job's), those asked for, by rank, with their data quality.

    ``names``: the files the checks name for each result (default: its trace)."""
    results, manifest = _check_one_job(path, results, manifest, dq, names)
    if ranks is not None:
        results = [r for r in results if r.rank in set(ranks)]
        if not results:
            raise InputError(path, f"no {what} for rank(s) {', '.join(map(str, ranks))}")
    results.sort(key=lambda r: r.rank)
    dq.ranks = [r.quality for r in results if r.quality and (r.quality.dropped or r.quality.notes)]
    dq.dropped_events = sum(q.dropped for q in dq.ranks)
    return manifest, results


SUMMARIES_PER_TASK = 256   # a folder of summaries read on a Dask cluster: tasks of this many files


def read_summaries(paths: tuple[str, ...]) -> list[tuple[str, bytes | str]]:
    """A Dask task's share of a folder of summaries: (path, the checked result's msgpack, or why the
    file is unusable) for each."""
    out: list[tuple[str, bytes | str]] = []
    for p in paths:
        try:
            out.append((p, rankresult.encode(rankresult.read_file(Path(p)))))
        except (InputError, rankresult.BadSummary) as exc:
            out.append((p, exc.problem if isinstance(exc, InputError) else str(exc)))
    return out


def _read_on(dask: str, files: list[Path]):
    """(file, result or None, why not) of every summary, in ``files``' order, read and checked by the
    cluster's workers (absolute paths) and decoded here as each task's answer arrives."""
    chunks = [tuple(os.path.abspath(f) for f in files[i:i + SUMMARIES_PER_TASK])
              for i in range(0, len(files), SUMMARIES_PER_TASK)]
    answers: dict[str, tuple] = {}
    engine = make_engine(dask)
    try:
        for chunk, got in engine.map(read_summaries, chunks):
            if not (isinstance(got, list) and len(got) == len(chunk)
                    and all(type(a) is tuple and len(a) == 2 and type(a[1]) in (bytes, str) for a in got)):
                raise InputError(chunk[0], f"a worker sent back {type(got).__name__}, not rank summaries")
            for p, (_, a) in zip(chunk, got):
                answers[p] = (None, a) if type(a) is str else _decoded(a)
    finally:
        engine.close()
    for f in files:
        yield (f, *answers.pop(os.path.abspath(f)))


def _decoded(data: bytes) -> tuple:
    try:
        return rankresult.decode(data), None
    except rankresult.BadSummary as exc:
        return None, f"a worker sent back {exc}"


def _read_here(files: list[Path]):
    for f in files:
        try:
            yield f, rankresult.read_file(f), None
        except (InputError, rankresult.BadSummary) as exc:
            yield f, None, exc.problem if isinstance(exc, InputError) else str(exc)


def _only_summaries(path: Path, files: list[Path], ranks: list[int] | None, manifest: dict | None,
                    dq: DataQuality, dask: str | None = None) -> tuple[dict | None, list[RankResult]]:
    """A folder of summaries alone: nothing to re-derive them from, so one that is not intact is refused.
    With ``dask``, the cluster's workers read and check the files (the reduce stays here)."""
    out = []
    for f, r, why in (_read_on(dask, files) if dask else _read_here(files)):
        if r is None:
            raise InputError(f, f"unusable summary ({why}): rebuild it with `fsdpdoctor summarize` on the "
                                "traces") from None
        if r.analysis_version != rankresult.ANALYSIS_VERSION:
            raise InputError(f, f"summary of analysis version {r.analysis_version}, this is "
                                f"{rankresult.ANALYSIS_VERSION}: rebuild it with `fsdpdoctor summarize` on the traces")
        out.append(r)
    dq.sources.append(f"figures of every rank read from summaries alone, with no trace to check them against: "
                    f"{_names(files)}")
    return _one_job(path, out, ranks, manifest, dq, "summary", names=[shown(f) for f in files])


def _check_writable(groups: list[list[Path]], summary_dir: Path | None) -> None:
    """Never write into a folder marked read-only (even as root, who could)."""
    folders = {summary_dir} if summary_dir else {f.parent for g in groups for f in g}
    for d in folders:
        mode = stat.S_IMODE(os.stat(d).st_mode)
        if not mode & 0o222 or not os.access(d, os.W_OK):
            raise InputError(d, "folder is read-only: write the summaries elsewhere with --out DIR")


def _pace(n: int, seconds: float) -> str:
    """How fast ranks are analysed, in the unit that reads well: ranks a second, or seconds a rank."""
    return f"{n / seconds:.1f} ranks/s" if n >= seconds else f"{seconds / n:.1f} s per rank"


class _Reporter:
    """Per-rank progress: the caller's callback (a progress bar), else, on long runs, a line on
    stderr every few seconds (silent for runs that finish quickly)."""

    QUIET_S = 5.0

    def __init__(self, progress: Progress | None, total: int, done: int):
        self.progress, self.total, self.n = progress, total, done
        self.t0 = self.last = time.monotonic()
        if progress:
            progress("", done, total)

    def __call__(self, name: str) -> None:
        self.n += 1
        if self.progress:
            self.progress(name, self.n, self.total)
            return
        now = time.monotonic()
        if now - self.t0 > self.QUIET_S and now - self.last > self.QUIET_S:
            self.last = now
            print(f"fsdpdoctor: {self.n}/{self.total} ranks analysed ({visible(name)}; {_pace(self.n, now - self.t0)})",
                  file=sys.stderr)

    def done(self) -> None:
        if self.progress:
            self.progress("", self.total, self.total)


def _check_one_job(source: Path, results: list[RankResult], manifest: dict | None,
                   dq: DataQuality, names: list[str] | None = None) -> tuple[list[RankResult], dict | None]:
    """Ranks in one folder must belong to one job (``trace.identity``); identical copies are read once."""
    names = names or [r.summary.file for r in results]
    members = [identity.Member(rank=r.rank, rank_source=r.rank_source, world_size=r.world_size, backend=r.backend,
                               file=name, identity=r.identity or identity.RankIdentity(host=r.host))
               for r, name in zip(results, names)]
    keep, manifest = identity.check_one_job(source, members, manifest, dq)
    return [results[i] for i in keep], manifest
