"""What the writers of every result type share: ``plain`` (a result, a dataclass, as plain dicts and
lists, to be written out) and ``dumps_indented`` (the indented JSON text of such a document)."""

from __future__ import annotations

import dataclasses
import json

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def plain(v):
    """``dataclasses.asdict`` of a result value without its deep copies of the leaves (a result is
    turned into a dict to be written out: the copies cost more than the walk)."""
    cls = type(v)
    if cls is str or cls is float or cls is int or v is None or cls is bool:
        return v
    if hasattr(cls, "__dataclass_fields__"):
        return {name: plain(getattr(v, name)) for name in _field_names(cls)}
    if cls is list:
        return [plain(x) for x in v]
    if cls is dict:
        return {plain(k): plain(x) for k, x in v.items()}
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a named tuple, rebuilt as asdict does
        return cls(*[plain(x) for x in v])
    if isinstance(v, (list, tuple)):
        return cls(plain(x) for x in v)
    if isinstance(v, dict):
        return {plain(k): plain(x) for k, x in v.items()}
    return v


def dumps_indented(d) -> str:
    """``json.dumps(d, indent=2, default=str)``, byte for byte, at the C encoder's speed: the stdlib
    writes an indented document through its pure-Python encoder (4-5x slower: most of a many-rank
    run's reduce), so the compact text is indented by msgspec, which copies every token as written.
    A document with NaN or infinity (not JSON, which msgspec refuses) takes the stdlib's way."""
    import msgspec

    text = json.dumps(d, default=str)
    try:
        return msgspec.json.format(text.encode(), indent=2).decode()
    except msgspec.DecodeError:
        return json.dumps(d, indent=2, default=str)
