"""Atomic output: a file appears whole under its name, or not at all; nothing is replaced
without ``force``; a failed run leaves every existing file as it was.

Every writer (a safetensors file, the shards and index of a Hugging Face layout, an inert
``save``) writes into an :class:`Output` and makes it visible with :func:`commit`.

Where the bytes go while they are written, best first:

1. **Linux, on a filesystem with** ``O_TMPFILE`` (ext4, XFS, Btrfs, tmpfs …): an unnamed
   file in DST's directory. A process killed at any point before the commit, SIGKILL or
   power cut included, leaves no file of any name. It gets its name from
   ``linkat(AT_FDCWD, "/proc/self/fd/N", dirfd, name, AT_SYMLINK_FOLLOW)``, the form
   ``open(2)`` documents for unprivileged processes (``os.link`` makes that call only when
   given a ``dst_dir_fd``; without one it calls ``link()``, which does not follow the
   ``/proc`` link and fails with ``EXDEV``). ``linkat`` fails with ``EEXIST`` rather than
   replace a file. If the link fails for another reason, the bytes are copied to a named
   temporary file (2.) and published from there.
2. **Otherwise** (macOS, no ``/proc``, a filesystem without ``O_TMPFILE``): a hidden
   temporary file ``.NAME.<random>.tmp`` beside DST, removed on any error or Ctrl-C, left
   behind only by SIGKILL or a power cut. Published with ``link(tmp, DST)``, which fails
   with ``EEXIST`` rather than replace a file.
3. **No hard links either** (FAT, exFAT, some network and FUSE filesystems): DST is first
   created empty with ``O_CREAT | O_EXCL`` (a reservation: it fails if any file is there),
   then the temporary file is renamed over it if DST is still that same reservation. Two
   windows remain: a reader can see the empty reservation for a moment, and a program that
   itself *renames* a file onto DST between that check and the rename loses its file. No
   program creating DST exclusively can lose one.

With ``force`` one file is published by ``rename`` over DST, atomic for readers: (1.) first
links the unnamed file to ``.NAME.<random>.tmp``, and a process killed between that link and
the rename leaves that name behind (the one window of (1.)).

Several files (shards and their index) are committed together: all are written (and
verified) first, then published in order; with ``force`` the files they replace are first
moved aside to ``.NAME.<random>.old``, the last output (the index naming the others) first,
so no reader ever sees an index naming a missing or half-replaced shard: it sees the old
set, then no index, then the new set. If any publication fails, the new files are removed
and the old ones moved back; after success the old ones are deleted. A process killed
during those few renames can leave ``.old`` files (the previous output) behind.

Each file is fsynced before it is published, and its directory after. An output directory
a run creates (:func:`make_dirs`) is removed again when the run fails before it publishes
anything. A full disk (``ENOSPC``, a quota's ``EDQUOT``) is reported with the bytes the
output needs and those free for it (:meth:`Output.error`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from types import TracebackType

from torchless.errors import EXISTS_HINT, ConversionError

__all__ = ["TMPFILE", "Output", "commit", "make_dirs", "remove_dirs"]

#: Write through an unnamed ``O_TMPFILE`` file where the platform has one (tests turn it off
#: to exercise the named-temporary path).
TMPFILE = sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_COPY_BLOCK = 1 << 20


def _token() -> str:
    """A random part for a temporary name (``secrets`` would cost its imports, ``hashlib``
    and ``random``, at every start)."""
    return os.urandom(6).hex()


def refuse_directory(dst: str) -> None:
    """An output file's path that names a directory is refused (``force`` never replaces
    one)."""
    if os.path.isdir(dst):
        raise ConversionError("the output path is a directory", path=dst,
                              hint="name the output file, e.g. -o DIR/model.safetensors "
                                   "(dst=...)")


def _exists_error(dst: str) -> ConversionError:
    return ConversionError("the output file exists (use force=True / --force to replace it)",
                           path=dst, hint=EXISTS_HINT)


def _os_error(e: OSError, dst: str, doing: str = "write") -> ConversionError:
    return ConversionError(f"cannot {doing}: {e.strerror or e}", path=dst)


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _free_bytes(directory: str) -> int | None:
    """The bytes an unprivileged process may still write in ``directory``'s filesystem."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):  # no statvfs (Windows), or the directory went away
        return None
    return st.f_bavail * st.f_frsize


class Output:
    """One file being written to ``fd``, invisible under ``dst`` until :func:`commit`.

    Refuses at once a ``dst`` that is a directory, or that exists without ``force`` (the
    commit checks again, race-free). :attr:`path` reads what was written, for checking it
    before it is published. As a context manager, leaving without a commit discards it."""

    def __init__(self, dst: str, *, force: bool) -> None:
        self.dst = dst
        self.directory = os.path.dirname(dst) or "."
        self.name = os.path.basename(dst)
        refuse_directory(dst)
        if not force and os.path.lexists(dst):
            raise _exists_error(dst)
        self.fd = -1
        self.temp: str | None = None  # the named temporary file, if there is one
        self.done = False
        if TMPFILE and self._open_unnamed():
            return
        self.temp, self.fd = self._open_named("tmp")

    def _open_unnamed(self) -> bool:
        try:
            fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR | _CLOEXEC, 0o666)
        except OSError:  # no O_TMPFILE here (EOPNOTSUPP, EISDIR on old kernels …)
            return False
        try:
            os.stat(f"/proc/self/fd/{fd}")  # it can only be named through /proc
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def _open_named(self, kind: str) -> tuple[str, int]:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _CLOEXEC
        for _ in range(100):
            path = os.path.join(self.directory, f".{self.name}.{_token()}.{kind}")
            try:
                return path, os.open(path, flags, 0o666)
            except FileExistsError:
                continue
            except OSError as e:
                raise ConversionError(f"cannot create a file in {self.directory!r}: "
                                      f"{e.strerror or e}", path=self.dst) from None
        raise ConversionError(f"cannot create a temporary file in {self.directory!r}",
                              path=self.dst)  # pragma: no cover

    @property
    def path(self) -> str:
        """A path that opens the bytes written so far."""
        return self.temp if self.temp is not None else f"/proc/self/fd/{self.fd}"

    def error(self, e: OSError, needed: int | None = None, held: int = 0,
              pending: int = 0) -> ConversionError:
        """The error for a failed write: for a full disk, the bytes the output needs
        (``needed``: this run's outputs together; unknown, more than this file's bytes so
        far and the ``pending`` bytes of the write that failed) and those free for it:
        free on the filesystem, plus what this file holds and the ``held`` bytes of this
        run's earlier outputs (all released when the run fails)."""
        if e.errno not in _FULL:
            return _os_error(e, self.dst)
        try:
            mine = os.fstat(self.fd)
            size = mine.st_size
            allocated = mine.st_blocks * 512 if sys.platform != "win32" else size
        except OSError:
            allocated = size = 0
        free = _free_bytes(self.directory)
        room = "" if free is None else f", {free + allocated + held:,} free"
        what = e.strerror or os.strerror(e.errno or 0)
        need = f"{needed:,}" if needed is not None else f"more than {size + pending:,}"
        return ConversionError(
            f"cannot write: {what}: the output needs {need} bytes{room} in "
            f"{self.directory!r}", path=self.dst,
            hint="free some space there, or write the output elsewhere (-o / dst=)")

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            raise self.error(e, pending=len(view)) from None

    def finish(self, needed: int | None = None, held: int = 0) -> None:
        """Flush the bytes to the disk (before anything can be published); ``needed`` and
        ``held`` are as for :meth:`error`."""
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise self.error(e, needed, held) from None

    # ---- publishing ---------------------------------------------------------------------

    def _is_ours(self) -> bool:
        """Whether ``dst`` is the file this output wrote."""
        try:
            mine, there = os.fstat(self.fd), os.lstat(self.dst)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def _publish(self, force: bool) -> None:
        """Give the file its name: replacing ``dst`` with ``force``, else never (EEXIST)."""
        if self.temp is None:
            if force:
                self._name_unnamed()  # then renamed over dst below
            else:
                dirfd = os.open(self.directory, os.O_RDONLY | _CLOEXEC)
                try:
                    os.link(f"/proc/self/fd/{self.fd}", self.name, dst_dir_fd=dirfd,
                            follow_symlinks=True)
                    return
                except FileExistsError:
                    raise
                except OSError:  # this filesystem will not link it: copy it to a name
                    self._copy_to_named()
                finally:
                    os.close(dirfd)
        assert self.temp is not None
        if force:
            os.replace(self.temp, self.dst)
            self.temp = None
            return
        try:
            os.link(self.temp, self.dst)
        except FileExistsError:
            raise
        except OSError:  # no hard links on this filesystem
            self._reserve_and_replace()
            return
        _unlink(self.temp)
        self.temp = None

    def _name_unnamed(self) -> None:
        dirfd = os.open(self.directory, os.O_RDONLY | _CLOEXEC)
        try:
            for _ in range(100):
                name = f".{self.name}.{_token()}.tmp"
                try:
                    os.link(f"/proc/self/fd/{self.fd}", name, dst_dir_fd=dirfd,
                            follow_symlinks=True)
                except FileExistsError:
                    continue
                except OSError:
                    break
                self.temp = os.path.join(self.directory, name)
                return
        finally:
            os.close(dirfd)
        self._copy_to_named()

    def _copy_to_named(self) -> None:
        path, fd = self._open_named("tmp")
        try:
            pos = 0
            while block := os.pread(self.fd, _COPY_BLOCK, pos):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                pos += len(block)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(self.fd)
        self.fd, self.temp = fd, path

    def _reserve_and_replace(self) -> None:
        assert self.temp is not None
        fd = os.open(self.dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
        try:
            reserved = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            there = os.lstat(self.dst)
            if (there.st_dev, there.st_ino) != (reserved.st_dev, reserved.st_ino):
                raise FileExistsError(f"{self.dst} was replaced while it was reserved")
            os.replace(self.temp, self.dst)
        except BaseException:
            with contextlib.suppress(OSError):
                there = os.lstat(self.dst)
                if (there.st_dev, there.st_ino) == (reserved.st_dev, reserved.st_ino):
                    os.unlink(self.dst)
            raise
        self.temp = None

    def _unpublish(self) -> None:
        """Remove ``dst`` if it is still the file this output published."""
        if self._is_ours():
            _unlink(self.dst)

    def close(self) -> None:
        """Release the descriptor; remove the temporary file if it was never published."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.temp is not None:
            _unlink(self.temp)
            self.temp = None

    def __enter__(self) -> Output:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def commit(outputs: Sequence[Output], *, force: bool) -> None:
    """Publish ``outputs`` in order, all or none (see the module docstring), and close them.

    Raises :class:`ConversionError` if one cannot be published (it exists and ``force`` is
    not set, or the system refuses); every existing file is then as it was."""
    try:
        if len(outputs) == 1:
            _publish_one(outputs[0], force)
        else:
            _publish_all(outputs, force)
        for directory in dict.fromkeys(out.directory for out in outputs):
            _fsync_dir(directory)
    finally:
        for out in outputs:
            out.close()


def _publish_one(out: Output, force: bool) -> None:
    try:
        out._publish(force)
    except FileExistsError:
        raise _exists_error(out.dst) from None
    except OSError as e:
        raise _os_error(e, out.dst, "publish") from None


def _publish_all(outputs: Sequence[Output], force: bool) -> None:
    aside: list[tuple[str, str]] = []  # (dst, where the old file waits)
    published: list[Output] = []
    try:
        if force:
            for out in reversed(outputs):
                if os.path.lexists(out.dst):
                    aside.append((out.dst, _move_aside(out)))
        for out in outputs:
            _publish_one(out, force=False)
            published.append(out)
    except BaseException:
        for out in reversed(published):
            out._unpublish()
        for dst, old in reversed(aside):
            with contextlib.suppress(OSError):
                os.replace(old, dst)
        raise
    for _, old in aside:
        _unlink(old)


def _move_aside(out: Output) -> str:
    for _ in range(100):
        old = os.path.join(out.directory, f".{out.name}.{_token()}.old")
        if not os.path.lexists(old):
            try:
                os.rename(out.dst, old)
            except OSError as e:
                raise _os_error(e, out.dst, "move the old file aside") from None
            return old
    raise ConversionError("cannot find a free name to move the old file aside",
                          path=out.dst)  # pragma: no cover


def make_dirs(path: str) -> list[str]:
    """Create the directory ``path`` and its missing parents; returns those created,
    deepest first (for :func:`remove_dirs` when the run fails)."""
    created: list[str] = []
    here = os.path.abspath(path)
    while not os.path.lexists(here) and here != os.path.dirname(here):
        created.append(here)
        here = os.path.dirname(here)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        remove_dirs(created)
        raise ConversionError(f"cannot create the output directory: {e.strerror or e}",
                              path=path) from None
    return created


def remove_dirs(created: Sequence[str]) -> None:
    """Remove the directories :func:`make_dirs` created, those still empty."""
    for directory in created:
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
