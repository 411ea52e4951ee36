"""``manifest.json`` read as untrusted input (schema: docs/manifest.md).

One reader for every verb. A manifest that cannot be read, or a field of the wrong type, never stops
an analysis: the field is dropped with a note and what it would have said is inferred from the traces.
Keys this reader does not know are kept as they are (newer writers may add some).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from collections.abc import Callable

from fsdpdoctor.errors import InputError
from fsdpdoctor.trace.io import DOCUMENT_MAX, read_raw
from fsdpdoctor.visible_text import encodable

WRAPPING_KINDS = ("none", "ddp", "fsdp1", "fsdp2")


def _int(lo: int = 0) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v < 2**53


def _num(lo: float = 0.0, strict: bool = False) -> Callable[[Any], bool]:
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        try:
            f = float(v)
        except OverflowError:
            return False
        return math.isfinite(f) and (f > lo if strict else f >= lo)
    return ok


def _str(v) -> bool:
    return isinstance(v, str)


def _bool(v) -> bool:
    return isinstance(v, bool)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _list_of(check) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _rank_key(k) -> bool:
    return isinstance(k, str) and k.isdigit() and len(k) < 10


def _map_of(check) -> Callable[[Any], bool]:
    """{"<rank>": value} maps (files, hosts, devices...)."""
    return lambda v: isinstance(v, dict) and all(_rank_key(k) and check(x) for k, x in v.items())


def _dict(v) -> bool:
    return isinstance(v, dict)


_TOP: dict[str, Callable[[Any], bool]] = {
    "world_size": _int(1),
    "backend": _str,
    "profiled_ranks": _list_of(_int()),
    "files": _map_of(_str),
    "missing_ranks": _map_of(_str),   # a window's profiled ranks whose trace is not there, and why
    "cycle_files": _map_of(_list_of(_str)),
    "versions": lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
    # capture writes null for a rank whose host/device it never heard of
    "hosts": _map_of(lambda x: x is None or _str(x)),
    "devices": _map_of(lambda x: x is None or _str(x)),
    "schedule": lambda v: isinstance(v, dict) and all(_int()(x) for x in v.values()),
    "profiled_steps": _list_of(_int()),
    "partial_steps": _list_of(_int()),
    "window": _dict,
    "samples_per_step": _num(strict=True),
    "tokens_per_step": _num(strict=True),
    "options": lambda v: isinstance(v, dict) and all(isinstance(x, bool) for x in v.values()),
    "created": _str,
    # the training framework a callback recorded: {"name": "hf-trainer"|"lightning"|"accelerate"|"plain",
    # "versions": {...}}
    "framework": lambda v: isinstance(v, dict) and v.get("name") in ("plain", "hf-trainer", "lightning", "accelerate"),
    # the host the manifest rank ran on (capture/host.py): cores it may run on, memory, ranks on it
    "host": lambda v: isinstance(v, dict) and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            and x >= 0) for x in v.values()),
    "host_load": _list_of(_dict),
}
_MODEL: dict[str, Callable[[Any], bool]] = {
    "parameters": _int(), "trainable_parameters": _int(), "param_bytes": _int(),
    "param_dtype": _str, "optimizer": _str,
}
_PREFETCH_LISTS = lambda v: isinstance(v, dict) and all(isinstance(k, str) and _list_of(_str)(x) for k, x in v.items())  # noqa: E731
_MIXED = _opt(lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()))
_WRAPPING: dict[str, dict[str, Callable[[Any], bool]]] = {
    "ddp": {"bucket_cap_mb": _num(strict=True), "find_unused_parameters": _bool,
            "gradient_as_bucket_view": _bool, "static_graph": _bool},
    "fsdp1": {"sharding_strategy": _str, "backward_prefetch": _opt(_str), "forward_prefetch": _bool,
              "limit_all_gathers": _bool, "mixed_precision": _MIXED, "units": _int()},
    "fsdp2": {"mesh": lambda v: isinstance(v, dict) and _list_of(_int(1))(v.get("shape", [])),
              "reshard_after_forward": lambda v: isinstance(v, dict) and all(
                  isinstance(x, (bool, int)) for x in v.values()),
              "forward_prefetch": _PREFETCH_LISTS, "backward_prefetch": _PREFETCH_LISTS,
              "mixed_precision": _MIXED, "units": _int()},
    "none": {},
}


def _short(v: Any) -> str:
    try:
        s = json.dumps(v)
    except (TypeError, ValueError, RecursionError):
        s = type(v).__name__
    return s if len(s) <= 40 else s[:37] + "..."


def _drop(d: dict, key: str, path: str, where: str, notes: list[str]) -> None:
    notes.append(f"{where}: {path} = {_short(d[key])} has the wrong type or value: ignored")
    del d[key]


def _drop_wrong_fields(d: dict, checks: dict[str, Callable[[Any], bool]], prefix: str, where: str,
                       notes: list[str]) -> None:
    """Remove each field ``checks`` knows whose value fails its check (null stands for absent)."""
    for key, ok in checks.items():
        if key in d and d[key] is not None and not ok(d[key]):
            _drop(d, key, prefix + key, where, notes)


def _checked_section(out: dict, name: str, checks: Callable[[dict], dict | None], where: str,
                     notes: list[str]) -> None:
    """Replace the section ``out[name]`` by a checked copy (the caller's document is never modified);
    drop it whole when it is not an object or ``checks`` has no table for it."""
    section = out.get(name)
    if section is None:
        return
    table = checks(section) if isinstance(section, dict) else None
    if table is None:
        _drop(out, name, name, where, notes)
        return
    out[name] = section = dict(section)
    _drop_wrong_fields(section, table, f"{name}.", where, notes)


def _wrapping_checks(wrap: dict) -> dict[str, Callable[[Any], bool]] | None:
    """The field checks of the wrapping's kind; None for a kind no fsdpdoctor writer produces."""
    kind = wrap.get("kind")
    return _WRAPPING[kind] if kind in WRAPPING_KINDS else None


def _drop_ranks_beyond_world(out: dict, where: str, notes: list[str]) -> None:
    """A per-rank map or rank list naming a rank >= world_size describes another job: dropped whole."""
    ws = out.get("world_size")
    if not isinstance(ws, int):
        return
    for key in ("files", "hosts", "devices", "cycle_files", "missing_ranks"):
        if isinstance(out.get(key), dict) and any(int(k) >= ws for k in out[key]):
            _drop(out, key, key, where, notes)
    if isinstance(out.get("profiled_ranks"), list) and any(r >= ws for r in out["profiled_ranks"]):
        _drop(out, "profiled_ranks", "profiled_ranks", where, notes)


def validate(doc: Any, where: str = "manifest.json") -> tuple[dict | None, list[str]]:
    """The manifest with every wrong-typed field removed, and one note per removal."""
    if not isinstance(doc, dict):
        return None, [f"{where} is not a JSON object: ignored, everything is inferred from the traces"]
    if "fsdpdoctor_manifest" not in doc:
        return None, [f"{where} has no 'fsdpdoctor_manifest' key (not written by fsdpdoctor): ignored"]
    notes: list[str] = []
    out = dict(doc)
    _drop_wrong_fields(out, _TOP, "", where, notes)
    _checked_section(out, "model", lambda _model: _MODEL, where, notes)
    _checked_section(out, "wrapping", _wrapping_checks, where, notes)
    if out.get("scenario") is not None and not isinstance(out["scenario"], dict):
        _drop(out, "scenario", "scenario", where, notes)
    _drop_ranks_beyond_world(out, where, notes)
    return out, notes


def read_manifest(folder: Path) -> tuple[dict | None, list[str]]:
    """``folder/manifest.json`` validated; (None, []) when there is none, (None, [why]) when unusable."""
    mpath = folder / "manifest.json"
    try:
        if not mpath.is_file():
            if mpath.exists() or mpath.is_symlink():
                return None, ["manifest.json is not a regular file: ignored, everything is inferred from the traces"]
            return None, []
        raw = read_raw(mpath, DOCUMENT_MAX)
    except InputError as exc:
        return None, [f"manifest.json cannot be read ({exc.problem}): ignored, everything is inferred "
                      "from the traces"]
    except OSError as exc:
        return None, [f"manifest.json cannot be read ({exc.strerror or exc}): ignored, everything is inferred "
                      "from the traces"]
    try:
        doc = json.loads(raw.decode("utf-8-sig"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:80] if not isinstance(exc, RecursionError) else "nested too deeply"
        return None, [f"manifest.json is not valid JSON ({why}): ignored, everything is inferred from the traces"]
    return validate(encodable(doc))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")
