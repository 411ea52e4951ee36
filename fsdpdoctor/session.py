"""One call from a path to a diagnosed ``Analysis``: find ranks -> map (per rank, anywhere) -> reduce -> diagnose.

Each rank is analysed by a worker (``fsdpdoctor.engines``), or read from its summary
(``rank<N>.summary.msgpack`` beside the trace) when that is current; the main process
only ever holds the ranks' compact results.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from fsdpdoctor.analysis import invariants, rankresult
from fsdpdoctor.analysis.engine import param_dtype as model_dtype
from fsdpdoctor.analysis.engine import reduce
from fsdpdoctor.analysis.rankresult import RankResult
from fsdpdoctor.engines import RankUnit, make_engine
from fsdpdoctor.errors import InputError
from fsdpdoctor.results import Analysis, DataQuality
import fsdpdoctor.trace.identity as identity
from fsdpdoctor.trace.loader import Progress, _trace_files, input_files, rank_from_filename
from fsdpdoctor.trace.manifest import read_manifest


def analyze_path(path: str | Path, *, ranks: list[int] | None = None, steps: set[int] | None = None,
                 thresholds: dict[str, float] | None = None, progress: Progress | None = None,
                 diagnose: bool = True, dask: str | None = None, workers: int | None = None,
                 use_summaries: bool = True) -> Analysis:
    path = Path(path)
    quality = DataQuality()
    manifest, results = rank_results(path, ranks=ranks, steps=steps, progress=progress, dask=dask, workers=workers,
                                     use_summaries=use_summaries, quality=quality)
    analysis = reduce(results, source=path, manifest=manifest)
    analysis.data_quality = quality
    if diagnose:
        from fsdpdoctor.diagnose import diagnose as run_rules

        analysis.findings = run_rules(analysis, thresholds=thresholds)
    invariants.enforce(analysis)
    return analysis


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


def rank_results(path: Path, *, ranks: list[int] | None = None, steps: set[int] | None = None,
                 progress: Progress | None = None, dask: str | None = None, workers: int | None = None,
                 use_summaries: bool = True, write_summaries: bool = False, summary_dir: Path | None = None,
                 param_dtype: str | None = None,
                 quality: DataQuality | None = None) -> tuple[dict | None, list[RankResult]]:
    """Every rank's ``RankResult``: from current summaries where allowed, else from the map.

    What the loader could not trust (manifest, files, dropped events, duplicates) goes into ``quality``."""
    dq = quality if quality is not None else DataQuality()
    if path.is_dir() and not _trace_files(path, []) and not write_summaries:
        summaries = sorted(p for p in path.glob("*" + rankresult.SUMMARY_SUFFIX) if not p.name.startswith("."))
        if summaries:  # summaries copied away from their traces: nothing to check them against
            if steps is not None:
                raise InputError(path, "--steps needs the traces: this folder holds only per-rank summaries "
                                       "(made for all steps)")
            manifest, dq.manifest = read_manifest(path)
            return _only_summaries(path, summaries, ranks, manifest, dq)
    manifest, groups = find_inputs(path, ranks, dq)
    if write_summaries:
        _check_writable(groups, summary_dir)
    dtype = param_dtype or model_dtype(manifest)
    results: list[RankResult] = []
    todo: list[RankUnit] = []
    for files in groups:
        if use_summaries and steps is None and len(files) == 1 and not write_summaries:
            r = rankresult.read_current(files[0])
            if r is not None and r.param_dtype == dtype:
                r.summary.file = str(files[0])  # the path as given now, as a re-read would report it
                results.append(r)
                continue
        todo.append(RankUnit(files=tuple(str(f) for f in files), steps=tuple(sorted(steps)) if steps else None,
                             param_dtype=dtype, write_summary=write_summaries,
                             summary_dir=str(summary_dir) if summary_dir else None,
                             cycle_files=_cycle_files(manifest, files) if len(files) > 1 else None))
    if todo:
        total = sum(Path(f).stat().st_size for u in todo for f in u.files)
        engine = make_engine(dask, workers, total, len(todo))
        report = _Reporter(progress, len(groups), len(results))
        try:
            for unit, encoded in engine.map(todo):
                results.extend(rankresult.decode(b) for b in encoded)
                report(Path(unit.files[0]).name)
        finally:
            engine.close()
        report.done()
    return _one_job(path, results, ranks, manifest, dq, "trace")


def _one_job(path: Path, results: list[RankResult], ranks: list[int] | None, manifest: dict | None,
             dq: DataQuality, what: str) -> tuple[dict | None, list[RankResult]]:
    """The job's ranks (refused if they are not one job's), those asked for, by rank, with their data quality."""
    results, manifest = _check_one_job(path, results, manifest, dq)
    if ranks is not None:
        results = [r for r in results if r.rank in set(ranks)]
        if not results:
            raise InputError(path, f"no {what} for rank(s) {', '.join(map(str, ranks))}")
    results.sort(key=lambda r: r.rank)
    dq.ranks = [r.quality for r in results if r.quality and (r.quality.dropped or r.quality.notes)]
    dq.dropped_events = sum(q.dropped for q in dq.ranks)
    return manifest, results


def _only_summaries(path: Path, files: list[Path], ranks: list[int] | None, manifest: dict | None,
                    dq: DataQuality) -> tuple[dict | None, list[RankResult]]:
    out = []
    for f in files:
        try:
            r = rankresult.decode(f.read_bytes())
        except (OSError, ValueError) as exc:
            raise InputError(f, f"unreadable summary ({str(exc)[:80]})") from None
        if r.analysis_version != rankresult.ANALYSIS_VERSION:
            raise InputError(f, f"summary of analysis version {r.analysis_version}, this is "
                                f"{rankresult.ANALYSIS_VERSION}: rebuild it with `fsdpdoctor summarize` on the traces")
        out.append(r)
    return _one_job(path, out, ranks, manifest, dq, "summary")


def _check_writable(groups: list[list[Path]], summary_dir: Path | None) -> None:
    """Never write into a folder marked read-only (even as root, who could)."""
    import os
    import stat

    folders = {summary_dir} if summary_dir else {f.parent for g in groups for f in g}
    for d in folders:
        mode = stat.S_IMODE(os.stat(d).st_mode)
        if not mode & 0o222 or not os.access(d, os.W_OK):
            raise InputError(d, "folder is read-only: write the summaries elsewhere with --out DIR")


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
            rate = (self.n) / (now - self.t0)
            print(f"fsdpdoctor: {self.n}/{self.total} ranks analysed ({name}; {rate:.1f} ranks/s)", file=sys.stderr)

    def done(self) -> None:
        if self.progress:
            self.progress("", self.total, self.total)


def _check_one_job(source: Path, results: list[RankResult], manifest: dict | None,
                   dq: DataQuality) -> tuple[list[RankResult], dict | None]:
    """Ranks in one folder must belong to one job (``trace.identity``); identical copies are read once."""
    members = [identity.Member(rank=r.rank, rank_source=r.rank_source, world_size=r.world_size, backend=r.backend,
                               file=r.summary.file, identity=r.identity or identity.RankIdentity(host=r.host))
               for r in results]
    keep, manifest = identity.check_one_job(source, members, manifest, dq)
    return [results[i] for i in keep], manifest
