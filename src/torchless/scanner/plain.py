"""Short pickles of plain data, remembered by their bytes.

Every legacy stream (and every TAR checkpoint) opens with the same few pickles: the magic
number, the protocol version and ``sys_info`` are the same bytes in each file one torch
version writes. Their inert run is most of the cost of a small legacy file's scan, and its
outcome is a function of the bytes alone: a stream that names no global, passes no
persistent id and takes no action, run to its STOP, gives one value and nothing else,
whatever surrounds it (no byte 0x95 but that of one FRAME after PROTO that ends with the
stream, so no FRAME whose length reaches past the STOP).

Such a stream is kept here, with its value, for the process (at most :data:`MAX_LENGTHS`
kinds and lengths of :data:`PER_LENGTH` streams each, so a hostile directory cannot grow
it). A later stream of the same kind and bytes under the same limits is answered from it,
with a fresh copy of the value (the callers may keep it). Only the header pickles are asked
for (:data:`HEADERS`), not the storage key lists, which differ from file to file.
"""

from __future__ import annotations

from typing import Any

from torchless.core.limits import Limits

__all__ = ["HEADERS", "MAX_BYTES", "PlainStreams"]

#: The pickles a container walk reads that are the same bytes in many files (as the walks
#: of :mod:`torchless.containers.legacy` and ``.tar`` name them).
HEADERS = frozenset({"legacy magic number", "legacy protocol version", "legacy sys_info",
                     "TAR sys_info"})

#: Longest stream kept (the sys_info pickle is about 120 bytes).
MAX_BYTES = 256
MAX_LENGTHS = 16
PER_LENGTH = 8
_SCALARS = (type(None), bool, int, float, str, bytes)


def _plain(value: Any, depth: int = 0) -> bool:
    """Plain data a copy can rebuild: scalars, and tuples, lists and dicts of them."""
    if type(value) in _SCALARS:
        return True
    if depth > 4:
        return False
    if type(value) in (tuple, list):
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind is list:
        return [_copy(v) for v in value]
    if kind is dict:
        return {k: _copy(v) for k, v in value.items()}
    if kind is tuple:
        return tuple(_copy(v) for v in value)
    return value


class PlainStreams:
    """The remembered streams of one :class:`Limits` (a stream a tighter limit refuses
    must not be answered from a run under a looser one)."""

    def __init__(self) -> None:
        self._limits: Limits | None = None
        #: (what the stream is, length) -> stream bytes -> value
        self._by_length: dict[tuple[str, int], dict[bytes, Any]] = {}

    def find(self, what: str, data: Any, start: int, stop: int,
             limits: Limits) -> tuple[Any, int] | None:
        """(a copy of the value, offset after STOP) of a remembered stream ``what`` (a
        legacy stream's "magic number" …) at ``start``."""
        if limits is not self._limits:
            return None
        for (kind, length), streams in self._by_length.items():
            if kind != what:
                continue
            if start + length <= stop:
                value = streams.get(data[start:start + length], streams)
                if value is not streams:
                    return _copy(value), start + length
        return None

    def keep(self, what: str, data: Any, start: int, end: int, value: Any,
             limits: Limits) -> None:
        """Remember the stream ``what`` at ``data[start:end]`` (run to STOP with nothing
        recorded but ``value``) if it is short plain data."""
        length = end - start
        if length > MAX_BYTES or not _plain(value):
            return
        raw = bytes(data[start:end])
        # protocol 4 and 5: one FRAME after PROTO that ends with the stream itself
        framed = raw[:1] == b"\x80" and raw[2:3] == b"\x95" and \
            11 + int.from_bytes(raw[3:11], "little") == length
        if 0x95 in (raw[11:] if framed else raw):
            return
        if limits is not self._limits:
            self._limits = limits
            self._by_length = {}
        streams = self._by_length.get((what, length))
        if streams is None:
            if len(self._by_length) >= MAX_LENGTHS:
                return
            streams = self._by_length[what, length] = {}
        if len(streams) < PER_LENGTH:
            streams[raw] = _copy(value)
