"""The bytes of an output file in the fewest system calls, in bounded memory: runs of the
source file copied by the kernel (the first of them read into a buffer and written from it),
small pieces gathered into one buffer, writes from the source's map only where the kernel
will not copy, and the disk started writing behind the copy by a thread of the writer's own
(the choices and their measurements: the constants below and
:mod:`torchless.write.safetensors`)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from time import perf_counter as _clock
from typing import TYPE_CHECKING

from torchless.errors import ConversionError
from torchless.model import chunks as _chunks

if TYPE_CHECKING:
    from queue import SimpleQueue
    from threading import Thread

__all__ = ["COPY_BLOCK_BYTES", "GATHER_BYTES", "KERNEL_COPY", "KERNEL_MIN_BYTES", "Progress",
           "READ_COPY_BYTES", "READ_GAP_BYTES", "RELEASE_BYTES", "Release", "SLOW_WRITE",
           "SPEED_WINDOW_BYTES", "Writer"]

#: Runs of the source file at least this long are copied by the kernel (no page of them
#: enters the process; the first :data:`READ_COPY_BYTES` go through the buffer); shorter
#: pieces are gathered into one buffer and written together.
KERNEL_MIN_BYTES = 1 << 20
#: The kernel copies to try, in order; the first that works on these files is kept.
#: Empty: write every run from the map instead.
KERNEL_COPY: tuple[str, ...] = ("copy_file_range", "sendfile")
#: Size of the buffer small pieces are gathered in.
GATHER_BYTES = 4 << 20
#: Small pieces whose place in the source file is known are read into the buffer with
#: ``os.preadv`` (their pages never enter the process's map); pieces that follow each other
#: in the file with at most this many bytes between them (a ZIP member's descriptor and the
#: next local header) are one call, the bytes between read into a scratch block. 20,000
#: pieces of 11,200 bytes: 0.11 s against 0.15 s gathered from the map (which also faulted
#: the map's pages in and released them).
READ_GAP_BYTES = 4 << 10
#: The most buffers one ``preadv`` call takes (the system's ``IOV_MAX``, 1024 on Linux).
_IOV_MAX = max(2, min(1024, os.sysconf("SC_IOV_MAX"))) if "SC_IOV_MAX" in getattr(
    os, "sysconf_names", {}) else 16
#: Block size of writes straight from the source's map (without a kernel copy).
COPY_BLOCK_BYTES = 1 << 20
#: How many bytes read from the source's map before its pages are released (512 MiB of
#: 2,000 bf16 tensors, gathered: peak RSS 72.6 MiB at 16 MiB, 52.0 at 4 MiB, same time).
RELEASE_BYTES = 4 << 20

#: Every this many bytes written, the kernel is asked to start writing them to the disk
#: (``posix_fadvise(POSIX_FADV_DONTNEED)`` on the range: writeback starts, and the pages are
#: dropped from the cache once clean), so that the disk works while the copy goes on and the
#: final ``fsync`` finds little left to do. 0: only the final ``fsync``. Measured with
#: ``benchmarks/convert.py --mib 8192 --files f32 --reps 2`` (8 GiB, 256 tensors, a loaded
#: machine): the final ``fsync`` added 0.5 s to torchless's 17.8 s and 3.4 s to the
#: ``copy_file_range`` floor script's 11.7 s, so that fsynced, torchless took 1.21x the
#: floor and 0.99x ``cp`` + ``sync`` against 1.52x the floor with the output left in the
#: page cache. ``benchmarks/copy_methods.py --sync`` times it alone
#: (``copy_file_range+writeback``). The requests are made by a thread of the writer's own
#: (:func:`_kick`), so that the copy does not wait for them: whole process, fsynced, medians
#: of 7 interleaved runs against requests made in line: 2 GiB f32 1.46 s against 1.95,
#: 512 MiB f32 0.370 s against 0.404.
WRITEBACK_BYTES = 64 << 20

#: The first this many bytes of the runs the kernel would copy are read into the buffer and
#: written from it instead (a copy more in the process, but each page written whole):
#: ``copy_file_range`` between offsets that are not the same within a page (a safetensors
#: header moves every tensor by its length; the ZIP moves each by its own headers) is
#: slower. Whole process, 512 MiB fsynced, medians of 9 interleaved runs against the
#: kernel copy alone: 0.478 s against 0.557 (256 f32 tensors), 0.496 s against 0.620 (2,000
#: bf16 tensors). Past a size the page cache holds back ``write`` much more than a kernel
#: copy (on this machine, 0.03 s against 0.05 for 64 MiB at first, then 0.12 to 0.45), so
#: the budget is bounded, and it ends early when the writes slow down (:data:`SLOW_WRITE`).
#: 0: kernel copies only.
READ_COPY_BYTES = 512 << 20
#: Writes through the buffer stop when a window of :data:`SPEED_WINDOW_BYTES` takes this
#: many times longer per byte than the fastest window so far.
SLOW_WRITE = 2.5
SPEED_WINDOW_BYTES = 32 << 20

#: ``progress(bytes_done)`` after each block written.
Progress = Callable[[int], None]
#: ``release(offset, count)``: the process no longer needs these bytes of the source's map.
Release = Callable[[int, int], None]

_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP,
                   errno.EBADF, errno.ESPIPE, errno.ETXTBSY}


def _kick(fd: int, kicks: SimpleQueue[tuple[int, int] | None]) -> None:
    """The writeback thread: ask the kernel to write each queued range of ``fd`` to the disk
    (and drop its pages once clean) until None. A thread of its own because the request
    does the first part of the writing in the caller (on this disk, 0.25 s of a 1.5 s
    conversion of 2 GiB), and the copy can go on meanwhile: the system call releases the
    GIL."""
    while True:
        item = kicks.get()
        if item is None:
            return
        try:
            os.posix_fadvise(fd, item[0], item[1], os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):  # not a file that takes advice: fsync does it all
            pass


class Writer:
    """The output's bytes, in order: small pieces gathered into one buffer and written
    together, runs of the source file of at least :data:`KERNEL_MIN_BYTES` copied by the
    kernel (adjacent runs joined into one call; the first :data:`READ_COPY_BYTES` read into
    the buffer and written from it), anything else written as it comes."""

    def __init__(self, fd: int, src_fd: int | None, progress: Progress | None,
                 release: Release | None = None) -> None:
        self.fd = fd
        self.src_fd = src_fd
        self.progress = progress
        self.release = release
        self.done = 0  # bytes in the file
        self.flushed = 0  # bytes whose writeback has been started
        self.queued = 0  # bytes taken, some still in the buffer or the pending run
        self.kernel = [m for m in KERNEL_COPY if hasattr(os, m)] if src_fd is not None else []
        self.buf: bytearray | None = None
        self.fill = 0
        self.mapped = 0  # bytes gathered from the map since its pages were last released
        # a pending run of the source file: where it starts, its length, its views
        self.run_offset = 0
        self.run_count = 0
        self.run_views: list[memoryview] = []
        # pending reads into the buffer: from file offset read_at up to read_end, the
        # buffer's slices (and scratch blocks for the bytes between pieces) in order
        self.can_read = src_fd is not None and hasattr(os, "preadv")
        self.read_at = self.read_end = 0
        self.reads: list[memoryview] = []
        self._scratch: memoryview | None = None
        self._view: memoryview | None = None  # of buf
        self.read_budget = READ_COPY_BYTES if self.kernel and self.can_read else 0
        # the writes through the buffer: seconds per byte of the fastest window so far,
        # and the window being timed
        self.best_write = float("inf")
        self.window_time = 0.0
        self.window_bytes = 0
        # the writeback thread (started with the first request) and its requests
        self._kicks: SimpleQueue[tuple[int, int] | None] | None = None
        self._kicker: Thread | None = None

    def _advance(self, n: int) -> None:
        self.done += n
        if WRITEBACK_BYTES and self.done - self.flushed >= WRITEBACK_BYTES:
            self._start_writeback()
        if self.progress is not None:
            self.progress(self.done)

    def _start_writeback(self) -> None:
        if self._kicks is None:
            from queue import SimpleQueue
            from threading import Thread
            self._kicks = SimpleQueue()
            self._kicker = Thread(target=_kick, args=(self.fd, self._kicks),
                                  name="torchless-writeback", daemon=True)
            self._kicker.start()
        self._kicks.put((self.flushed, self.done - self.flushed))
        self.flushed = self.done

    def close(self) -> None:
        """Wait for the writeback requests still queued: call it before the file is closed,
        whatever happened (a request on a closed descriptor fails harmlessly, but on one the
        process has opened again it would advise another file)."""
        if self._kicks is not None and self._kicker is not None:
            self._kicks.put(None)
            self._kicker.join()
            self._kicks = self._kicker = None

    def _write_all(self, view: memoryview) -> None:
        while view:
            n = os.write(self.fd, view[:_chunks.CHUNK_BYTES])
            view = view[n:]
            self._advance(n)

    def flush(self) -> None:
        """Write out the pending run and the gathered bytes."""
        self._flush_run()
        self._flush_buffer()
        self._release_gathered()

    def _flush_buffer(self) -> None:
        if self.reads:
            self._read_pending()
        if self.fill:
            assert self.buf is not None
            self._write_all(memoryview(self.buf)[:self.fill])
            self.fill = 0

    def _release_gathered(self) -> None:
        """Hand back the map's pages read while gathering: they are in the buffer now. Their
        offsets are not tracked (small pieces need no file offset), so all of the map's."""
        if self.mapped and self.release is not None:
            self.release(0, 1 << 62)
        self.mapped = 0

    def _gather(self, view: memoryview, from_map: bool) -> None:
        n = len(view)
        if self.buf is None:
            self.buf = bytearray(GATHER_BYTES)
        if self.fill + n > GATHER_BYTES:
            self._flush_buffer()
        self.buf[self.fill:self.fill + n] = view
        self.fill += n
        if from_map:
            self.mapped += n
            if self.mapped >= RELEASE_BYTES:
                self._release_gathered()

    def _buffer_view(self) -> memoryview:
        """A view of the buffer (made with it, once) that reads go into in place."""
        if self._view is None:
            if self.buf is None:
                self.buf = bytearray(GATHER_BYTES)
            self._view = memoryview(self.buf)
        return self._view

    def read(self, offset: int, count: int) -> None:
        """Bytes ``offset`` to ``offset + count`` of the file behind ``src_fd`` (at most
        :data:`GATHER_BYTES`; only when :attr:`can_read`), read into the buffer in place,
        with the pieces before it that follow it in the file in one ``preadv``."""
        if count > GATHER_BYTES or not self.can_read:  # pragma: no cover - a bug of ours
            raise ValueError("read() takes a piece of the buffer's size at most, of a file")
        self._flush_run()
        self.queued += count
        view = self._view if self._view is not None else self._buffer_view()  # per piece
        if self.fill + count > GATHER_BYTES:
            self._flush_buffer()
        fill = self.fill
        into = view[fill:fill + count]
        self.fill = fill + count
        reads = self.reads
        gap = offset - self.read_end
        if reads and 0 <= gap <= READ_GAP_BYTES and len(reads) + 2 <= _IOV_MAX:
            if gap:
                if self._scratch is None or len(self._scratch) < gap:
                    self._scratch = memoryview(bytearray(READ_GAP_BYTES))
                reads.append(self._scratch[:gap])
            reads.append(into)
        else:
            if reads:
                self._read_pending()
            self.reads = [into]
            self.read_at = offset
        self.read_end = offset + count

    def _read_pending(self) -> None:
        """Fill the buffer's slices the pending reads stand for (a short read is retried
        from where it stopped; the file ending first is an error)."""
        reads, at = self.reads, self.read_at
        self.reads = []
        assert self.src_fd is not None
        left = self.read_end - at
        while True:
            got = os.preadv(self.src_fd, reads, at)
            if got >= left:
                return
            if got <= 0:
                raise ConversionError("the source file ended early (changed while "
                                      "converting?)")
            at += got
            left -= got
            i = 0
            while got >= len(reads[i]):
                got -= len(reads[i])
                i += 1
            reads = [reads[i][got:], *reads[i + 1:]]

    def write(self, data: bytes | memoryview) -> None:
        """Bytes that are not a range of the source file (the header, converted blocks)."""
        self._flush_run()
        view = memoryview(data).cast("B")
        self.queued += len(view)
        if len(view) < KERNEL_MIN_BYTES:
            self._gather(view, False)
        else:
            self._flush_buffer()
            self._write_all(view)

    def copy(self, offset: int | None, mapped: memoryview) -> None:
        """``mapped``, a view of the source's map that is also bytes ``offset`` (if known)
        of the file behind ``src_fd``."""
        count = len(mapped)
        self.queued += count
        if offset is None or count < KERNEL_MIN_BYTES:
            self._flush_run()
            if count < GATHER_BYTES:
                self._gather(mapped, True)
            else:
                self._flush_buffer()
                self._write_mapped(None, mapped)
            return
        if self.run_count and self.run_offset + self.run_count == offset:
            self.run_count += count
            self.run_views.append(mapped)
            return
        self._flush_run()
        self.run_offset, self.run_count, self.run_views = offset, count, [mapped]

    def _flush_run(self) -> None:
        if not self.run_count:
            return
        offset, count, views = self.run_offset, self.run_count, self.run_views
        self.run_count, self.run_views = 0, []
        self._flush_buffer()
        copied = self._read_copy(offset, count) if self.read_budget else 0
        if copied < count:
            copied += self._kernel_copy(offset + copied, count - copied)
        pos = 0
        for view in views:  # what the kernel did not copy, from the map
            n = len(view)
            if pos + n > copied:
                skip = max(0, copied - pos)
                self._write_mapped(offset + pos + skip, view[skip:])
            pos += n

    def _read_copy(self, offset: int, count: int) -> int:
        """Copy up to ``count`` bytes at ``offset`` through the buffer, ``preadv`` then
        ``write``, while :attr:`read_budget` lasts; returns how many were copied. Each
        :data:`SPEED_WINDOW_BYTES` the writes' speed is compared with the best window's: once
        the kernel holds them back (more than :data:`SLOW_WRITE` times slower), the budget
        ends and the kernel copies the rest."""
        assert self.src_fd is not None  # a budget only with a file to read (__init__)
        view, fd, src = self._buffer_view(), self.fd, self.src_fd
        copied = 0
        while copied < count and self.read_budget > 0:
            n = min(count - copied, len(view), self.read_budget)
            got = os.preadv(src, [view[:n]], offset + copied)
            if got <= 0:
                raise ConversionError("the source file ended early (changed while "
                                      "converting?)")
            copied += got
            self.read_budget -= got
            done = 0
            while done < got:
                start = _clock()
                n = os.write(fd, view[done:got])
                self.window_time += _clock() - start
                done += n
                self._advance(n)
            self.window_bytes += got
            if self.window_bytes >= SPEED_WINDOW_BYTES:
                took = self.window_time / self.window_bytes
                self.window_time, self.window_bytes = 0.0, 0
                if took > SLOW_WRITE * self.best_write:
                    self.read_budget = 0
                self.best_write = min(self.best_write, took)
        return copied

    def _kernel_copy(self, offset: int, count: int) -> int:
        """Copy ``count`` bytes at ``offset`` with the first kernel method that works;
        returns how many were copied (fewer if none works here)."""
        copied = 0
        while self.kernel and self.src_fd is not None and copied < count:
            method = self.kernel[0]
            n = min(count - copied, 1 << 30)
            try:
                if method == "copy_file_range":
                    got = os.copy_file_range(self.src_fd, self.fd, n, offset + copied)
                else:
                    got = os.sendfile(self.fd, self.src_fd, offset + copied, n)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                self.kernel.pop(0)
                continue
            if got == 0:
                raise ConversionError("the source file ended early (changed while "
                                      "converting?)")
            copied += got
            self._advance(got)
        return copied

    def _write_mapped(self, offset: int | None, mapped: memoryview) -> None:
        """Write a view of the map in blocks, releasing its pages behind (all of the map's
        pages when ``offset``, where the view lies in the file, is not known)."""
        end = len(mapped)
        released = pos = 0
        while pos < end:
            n = os.write(self.fd, mapped[pos:min(end, pos + COPY_BLOCK_BYTES)])
            pos += n
            self._advance(n)
            if self.release is not None and (pos - released >= RELEASE_BYTES or pos == end):
                if offset is None:
                    self.release(0, 1 << 62)
                else:
                    self.release(offset + released, pos - released)
                released = pos
