"""Checkpoints that are not local files: HTTP(S) range requests, or any fsspec URL or file.

A :class:`RemoteSource` stands in for :class:`~torchless.io.source.Source`. Nothing is
downloaded up front: :meth:`RemoteSource.view` fetches the blocks of the range asked for
(adjacent missing blocks in one request) into a sparse, unlinked temporary file that the
process maps, so a ZIP checkpoint is opened with a handful of requests (its end records, the
central directory, ``data.pkl`` and the small records beside it; each member's local header
is checked when that member is read). Tensor bytes are fetched when a tensor is read, and
:meth:`RemoteSource.blocks` streams a member to a converter in bounded memory without keeping
it. Legacy, TAR and plain-pickle files are walked sequentially by the pickle interpreter, so
their whole file is fetched first.

``http://`` and ``https://`` use the standard library. A server that ignores ``Range`` (it
answers ``200`` with the whole body, as ``python -m http.server`` does) is read from a
download: a file of at most ``Limits.max_download_bytes`` (64 MiB; any size with
``allow_full_download=True`` / ``--download``) is streamed from that answer into an unnamed
temporary file (nothing is left behind, whatever happens), its length checked against the
``Content-Length``, and only then read; the callback :data:`download_progress` holds, if any,
is told ``(bytes_done, bytes_total)`` as it arrives. A larger file is refused before its body
is read. Other schemes
(``s3://``, ``hf://``, ``gs://`` …) and open file objects go through fsspec, an optional
dependency (``pip install torchless[remote]``).
"""

from __future__ import annotations

import contextvars
import mmap
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from torchless.errors import (
    CheckpointError,
    FormatError,
    LimitError,
    TruncatedInputError,
    UnsupportedError,
)
from torchless.io.source import Source

__all__ = ["BLOCK_BYTES", "NO_DOWNLOAD_LIMIT", "RemoteSource", "download_progress",
           "is_remote"]

#: ``max_download_bytes`` for ``allow_full_download=True``: any size.
NO_DOWNLOAD_LIMIT = (1 << 63) - 1
#: ``download_progress.set(f)``: ``f(bytes_done, bytes_total)`` while a file is downloaded
#: whole from a server that ignores ``Range`` (``bytes_total`` 0 when the server did not
#: say); the command line sets its progress line here.
download_progress: contextvars.ContextVar[Callable[[int, int], None] | None] = \
    contextvars.ContextVar("torchless_download_progress", default=None)
_DOWNLOAD_CHUNK = 1 << 20

#: Granularity of fetches into the local map; small reads are rounded up to it.
BLOCK_BYTES = 64 << 10
#: Largest single request when streaming a member to a converter.
STREAM_BYTES = 8 << 20
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_remote(path: Any) -> bool:
    """A URL (``scheme://…``) or an open file-like object with ``read`` and ``seek``."""
    if isinstance(path, str):
        return _URL.match(path) is not None and not path.startswith("file://")
    return hasattr(path, "read") and hasattr(path, "seek") and not isinstance(path, os.PathLike)


@dataclass
class Stats:
    """What was asked of the server: requests made and bytes received."""

    requests: int = 0
    bytes: int = 0


class _Backend(Protocol):
    size: int
    stats: Stats
    validators: dict[str, str]

    def fetch(self, start: int, end: int) -> bytes: ...

    def stream(self, start: int, end: int, chunk: int) -> Iterator[bytes]: ...


class _Http:
    """Range requests with the standard library; a download of the whole file from a server
    that ignores them (:attr:`whole`), up to ``max_download`` bytes."""

    def __init__(self, url: str, timeout: float = 60.0, *,
                 max_download: int = NO_DOWNLOAD_LIMIT) -> None:
        self.url = url
        self.timeout = timeout
        self.stats = Stats()
        #: the downloaded file, when the server ignores ``Range``
        self.whole: IO[bytes] | None = None
        with self._get(0, 1, whole=True) as r:
            #: what identifies this version of the file (the conversion certificate's)
            self.validators = {k: str(v) for k, v in (
                ("etag", r.headers.get("ETag")),
                ("last_modified", r.headers.get("Last-Modified"))) if v}
            if r.status == 206:
                self.size = _content_range_total(r.headers.get("Content-Range"), url)
                r.read(2)
            else:
                self.whole, self.size = self._download(r, max_download)

    def _download(self, r: Any, limit: int) -> tuple[IO[bytes], int]:
        """The body of a ``200`` answer, streamed into an unnamed temporary file: refused
        before it is read when its ``Content-Length`` is over ``limit``, and as soon as it
        passes ``limit`` when the server did not say; checked whole before it is used."""
        import http.client
        import tempfile

        length = _content_length(r.headers.get("Content-Length"))
        if length is not None and length > limit:
            raise _too_big(self.url, r.status, length, limit)
        f = tempfile.TemporaryFile(prefix="torchless-download-")
        try:
            done = 0
            report = download_progress.get()
            while True:
                try:
                    data = r.read(_DOWNLOAD_CHUNK)
                except http.client.IncompleteRead as e:  # the body ended early
                    raise TruncatedInputError(
                        f"the server sent {done + len(e.partial)} of the {length} bytes its "
                        "Content-Length says", path=self.url) from None
                except http.client.HTTPException as e:
                    raise _not_http(e, self.url) from None
                except OSError as e:
                    raise CheckpointError(f"the download failed at byte {done}: {e}",
                                          path=self.url) from None
                if not data:
                    break
                done += len(data)
                self.stats.bytes += len(data)
                if done > limit:
                    raise _too_big(self.url, r.status, None, limit)
                if length is not None and done > length:
                    raise FormatError(f"the server sent more than the {length} bytes its "
                                      "Content-Length says", path=self.url)
                f.write(data)
                if report is not None:
                    report(done, length or 0)
            if length is not None and done != length:
                raise TruncatedInputError(f"the server sent {done} of the {length} bytes "
                                          "its Content-Length says", path=self.url)
            f.flush()
        except BaseException:
            f.close()
            raise
        return f, done

    def _get(self, start: int, end: int, *, whole: bool = False) -> Any:
        import http.client  # loaded for URLs only: local reads start without it
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url, headers={
            "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity",
            "User-Agent": "torchless"})
        self.stats.requests += 1
        try:
            r = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and end - start == 1:
                raise FormatError("the server says the file is empty", path=self.url) from None
            raise CheckpointError(f"HTTP {e.code} {e.reason}", path=self.url,
                                  hint="check the URL; a file that needs credentials can be "
                                       "downloaded first and read locally") from None
        except (urllib.error.URLError, OSError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise CheckpointError(f"cannot fetch: {reason}", path=self.url,
                                  hint="check the URL and the network connection") from None
        except http.client.HTTPException as e:  # a header line past 64 KiB, 100 headers …
            raise _not_http(e, self.url) from None
        if r.status != 206 and whole and r.status == 200:
            return r  # the first request: a server that ignores Range, read as a download
        if r.status != 206:
            length = r.headers.get("Content-Length")
            r.close()
            raise UnsupportedError(
                f"the server ignores Range requests (it answered {r.status} with the whole "
                f"body{f' of {length} bytes' if length else ''}) after it had answered one",
                path=self.url, hint="download the file (curl -O, huggingface-cli download …) "
                                    "and read the local copy")
        got = _content_range_start(r.headers.get("Content-Range"), self.url)
        if got != start:
            r.close()
            raise FormatError(f"asked for bytes from {start}, the server sent from {got}",
                              path=self.url)
        return r

    def fetch(self, start: int, end: int) -> bytes:
        import http.client

        with self._get(start, end) as r:
            try:
                data = r.read(end - start)
            except http.client.HTTPException as e:  # a broken chunked body …
                raise _not_http(e, self.url) from None
        self.stats.bytes += len(data)
        if len(data) != end - start:
            raise TruncatedInputError(f"the server sent {len(data)} of {end - start} bytes "
                                      f"at offset {start}", path=self.url)
        return bytes(data)

    def stream(self, start: int, end: int, chunk: int) -> Iterator[bytes]:
        import http.client

        with self._get(start, end) as r:
            pos = start
            while pos < end:
                try:
                    data = r.read(min(chunk, end - pos))
                except http.client.HTTPException as e:
                    raise _not_http(e, self.url) from None
                if not data:
                    raise TruncatedInputError(f"the server stopped at offset {pos} of "
                                              f"{start}-{end}", path=self.url)
                self.stats.bytes += len(data)
                pos += len(data)
                yield data


def _content_length(value: str | None) -> int | None:
    m = re.fullmatch(r"\d{1,19}", (value or "").strip())
    return int(m.group(0)) if m else None


def _too_big(url: str, status: int, length: int | None, limit: int) -> LimitError:
    size = f"{length:,} bytes" if length is not None else f"more than {limit:,} bytes"
    return LimitError(
        "max_download_bytes", limit, length if length is not None else -1,
        f"the server ignores Range requests (it answered {status} with the whole body, "
        f"{size}): torchless downloads such a file whole only up to that size", path=url,
        hint="allow the download with --download (allow_full_download=True), or raise the "
             "bound with --limit max_download_bytes=N; or download it yourself (curl -O) "
             "and read the local copy")


def _not_http(e: Exception, url: str) -> CheckpointError:
    return CheckpointError(f"the server's answer is not usable HTTP: {type(e).__name__}: {e}",
                           path=url, hint="check the URL; or download the file with another "
                                          "tool and read the local copy")


# offsets of at most 19 digits (int64): a longer number is no file's size, and past 4,300
# digits int() itself refuses
def _content_range_total(value: str | None, url: str) -> int:
    m = re.fullmatch(r"bytes \d{1,19}-\d{1,19}/(\d{1,19})", (value or "").strip())
    if m is None:
        raise FormatError(f"the server sent no usable Content-Range ({value!r})", path=url)
    return int(m.group(1))


def _content_range_start(value: str | None, url: str) -> int:
    m = re.fullmatch(r"bytes (\d{1,19})-\d{1,19}/\d{1,19}", (value or "").strip())
    if m is None:
        raise FormatError(f"the server sent no usable Content-Range ({value!r})", path=url)
    return int(m.group(1))


def _file_name(f: Any) -> str:
    for attr in ("path", "name"):
        try:
            value = f.path if attr == "path" else f.name
        except AttributeError:
            continue
        if isinstance(value, str) and value:
            return value
    return "<file object>"


class _Fsspec:
    """Any fsspec URL, or an open file object (fsspec's or another with read/seek)."""

    def __init__(self, target: Any) -> None:
        self.stats = Stats()
        self.fs: Any = None
        self.file: Any = None
        if isinstance(target, str):
            try:
                import fsspec
            except ImportError:
                raise UnsupportedError(f"reading {target.split('://')[0]}:// URLs needs "
                                       "fsspec: pip install torchless[remote]",
                                       hint="pip install torchless[remote] (fsspec and its "
                                            "protocol package, e.g. s3fs)") from None
            try:
                self.fs, self.path = fsspec.core.url_to_fs(target)
                info = self.fs.info(self.path)
                self.size = int(info["size"]) if info.get("size") is not None else int(
                    self.fs.size(self.path))
            except (OSError, ValueError, ImportError) as e:
                raise CheckpointError(f"cannot open: {e}", path=target) from None
            self.validators = {k: str(info[name]) for k, name in (
                ("etag", "ETag"), ("etag", "etag"), ("last_modified", "LastModified"),
                ("last_modified", "last_modified"), ("mtime", "mtime")) if info.get(name)}
        else:
            self.validators = {}
            self.file = target
            self.path = _file_name(target)
            target.seek(0, os.SEEK_END)
            self.size = int(target.tell())

    def fetch(self, start: int, end: int) -> bytes:
        self.stats.requests += 1
        try:
            if self.fs is not None:
                data = bytes(self.fs.cat_file(self.path, start=start, end=end))
            else:
                self.file.seek(start)
                data = bytes(self.file.read(end - start))
        except OSError as e:
            raise CheckpointError(f"cannot read bytes {start}-{end}: {e}",
                                  path=self.path) from None
        self.stats.bytes += len(data)
        if len(data) != end - start:
            raise TruncatedInputError(f"got {len(data)} of {end - start} bytes at offset "
                                      f"{start}", path=self.path)
        return data

    def stream(self, start: int, end: int, chunk: int) -> Iterator[bytes]:
        for pos in range(start, end, chunk):
            yield self.fetch(pos, min(end, pos + chunk))


class RemoteSource(Source):
    """A remote file read by ranges into a sparse local map (see the module docstring)."""

    remote = True

    def __init__(self, target: Any, *, max_download: int | None = None) -> None:
        """``max_download``: the largest file downloaded whole from a server that ignores
        ``Range`` (default ``Limits().max_download_bytes``)."""
        if max_download is None:
            from torchless.core.limits import Limits

            max_download = Limits().max_download_bytes
        http = _Http(target, max_download=max_download) if isinstance(
            target, str) and target.lower().startswith(("http://", "https://")) else None
        self._backend: _Backend = http if http is not None else _Fsspec(target)
        whole = http.whole if http is not None else None
        self.path = target if isinstance(target, str) else _file_name(target)
        self.size = self._backend.size
        self.identity = (-1, id(self))
        self._mmap = None
        self._view = memoryview(b"")
        # downloaded: every block is here
        self._have = bytearray((b"\x01" if whole is not None else b"\x00")
                               * -(-self.size // BLOCK_BYTES))
        if self.size:
            import tempfile

            self._file = whole if whole is not None else tempfile.TemporaryFile(
                prefix="torchless-remote-")
            try:
                if whole is None:
                    os.ftruncate(self._file.fileno(), self.size)  # sparse: no disk used yet
                self._mmap = mmap.mmap(self._file.fileno(), self.size)
            except OSError as e:
                self._file.close()
                raise CheckpointError(f"cannot map a local buffer: {e}", path=self.path
                                      ) from None
            self._view = memoryview(self._mmap).toreadonly()
        elif whole is not None:
            whole.close()

    @property
    def stats(self) -> Stats:
        return self._backend.stats

    @property
    def validators(self) -> dict[str, str]:
        """What the server says identifies this version of the file: ``etag`` and
        ``last_modified`` (HTTP), or what an fsspec file system's ``info`` gives."""
        return dict(self._backend.validators)

    def _ensure(self, offset: int, n: int) -> None:
        """Fetch the missing blocks of ``[offset, offset + n)``, a run per request."""
        if n <= 0 or self._mmap is None:
            return
        first, last = offset // BLOCK_BYTES, (offset + n - 1) // BLOCK_BYTES
        b = first
        while b <= last:
            if self._have[b]:
                b += 1
                continue
            run = b
            while run <= last and not self._have[run]:
                run += 1
            start, end = b * BLOCK_BYTES, min(self.size, run * BLOCK_BYTES)
            self._mmap[start:end] = self._backend.fetch(start, end)
            self._have[b:run] = b"\x01" * (run - b)
            b = run

    def view(self, offset: int, n: int, what: str = "data") -> memoryview:
        out = super().view(offset, n, what)  # bounds
        self._ensure(offset, n)
        return out

    @property
    def buffer(self) -> memoryview:
        """The whole file, fetched (remote sources are meant to be read by ranges)."""
        self._ensure(0, self.size)
        return self._view

    @property
    def raw(self) -> mmap.mmap | bytes:
        """The whole file for the pickle interpreter (legacy, TAR, plain pickles)."""
        self._ensure(0, self.size)
        return self._mmap if self._mmap is not None else b""

    def blocks(self, offset: int, n: int, chunk: int) -> Iterator[memoryview | bytes]:
        """Bytes ``[offset, offset + n)`` streamed from the server, not kept; blocks already
        fetched (the member's local header is read with the start of its data) come from
        the local map instead of being asked for again."""
        super().view(offset, n)  # bounds
        end = offset + n
        pos = offset
        while pos < end:
            b = pos // BLOCK_BYTES
            if self._have[b]:
                stop = min(end, (b + 1) * BLOCK_BYTES)
                for i in range(pos, stop, chunk):
                    yield self._view[i:min(stop, i + chunk)]
                pos = stop
                continue
            limit = min(end, pos + STREAM_BYTES)
            run = b + 1
            while run * BLOCK_BYTES < limit and not self._have[run]:
                run += 1
            stop = min(limit, run * BLOCK_BYTES)
            yield from self._backend.stream(pos, stop, chunk)
            pos = stop

    def close(self) -> None:
        super().close()
        if self.size:
            self._file.close()
