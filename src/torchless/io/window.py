"""A byte range of an opened file, read as a file of its own.

A DCP shard (``__0_0.distcp``) is a run of whole ``torch.save`` archives, one per tensor
chunk or value, each at an (offset, length) the checkpoint's metadata records. A window
gives the ZIP and torch readers exactly that range: every offset they see counts from its
start, nothing outside it can be read, and views of it are views of the file's map.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchless.errors import FormatError, TruncatedInputError
from torchless.io.source import Source

__all__ = ["Window"]


class Window:
    """Bytes ``[offset, offset + size)`` of ``source``, with :class:`Source`'s reading
    interface (``view``, ``read``, ``blocks``, ``buffer``, ``release``)."""

    remote = False

    def __init__(self, source: Source, offset: int, size: int, label: str) -> None:
        self.parent = source
        self.offset = offset
        self.size = size
        self.path = label
        self.identity = None
        self._view = source.view(offset, size, label)

    @property
    def buffer(self) -> memoryview:
        return self._view

    @property
    def raw(self) -> memoryview:
        return self._view

    def view(self, offset: int, n: int, what: str = "data") -> memoryview:
        if offset < 0 or n < 0:
            raise FormatError(f"{what}: negative offset or length", offset=offset)
        if offset + n > self.size:
            raise TruncatedInputError(
                f"{what}: expected {n} bytes at offset {offset}, "
                f"the item has {max(0, self.size - offset)}", offset=offset)
        return self._view[offset:offset + n]

    def read(self, offset: int, n: int, what: str = "data") -> bytes:
        return bytes(self.view(offset, n, what))

    def blocks(self, offset: int, n: int, chunk: int) -> Iterator[memoryview | bytes]:
        view = self.view(offset, n)
        for i in range(0, n, chunk):
            yield view[i:i + chunk]

    def release(self, offset: int, n: int) -> None:
        self.parent.release(self.offset + offset, n)

    def close(self) -> None:
        """The parent file owns the map; it is closed with the checkpoint."""
