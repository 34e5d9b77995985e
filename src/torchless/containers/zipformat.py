"""The ZIP records torch archives are made of, and the rules that read their fields.

Byte layouts (PKWARE APPNOTE 6.3), as :mod:`struct` formats, and the few readings in which ZIP
readers differ, each settled as torch's reader (miniz) settles it: which ZIP64 extra field
counts, which central fields it fills, how wide a data descriptor's sizes are, and what a
member name must be. :mod:`.ziparchive` applies them, in strict mode for the reader and in
report mode for the scanner.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass

from torchless.errors import ArchiveFormatError, CheckpointError, UnsafePathError

__all__ = ["CENTRAL", "EOCD", "EOCD64", "EOCD64_LOC", "LOCAL", "Entry", "any_name",
           "descriptor_is_zip64", "member_name", "zip64_field", "zip64_values"]

EOCD = struct.Struct("<4sHHHHIIH")  # sig, disk, cd disk, n here, n total, cd size, cd off, cl
EOCD64_LOC = struct.Struct("<4sIQI")  # sig, disk, eocd64 offset, total disks
EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # sig, size, made, need, disk, cd disk, n, N, size, off
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
LOCAL = struct.Struct("<4sHHHHHIIIHH")
SIG_EOCD64 = b"PK\x06\x06"
SIG_EOCD64_LOC = b"PK\x06\x07"
SIG_CENTRAL = b"PK\x01\x02"
SIG_LOCAL = b"PK\x03\x04"
SIG_DESCRIPTOR = b"PK\x07\x08"
FLAG_DESCRIPTOR = 0x0008
FLAG_UTF8 = 0x0800
ALLOWED_FLAGS = FLAG_DESCRIPTOR | FLAG_UTF8 | 0x0006  # bits 1-2: deflate speed hints
STORED, DEFLATED = 0, 8
SATURATED = 0xFFFFFFFF
codecs.lookup("cp437")  # member names without the UTF-8 flag; looked up now, not mid-read
REPACK_HINT = ("torch.save writes plain archives: re-save the checkpoint with torch.save, or "
               "re-pack it with stored or deflated members (zip -r)")
JOIN_HINT = "join the parts into one file (zip -s 0 split.zip --out whole.zip) first"


@dataclass(slots=True)
class Entry:
    """One archive member: as its central entry lists it (``listed``), or as a local header
    that no central entry lists shows it (the scanner's hidden members)."""

    name: str
    method: int
    flags: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    data_offset: int = -1
    end_offset: int = -1  # after data (and descriptor)
    is_dir: bool = False
    raw_name: bytes = b""
    listed: bool = True
    #: Its local header has been read and checked: data_offset and end_offset are known.
    located: bool = False

    def least_end(self) -> int:
        """Where the member ends at the earliest, from its central entry alone: a local
        header repeats the name, and the data follows it."""
        return self.header_offset + LOCAL.size + len(self.raw_name) + self.compressed_size


def zip64_field(extra: bytes) -> bytes | None:
    """The body of the first ZIP64 extended-information field (tag 0x0001) of an extra
    block, or None. The fields are walked as miniz walks them: a field that runs past the
    block, or 1-3 bytes left over, before that field is reached is a ValueError."""
    i = 0
    while i < len(extra):
        if i + 4 > len(extra):
            raise ValueError(f"extra field block ends with {len(extra) - i} stray bytes")
        tag, size = struct.unpack_from("<HH", extra, i)
        if i + 4 + size > len(extra):
            raise ValueError(f"extra field 0x{tag:04x} runs past the extra block")
        if tag == 0x0001:
            return extra[i + 4:i + 4 + size]
        i += 4 + size
    return None


def zip64_values(extra: bytes, usize: int, csize: int, hoff: int,
                 name: str) -> tuple[tuple[int, int, int], CheckpointError | None]:
    """The saturated fields of a central entry from its ZIP64 extra field, as miniz takes
    them: in the order size, compressed size, offset, each present only if saturated; what
    follows them is ignored. A missing value, or a malformed extra block before the field,
    is the error returned (with the fields read so far, the others left saturated)."""
    try:
        body = zip64_field(extra)
    except ValueError as err:
        return (usize, csize, hoff), ArchiveFormatError(f"member {name!r}: {err}")
    vals = body if body is not None else b""
    out = [usize, csize, hoff]
    k = 0
    for i, value in enumerate(out):
        if value == SATURATED:
            if k + 8 > len(vals):
                return ((out[0], out[1], out[2]),
                        ArchiveFormatError(f"member {name!r} lacks the ZIP64 fields it needs"))
            out[i], k = int.from_bytes(vals[k:k + 8], "little"), k + 8
    return (out[0], out[1], out[2]), None


def descriptor_is_zip64(local_zip64: bool, e: Entry) -> bool:
    """Whether a member's data descriptor has 8-byte sizes: if its local header has a ZIP64
    extra field (the format's rule, and what torch's writer does: it gives every member of
    4 GiB or more, or starting at 4 GiB or later, that field and a wide descriptor) or if
    the sizes need it (writers that stream without the local field)."""
    return local_zip64 or e.size >= SATURATED or e.compressed_size >= SATURATED


def member_name(raw: bytes, flags: int) -> str:
    """A member name: it must decode (UTF-8 when the flag says so, else code page 437) and
    be a plain relative path (no NUL, backslash, drive, leading slash, ``.``/``..`` component
    or empty component); raises what is wrong with it (:func:`any_name` reads it anyway)."""
    try:
        name = raw.decode("utf-8") if flags & FLAG_UTF8 else raw.decode("cp437")
    except UnicodeDecodeError:
        raise ArchiveFormatError(f"archive member name {raw[:60]!r} is not valid UTF-8") \
            from None
    if "\x00" in name:
        raise UnsafePathError(f"archive member name {name!r} contains a NUL byte")
    if "\\" in name:
        raise UnsafePathError(f"archive member name {name!r} contains a backslash")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafePathError(f"archive member name {name!r} is an absolute path")
    bounded = f"/{name.rstrip('/')}/"  # a "." or ".." component lies between two slashes
    if "/./" in bounded or "/../" in bounded or "//" in name:
        raise UnsafePathError(f"archive member name {name!r} is not a plain relative path")
    if not name:
        raise UnsafePathError("archive member with an empty name")
    return name


def any_name(raw: bytes, flags: int) -> str:
    """A member name however it is made (bytes that do not decode are escaped): what the
    scanner calls a member whose name the reader refuses."""
    return raw.decode("utf-8" if flags & FLAG_UTF8 else "cp437", "backslashreplace")
