"""A TAR archive's regular members, read without :mod:`tarfile`, for reading and scanning.

One parser in two modes (:mod:`torchless.core.findings`): strict for the reader, which
refuses the archive at its first problem, and report for the scanner, which records each
problem and goes on as far as the headers can be followed. Names are read as ``tarfile``
(what torch's pre-0.1.10 loader used) reads them: a PAX ``path`` record, else a GNU long
name, else the ustar prefix and name. Links are refused (nothing is ever extracted); every
header checksum and size is checked against the file; duplicates, path tricks and data
after the end-of-archive blocks are refused. A member of an unknown type is refused by the
reader; the scanner, like ``tarfile``, reads it as a regular file.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchless.core.findings import Anomaly, Findings, Mode
from torchless.core.limits import Limits
from torchless.errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    CheckpointError,
    LimitError,
    TruncatedInputError,
    UnsafePathError,
)
from torchless.io.source import Source

__all__ = ["TarArchive", "TarMember"]

_BLOCK = 512
_REGULAR = (b"0", b"\x00", b"7")


@dataclass
class TarMember:
    name: str
    offset: int
    size: int


def _octal(field: bytes, what: str, offset: int) -> tuple[int, CheckpointError | None]:
    """A numeric header field (octal text, or base-256 when its top bit is set)."""
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            return -1, ArchiveFormatError(f"TAR header {what} field is negative", offset=offset)
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big"), None
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0, None
    if not all(0x30 <= c <= 0x37 for c in text):
        return -1, ArchiveFormatError(f"TAR header {what} field is not octal: {text[:12]!r}",
                                      offset=offset)
    return int(text, 8), None


def _unsafe(name: str) -> UnsafePathError | None:
    if "\x00" in name or "\\" in name or name.startswith("/") or \
            any(p == ".." for p in name.split("/")):
        return UnsafePathError(f"TAR member name {name[:80]!r} is not a plain relative path")
    return None


def _pax_path(body: bytes, pos: int) -> tuple[str | None, CheckpointError | None]:
    """The ``path`` record of a PAX extended header, and what is malformed in it."""
    name = None
    i = 0
    while i < len(body):
        space = body.find(b" ", i, i + 20)
        if space < 0 or not body[i:space].isdigit():
            return name, ArchiveFormatError("malformed PAX header record", offset=pos)
        length = int(body[i:space])
        if length <= space - i or i + length > len(body):
            return name, ArchiveFormatError("PAX header record length out of range", offset=pos)
        key, _, value = body[space + 1:i + length - 1].partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "replace")
        i += length
    return name, None


class TarArchive:
    """The regular members of a TAR file, validated (strict) or described (report)."""

    def __init__(self, source: Source, limits: Limits, *, mode: Mode = "strict") -> None:
        self.source = source
        self.findings = Findings(mode)
        #: Regular members by name (the first of each name).
        self.members: dict[str, TarMember] = {}
        #: Report mode: the members whose name an earlier member already has.
        self.duplicates: list[TarMember] = []
        self._read(limits)

    @property
    def anomalies(self) -> list[Anomaly]:
        return self.findings.anomalies

    def _read(self, limits: Limits) -> None:
        source, f = self.source, self.findings
        pos = 0
        long_name: str | None = None
        pax_name: str | None = None
        while True:
            if pos + _BLOCK > source.size:
                f("tar", TruncatedInputError(
                    "TAR archive ends without its end-of-archive blocks", offset=pos))
                return
            header = source.read(pos, _BLOCK, "TAR header")
            if header == b"\x00" * _BLOCK:
                self._check_tail(pos + _BLOCK)
                return
            stored, problem = _octal(header[148:156], "checksum", pos)
            if problem is not None:
                f("tar", problem)
            elif stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
                f("tar", ArchiveFormatError("TAR header checksum does not match", offset=pos))
            size, problem = _octal(header[124:136], "size", pos)
            data = pos + _BLOCK
            if problem is None and data + size > source.size:
                problem = TruncatedInputError(
                    f"TAR member declares {size} bytes, the file has {source.size - data}",
                    offset=pos)
            if problem is not None:
                f("tar", problem, report=f"{problem.message}; the rest of the archive cannot "
                                         "be followed")
                return
            kind = header[156:157]
            raw_name = header[:100].split(b"\x00", 1)[0]
            if header[257:262] == b"ustar" and header[345:346] != b"\x00":
                raw_name = header[345:500].split(b"\x00", 1)[0] + b"/" + raw_name
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                name = raw_name.decode("utf-8", "backslashreplace")
                f("name", ArchiveFormatError("TAR member name is not UTF-8", offset=pos), name)
            if kind == b"L":
                long_name = source.read(data, size, "GNU long name").split(b"\x00", 1)[0] \
                    .decode("utf-8", "replace")
            elif kind in (b"x", b"g"):
                found, problem = _pax_path(source.read(data, size, "PAX header"), pos)
                if problem is not None:
                    f("tar", problem)
                if kind == b"x":
                    pax_name = found
            elif kind in (b"1", b"2"):
                f("link", UnsafePathError(f"TAR member {name!r} is a link"), name, pos)
            else:
                if kind not in _REGULAR and kind != b"5":
                    f("tar", ArchiveFormatError(
                        f"TAR member {name!r} has unsupported type {kind!r}"), name, pos)
                name = pax_name if pax_name is not None else \
                    long_name if long_name is not None else name
                pax_name = long_name = None
                unsafe = _unsafe(name)
                if unsafe is not None:
                    f("name", unsafe, name, pos)
                if kind != b"5" and not self._add(TarMember(name, data, size), limits, pos):
                    return
            pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK

    def _add(self, member: TarMember, limits: Limits, pos: int) -> bool:
        """Keep a regular member; False when no more may be listed."""
        if member.name in self.members:
            self.findings("duplicate", AmbiguousArchiveError(
                f"duplicate TAR member {member.name!r}"), member.name, pos)
            self.duplicates.append(member)
            return True
        if len(self.members) >= limits.max_archive_entries:
            self.findings("limit", LimitError("max_archive_entries", limits.max_archive_entries,
                                              len(self.members) + 1))
            return False
        self.members[member.name] = member
        return True

    def _check_tail(self, pos: int) -> None:
        """After the end-of-archive block only zero padding may follow."""
        chunk = 1 << 20
        while pos < self.source.size:
            n = min(chunk, self.source.size - pos)
            if self.source.read(pos, n, "TAR padding").count(0) != n:
                self.findings("trailing", ArchiveFormatError(
                    "data after the end of the TAR archive", offset=pos))
                return
            pos += n
