"""The profiled windows of a run folder, and which one a verb analyses (docs/capture.md).

A run captured with ``fsdpdoctor.capture`` holds the fixed schedule's traces at its top level (as
always) and one folder per window opened on demand or on anomaly, ``window-<first step>/``, each
with its own ``manifest.json`` (the reason and the step range). ``analyze RUN_DIR`` takes the
latest window and lists the others; ``--window STEP`` picks one by its first step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.manifest import read_manifest

WINDOW_RE = re.compile(r"^window-(\d{1,12})$")


@dataclass(slots=True)
class Window:
    """One profiled window of a run folder: its folder, steps, what opened it and the steps it cut."""

    folder: Path
    first: int | None          # first profiled step (None: the manifest does not say)
    last: int | None
    trigger: str               # "schedule" (the fixed window at the top level), "demand", "anomaly" or "unknown"
    reason: str | None
    partial: list[int]         # steps the profiler cut (left out of every figure)
    empty: bool = False        # no trace in it (the job ended before any rank wrote one)

    def label(self) -> str:
        span = "" if self.first is None else (f"step {self.first}" if self.last in (None, self.first)
                                              else f"steps {self.first}-{self.last}")
        why = self.reason or self.trigger
        return f"{self.folder.name if self.trigger != 'schedule' else 'fixed schedule (top level)'}: {span}, {why}"


def _has_traces(folder: Path) -> bool:
    try:
        return any(p.name.endswith((".json", ".json.gz")) and p.name != "manifest.json"
                   and not p.name.startswith(".") for p in folder.iterdir())
    except OSError:
        return False


def _window_of(folder: Path, fixed: bool) -> Window:
    manifest, _notes = read_manifest(folder)
    m = manifest or {}
    steps = m.get("profiled_steps") or []
    partial = [s for s in (m.get("partial_steps") or []) if isinstance(s, int)]
    w = m.get("window") if isinstance(m.get("window"), dict) else {}
    first = w.get("first_step") if isinstance(w.get("first_step"), int) else (min(steps) if steps else None)
    last = w.get("last_step") if isinstance(w.get("last_step"), int) else (max(steps) if steps else None)
    if not fixed:  # a window folder is named after its first step: the name is what --window matches
        first = int(WINDOW_RE.match(folder.name).group(1))
        last = last if last is not None and last >= first else None
    trigger = "schedule" if fixed else (w.get("trigger") if w.get("trigger") in ("demand", "anomaly") else "unknown")
    reason = w.get("reason") if isinstance(w.get("reason"), str) else None
    return Window(folder=folder, first=first, last=last, trigger=trigger, reason=reason, partial=partial,
                  empty=not fixed and not _has_traces(folder))


def _window_folders(run_dir: Path) -> list[Path]:
    try:
        return [p for p in run_dir.iterdir() if WINDOW_RE.match(p.name) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def list_windows(run_dir: Path) -> list[Window]:
    """Every window of a run folder, by first step (the fixed schedule's first when it has traces)."""
    run_dir = Path(run_dir)
    out = []
    if _has_traces(run_dir):
        out.append(_window_of(run_dir, fixed=True))
    out += [_window_of(p, fixed=False) for p in _window_folders(run_dir)]
    return sorted(out, key=lambda w: (w.first if w.first is not None else -1, w.trigger != "schedule"))


def resolve_window(path: Path, window: int | None) -> tuple[Path, str | None]:
    """(the folder or file to analyse, a note listing the run's other windows).

    A run folder with ``window-*`` folders: the latest window, or the one whose first step is
    ``window``. Anything else is returned as it is (``window`` then needs a run folder with windows)."""
    path = Path(path)
    # most folders have no window: only then is the fixed window's manifest read here
    wins = list_windows(path) if path.is_dir() and _window_folders(path) else []
    if not wins:
        if window is not None:
            raise InputError(path, "a window was asked for (--window STEP), but this is no run folder with window-<step> folders")
        if path.is_dir() and (path / "steps").is_dir() and not _has_traces(path):
            raise InputError(path, f"no profiled window yet, only the step series: `fsdpdoctor steps {path}` shows "
                                   f"it, `fsdpdoctor trigger {path}` asks the running job for a window")
        return path, None
    full = [w for w in wins if not w.empty]
    if window is None:
        if not full:
            raise InputError(path, "no window holds a trace yet (the job ended before writing one?): "
                                   f"`fsdpdoctor steps {path}` shows the step series")
        chosen = full[-1]
    else:
        hits = [w for w in wins if w.first == window]
        if not hits:
            have = ", ".join(str(w.first) for w in wins if w.first is not None)
            raise InputError(path, f"no window starts at step {window} (windows start at: {have})")
        chosen = hits[0]
        if chosen.empty:
            raise InputError(chosen.folder, "this window holds no trace (the job ended before any rank wrote one)")
    others = [w for w in full if w is not chosen]
    note = f"analysing {chosen.label()}"
    if others:
        note += "; other windows (--window STEP): " + "; ".join(w.label() for w in others)
    if empty := [w.folder.name for w in wins if w.empty]:
        note += f"; without a trace (the job ended first): {', '.join(empty)}"
    return chosen.folder, note


def partial_steps(manifest: dict | None) -> list[int]:
    """Steps the profiler cut short (the job stopped inside a window), as the manifest lists them."""
    ps = (manifest or {}).get("partial_steps")
    return sorted({s for s in ps if isinstance(s, int) and not isinstance(s, bool)}) if isinstance(ps, list) else []


def without_partial(steps: set[int] | None, manifest: dict | None) -> tuple[set[int] | None, str | None]:
    """The steps to analyse once the cut ones are left out, and a note saying which were.

    With no selection, the manifest's completed steps (``profiled_steps``) are taken; a cut step is
    always the last one a rank recorded, so without that list every step before it is kept."""
    cut = partial_steps(manifest)
    if not cut:
        return steps, None
    if steps is None:
        done = (manifest or {}).get("profiled_steps")
        steps = set(done) if isinstance(done, list) and done else set(range(min(cut)))
    kept = steps - set(cut)
    note = (f"step{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))} cut short by the end of profiling "
            "(the job stopped inside the window): left out of every figure")
    return kept, note
