"""What a caller passes to read, made a :class:`~torchless.io.source.Source`: a path, a URL,
or an open binary file object.

A file object of the operating system's own file (``open(path, "rb")``, and fsspec's
uncompressed local file, which is what Lightning passes to ``torch.load``) is mapped through
its descriptor like a path: nothing is copied. Any other file object (``io.BytesIO``, an
fsspec remote file …) is read by ranges (:class:`~torchless.io.remote.RemoteSource`), so it
must be binary and seekable: ``seek``, ``tell`` and ``read``. One that cannot seek (a pipe,
an HTTP response, a socket) is refused, saying so: read it into ``io.BytesIO`` first, or
pass its path.
"""

from __future__ import annotations

import io
import os
from typing import Any

from torchless.errors import UnsupportedError
from torchless.io.remote import RemoteSource, _file_name, is_remote
from torchless.io.source import Source

__all__ = ["is_file_object", "open_source"]

#: The standard library's own files: their bytes are those of their descriptor.
_OS_FILES = (io.BufferedReader, io.BufferedRandom, io.FileIO)


def is_file_object(target: Any) -> bool:
    """An open file object (not a path or a URL)."""
    return hasattr(target, "read") and not isinstance(target, (str, bytes, os.PathLike))


def open_source(target: Any, *, max_download: int | None = None) -> Source:
    """The source of ``target``: a path, a URL (``https://``, any fsspec scheme) or an open
    binary, seekable file object (read from its start, whatever its position).
    ``max_download``: as for :class:`~torchless.io.remote.RemoteSource`."""
    if not is_file_object(target):
        return RemoteSource(target, max_download=max_download) if is_remote(
            target) else Source(os.fspath(target))
    if isinstance(target, io.TextIOBase):
        raise UnsupportedError("a text file object: torchless reads bytes",
                               hint="open the file in binary mode: open(path, 'rb')")
    try:
        can_seek = bool(target.seekable()) if hasattr(target, "seekable") else True
    except (OSError, ValueError):
        can_seek = False
    if not hasattr(target, "seek") or not can_seek:
        raise UnsupportedError(
            "the file object cannot seek: torchless reads a checkpoint by ranges (its end "
            "records first) and needs a binary file object with seek, tell and read",
            hint="pass the file's path, or read the stream into memory first: "
                 "io.BytesIO(stream.read())")
    fd = _descriptor(target)
    if fd is not None:
        return Source(_file_name(target), fd=fd)
    return RemoteSource(target)


def _descriptor(f: Any) -> int | None:
    """The descriptor whose bytes ``f`` reads, for the standard library's files and fsspec's
    uncompressed local file (which wraps one); None for any other object (a ``GzipFile``
    has a descriptor too, of other bytes)."""
    inner = f
    if type(f).__name__ == "LocalFileOpener":
        try:
            inner = None if f.compression else f.f
        except AttributeError:
            return None
    if type(inner) not in _OS_FILES:
        return None
    try:
        return int(inner.fileno())
    except (OSError, ValueError):
        return None
