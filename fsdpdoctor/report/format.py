"""Small formatting helpers shared by the console report and the TUI."""

from __future__ import annotations

from fsdpdoctor.units import ms, num, pct, size  # noqa: F401  (re-exported for the renderers)

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
CATEGORY_STYLE = {
    "compute": "green", "optimizer": "blue", "exposed comm": "red", "data loading": "magenta", "idle": "bright_black",
}


def categories(b) -> list[tuple[str, float]]:
    """The disjoint parts of a step, in display order."""
    return [("compute", b.compute_us), ("optimizer", b.optimizer_us), ("exposed comm", b.exposed_comm_us),
            ("data loading", b.data_loading_us), ("idle", b.idle_us)]


def trace_family(job) -> str:
    """What the header calls the trace: GPU or CPU as its dialect reads it, unless the input kind says
    the device is another accelerator (MTIA, HPU...) or its timeline is missing."""
    kind = job.input_kind
    if kind is not None and kind.device == "missing":
        return "GPU (no device timeline)"
    if kind is not None and kind.device == "empty":
        return "GPU (no device events)"
    if kind is not None and (not kind.device_known or kind.generic or kind.device_word != "GPU"):
        return kind.device.upper()  # MTIA, HPU, XPU...: never "GPU" for another accelerator's timeline
    return job.dialect.upper()


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


def straggler_rank(a) -> int | None:
    """The straggler, when the diagnosis says there is one (the console report and the TUI mark it)."""
    f = next((f for f in a.findings if f.id == "straggler"), None)
    return f.ranks[0] if f and f.ranks else None
