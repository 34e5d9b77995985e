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
    ├── LimitError                         a Limits field exceeded (which, limit, actual)
    ├── UnsupportedError                   valid but refused: sparse, quantized, encrypted …
    └── ConversionError(…, ValueError)     the output cannot be written as asked
        └── InvalidKeyError                a tensor name safetensors cannot hold

Errors raised deep inside a layer do not know the file they came from; the
layer that opened the file fills in ``path`` (and ``member``) on the way out.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousArchiveError",
    "ArchiveFormatError",
    "CheckpointError",
    "ChecksumError",
    "ConversionError",
    "FormatError",
    "InvalidKeyError",
    "LimitError",
    "NotACheckpointError",
    "PickleError",
    "StorageError",
    "TensorGeometryError",
    "TruncatedInputError",
    "UnsafeGlobalError",
    "UnsafePathError",
    "UnsupportedError",
    "UnsupportedOpcodeError",
]


class CheckpointError(Exception):
    """Base of every torchless error.

    ``message`` says what was wrong; ``path``, ``member`` (an archive member or
    a tensor name) and ``offset`` (a byte offset inside the member or file)
    say where, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.member = member
        self.offset = offset

    def add_context(
        self, *, path: str | None = None, member: str | None = None
    ) -> CheckpointError:
        """Fill in where the error happened, keeping what is already known."""
        if self.path is None and path is not None:
            self.path = path
        if self.member is None and member is not None:
            self.member = member
        return self

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


class FormatError(CheckpointError, ValueError):
    """The bytes are not a checkpoint, or the container is corrupt or inconsistent."""


class TruncatedInputError(FormatError):
    """The input ends before a length it declares."""


class NotACheckpointError(FormatError):
    """The input is some other kind of file; the message says what it looks like."""


class ArchiveFormatError(FormatError):
    """A ZIP, TAR or legacy container is structurally invalid."""


class AmbiguousArchiveError(ArchiveFormatError):
    """Two reasonable parsers would read different content from this archive."""


class ChecksumError(ArchiveFormatError):
    """The CRC-32 of an archive member does not match its bytes."""


class UnsafePathError(ArchiveFormatError):
    """A member name or storage key is absolute, climbs out with '..', or is a link."""


class StorageError(FormatError):
    """A storage record disagrees with what references it."""


class TensorGeometryError(FormatError):
    """A tensor's size, stride or offset is invalid or reaches outside its storage."""


class PickleError(CheckpointError, ValueError):
    """The pickle opcode stream is malformed."""


class UnsupportedOpcodeError(PickleError):
    """An opcode torchless never accepts (unknown byte, text PERSID, out-of-band buffer)."""


class UnsafeGlobalError(CheckpointError):
    """The file references a callable that only an attack would put there.

    ``names`` lists the offending ``module.name`` strings.
    """

    def __init__(
        self,
        message: str,
        *,
        names: tuple[str, ...] = (),
        path: str | None = None,
        member: str | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message, path=path, member=member, offset=offset)
        self.names = names


class LimitError(CheckpointError):
    """A resource limit was exceeded; ``limit_name``, ``limit`` and ``actual`` say which."""

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
    ) -> None:
        detail = f" ({what})" if what else ""
        super().__init__(
            f"limit {limit_name}={limit} exceeded: {actual}{detail}; "
            f"raise it with Limits({limit_name}=...) if the file is trusted",
            path=path,
            member=member,
            offset=offset,
        )
        self.limit_name = limit_name
        self.limit = limit
        self.actual = actual


class UnsupportedError(CheckpointError):
    """Valid input that torchless refuses: sparse, quantized, nested tensors, encryption …"""


class ConversionError(CheckpointError, ValueError):
    """The output cannot be written as asked."""


class InvalidKeyError(ConversionError):
    """A tensor name cannot be stored in the output format."""
