"""Decoding Kineto JSON into typed event structs (msgspec).

A trace holds 10^5..10^6 events. Decoding into slotted structs is several
times faster than building dicts, and leaving each event's ``args`` as raw
bytes means we only pay for the arguments we actually read (collectives,
correlation ids), which is a small fraction of the events.
"""

# Annotations are objects, not text: see results/analysis.py (the decoders here are built at import).

import re
from pathlib import Path
from typing import Any, Union

import msgspec

from fsdpdoctor.errors import InputError


# the fields of an event the loader reads, with their defaults (``args`` stays raw until read)
_FIELDS = [("name", Any, ""), ("cat", Any, None), ("ts", Any, None), ("dur", Any, None), ("pid", Any, None),
           ("tid", Any, None), ("args", msgspec.Raw, msgspec.Raw(b""))]

# every event as one struct, "ph" a field like the others: reads any shape
Event = msgspec.defstruct("Event", [("ph", Any, None)] + _FIELDS, gc=False, module=__name__)


def _document(name: str, event: Any) -> type:
    """The top-level object of a Kineto trace: its events and the fields of the job it names."""
    return msgspec.defstruct(name, [("traceEvents", list[event] | None, None)]
                             + [(f, Any, None) for f in ("distributedInfo", "deviceProperties", "host_name",
                                                         "baseTimeNanoseconds", "schemaVersion",
                                                         "fsdpdoctor_cpu")],
                             gc=False, module=__name__)


KinetoDoc = _document("KinetoDoc", Event)


# The same events as a union tagged by "ph": complete, metadata and instant events get every field;
# the phases the loader never reads (flow arrows are a third of a GPU trace, counters, async...)
# get none, so their fields are skipped unread (decode 18 vs 25 ms on a 10 MB trace). An unknown or
# ill-typed "ph" fails the union, and the document is decoded again with ``Event``.
_READ_PHASES = ("X", "M", "i", "I")
_SKIPPED_PHASES = ("s", "f", "t", "C", "B", "E", "b", "e", "n", "P", "O", "N", "D", "R", "S", "T", "p", "F")


def _variant(ph: str, fields: bool) -> type:
    """The struct of phase ``ph``: with every field, or with none (then the same names are class
    attributes holding the defaults, so code reading any event reads these too)."""
    namespace = {"ph": ph} if fields else {"ph": ph, **{f: default for f, _, default in _FIELDS}}
    return msgspec.defstruct(f"Event_{ph if ph.isupper() else ph + '_'}", _FIELDS if fields else [],
                             namespace=namespace, tag_field="ph", tag=ph, gc=False, module=__name__)


_VARIANTS = tuple(_variant(ph, True) for ph in _READ_PHASES) + tuple(_variant(ph, False) for ph in _SKIPPED_PHASES)
TaggedEvent = Union[_VARIANTS]  # noqa: UP007 - a Union of a tuple of types


TaggedDoc = _document("TaggedDoc", TaggedEvent)


class CorrArgs(msgspec.Struct, gc=False):
    """The two arguments every kernel and runtime row is asked for."""

    correlation: Any = None
    collective: Any = msgspec.field(name="Collective name", default=None)


_generic_doc_decoder = msgspec.json.Decoder(KinetoDoc)
_generic_events_decoder = msgspec.json.Decoder(list[Event])
_tagged_doc_decoder = msgspec.json.Decoder(TaggedDoc)
_tagged_events_decoder = msgspec.json.Decoder(list[TaggedEvent])


class _TaggedFirst:
    """Decode with the tagged union; on any failure decode again with ``Event``, which reads every
    shape the union refuses and raises the errors the user is shown."""

    def __init__(self, tagged, generic):
        self.tagged, self.generic = tagged, generic

    def decode(self, data):
        try:
            return self.tagged.decode(data)
        except (msgspec.MsgspecError, RecursionError):
            return self.generic.decode(data)


class MemoryArgs(msgspec.Struct, gc=False):
    """The fields of an allocator sample's (``[memory]`` instant's) ``args`` that are read, as written
    (the data-quality checks judge their types); the others are skipped unread."""

    total: Any = msgspec.field(name="Total Allocated", default=None)
    device_type: Any = msgspec.field(name="Device Type", default=0)
    device_id: Any = msgspec.field(name="Device Id", default=-1)
    bytes: Any = msgspec.field(name="Bytes", default=msgspec.UNSET)
    reserved: Any = msgspec.field(name="Total Reserved", default=msgspec.UNSET)


_doc_decoder = _TaggedFirst(_tagged_doc_decoder, _generic_doc_decoder)
_events_decoder = _TaggedFirst(_tagged_events_decoder, _generic_events_decoder)
_corr_decoder = msgspec.json.Decoder(CorrArgs)
_dict_decoder = msgspec.json.Decoder(dict)


_BOM = b"\xef\xbb\xbf"
_FIRST_TOKEN = re.compile(rb"\S")  # the first byte bytes.strip() would keep


def is_blank(data: bytes) -> bool:
    """Whether the bytes are empty or only whitespace, without copying them as ``data.strip()`` does."""
    return _FIRST_TOKEN.search(data) is None


def decode_trace(data: bytes, path: Path) -> tuple[dict, list[Event], str]:
    """(document fields, events, format) from the bytes of one trace file."""
    if data.startswith(_BOM):
        data = data[len(_BOM):]  # a UTF-8 byte-order mark some editors write: the JSON after it is fine
    elif data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise InputError(path, "UTF-16 text (byte-order mark); a trace is UTF-8 JSON")
    first = _FIRST_TOKEN.search(data)  # not data.lstrip(): that copies the whole buffer
    head = data[first.start():first.start() + 1] if first else b""
    try:
        if head == b"[":
            events = _events_decoder.decode(data)
            # another tool's JSON list (records with neither phase nor time): not events to sanitise one by one
            if events and not any(e.ph is not None or e.ts is not None for e in events):
                raise InputError(path, f"JSON is not a Chrome/Kineto trace (a list of {len(events)} records, "
                                       "none with a 'ph' phase or a 'ts' time)")
            return {}, events, "event-list"
        if head != b"{":
            msgspec.json.decode(data)  # raises a DecodeError for non-JSON
            raise InputError(path, "JSON is not a Chrome/Kineto trace")
        doc = _doc_decoder.decode(data)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.startswith("Number out of range"):
            raise InputError(path, f"a number beyond the range of a double ({msg[:100]})") from None
        raise InputError(path, f"JSON is not a Chrome/Kineto trace ({msg[:100]})") from None
    except msgspec.DecodeError as exc:
        raise InputError(path, _decode_problem(data, str(exc))) from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply to be a trace") from None
    events = doc.traceEvents
    if events is None:
        raise InputError(path, "JSON is not a Chrome/Kineto trace (no 'traceEvents' list)")
    meta = {"distributedInfo": doc.distributedInfo, "deviceProperties": doc.deviceProperties,
            "host_name": doc.host_name, "baseTimeNanoseconds": doc.baseTimeNanoseconds,
            "schemaVersion": doc.schemaVersion, "fsdpdoctor_cpu": doc.fsdpdoctor_cpu}
    return meta, events, "kineto"


_NON_JSON_NUMBERS = re.compile(rb"-?(?:NaN|Infinity)\b")


def _decode_problem(data: bytes, msg: str) -> str:
    """What is wrong with bytes msgspec could not decode, in words a user can act on."""
    if "truncated" in msg:
        return "JSON ends early (truncated file?)"
    m = re.search(r"\(byte (\d+)\)", msg)
    if m:
        at = int(m.group(1))
        if _NON_JSON_NUMBERS.match(data, at) or _NON_JSON_NUMBERS.match(data, max(at - 1, 0)):
            return f"NaN or Infinity at byte {at}: not valid JSON (the writer produced non-standard numbers)"
    return f"not valid JSON ({msg[:100]})"


def raw_args(raw: msgspec.Raw) -> dict:
    """An event's ``args`` object; raises (ValidationError/RecursionError) when it is not a sane object."""
    if not raw:
        return {}
    return _dict_decoder.decode(raw)


_memory_decoder = msgspec.json.Decoder(MemoryArgs)
_memory_list_decoder = msgspec.json.Decoder(list[MemoryArgs])


def memory_args(raw: msgspec.Raw) -> MemoryArgs:
    """An allocator sample's arguments; raises (ValidationError) when ``args`` is not an object."""
    return _memory_decoder.decode(raw) if raw else MemoryArgs()


def memory_args_list(raws: list) -> list[MemoryArgs]:
    """``memory_args`` of many samples in one decode (a memory-profiled trace holds 10^4-10^5);
    raises when any of them is not an object."""
    return _memory_list_decoder.decode(b"[" + b",".join([r if r else b"{}" for r in raws]) + b"]")


def corr_args(raw: msgspec.Raw) -> CorrArgs | None:
    return _corr_decoder.decode(raw) if raw else None
