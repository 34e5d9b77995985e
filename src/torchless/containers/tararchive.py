"""A TAR archive's regular members, read without :mod:`tarfile`, for reading and scanning.

One parser in two modes (:mod:`torchless.core.findings`): strict for the reader, which
refuses the archive at its first problem, and report for the scanner, which records each
problem and goes on as far as the headers can be followed. Members are named as ``tarfile``
(torch's TAR loader) names them: the prefix field joined to the name field (magic or not),
then the PAX global records, then the GNU long names and PAX extended records before the
member (the first one written wins); of two members with one name ``tarfile`` reads the
last. A renaming, a PAX size other than the header's and a duplicate are parser
differentials (``pax``, ``duplicate``): a reader that applies other rules reads other bytes.
Links are refused (nothing is ever extracted); every header checksum and size is checked
against the file; path tricks and data after the end-of-archive blocks are refused. A member
of an unknown type is refused by the reader; the scanner, like ``tarfile``, reads it as a
regular file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def _pax_records(body: bytes, pos: int) -> tuple[dict[str, str], CheckpointError | None]:
    """The records of a PAX extended header, and what is malformed in them."""
    records: dict[str, str] = {}
    i = 0
    while i < len(body):
        space = body.find(b" ", i, i + 20)
        if space < 0 or not body[i:space].isdigit():
            return records, ArchiveFormatError("malformed PAX header record", offset=pos)
        length = int(body[i:space])
        if length <= space - i or i + length > len(body):
            return records, ArchiveFormatError("PAX header record length out of range",
                                               offset=pos)
        key, _, value = body[space + 1:i + length - 1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        i += length
    return records, None


#: PAX keys that change which bytes a member name stands for, as :mod:`tarfile` applies them.
_PAX_NAME = ("path", "GNU.sparse.name")
_PAX_SIZE = ("size", "GNU.sparse.size", "GNU.sparse.realsize")


def _pax_size(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def _pax_applied(records: dict[str, str], name: str, size: int) -> tuple[str, int]:
    """A member's name and size after one set of PAX records (each key in tarfile's order:
    the last one present wins)."""
    for k in _PAX_NAME:
        if k in records:
            name = records[k].rstrip("/")
    for k in _PAX_SIZE:
        if k in records:
            size = _pax_size(records[k])
    return name, size


class TarArchive:
    """The regular members of a TAR file, validated (strict) or described (report)."""

    def __init__(self, source: Source, limits: Limits, *, mode: Mode = "strict") -> None:
        self.source = source
        self.findings = Findings(mode)
        #: Regular members by name (the last of each name, which tarfile reads).
        self.members: dict[str, TarMember] = {}
        #: Report mode: the members whose name a later member has too.
        self.duplicates: list[TarMember] = []
        self._read(limits)

    @property
    def anomalies(self) -> list[Anomaly]:
        return self.findings.anomalies

    def _read(self, limits: Limits) -> None:
        source, f = self.source, self.findings
        pos = 0
        #: PAX global records (they apply to every later member, as tarfile applies them),
        #: and the GNU long names / PAX extended headers waiting for the next member.
        global_pax: dict[str, str] = {}
        wrappers: list[tuple[bytes, Any]] = []
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
            name = self._header_name(header, kind, pos)
            if kind in (b"L", b"K"):
                wrappers.append((kind, source.read(data, size, "GNU long name").split(
                    b"\x00", 1)[0].decode("utf-8", "replace")))
            elif kind in (b"x", b"X", b"g"):
                records, problem = _pax_records(source.read(data, size, "PAX header"), pos)
                if problem is not None:
                    f("tar", problem)
                if kind == b"g":
                    moved = [k for k in (*_PAX_NAME, *_PAX_SIZE) if k in records]
                    if moved:
                        f("pax", AmbiguousArchiveError(
                            f"a PAX global header sets {moved[0]!r}: tarfile (torch's TAR "
                            "loader) applies it to every later member, other readers do "
                            "not", offset=pos), offset=pos)
                    global_pax.update(records)
                else:
                    wrappers.append((kind, {**global_pax, **records}))
            elif kind in (b"1", b"2"):
                f("link", UnsafePathError(f"TAR member {name!r} is a link"), name, pos)
                wrappers = []
            else:
                if kind not in _REGULAR and kind != b"5":
                    f("tar", ArchiveFormatError(
                        f"TAR member {name!r} has unsupported type {kind!r}"), name, pos)
                name, size, step = self._renamed(name, size, global_pax, wrappers, pos)
                wrappers = []
                unsafe = _unsafe(name)
                if unsafe is not None:
                    f("name", unsafe, name, pos)
                if data + size > source.size:
                    f("tar", TruncatedInputError(
                        f"TAR member {name!r} declares {size} bytes, the file has "
                        f"{source.size - data}", offset=pos), name, pos)
                    return
                if kind != b"5" and not self._add(TarMember(name, data, size), limits, pos):
                    return
                pos = data + (step + _BLOCK - 1) // _BLOCK * _BLOCK
                continue
            pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK

    def _header_name(self, header: bytes, kind: bytes, pos: int) -> str:
        """A header's own name as tarfile reads it: the prefix field (bytes 345-500, with
        or without the ustar magic) joined to the name field, for every type but GNU's."""
        raw_name = header[:100].split(b"\x00", 1)[0]
        prefix = header[345:500].split(b"\x00", 1)[0]
        if prefix and kind not in (b"L", b"K", b"S"):
            raw_name = prefix + b"/" + raw_name
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            name = raw_name.decode("utf-8", "backslashreplace")
            self.findings("name", ArchiveFormatError("TAR member name is not UTF-8",
                                                     offset=pos), name)
        if kind == b"5" or (kind == b"\x00" and name.endswith("/")):
            name = name.rstrip("/")
        return name

    def _renamed(self, name: str, size: int, global_pax: dict[str, str],
                 wrappers: list[tuple[bytes, Any]], pos: int) -> tuple[str, int, int]:
        """A member's name and size as tarfile gives them, and the size its data takes in
        the file: the global PAX records first, then its GNU long names and PAX extended
        headers, the one nearest the member first, so the first one written wins. A name
        or size that differs from the header's is a parser differential: readers that do
        not apply these records (or apply them in another order) see another member."""
        header_name, header_size, step = name, size, size
        name, size = _pax_applied(global_pax, name, size)
        for kind, value in reversed(wrappers):
            if kind == b"L":
                name = value
            elif kind in (b"x", b"X"):
                name, size = _pax_applied(value, name, size)
                if "size" in value:
                    step = size
        if name != header_name:
            self.findings("pax", AmbiguousArchiveError(
                f"TAR member {header_name!r} is renamed {name!r} by a PAX or GNU long-name "
                "header: tarfile (torch's TAR loader) and readers that ignore those records "
                "see different members", offset=pos), name, pos)
        if size != header_size:
            self.findings("pax", AmbiguousArchiveError(
                f"TAR member {name!r} declares {header_size} bytes in its header and {size} "
                "in a PAX record: readers disagree about its data", offset=pos), name, pos)
        return name, size, step

    def _add(self, member: TarMember, limits: Limits, pos: int) -> bool:
        """Keep a regular member; False when no more may be listed."""
        earlier = self.members.get(member.name)
        if earlier is not None:  # tarfile (torch) reads the last member of a name
            self.findings("duplicate", AmbiguousArchiveError(
                f"duplicate TAR member {member.name!r}"), member.name, pos)
            self.duplicates.append(earlier)
            self.members[member.name] = member
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
