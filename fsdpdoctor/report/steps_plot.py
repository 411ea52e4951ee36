"""The step series of a run as a plot in the terminal (``fsdpdoctor steps`` and the TUI's ``s``); the
series are read by ``trace/step_series.open_steps``."""

from __future__ import annotations

import statistics
import textwrap

MARKS = {"schedule": "S", "demand": "T", "anomaly": "A", "unknown": "?"}


def _fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def render(series, windows, width: int = 80, height: int = 12) -> list[str]:
    """A scatter of per-column median step time per rank (rank digit, '*' where ranks share a cell),
    a row marking the windows (S fixed schedule, T trigger, A anomaly), the step axis, one line per window."""
    margin = 9
    cols = width - margin - 1
    lo = min(s.steps[0] for s in series if s.steps) if any(s.steps for s in series) else 0
    hi = max(s.steps[-1] for s in series if s.steps) if any(s.steps for s in series) else 0
    span = max(1, hi - lo + 1)
    per_col = max(1, -(-span // cols))
    cols = -(-span // per_col)
    med: dict[int, list[float | None]] = {}
    for s in series:
        buckets: list[list[float]] = [[] for _ in range(cols)]
        for k, d in zip(s.steps, s.duration_s):
            buckets[(k - lo) // per_col].append(d)
        med[s.rank] = [statistics.median(b) if b else None for b in buckets]
    values = sorted(v for m in med.values() for v in m if v is not None)
    peak = values[-1] if values else 1e-3
    # one export or checkpoint step far above the rest would flatten the whole run into one row: the scale
    # stops at 3x the 95th percentile and taller columns end in '^'
    p95 = values[min(len(values) - 1, int(0.95 * len(values)))] if values else peak
    top = min(peak, 3 * p95) * 1.05 or 1e-3
    grid = [[" "] * cols for _ in range(height)]
    for rank, m in med.items():
        glyph = str(rank) if rank < 10 else "+"
        for c, v in enumerate(m):
            if v is None:
                continue
            r = height - 1 - min(height - 1, int(v / top * height))
            g = "^" if v > top else glyph
            grid[r][c] = g if grid[r][c] in (" ", g) else "*"
    lines = [f"step time of {len(series)} rank{'s' if len(series) > 1 else ''} (ms), steps {lo}-{hi}"
             + (f", median of {per_col} steps per column" if per_col > 1 else "")]
    for r, row in enumerate(grid):
        label = _fmt_ms(top * (height - r) / height) if r in (0, height // 2, height - 1) else ""
        lines.append(f"{label:>{margin - 1}} |" + "".join(row))
    marks = [" "] * cols
    for w in windows:
        if w.first is None:
            continue
        a = max(0, (w.first - lo) // per_col)
        b = min(cols - 1, ((w.last if w.last is not None else w.first) - lo) // per_col)
        for c in range(a, b + 1):
            marks[c] = MARKS.get(w.trigger, "?")
    lines.append(f"{'':>{margin - 1}} +" + "-" * cols)
    lines.append(f"{'windows':>{margin - 1}}  " + "".join(marks))
    axis = [" "] * cols
    for c, k in ((0, lo), (cols // 2, lo + (cols // 2) * per_col), (cols - 1, hi)):
        text = str(k)
        start = max(0, min(cols - len(text), c - len(text) // 2))
        axis[start:start + len(text)] = list(text)
    lines.append(f"{'step':>{margin - 1}}  " + "".join(axis))
    legend = ", ".join(f"{v} {k if k != 'demand' else 'trigger'}" for k, v in MARKS.items() if k != "unknown")
    plot = [ln[:width] for ln in lines]
    # the words below the plot wrap at the width (a cut would lose them), under their own indent
    text = [(f"{'':>{margin - 1}}  ranks by digit, * overlap, ^ off the scale (max {_fmt_ms(peak)} ms)", margin + 1),
            (f"{'':>{margin - 1}}  windows: {legend}", margin + 1)]
    text += [(f"  {MARKS.get(w.trigger, '?')} {w.label()}", 4) for w in windows]
    for line, indent in text:
        plot += (textwrap.wrap(line, width, subsequent_indent=" " * min(indent, width // 2))
                 if len(line) > width else [line])
    return [ln.rstrip() for ln in plot]
