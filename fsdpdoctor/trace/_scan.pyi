"""The compiled trace scanner (_scan.c): a run of Kineto trace events read from its JSON bytes into columns.

Built at install where a C compiler exists; ``fsdpdoctor.trace.columns.from_bytes`` turns a ``Scanned`` into
the loader's ``Columns``. Every per-event column holds one native-endian number per complete ("X") event.
"""

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

class Scanned(tuple):  # a PyStructSequence: a named tuple of 13 fields
    n_fields: int
    n_sequence_fields: int
    n_unnamed_fields: int
    @property
    def names(self) -> list[str]: ...  # each once, in order of first appearance
    @property
    def name_ids(self) -> bytearray: ...  # int32: a row's index in names
    @property
    def categories(self) -> list[str | None]: ...  # as written, each once
    @property
    def category_ids(self) -> bytearray: ...  # int32: a row's index in categories
    @property
    def tracks(self) -> list[tuple[int | str | None, int | str | None]]: ...  # (pid, tid), each once
    @property
    def track_ids(self) -> bytearray: ...  # int32: a row's index in tracks
    @property
    def ts(self) -> bytearray: ...  # float64, us
    @property
    def dur(self) -> bytearray: ...  # float64, us (0.0 without one)
    @property
    def args_starts(self) -> bytearray: ...  # int64: where a row's args object starts in the buffer
    @property
    def args_ends(self) -> bytearray: ...  # int64: just after it (0 and 0: no args object)
    @property
    def correlations(self) -> bytearray: ...  # int64: args' correlation id (-1: none)
    @property
    def collective(self) -> bytearray: ...  # uint8: 1 when args has a "Collective name" that is not null
    @property
    def others(self) -> list[tuple[int, int]]: ...  # (start, end) of each metadata or instant event

def scan(buffer: Buffer, /) -> Scanned | None:
    """The columns of a run of whole events (``{...},{...}``), or None when the Python reading must read
    them (anything the scanner is not sure to read exactly as msgspec would)."""
