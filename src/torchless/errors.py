"""The exception tree. Every failure torchless reports is one of these.

::

    CheckpointError                        base; carries path, member, offset where known
    ├── FormatError(…, ValueError)         not a checkpoint, corrupt or inconsistent container
    │   ├── TruncatedInputError            the input ends before a declared length
    │   ├── NotACheckpointError            the bytes are some other format (says which)
    │   ├── ArchiveFormatError             structurally invalid ZIP/TAR/legacy container
    │   │   ├── AmbiguousArchiveError      two parsers could read different content
    │   │   ├── ChecksumError              CRC-32 of a member does not match
    │   │   └── UnsafePathError            member name or storage key that is a path trick
    │   ├── StorageError                   persistent id / storage record inconsistent
    │   └── TensorGeometryError            size/stride/offset outside the storage
    ├── PickleError(…, ValueError)         malformed opcode stream (offset, opcode)
    │   └── UnsupportedOpcodeError         an opcode we never accept (unknown, PERSID text …)
    ├── UnsafeGlobalError                  the file names a callable only an attack would use
    ├── MissingFileError(…, FileNotFoundError)  no file at the path (torch.load and
    │                                      safetensors raise FileNotFoundError there too)
    ├── LimitError                         a Limits field exceeded (which, limit, actual)
    ├── UnsupportedError                   valid but refused: sparse, quantized, encrypted …
    ├── ConversionError(…, ValueError)     the output cannot be written as asked
    │   └── InvalidKeyError                a tensor name safetensors cannot hold
    └── InternalError(…, RuntimeError)     a bug in torchless, no verdict on the file

Errors raised deep inside a layer do not know the file they came from; the
layer that opened the file fills in ``path`` (and ``member``) on the way out.

Every class but :class:`InternalError` is a refusal: torchless looked at the input (or
the output asked for) and will not go on. :class:`InternalError` is the one exception
torchless did not expect, raised where a public entry point meets anything that is not one
of its own errors (``raise InternalError… from e`` keeps the original and its traceback).
It stays inside the tree, so ``except CheckpointError`` still never lets a torchless bug
crash a program that reads untrusted files; but it is not a ``FormatError`` or a
``ValueError``, its hint asks for a bug report instead of blaming the file, and ``batch``
and the command line report it apart from refusals.

Every error also carries a ``hint``: what the user can do about it. Each class has a
default; a raise site that knows more passes ``hint=``. ``str(e)`` is the location and
the message; the command line prints the hint on a second line, JSON outputs carry it as
``"hint"``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable, Iterator
from types import CodeType, FrameType, FunctionType
from typing import Any, ParamSpec, TypeVar, cast

__all__ = [
    "AmbiguousArchiveError",
    "ArchiveFormatError",
    "CheckpointError",
    "ChecksumError",
    "ConversionError",
    "FormatError",
    "InternalError",
    "InvalidKeyError",
    "LimitError",
    "MissingFileError",
    "NotACheckpointError",
    "PickleError",
    "StorageError",
    "TensorGeometryError",
    "TruncatedInputError",
    "UnsafeGlobalError",
    "UnsafePathError",
    "UnsupportedError",
    "UnsupportedOpcodeError",
    "error_boundary",
    "reports_bugs",
]


class CheckpointError(Exception):
    """Base of every torchless error.

    ``message`` says what was wrong; ``path``, ``member`` (an archive member or
    a tensor name) and ``offset`` (a byte offset inside the member or file)
    say where, when known; ``hint`` says what the user can do.
    """

    #: What the user can do; each subclass has its own, a raise site may pass a better one.
    hint: str = ("check that the path names a PyTorch checkpoint you can read; "
                 "`torchless scan FILE` shows what a file holds without running it")

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.member = member
        self.offset = offset
        if hint is not None:
            self.hint = hint

    def add_context(
        self, *, path: str | None = None, member: str | None = None
    ) -> CheckpointError:
        """Fill in where the error happened, keeping what is already known."""
        if self.path is None and path is not None:
            self.path = path
        if self.member is None and member is not None:
            self.member = member
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # the default rebuilds with cls(*args), which subclasses with other signatures
        # (LimitError) cannot take; rebuild from the attributes instead, hint included
        return _rebuild, (type(self), self.args, dict(self.__dict__))

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.member is not None:
            where.append(self.member)
        loc = ": ".join(where)
        if self.offset is not None:
            loc = f"{loc} at byte {self.offset}" if loc else f"at byte {self.offset}"
        return f"{loc}: {self.message}" if loc else self.message


def _rebuild(cls: type[CheckpointError], args: tuple[Any, ...],
             state: dict[str, Any]) -> CheckpointError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class FormatError(CheckpointError, ValueError):
    """The bytes are not a checkpoint, or the container is corrupt or inconsistent."""

    hint = (
        "the file is damaged or is not a PyTorch checkpoint: download or copy it again "
        "from its source; `torchless scan FILE` shows what it holds")


class TruncatedInputError(FormatError):
    """The input ends before a length it declares."""

    hint = (
        "the file is cut short (an interrupted download or copy?): fetch it again and "
        "compare its size with the original")


class NotACheckpointError(FormatError):
    """The input is some other kind of file; the message says what it looks like."""

    hint = (
        "this file is not a PyTorch checkpoint: open it with the tool for the format "
        "named above, or check that you passed the right file")


class ArchiveFormatError(FormatError):
    """A ZIP, TAR or legacy container is structurally invalid."""

    hint = (
        "the archive is damaged or was re-packed by a tool that breaks torch's layout: "
        "get the original file again")


class AmbiguousArchiveError(ArchiveFormatError):
    """Two reasonable parsers would read different content from this archive."""

    hint = (
        "different tools would read different content from this file: damage, or a "
        "trick used to hide a payload from scanners; do not torch.load it, get the file "
        "again from a source you trust")


class ChecksumError(ArchiveFormatError):
    """The CRC-32 of an archive member does not match its bytes."""

    hint = (
        "the member's bytes changed after the archive was written (damage or tampering): "
        "download the file again")


class UnsafePathError(ArchiveFormatError):
    """A member name or storage key is absolute, climbs out with '..', or is a link."""

    hint = (
        "the archive names a path outside itself or a link, a path-traversal trick: do "
        "not unpack or torch.load it")


class StorageError(FormatError):
    """A storage record disagrees with what references it."""

    hint = (
        "the tensor data does not match what the file declares (a damaged or hand-made "
        "file): get the file again from its source")


class TensorGeometryError(FormatError):
    """A tensor's size, stride or offset is invalid or reaches outside its storage."""

    hint = (
        "a tensor's shape, stride or offset does not fit its data (a damaged or hand-made "
        "file): get the file again from its source")


class PickleError(CheckpointError, ValueError):
    """The pickle opcode stream is malformed."""

    hint = (
        "the pickle inside the file is damaged or hand-made: get the file again from its "
        "source; `torchless scan FILE` lists what it references")


class UnsupportedOpcodeError(PickleError):
    """An opcode torchless never accepts (unknown byte, text PERSID, out-of-band buffer)."""

    hint = (
        "torch.save never writes this pickle opcode: the file was made by another tool or "
        "by hand; do not torch.load it unless you trust its source")


class UnsafeGlobalError(CheckpointError):
    """The file references a callable that only an attack would put there.

    ``names`` lists the offending ``module.name`` strings.
    """

    hint = (
        "do not torch.load this file: loading it would run the code it names. If you "
        "trust it and need its contents, torchless.open(FILE, allow_globals=['module.name']) "
        "or --allow-global module.name (inspect, convert, verify) keeps the name as an inert "
        "record")

    def __init__(
        self,
        message: str,
        *,
        names: tuple[str, ...] = (),
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, path=path, member=member, offset=offset, hint=hint)
        self.names = names


class MissingFileError(CheckpointError, FileNotFoundError):
    """No file at the path: a ``FileNotFoundError`` too (``errno`` ENOENT, ``filename``
    the path), as ``open``, ``torch.load`` and ``safetensors.safe_open`` raise."""

    hint = ("no file at this path: check the path (a relative path starts from the current "
            "directory)")

    def __init__(self, message: str, *, path: str | None = None, member: str | None = None,
                 offset: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, path=path, member=member, offset=offset, hint=hint)
        self.errno = errno.ENOENT
        self.strerror = os.strerror(errno.ENOENT)
        self.filename = path

    def __reduce__(self) -> tuple[Any, ...]:  # errno and filename are not in __dict__
        return _rebuild_missing, (self.args, dict(self.__dict__), self.filename)


def _rebuild_missing(args: tuple[Any, ...], state: dict[str, Any],
                     filename: str | None) -> MissingFileError:
    err = _rebuild(MissingFileError, args, state)
    assert isinstance(err, MissingFileError)
    err.errno = errno.ENOENT
    err.strerror = os.strerror(errno.ENOENT)
    err.filename = filename
    return err


class LimitError(CheckpointError):
    """A resource limit was exceeded; ``limit_name``, ``limit`` and ``actual`` say which."""

    hint = (
        "if you trust the file, raise the limit: Limits(name=...) in Python, --limit "
        "name=N on the command line")

    def __init__(
        self,
        limit_name: str,
        limit: int,
        actual: int,
        what: str = "",
        *,
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        detail = f" ({what})" if what else ""
        if not limit_name.startswith("max_"):  # not a Limits field: memory ran out
            message = what or f"{limit_name} exhausted"
            hint = hint or ("a file can declare sizes far beyond its own: if you trust this "
                            "one, read it on a machine with more free memory")
        else:
            got = f": {actual}" if actual >= 0 else ""  # -1: the count is not known
            message = (f"limit {limit_name}={limit} exceeded{got}{detail}; "
                       f"raise it with Limits({limit_name}=...) if the file is trusted")
            if hint is None:  # counts stop where they cross the limit: ``actual`` is a floor
                need = f"at least {actual}" if actual > limit else f"above {limit}"
                hint = (f"if you trust the file, raise the limit: Limits({limit_name}=N) in "
                        f"Python, --limit {limit_name}=N on the command line, N {need}")
        super().__init__(message, path=path, member=member, offset=offset, hint=hint)
        self.limit_name = limit_name
        self.limit = limit
        self.actual = actual


class UnsupportedError(CheckpointError):
    """Valid input that torchless refuses: sparse, quantized, nested tensors, encryption …"""

    hint = (
        "the file is valid but holds something torchless cannot read; the other tensors "
        "still read (Checkpoint.tensors), and convert leaves the unreadable ones out with "
        "--skip-unsupported / skip_unsupported=True")


class ConversionError(CheckpointError, ValueError):
    """The output cannot be written as asked."""

    hint = (
        "the output cannot be written as asked: check the output path, its directory and "
        "the options given")


class InvalidKeyError(ConversionError):
    """A tensor name cannot be stored in the output format."""

    hint = (
        "safetensors cannot hold this tensor name: rename that key in the source "
        "checkpoint, or convert only a subtree without it (--key K / key=...)")


#: Where bugs are reported.
ISSUES_URL = "https://github.com/torchless/torchless/issues"


class InternalError(CheckpointError, RuntimeError):
    """A bug in torchless: an exception it did not expect, met while it worked on a file.

    Not a refusal: the file may be fine. ``cause`` names the original exception's type;
    the exception itself is ``__cause__``.
    """

    hint = ("this is a bug in torchless, not a verdict on the file: please report it at "
            f"{ISSUES_URL} with the command, the traceback and, if you can share it, the file")

    def __init__(self, message: str, *, cause: str = "", path: str | None = None,
                 member: str | None = None, offset: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, path=path, member=member, offset=offset, hint=hint)
        self.cause = cause

    @classmethod
    def wrap(cls, error: BaseException, doing: str, path: str | None = None) -> InternalError:
        """The error to raise ``from error``: ``internal error while DOING (Type: text)``."""
        name = type(error).__name__
        return cls(f"internal error while {doing} ({name}: {error}); this is a torchless bug",
                   cause=name, path=path)


_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def error_boundary(doing: str, path: str | None = None, *, max_depth: int = -1,
                   lets_through: Callable[[BaseException], bool] | None = None
                   ) -> Iterator[None]:
    """The one place where what leaves a public entry point becomes one of our errors.

    Every entry point (``open``, ``load``, ``convert``, ``verify``, ``scan`` of one file, a
    command) runs inside it, so each failure reaches the caller the same way:

    * our own errors pass, with ``path`` filled in where they did not know it;
    * ``RecursionError`` is the ``max_depth`` limit (``max_depth``: its value, if known) and
      ``MemoryError`` the ``memory`` limit: :class:`LimitError`;
    * ``OSError`` is the system failing us (an I/O error, a file gone), not the file's
      content: a :class:`CheckpointError` saying so;
    * anything else is a bug of ours: :class:`InternalError`, the original as its cause.

    ``lets_through(e)``: an exception the entry point raises on purpose (its own argument
    checks), passed on untouched. ``KeyboardInterrupt`` and ``SystemExit`` always pass."""
    try:
        yield
    except CheckpointError as e:
        e.add_context(path=path)
        raise  # as it is: its cause (an InternalError's original error) stays
    except Exception as e:
        if lets_through is not None and lets_through(e):
            raise
        if isinstance(e, RecursionError):
            raise LimitError("max_depth", max_depth, -1, f"recursion while {doing}",
                             path=path) from e
        if isinstance(e, MemoryError):
            raise LimitError("memory", 0, 0, f"out of memory while {doing}", path=path,
                             hint="close other programs, or work on a machine with more "
                                  "memory") from e
        if isinstance(e, OSError):
            verb = doing.split()[0]
            raise CheckpointError(f"{_SYSTEM_VERBS.get(verb, 'failed while ' + doing)}: "
                                  f"{e.strerror or e}", path=path) from e
        raise InternalError.wrap(e, doing, path) from e


#: What a system error stopped, by the entry point's verb ("cannot read: Input/output error").
_SYSTEM_VERBS = {"reading": "cannot read", "loading": "cannot read", "scanning": "cannot read",
                 "converting": "cannot convert", "verifying": "cannot verify"}


def reports_bugs(doing: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A public entry point run inside :func:`error_boundary` (naming the file of its first
    argument), which lets through the ``ValueError``/``TypeError`` the entry point raises
    itself, not those of what it calls (its argument checks, a call with wrong arguments)."""

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        own = cast(FunctionType, fn).__code__

        def own_check(e: BaseException) -> bool:
            return isinstance(e, (ValueError, TypeError)) and _raised_by(e, own)

        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with error_boundary(doing, _label(args), lets_through=own_check):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def _raised_by(error: BaseException, code: CodeType) -> bool:
    """Whether ``error`` came from the frame running ``code``, or from calling it (bad
    arguments)."""
    frames: list[FrameType] = []  # traceback.walk_tb, without importing traceback at start-up
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != __file__:  # not the wrapper's or the boundary's
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    if not frames:  # raised in calling it: bad arguments
        return True
    return frames[-1].f_code is code


def _label(args: tuple[Any, ...]) -> str | None:
    first = args[0] if args else None
    if isinstance(first, str):
        return first
    try:
        return str(os.fspath(first)) if first is not None else None
    except TypeError:
        return None


#: For "the output file exists": what to do.
EXISTS_HINT = ("add --force (force=True) to replace it, --skip-existing (skip_existing=True) to "
               "keep it where it verifies against its source, or choose another output "
               "with -o / dst")


def type_phrase(obj: object) -> str:
    """``a str``, ``an int``: the type of a value as a message names it."""
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
