"""A strict ZIP reader for torch archives (torch >= 1.6 and TorchScript).

Our own parser, not :mod:`zipfile`: two ZIP readers that disagree about a
file are how scanners get bypassed, so this one refuses every archive that a
reasonable reader could see differently from torch's (miniz). It reads the
end-of-central-directory record that ends exactly at EOF (ZIP64 included),
every central entry, and each local header, and checks: one EOCD candidate,
entry count, no data before the first local header or between the central
directory and the EOCD, no flags but UTF-8 and data-descriptor, stored or
deflate only, names that are relative paths without tricks, no links, no
duplicates, local header equal to central entry, entries that do not
overlap, data descriptors that agree, sizes inside the file.

Stored members are returned as zero-copy views of the file map; deflated
members are inflated with the output bounded by the declared size, whole
(:meth:`ZipArchive.data`) or block by block (:meth:`ZipArchive.iter_member`).
"""

from __future__ import annotations

import codecs
import itertools
import struct
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from torchless.core.limits import Limits
from torchless.errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    ChecksumError,
    LimitError,
    TruncatedInputError,
    UnsafePathError,
    UnsupportedError,
)
from torchless.io.source import Source

__all__ = ["Entry", "ZipArchive", "zip64_field"]

_EOCD = struct.Struct("<4sHHHHIIH")  # sig, disk, cd disk, n here, n total, cd size, cd off, cl
_EOCD64_LOC = struct.Struct("<4sIQI")  # sig, disk, eocd64 offset, total disks
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # sig, size, made, need, disk, cd disk, n, N, size, off
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_SIG_EOCD = b"PK\x05\x06"
_SIG_EOCD64 = b"PK\x06\x06"
_SIG_EOCD64_LOC = b"PK\x06\x07"
_SIG_CENTRAL = b"PK\x01\x02"
_SIG_LOCAL = b"PK\x03\x04"
_SIG_DESCRIPTOR = b"PK\x07\x08"
_FLAG_DESCRIPTOR = 0x0008
_FLAG_UTF8 = 0x0800
_ALLOWED_FLAGS = _FLAG_DESCRIPTOR | _FLAG_UTF8 | 0x0006  # bits 1-2: deflate speed hints
_STORED, _DEFLATED = 0, 8
_MAX_COMMENT = 0xFFFF
_RATIO_FLOOR = 64 << 20
#: Compressed bytes fed to the inflater at a time when streaming a member.
_INFLATE_INPUT = 1 << 20
codecs.lookup("cp437")  # member names without the UTF-8 flag; looked up now, not mid-read
_REPACK_HINT = ("torch.save writes plain archives: re-save the checkpoint with torch.save, or "
                "re-pack it with stored or deflated members (zip -r)")
_JOIN_HINT = "join the parts into one file (zip -s 0 split.zip --out whole.zip) first"


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


@dataclass
class Entry:
    """One archive member."""

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


def _u16(b: memoryview | bytes, i: int) -> int:
    return int.from_bytes(b[i:i + 2], "little")


class ZipArchive:
    """The directory of a ZIP file on a :class:`Source`, validated."""

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits
        self.entries: dict[str, Entry] = {}
        self._parse()

    # ---- directory ----------------------------------------------------------------

    def _find_eocd(self) -> int:
        size = self.source.size
        if size < _EOCD.size:
            raise TruncatedInputError("file too short to hold a ZIP end-of-directory record")
        lo = max(0, size - _EOCD.size - _MAX_COMMENT)
        tail = bytes(self.source.view(lo, size - lo))
        candidates = []
        seen_sig = False
        i = len(tail) - _EOCD.size
        while i >= 0:
            i = tail.rfind(_SIG_EOCD, 0, i + 4)
            if i < 0:
                break
            seen_sig = True
            comment_len = _u16(tail, i + 20)
            if i + _EOCD.size + comment_len == len(tail):
                candidates.append(lo + i)
            i -= 1
        if not candidates:
            if seen_sig:
                raise ArchiveFormatError(
                    "ZIP end-of-directory record does not end at the end of the file "
                    "(trailing data or a wrong comment length)")
            raise TruncatedInputError("no ZIP end-of-directory record (truncated archive?)")
        if len(candidates) > 1:
            raise AmbiguousArchiveError(
                "several ZIP end-of-directory records end at the end of the file; "
                "readers would disagree about which directory is real")
        return candidates[0]

    def _parse(self) -> None:
        src = self.source
        eocd_off = self._find_eocd()
        _, disk, cd_disk, n_here, n_total, cd_size, cd_off, _ = _EOCD.unpack(
            src.view(eocd_off, _EOCD.size))
        if disk != 0 or cd_disk != 0 or n_here != n_total:
            raise UnsupportedError("multi-disk (split) ZIP archives are not supported",
                                   hint=_JOIN_HINT)
        cd_end_limit = eocd_off
        loc_off = eocd_off - _EOCD64_LOC.size
        if loc_off >= 0 and bytes(src.view(loc_off, 4)) == _SIG_EOCD64_LOC:
            n64, size64, off64, cd_end_limit = self._zip64(loc_off)
            for small, big, sat in ((n_total, n64, 0xFFFF), (cd_size, size64, 0xFFFFFFFF),
                                    (cd_off, off64, 0xFFFFFFFF)):
                if small != sat and small != big:
                    raise AmbiguousArchiveError(
                        "ZIP64 end record disagrees with the classic end record")
            n_total, cd_size, cd_off = n64, size64, off64
        elif n_total == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_off):
            raise ArchiveFormatError("ZIP64 fields without a ZIP64 end-of-directory locator")
        if n_total > self.limits.max_archive_entries:
            raise LimitError("max_archive_entries", self.limits.max_archive_entries, n_total)
        if cd_off + cd_size != cd_end_limit:
            if cd_off + cd_size > cd_end_limit:
                raise ArchiveFormatError(
                    f"central directory (offset {cd_off}, {cd_size} bytes) runs past the "
                    "end-of-directory record")
            raise ArchiveFormatError("data between the central directory and its end record")
        if n_total * _CENTRAL.size > cd_size:
            raise ArchiveFormatError(
                f"end record claims {n_total} entries but the central directory has room "
                f"for at most {cd_size // _CENTRAL.size}")
        cd = src.view(cd_off, cd_size, "central directory")
        pos = 0
        entries: list[Entry] = []
        while pos < cd_size:
            if len(entries) >= n_total:
                raise ArchiveFormatError(
                    f"central directory holds more entries than the {n_total} declared")
            entry, pos = self._central_entry(cd, pos, cd_off)
            entries.append(entry)
        if len(entries) != n_total:
            raise ArchiveFormatError(
                f"end record declares {n_total} entries, central directory holds {len(entries)}")
        for entry in entries:
            if entry.name in self.entries:
                raise AmbiguousArchiveError(f"duplicate archive member {entry.name!r}")
            self.entries[entry.name] = entry
        self._cd_off = cd_off
        if not self.source.remote:
            self._check_locals(entries, cd_off)
        # remote: each member's local header is checked when the member is read

    def _zip64(self, loc_off: int) -> tuple[int, int, int, int]:
        src = self.source
        _, disk, rec_off, disks = _EOCD64_LOC.unpack(src.view(loc_off, _EOCD64_LOC.size))
        if disk != 0 or disks != 1:  # miniz refuses every disk count but 1
            raise UnsupportedError("multi-disk (split) ZIP archives are not supported",
                                   hint=_JOIN_HINT)
        if rec_off + _EOCD64.size > loc_off:
            raise ArchiveFormatError("ZIP64 end-of-directory record offset is invalid")
        sig, rec_size, _, _, d, cdd, n_here, n_total, cd_size, cd_off = _EOCD64.unpack(
            src.view(rec_off, _EOCD64.size))
        if sig != _SIG_EOCD64:
            raise ArchiveFormatError("bad ZIP64 end-of-directory signature")
        if d != 0 or cdd != 0 or n_here != n_total:
            raise UnsupportedError("multi-disk (split) ZIP archives are not supported",
                                   hint=_JOIN_HINT)
        if rec_off + 12 + rec_size != loc_off:
            raise ArchiveFormatError("data between the ZIP64 end record and its locator")
        if cd_size > 0xFFFFFFFF:
            raise UnsupportedError("a central directory of 4 GiB or more (torch's reader "
                                   "refuses it too)")
        return n_total, cd_size, cd_off, rec_off

    def _central_entry(self, cd: memoryview, pos: int, cd_off: int) -> tuple[Entry, int]:
        if pos + _CENTRAL.size > len(cd):
            raise ArchiveFormatError("central directory entry cut short")
        (sig, made_by, _need, flags, method, _t, _d, crc, csize, usize, nlen, elen, clen,
         disk, _iattr, eattr, hoff) = _CENTRAL.unpack(cd[pos:pos + _CENTRAL.size])
        if sig != _SIG_CENTRAL:
            raise ArchiveFormatError(f"bad central directory signature at byte {cd_off + pos}")
        end = pos + _CENTRAL.size + nlen + elen + clen
        if end > len(cd):
            raise ArchiveFormatError("central directory entry runs past the directory")
        raw_name = bytes(cd[pos + _CENTRAL.size:pos + _CENTRAL.size + nlen])
        extra = bytes(cd[pos + _CENTRAL.size + nlen:pos + _CENTRAL.size + nlen + elen])
        name = self._decode_name(raw_name, flags)
        if flags & ~_ALLOWED_FLAGS:
            bad = flags & ~_ALLOWED_FLAGS
            what = "encrypted" if bad & 0x41 else f"marked with unknown flag bits 0x{bad:04x}"
            raise UnsupportedError(f"archive member {name!r} is {what}; torchless reads only "
                                   "plain stored or deflated members", hint=_REPACK_HINT)
        if method not in (_STORED, _DEFLATED):
            raise UnsupportedError(
                f"archive member {name!r} uses compression method {method} "
                "(only stored and deflate are supported)", hint=_REPACK_HINT)
        if disk == 0xFFFF:  # a ZIP64 disk number: miniz refuses it as multi-disk
            raise UnsupportedError(f"archive member {name!r} lies on another disk of a "
                                   "split archive", hint=_JOIN_HINT)
        if 0xFFFFFFFF in (csize, usize, hoff):
            usize, csize, hoff = self._zip64_extra(extra, usize, csize, hoff, name)
        if (made_by >> 8) == 3 and (eattr >> 16) & 0o170000 == 0o120000:
            raise UnsafePathError(f"archive member {name!r} is a symbolic link")
        if method == _STORED and csize != usize:
            raise ArchiveFormatError(
                f"stored member {name!r} declares {csize} compressed but {usize} bytes")
        entry = Entry(name, method, flags, crc, csize, usize, hoff, is_dir=name.endswith("/"))
        return entry, end

    @staticmethod
    def _zip64_extra(extra: bytes, usize: int, csize: int, hoff: int,
                     name: str) -> tuple[int, int, int]:
        """The saturated fields of a central entry from its ZIP64 extra field, as miniz
        takes them: in the order size, compressed size, offset, each present only if
        saturated; what follows them is ignored, a missing one or a malformed extra block
        before the field is refused."""
        try:
            body = zip64_field(extra)
        except ValueError as err:
            raise ArchiveFormatError(f"member {name!r}: {err}") from None
        vals = body if body is not None else b""
        out: list[int] = []
        k = 0
        for value in (usize, csize, hoff):
            if value == 0xFFFFFFFF:
                if k + 8 > len(vals):
                    raise ArchiveFormatError(f"member {name!r} lacks the ZIP64 fields it needs")
                value, k = int.from_bytes(vals[k:k + 8], "little"), k + 8
            out.append(value)
        return out[0], out[1], out[2]

    @staticmethod
    def _decode_name(raw: bytes, flags: int) -> str:
        try:
            name = raw.decode("utf-8") if flags & _FLAG_UTF8 else raw.decode("cp437")
        except UnicodeDecodeError:
            raise ArchiveFormatError(
                f"archive member name {raw[:60]!r} is not valid UTF-8") from None
        if "\x00" in name:
            raise UnsafePathError(f"archive member name {name!r} contains a NUL byte")
        if "\\" in name:
            raise UnsafePathError(f"archive member name {name!r} contains a backslash")
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise UnsafePathError(f"archive member name {name!r} is an absolute path")
        if any(part in ("..", ".") for part in name.rstrip("/").split("/")) or "//" in name:
            raise UnsafePathError(f"archive member name {name!r} is not a plain relative path")
        if not name:
            raise UnsafePathError("archive member with an empty name")
        return name

    def _check_locals(self, entries: list[Entry], cd_off: int) -> None:
        for e in entries:
            self._check_local(e, cd_off)
        ordered = sorted(entries, key=lambda x: x.header_offset)
        if ordered and ordered[0].header_offset != 0:
            raise AmbiguousArchiveError(
                f"{ordered[0].header_offset} bytes of data before the first archive member")
        for a, b in itertools.pairwise(ordered):
            if b.header_offset < a.end_offset:
                raise AmbiguousArchiveError(
                    f"archive members {a.name!r} and {b.name!r} overlap")
            if b.header_offset > a.end_offset:
                raise AmbiguousArchiveError(
                    f"{b.header_offset - a.end_offset} unaccounted bytes between archive "
                    f"members {a.name!r} and {b.name!r}")
        if ordered and ordered[-1].end_offset != cd_off:
            raise AmbiguousArchiveError(
                "unaccounted bytes between the last archive member and the central directory")

    def _check_local(self, e: Entry, cd_off: int) -> None:
        """One member's local header against its central entry; sets where its data is."""
        src = self.source
        if e.header_offset + _LOCAL.size > cd_off:
            raise ArchiveFormatError(
                f"member {e.name!r}: local header offset {e.header_offset} lies outside "
                "the archive data")
        (sig, _need, flags, method, _t, _d, crc, csize, usize, nlen, elen) = _LOCAL.unpack(
            src.view(e.header_offset, _LOCAL.size))
        if sig != _SIG_LOCAL:
            raise ArchiveFormatError(f"member {e.name!r}: bad local header signature")
        raw_name = src.read(e.header_offset + _LOCAL.size, nlen, "local header name")
        if raw_name != e.name.encode("utf-8" if e.flags & _FLAG_UTF8 else "cp437"):
            raise AmbiguousArchiveError(
                f"member {e.name!r}: local header names it {raw_name[:60]!r}")
        if method != e.method:
            raise AmbiguousArchiveError(
                f"member {e.name!r}: local header says method {method}, central "
                f"directory says {e.method}")
        if (flags & _FLAG_DESCRIPTOR) != (e.flags & _FLAG_DESCRIPTOR) or \
                (flags & ~_ALLOWED_FLAGS):
            raise AmbiguousArchiveError(f"member {e.name!r}: local and central flags differ")
        if not flags & _FLAG_DESCRIPTOR or crc or csize or usize:
            if crc != e.crc:
                raise AmbiguousArchiveError(
                    f"member {e.name!r}: local header CRC differs from the central one")
            if (csize, usize) != (e.compressed_size, e.size) and \
                    (csize, usize) != (0xFFFFFFFF, 0xFFFFFFFF):
                raise AmbiguousArchiveError(
                    f"member {e.name!r}: local header sizes differ from the central ones")
        e.data_offset = e.header_offset + _LOCAL.size + nlen + elen
        e.end_offset = e.data_offset + e.compressed_size
        if e.end_offset > cd_off:
            raise ArchiveFormatError(
                f"member {e.name!r}: {e.compressed_size} bytes of data at offset "
                f"{e.data_offset} run past the archive data")
        if flags & _FLAG_DESCRIPTOR:
            extra = src.read(e.header_offset + _LOCAL.size + nlen, elen, "local extra field")
            try:
                zip64 = zip64_field(extra) is not None
            except ValueError as err:
                raise ArchiveFormatError(f"member {e.name!r}: local header: {err}") from None
            e.end_offset = self._descriptor(e, cd_off, zip64)

    def _located(self, name: str) -> Entry:
        e = self.entries[name]
        if e.data_offset < 0 and not e.is_dir:
            self._check_local(e, self._cd_off)
        return e

    def _descriptor(self, e: Entry, cd_off: int, local_zip64: bool) -> int:
        """Where the data descriptor after a member's data ends, checked against the
        central entry. Its sizes are 8 bytes wide if the local header has a ZIP64 extra
        field (the format's rule, and what torch's writer does: it gives every member of 4
        GiB or more, or starting at 4 GiB or later, that field and a wide descriptor) or if
        the sizes need it (writers that stream without the local field)."""
        pos = e.end_offset
        room = cd_off - pos
        head = self.source.read(pos, min(24, room), "data descriptor")
        if head[:4] == _SIG_DESCRIPTOR:
            head, pos = head[4:], pos + 4
        zip64 = local_zip64 or e.size >= 0xFFFFFFFF or e.compressed_size >= 0xFFFFFFFF
        fmt = "<IQQ" if zip64 else "<III"
        need = struct.calcsize(fmt)
        if len(head) < need:
            raise ArchiveFormatError(f"member {e.name!r}: data descriptor cut short")
        crc, csize, usize = struct.unpack_from(fmt, head)
        if (crc, csize, usize) != (e.crc, e.compressed_size, e.size):
            raise AmbiguousArchiveError(
                f"member {e.name!r}: data descriptor disagrees with the central directory")
        return pos + need

    # ---- members -------------------------------------------------------------------

    def data(self, name: str, *, check_crc: bool) -> memoryview | bytes:
        """A member's bytes: a view of the map if stored, inflated bytes if deflated."""
        e = self._located(name)
        raw = self.source.view(e.data_offset, e.compressed_size, name)
        if e.method == _STORED:
            out: memoryview | bytes = raw
        else:
            out = self._inflate(e, raw)
        if check_crc and zlib.crc32(out) != e.crc:
            raise ChecksumError(f"CRC-32 of member {name!r} does not match its bytes")
        return out

    def _check_inflate(self, e: Entry) -> None:
        lim = self.limits
        if e.size > lim.max_inflated_bytes:
            raise LimitError("max_inflated_bytes", lim.max_inflated_bytes, e.size, e.name)
        if e.size > _RATIO_FLOOR and e.size > lim.max_inflate_ratio * max(1, e.compressed_size):
            raise LimitError("max_inflate_ratio", lim.max_inflate_ratio,
                             e.size // max(1, e.compressed_size), e.name)

    def _inflate(self, e: Entry, raw: memoryview) -> bytes:
        self._check_inflate(e)
        d = zlib.decompressobj(-15)
        try:
            out = d.decompress(raw, e.size + 1)
        except zlib.error as err:
            raise ArchiveFormatError(f"member {e.name!r}: corrupt deflate data ({err})") from None
        if len(out) > e.size:
            raise ArchiveFormatError(
                f"member {e.name!r} inflates to more than its declared {e.size} bytes")
        if len(out) < e.size or not d.eof:
            raise TruncatedInputError(
                f"member {e.name!r}: deflate data ends after {len(out)} of {e.size} bytes")
        return out

    def is_deflated(self, name: str) -> bool:
        return self.entries[name].method == _DEFLATED

    def iter_member(self, name: str, chunk: int, *,
                    check_crc: bool) -> Iterator[memoryview | bytes]:
        """A member's bytes in blocks of at most ``chunk`` bytes, in bounded memory.

        Stored members come as views of the map; deflated ones are inflated block by block
        (at most ``chunk`` bytes of output and :data:`_INFLATE_INPUT` of input at a time),
        with the checks of :meth:`data`: the limits, the exact declared size, the end of
        the deflate stream and, if asked, the CRC-32, which is known only at the end, so a
        mismatch is raised after the last block."""
        if chunk < 1:
            raise ValueError("chunk must be positive")
        e = self._located(name)
        crc = 0
        if e.method == _STORED:
            for block in self.source.blocks(e.data_offset, e.size, chunk):
                if check_crc:
                    crc = zlib.crc32(block, crc)
                yield block
        else:
            raw = self.source.view(e.data_offset, e.compressed_size, name)
            crc = yield from self._inflate_blocks(e, raw, chunk, check_crc)
        if check_crc and crc != e.crc:
            raise ChecksumError(f"CRC-32 of member {name!r} does not match its bytes")

    def _inflate_blocks(self, e: Entry, raw: memoryview, chunk: int,
                        check_crc: bool) -> Generator[bytes, None, int]:
        self._check_inflate(e)
        d = zlib.decompressobj(-15)
        pos = produced = crc = 0
        pending: memoryview | bytes = b""
        while not d.eof:
            if not pending and pos < len(raw):
                pending = raw[pos:pos + _INFLATE_INPUT]
                pos += len(pending)
            fed = len(pending)
            try:
                out = d.decompress(pending, min(chunk, e.size + 1 - produced))
            except zlib.error as err:
                raise ArchiveFormatError(
                    f"member {e.name!r}: corrupt deflate data ({err})") from None
            pending = d.unconsumed_tail
            produced += len(out)
            if produced > e.size:
                raise ArchiveFormatError(
                    f"member {e.name!r} inflates to more than its declared {e.size} bytes")
            if out:
                if check_crc:
                    crc = zlib.crc32(out, crc)
                yield out
            elif not fed:
                break  # no input left and nothing more comes out
        if produced < e.size or not d.eof:
            raise TruncatedInputError(
                f"member {e.name!r}: deflate data ends after {produced} of {e.size} bytes")
        return crc
