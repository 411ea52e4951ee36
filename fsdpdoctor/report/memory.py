"""``fsdpdoctor memory``: the prediction, the other strategies, the measured peaks and the
explanation as tables that fit the console's width (headers wrap at spaces, numbers never)."""

from __future__ import annotations

from dataclasses import asdict

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from fsdpdoctor.analysis import memory as mem
from fsdpdoctor.results.memory import GB, GiB, MemoryReport
from fsdpdoctor.report.prose import prose
from fsdpdoctor.report.terminal import terminal_console


def _column(words: bool) -> dict:
    """A column of words wraps at spaces; a column of figures ("10.50 GB") is never broken, its
    header wraps instead."""
    return {"justify": "left"} if words else {"justify": "right", "no_wrap": True}


def _fit(rep: MemoryReport, gb) -> str:
    """Whether the per-rank total fits one device, in one sentence."""
    total = rep.estimate.total
    if rep.fits is None:
        return (f"Fits the device? Unknown: give its memory with --gpu-memory (e.g. 80GB) to compare the "
                f"{gb(total)} per rank with it.")
    cap = f"{gb(rep.device_bytes)} ({rep.device_source})"
    if rep.fits:
        return f"Fits: {gb(total)} per rank of {cap}, {gb(rep.device_bytes - total)} left for what is not included."
    return (f"DOES NOT FIT: {gb(total)} per rank is more than the {cap}, by {gb(total - rep.device_bytes)}; "
            "the strategies below show what would.")


def _prediction_table(rep: MemoryReport) -> Table:
    """The per-rank prediction: one row per piece of model state (where it lives), then the transient,
    activations and the device total."""
    est, cfg = rep.estimate, rep.estimate.config
    gb, gib = mem.fmt_gb, mem.fmt_gib
    head = (f"{cfg.parameters:,} params, {cfg.dtype}{' mixed precision' if cfg.mixed_precision else ''}, "
            f"{cfg.optimizer}, {est.strategy_label}{' + CPU offload' if cfg.cpu_offload else ''}, "
            f"world size {cfg.world_size}, shard group {est.shard_degree}")
    if rep.run_folder is not None:
        head = f"{rep.run_folder}: " + head
    t = Table(title=f"Per-rank memory prediction — {head}", box=box.SIMPLE_HEAD,
              caption="GB = 1e9 bytes, GiB = 2^30 bytes (MB = 1e6, MiB = 2^20); GB and GiB per rank; "
                      "B/param: bytes per parameter before sharding, and on this rank")
    for c in ("component", "B/param", "on this rank", "GB", "GiB", "where"):
        t.add_column(c, **_column(c in ("component", "where")), min_width=16 if c == "component" else None)
    bpp, prb = est.bytes_per_param, est.per_rank_bytes_per_param
    host = est.host
    for name, key in (("weights", "weights"), ("gradients", "gradients"),
                      ("optimizer states", "optimizer_states"), ("master weights", "master_weights")):
        dev = getattr(est, key)
        h = getattr(host, key)
        where = "device" if not h else ("host" if not dev else "device+host")
        if not dev and not h:
            where = "-"
        shown = dev if dev else h
        t.add_row(name, f"{getattr(bpp, key):g}", f"{getattr(prb, key) + h / cfg.parameters:.3g}",
                  gb(shown), gib(shown), where)
    t.add_row("[bold]model state (device)[/]", f"{bpp.total:g}", f"{prb.total:.3g}",
              f"[bold]{gb(est.model_state)}[/]", gib(est.model_state), "device")
    if host.total:
        t.add_row("model state (host, offloaded)", "", "", gb(host.total), gib(host.total), "host")
    if est.peak_transient is not None:
        t.add_row("peak transient (largest unit)", "", "", gb(est.peak_transient), gib(est.peak_transient), "device")
    elif est.transient_applicable:
        t.add_row("peak transient (largest unit)", "", "", "not included", "", "")
    if est.activations is not None:
        a = est.activations.total_bytes
        t.add_row("activations (ESTIMATE)", "", "", gb(a), gib(a), "device")
    t.add_row("[bold]total (device)[/]", "", "", f"[bold]{gb(est.total)}[/]", gib(est.total), "device")
    return t


def _strategies_table(rows) -> Table:
    """Every strategy's per-rank figures beside the current one's (the current row in bold)."""
    gb = mem.fmt_gb
    c = Table(title="How the other strategies would change it (per rank)", box=box.SIMPLE_HEAD)
    longest_word = max((len(w) for r in rows for w in r.label.split()), default=8)
    for col in ("strategy", "shard group", "model state", "transient", "host", "vs current"):
        c.add_column(col, **_column(col == "strategy"), min_width=longest_word if col == "strategy" else None)
    cur = next(r for r in rows if r.current)
    for r in rows:
        delta = r.model_state - cur.model_state
        vs = "current" if r.current else (("+" if delta > 0 else "") + gb(delta))
        c.add_row(("[bold]" + r.label + "[/]") if r.current else r.label, str(r.shard_degree), gb(r.model_state),
                  gb(r.peak_transient) if r.peak_transient is not None else "-",
                  gb(r.host) if r.host else "-", vs)
    return c


def _measured_table(meas_rows: list[dict]) -> Table:
    """Each rank's measured allocator peak against the predicted total."""
    gb, gib = mem.fmt_gb, mem.fmt_gib
    m = Table(title="Measured allocator peak vs prediction", box=box.SIMPLE_HEAD)
    for col in ("rank", "device", "start level", "peak allocated", "peak GiB", "predicted total", "peak/predicted"):
        m.add_column(col, **_column(False))
    for r in meas_rows:
        dev = r["device_type"] + (f":{r['device_id']}" if r["device_type"] != "cpu" else "")
        ratio = r["ratio_to_predicted_total"]
        m.add_row(str(r["rank"]), dev, gb(r["start_allocated"]), gb(r["peak_allocated"]), gib(r["peak_allocated"]),
                  gb(r["predicted_total"]), f"{ratio:.2f}x" if ratio is not None else "-")
    return m


def _print_explanation(console: Console, rep: MemoryReport) -> None:
    """How the figures were counted, what they leave out, and the notes on the run folder."""
    est = rep.estimate
    console.print("[bold]Explanation[/]")
    for line in est.explanation:
        console.print(Padding(prose(line), (0, 0, 0, 2), expand=False))
    if est.activations is not None:
        console.print(Padding(prose(f"activations: {est.activations.formula}"), (0, 0, 0, 2), expand=False))
        for n in est.activations.notes:
            console.print(Padding(prose(f"({n})"), (0, 0, 0, 4), expand=False))
    console.print(Text.assemble(("Not included", "bold"), ": " + "; ".join(est.not_included)))
    for n in rep.notes:
        console.print(Padding(prose(f"note: {n}"), (0, 0, 0, 2), expand=False))


def render(rep: MemoryReport, console: Console | None = None) -> None:
    """The prediction, whether it fits, the other strategies, the measured peaks, then the explanation."""
    console = console or terminal_console(highlight=False)
    console.print(_prediction_table(rep))
    console.print(Padding(prose(_fit(rep, mem.fmt_gb)), (0, 0, 0, 2), expand=False))
    console.print(_strategies_table(rep.strategies))
    for s in rep.sentences:
        console.print(Padding(prose(f"• {s}"), (0, 0, 0, 2), expand=False))
    if rep.measured:
        console.print(_measured_table(rep.measured))
    _print_explanation(console, rep)


def document(rep: MemoryReport) -> dict:
    """``memory --json``: the prediction, the other strategies, the device and the measured peaks."""
    return {"run_folder": str(rep.run_folder) if rep.run_folder else None,
            "device": {"bytes": rep.device_bytes, "source": rep.device_source, "fits": rep.fits},
            "estimate": _estimate(rep.estimate), "comparison": [asdict(r) for r in rep.strategies],
            "comparison_sentences": rep.sentences, "measured": rep.measured, "notes": rep.notes}


def _estimate(est) -> dict:
    cfg = asdict(est.config)
    return {
        "units": {"bytes": 1, "GB": GB, "GiB": GiB},
        "config": cfg,
        "strategy_label": est.strategy_label,
        "shard_degree": est.shard_degree,
        "bytes_per_param": {**asdict(est.bytes_per_param), "total": est.bytes_per_param.total},
        "per_rank_bytes_per_param": {**asdict(est.per_rank_bytes_per_param),
                                     "total": est.per_rank_bytes_per_param.total},
        "per_rank_bytes": {
            "weights": est.weights,
            "gradients": est.gradients,
            "optimizer_states": est.optimizer_states,
            "master_weights": est.master_weights,
            "model_state": est.model_state,
            "peak_transient": est.peak_transient,
            "activations": est.activations.total_bytes if est.activations else None,
            "total": est.total,
        },
        "host_bytes_per_rank": {**asdict(est.host), "total": est.host.total},
        "activations": asdict(est.activations) if est.activations else None,
        "explanation": list(est.explanation),
        "not_included": list(est.not_included),
    }
