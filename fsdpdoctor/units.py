"""Human-readable times, shares and sizes: used by the findings' text (diagnose) and every renderer."""

from __future__ import annotations


def ms(us: float | None, digits: int = 1) -> str:
    if us is None:
        return "-"
    return f"{us / 1e3:.{digits}f} ms"


def num(us: float | None) -> str:
    """Microseconds as a bare millisecond figure for tables whose header says ms."""
    return "-" if us is None else f"{us / 1e3:.1f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def size(n: float | None) -> str:
    if not n:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
