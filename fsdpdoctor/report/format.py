"""Small formatting helpers shared by the console report and the TUI."""

from __future__ import annotations

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
CATEGORY_STYLE = {
    "compute": "green", "optimizer": "blue", "exposed comm": "red", "data loading": "magenta", "idle": "bright_black",
}


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


def categories(b) -> list[tuple[str, float]]:
    """The disjoint parts of a step, in display order."""
    return [("compute", b.compute_us), ("optimizer", b.optimizer_us), ("exposed comm", b.exposed_comm_us),
            ("data loading", b.data_loading_us), ("idle", b.idle_us)]


def wrapping_line(job) -> str:
    d = job.wrapping_details or {}
    parts = [job.wrapping.upper() if job.wrapping not in ("unknown", "none") else job.wrapping]
    if job.wrapping == "ddp" and d:
        parts.append(f"bucket_cap_mb={d.get('bucket_cap_mb')}")
        if d.get("find_unused_parameters"):
            parts.append("find_unused_parameters=True")
    elif job.wrapping == "fsdp1" and d:
        parts.append(f"{d.get('sharding_strategy')}, backward_prefetch={d.get('backward_prefetch')}, "
                     f"forward_prefetch={d.get('forward_prefetch')}, limit_all_gathers={d.get('limit_all_gathers')}")
    elif job.wrapping == "fsdp2" and d:
        parts.append(f"{d.get('units')} units")
    parts.append(f"({job.wrapping_source})")
    return " ".join(str(p) for p in parts)
