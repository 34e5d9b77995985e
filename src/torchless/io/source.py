"""An input file as a read-only memory map with bounds-checked slices, and positioned reads.

Two ways to the same bytes, for two jobs. Tensor data is viewed through the map (zero-copy:
an array is the file's pages). Headers and records (a ZIP's directory and local headers, a
TAR header, the pickle) are copied out with ``os.pread``: a read through the map faults in a
whole readahead window or page-cache folio around each header and keeps those pages in the
process's resident set, so that opening a 2 GiB archive whose tensors are spread over the file
read the whole file when cold and added hundreds of MiB of RSS when warm; ``pread`` copies
only the bytes asked for.
"""

from __future__ import annotations

import errno
import functools
import mmap
import os
import stat
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from torchless.errors import CheckpointError, FormatError, MissingFileError, TruncatedInputError

__all__ = ["Source"]


class Source:
    """A read-only view of one file's bytes.

    ``view(offset, n)`` returns a zero-copy memoryview after checking that the
    range lies inside the file; nothing ever reads past the end.
    """

    #: Whether the bytes come from elsewhere by ranges (:mod:`torchless.io.remote`).
    remote = False

    _closed = False
    _fd = -1  # open for positioned reads (-1: none, reads go through the map)

    #: The whole file, when it was read rather than mapped (``copy_below``).
    _copy = b""
    #: The address of the map's first byte, once :meth:`offset_of` has asked for it.
    _base: int | None = None
    #: Where ZIP end records could start (:func:`torchless.io.detect.zip_end_records`, which
    #: fills it in: the sniffers, the ZIP reader and the scanner each ask).
    zip_ends: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def __init__(self, path: str | os.PathLike[str], *, copy_below: int = 0,
                 fd: int | None = None) -> None:
        """``copy_below``: a file of at most this many bytes is read into memory instead
        of mapped (for a scan of many small files, a map's set-up, page faults and unmap
        cost more than a copy). ``fd``: the file is this open descriptor (of an open file
        object; duplicated, the caller's stays open), ``path`` only its name."""
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0)) if fd is None \
                else os.dup(fd)
        except FileNotFoundError as e:
            raise MissingFileError(f"cannot open: {e.strerror or e}", path=self.path) from None
        except OSError as e:
            raise CheckpointError(f"cannot open: {e.strerror or e}", path=self.path,
                                  hint="check the path (relative paths start from the "
                                       "current directory) and that you may read the file"
                                  ) from None
        keep = False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError("not a regular file", path=self.path,
                                  hint="pass a checkpoint file (a pipe or device cannot be "
                                       "read by ranges: copy it to a file first)")
            self.size = st.st_size
            self.identity = (st.st_dev, st.st_ino)  # lets a writer copy from the same file
            self._mmap: mmap.mmap | None = None
            if 0 < self.size <= copy_below:
                self._copy = self._read_all(fd)
                self._view = memoryview(self._copy)
            elif self.size:
                self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                self._view = memoryview(self._mmap)
            else:
                self._view = memoryview(b"")
            keep = not self._copy and hasattr(os, "pread")
        except OSError as e:
            if e.errno == errno.ENOMEM:
                raise CheckpointError(
                    f"cannot map the file's {self.size:,} bytes: the process may not reserve "
                    "that much address space", path=self.path,
                    hint="torchless maps a checkpoint without reading it (a conversion keeps "
                         "tens of MiB resident whatever the size), but the map needs address "
                         "space: raise the limit (`ulimit -v`, RLIMIT_AS) above the file's "
                         "size") from None
            raise CheckpointError(f"cannot map: {e.strerror or e}", path=self.path) from None
        finally:
            if keep:
                self._fd = fd
            else:
                os.close(fd)

    def _read_all(self, fd: int) -> bytes:
        parts = []
        got = 0
        while got < self.size:
            try:
                part = os.read(fd, self.size - got)
            except OSError as e:
                raise CheckpointError(f"cannot read: {e.strerror or e}", path=self.path) from None
            if not part:
                raise TruncatedInputError(f"the file was cut while open (read {got} of "
                                          f"{self.size} bytes)", offset=got)
            parts.append(part)
            got += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def buffer(self) -> memoryview:
        """The whole file."""
        return self._view

    @property
    def raw(self) -> mmap.mmap | bytes:
        """The whole file as an object with find() and slicing (for the pickle VM)."""
        return self._mmap if self._mmap is not None else self._copy

    def view(self, offset: int, n: int, what: str = "data") -> memoryview:
        self._check(offset, n, what)
        return self._view[offset : offset + n]

    def offset_of(self, view: memoryview) -> int | None:
        """Where ``view``, a slice of :attr:`buffer`, lies in the file (None for any other
        buffer): lets a writer copy those bytes straight from the file."""
        if self._mmap is None or view.obj is not self._mmap or not view.nbytes \
                or not view.c_contiguous:
            return None
        if self._base is None:
            self._base = _address(self._view)
        where = _address(view) - self._base
        return where if 0 <= where and where + view.nbytes <= self.size else None

    def _check(self, offset: int, n: int, what: str) -> None:
        if self._closed:
            raise CheckpointError(
                "the checkpoint is closed: its tensors can no longer be read", path=self.path,
                hint="read tensors (numpy(), to_torch()) inside the `with torchless.open(...)` "
                     "block, or copy what you need (np.array(t.numpy())) before it ends")
        if offset < 0 or n < 0:
            raise FormatError(f"{what}: negative offset or length", offset=offset)
        if offset + n > self.size:
            raise TruncatedInputError(
                f"{what}: expected {n} bytes at offset {offset}, "
                f"file has {max(0, self.size - offset)}",
                offset=offset,
            )

    def release(self, offset: int, n: int) -> None:
        """Hand back the whole pages of ``[offset, offset + n)`` of the map: the process's
        resident set shrinks, the page cache keeps them, and a later read faults them back
        in from the file unchanged (the map is shared and read-only)."""
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        begin = -(-offset // page) * page
        end = min(offset + n, self.size) // page * page
        if end > begin:
            try:
                self._mmap.madvise(mmap.MADV_DONTNEED, begin, end - begin)
            except (OSError, ValueError):  # pragma: no cover - advice only
                pass

    def blocks(self, offset: int, n: int, chunk: int) -> Iterator[memoryview | bytes]:
        """Bytes ``[offset, offset + n)`` in blocks of at most ``chunk`` bytes."""
        view = self.view(offset, n)
        for i in range(0, n, chunk):
            yield view[i:i + chunk]

    def read(self, offset: int, n: int, what: str = "data") -> bytes:
        """A copy of ``[offset, offset + n)``, read without touching the map (see the module
        docstring); where ``os.pread`` is missing, through the map."""
        if self._fd < 0:
            return bytes(self.view(offset, n, what))
        self._check(offset, n, what)
        try:
            out = os.pread(self._fd, n, offset)
            while len(out) < n:  # a short read: a huge range, or a file cut while open
                more = os.pread(self._fd, n - len(out), offset + len(out))
                if not more:
                    raise TruncatedInputError(
                        f"{what}: the file was cut while open ({offset + len(out)} bytes "
                        f"left of {self.size})", offset=offset + len(out))
                out += more
        except OSError as e:
            raise CheckpointError(f"cannot read: {e.strerror or e}", path=self.path) from None
        return out

    def read_into(self, offset: int, out: Any, what: str = "data") -> None:
        """Fill the writable buffer ``out`` with the file's bytes from ``offset`` on (a
        tensor's memory, read once: no copy in between). Read with ``os.preadv``, the map's
        pages are never touched; where it is missing, copied through the map and those
        pages handed back (:meth:`release`)."""
        dest = memoryview(out).cast("B")
        n = dest.nbytes
        self._check(offset, n, what)
        if self._fd < 0 or not hasattr(os, "preadv"):
            dest[:] = self._view[offset:offset + n]
            self.release(offset, n)
            return
        got = 0
        try:
            while got < n:  # short reads: Linux reads at most 2 GiB a call, or a cut file
                step = os.preadv(self._fd, [dest[got:]], offset + got)
                if not step:
                    raise TruncatedInputError(
                        f"{what}: the file was cut while open ({offset + got} bytes "
                        f"left of {self.size})", offset=offset + got)
                got += step
        except OSError as e:
            raise CheckpointError(f"cannot read: {e.strerror or e}", path=self.path) from None

    def release_view(self, view: memoryview | bytes) -> None:
        """:meth:`release` the pages under ``view`` when it is a slice of this file's map
        (a copy of the bytes has been made and the map's pages need not stay resident)."""
        if isinstance(view, memoryview):
            where = self.offset_of(view)
            if where is not None:
                self.release(where, view.nbytes)

    def close(self) -> None:
        """Drop our reference; arrays still viewing the map keep it alive until they go."""
        self._close_fd()
        self._mmap = None
        self._copy = b""
        self._view = memoryview(b"")
        self._closed = True

    def _close_fd(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close bound at definition: __del__ may run at interpreter exit, after this
        # module's globals (os among them) were set to None
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close(fd)

    def __del__(self) -> None:
        self._close_fd()

    def __enter__(self) -> Source:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@functools.cache
def _py_buffer() -> Any:
    """CPython's ``Py_buffer`` (the buffer protocol's view of an object's memory) as a ctypes
    structure, and ctypes itself, imported when first needed (a writer copying tensor bytes
    from the map): a scan or an inspect never imports ctypes."""
    import ctypes

    class PyBuffer(ctypes.Structure):
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                    ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                    ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                    ("internal", ctypes.c_void_p)]

    return PyBuffer, ctypes


def _address(view: memoryview) -> int:
    """The address of a (read-only) view's first byte, asked through the buffer protocol:
    ctypes' own ``from_buffer`` wants a writable buffer, and a map of a checkpoint is not."""
    py_buffer, ctypes = _py_buffer()
    info = py_buffer()
    api = ctypes.pythonapi
    if api.PyObject_GetBuffer(ctypes.py_object(view), ctypes.byref(info), 0) != 0:
        raise ValueError("no buffer")  # pragma: no cover - a memoryview always has one
    try:
        return int(info.buf or 0)
    finally:
        api.PyBuffer_Release(ctypes.byref(info))
