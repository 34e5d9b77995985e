"""A tolerant pass over a ZIP archive for the scanner: list everything, refuse nothing.

:mod:`._zip` refuses the first thing two ZIP readers could see differently; the scanner
must instead say *every* such thing and still reach every byte that some reader would
interpret. This pass reads each end-of-directory record that could be the real one, every
central entry, each local header, and the regions no entry accounts for, and records an
anomaly (``kind``, member, offset, message) for each disagreement:

``eocd``         several end records, one not at the end of the file, counts or sizes wrong,
                 a ZIP64 locator counting other than one disk
``prefix``       data before the first member (the archive is not at offset 0)
``trailing``     data after the end record
``gap``          bytes between members or before the central directory that no entry owns
``hidden``       a local header that no central entry names (its data is scanned too)
``header``       local and central header disagree (name, method, flags, CRC, sizes); an
                 extra block that runs past its end, a central ZIP64 field lacking a value,
                 a member on another disk (what torch's reader, miniz, refuses)
``flags``        flag bits other than UTF-8 / data descriptor (encryption, patched data …)
``method``       compression other than stored or deflate
``crc``          CRC-32 of the bytes differs from the recorded one
``descriptor``   the data descriptor disagrees with the central entry
``duplicate``    two entries with one name
``overlap``      two entries sharing bytes
``name``         a name that is not a plain relative path, or not valid UTF-8
``link``         a member marked as a symbolic link
``bounds``       an entry whose header or data lies outside the file
"""

from __future__ import annotations

import itertools
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from torchless.containers.ziparchive import Entry, zip64_field

__all__ = ["ZipAnomaly", "ZipMember", "ZipScan", "read_member", "scan_zip"]

_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD64_LOC = struct.Struct("<4sIQI")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_SIG_EOCD = b"PK\x05\x06"
_SIG_LOCAL = b"PK\x03\x04"
_SIG_DESC = b"PK\x07\x08"
_FLAG_DESC = 0x0008
_FLAG_UTF8 = 0x0800
_ALLOWED_FLAGS = _FLAG_DESC | _FLAG_UTF8 | 0x0006
_MAX_COMMENT = 0xFFFF
#: Compressed bytes fed to the inflater at a time.
_INFLATE_BLOCK = 1 << 20


@dataclass(frozen=True)
class ZipAnomaly:
    kind: str
    message: str
    member: str | None = None
    offset: int | None = None


@dataclass
class ZipMember(Entry):
    """One entry as some reader would see it (``source``: "central" or "local")."""

    source: str = "central"


@dataclass
class ZipScan:
    members: list[ZipMember] = field(default_factory=list)
    anomalies: list[ZipAnomaly] = field(default_factory=list)
    #: Byte ranges that no entry owns but some reader might read: (start, end).
    loose: list[tuple[int, int]] = field(default_factory=list)
    has_crc: bool = False

    def flag(self, kind: str, message: str, member: str | None = None,
             offset: int | None = None) -> None:
        self.anomalies.append(ZipAnomaly(kind, message, member, offset))


def _decode(raw: bytes, flags: int, out: ZipScan, offset: int) -> str:
    try:
        name = raw.decode("utf-8") if flags & _FLAG_UTF8 else raw.decode("cp437")
    except UnicodeDecodeError:
        name = raw.decode("utf-8", "backslashreplace")
        out.flag("name", f"member name {name[:80]!r} is not valid UTF-8", name, offset)
        return name
    bad = ("\x00" in name or "\\" in name or name.startswith("/") or
           (len(name) > 1 and name[1] == ":") or not name or "//" in name or
           any(p in ("..", ".") for p in name.rstrip("/").split("/")))
    if bad:
        out.flag("name", f"member name {name[:80]!r} is not a plain relative path", name, offset)
    return name


def _eocd_candidates(buf: Any, size: int) -> list[int]:
    lo = max(0, size - _EOCD.size - _MAX_COMMENT)
    out = []
    i = size - _EOCD.size
    while i >= lo:
        i = buf.rfind(_SIG_EOCD, lo, i + 4)
        if i < 0:
            break
        out.append(i)
        i -= 1
    return out


def scan_zip(buf: Any, size: int) -> ZipScan:
    """Everything about the ZIP archive(s) whose end record lies near the end of ``buf``."""
    out = ZipScan()
    candidates = _eocd_candidates(buf, size)
    exact = [c for c in candidates
             if c + _EOCD.size + int.from_bytes(buf[c + 20:c + 22], "little") == size]
    if not candidates:
        out.flag("eocd", "no ZIP end-of-directory record near the end of the file")
        _hidden(buf, 0, size, out)  # what a reader walking local headers would still see
        return out
    chosen = exact or candidates[:1]
    if not exact:
        end = candidates[0] + _EOCD.size + int.from_bytes(
            buf[candidates[0] + 20:candidates[0] + 22], "little")
        out.flag("trailing", f"{size - min(end, size)} bytes after the ZIP end record "
                 "(or a wrong comment length)", offset=min(end, size))
        if end < size:
            out.loose.append((end, size))
    if len(exact) > 1:
        out.flag("eocd", f"{len(exact)} end-of-directory records end at the end of the file; "
                 "readers disagree about which directory is real", offset=exact[-1])
    seen: set[int] = set()
    for eocd in chosen:
        _directory(buf, size, eocd, out, seen)
    _coverage(buf, size, out, min(chosen))
    return out


def _directory(buf: Any, size: int, eocd: int, out: ZipScan, seen: set[int]) -> None:
    _, disk, cd_disk, n_here, n_total, cd_size, cd_off, _ = _EOCD.unpack(buf[eocd:eocd + 22])
    if disk or cd_disk or n_here != n_total:
        out.flag("eocd", "end record describes a multi-disk (split) archive", offset=eocd)
    cd_end = eocd
    loc = eocd - _EOCD64_LOC.size
    if loc >= 0 and buf[loc:loc + 4] == b"PK\x06\x07":
        _, _, rec, disks = _EOCD64_LOC.unpack(buf[loc:loc + _EOCD64_LOC.size])
        if disks != 1:
            out.flag("eocd", f"ZIP64 end-record locator counts {disks} disks (torch reads "
                     "only 1)", offset=loc)
        if rec + _EOCD64.size <= loc and buf[rec:rec + 4] == b"PK\x06\x06":
            fields = _EOCD64.unpack(buf[rec:rec + _EOCD64.size])
            n_total, cd_size, cd_off = fields[7], fields[8], fields[9]
            cd_end = rec
        else:
            out.flag("eocd", "ZIP64 end-record locator points at no ZIP64 end record",
                     offset=loc)
    delta = 0
    if cd_off + cd_size != cd_end:
        if cd_end - cd_size > 0 and cd_off + cd_size < cd_end and cd_end - cd_size <= size:
            delta = cd_end - cd_size - cd_off
            out.flag("prefix", f"member offsets are relative to byte {delta}: {delta} bytes "
                     "before the archive (self-extractor / concatenation layout)", offset=0)
        else:
            out.flag("eocd", f"central directory (offset {cd_off}, {cd_size} bytes) does not "
                     "end where the end record starts", offset=eocd)
    start = cd_off + delta
    if start in seen:
        return
    seen.add(start)
    pos, count = start, 0
    while pos + _CENTRAL.size <= min(size, cd_end) and buf[pos:pos + 4] == b"PK\x01\x02":
        if count >= 1_000_000:
            out.flag("eocd", "more than a million central entries; the rest is not listed")
            break
        f = _CENTRAL.unpack(buf[pos:pos + _CENTRAL.size])
        (_, made_by, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, disk,
         _, eattr, hoff) = f
        body = pos + _CENTRAL.size
        name = _decode(bytes(buf[body:body + nlen]), flags, out, pos)
        extra = bytes(buf[body + nlen:body + nlen + elen])
        if disk == 0xFFFF:
            out.flag("header", f"central entry of {name!r} puts it on another disk (a split "
                     "archive; torch refuses it)", name, pos)
        if 0xFFFFFFFF in (csize, usize, hoff):
            usize, csize, hoff = _zip64(extra, usize, csize, hoff, name, pos, out)
        if (made_by >> 8) == 3 and (eattr >> 16) & 0o170000 == 0o120000:
            out.flag("link", f"member {name!r} is a symbolic link", name, pos)
        out.members.append(ZipMember(name, method, flags, crc, csize, usize, hoff + delta,
                                     is_dir=name.endswith("/")))
        pos = body + nlen + elen + clen
        count += 1
    if count != n_total:
        out.flag("eocd", f"end record declares {n_total} entries, the central directory "
                 f"holds {count}", offset=eocd)
    if pos < cd_end and count == n_total:
        out.flag("gap", f"{cd_end - pos} bytes between the central directory and its end "
                 "record", offset=pos)
        out.loose.append((pos, cd_end))


def _zip64(extra: bytes, usize: int, csize: int, hoff: int, name: str, pos: int,
           out: ZipScan) -> tuple[int, int, int]:
    """The saturated fields from the ZIP64 extra field, taken as miniz takes them (see
    :func:`._zip.zip64_field`); what miniz refuses is flagged, the fields left saturated."""
    try:
        body = zip64_field(extra) or b""
    except ValueError as err:
        out.flag("header", f"central entry of {name!r}: {err}", name, pos)
        return usize, csize, hoff
    vals, k = [usize, csize, hoff], 0
    for i, value in enumerate(vals):
        if value == 0xFFFFFFFF:
            if k + 8 > len(body):
                out.flag("header", f"central entry of {name!r} lacks the ZIP64 fields it "
                         "needs", name, pos)
                break
            vals[i], k = int.from_bytes(body[k:k + 8], "little"), k + 8
    return vals[0], vals[1], vals[2]


def _local(buf: Any, size: int, m: ZipMember, out: ZipScan) -> bool:
    """Check one member's local header against its central entry; set its data range."""
    h = m.header_offset
    if h < 0 or h + _LOCAL.size > size:
        out.flag("bounds", f"local header offset {h} lies outside the file", m.name)
        return False
    (sig, _, flags, method, _, _, crc, csize, usize, nlen, elen) = _LOCAL.unpack(
        buf[h:h + _LOCAL.size])
    if sig != _SIG_LOCAL:
        out.flag("header", "no local header signature where the central entry points",
                 m.name, h)
        return False
    raw = bytes(buf[h + _LOCAL.size:h + _LOCAL.size + nlen])
    central = m.name.encode("utf-8" if m.flags & _FLAG_UTF8 else "cp437", "backslashreplace")
    if raw != central:
        out.flag("header", f"local header names the member {raw[:80]!r}", m.name, h)
    if method != m.method:
        out.flag("header", f"local header says method {method}, central entry {m.method}",
                 m.name, h)
    if flags != m.flags:
        out.flag("header", f"local flags 0x{flags:04x} differ from central 0x{m.flags:04x}",
                 m.name, h)
    for fl in {flags, m.flags}:
        if fl & ~_ALLOWED_FLAGS:
            bad = fl & ~_ALLOWED_FLAGS
            what = "encryption" if bad & 0x41 else "patched data" if bad & 0x20 else "unknown"
            out.flag("flags", f"flag bits 0x{bad:04x} ({what}) set", m.name, h)
    if not flags & _FLAG_DESC or crc or csize or usize:
        if crc != m.crc:
            out.flag("header", "local header CRC differs from the central one", m.name, h)
        if (csize, usize) != (m.compressed_size, m.size) and \
                (csize, usize) != (0xFFFFFFFF, 0xFFFFFFFF):
            out.flag("header", "local header sizes differ from the central ones", m.name, h)
    if m.method not in (0, 8):
        out.flag("method", f"compression method {m.method} (only stored and deflate are "
                 "read by torch)", m.name, h)
    elif m.method == 0 and m.compressed_size != m.size:
        out.flag("header", f"stored member declares {m.compressed_size} compressed and "
                 f"{m.size} bytes", m.name, h)
    m.data_offset = h + _LOCAL.size + nlen + elen
    m.end_offset = m.data_offset + m.compressed_size
    if m.end_offset > size:
        out.flag("bounds", f"{m.compressed_size} bytes of data at offset {m.data_offset} run "
                 "past the end of the file", m.name, m.data_offset)
        m.end_offset = size
        return False
    if flags & _FLAG_DESC:
        try:
            local_zip64 = zip64_field(bytes(buf[h + _LOCAL.size + nlen:m.data_offset])) \
                is not None
        except ValueError as err:
            out.flag("header", f"local header: {err}", m.name, h)
            local_zip64 = False
        _descriptor(buf, size, m, out, local_zip64)
    return True


def _descriptor(buf: Any, size: int, m: ZipMember, out: ZipScan, local_zip64: bool) -> None:
    """Check the data descriptor; 8-byte sizes on the rule of :meth:`._zip.ZipArchive.
    _descriptor` (a ZIP64 field in the local header, or sizes that need them)."""
    pos = m.end_offset
    if buf[pos:pos + 4] == _SIG_DESC:
        pos += 4
    wide = local_zip64 or m.size >= 0xFFFFFFFF or m.compressed_size >= 0xFFFFFFFF
    n = 20 if wide else 12
    if pos + n > size:
        out.flag("descriptor", "data descriptor cut short", m.name, pos)
        return
    crc = int.from_bytes(buf[pos:pos + 4], "little")
    half = n // 2 - 2
    csize = int.from_bytes(buf[pos + 4:pos + 4 + half], "little")
    usize = int.from_bytes(buf[pos + 4 + half:pos + 4 + 2 * half], "little")
    if (crc, csize, usize) != (m.crc, m.compressed_size, m.size):
        out.flag("descriptor", "data descriptor disagrees with the central entry", m.name, pos)
    m.end_offset = pos + n


def _coverage(buf: Any, size: int, out: ZipScan, eocd: int) -> None:
    names: dict[str, int] = {}
    located = []
    for m in out.members:
        names[m.name] = names.get(m.name, 0) + 1
        if _local(buf, size, m, out):
            located.append(m)
    for name, n in names.items():
        if n > 1:
            out.flag("duplicate", f"{n} entries named {name!r}", name)
    out.has_crc = any(m.crc for m in out.members if m.size)
    ordered = sorted(located, key=lambda x: (x.header_offset, x.end_offset))
    for a, b in itertools.pairwise(ordered):
        if b.header_offset < a.end_offset:
            out.flag("overlap", f"members {a.name!r} and {b.name!r} share bytes", b.name,
                     b.header_offset)
    cursor = 0
    regions = []
    for m in ordered:
        if m.header_offset > cursor:
            regions.append((cursor, m.header_offset))
        cursor = max(cursor, m.end_offset)
    central = _central_start(buf, out, eocd)
    if central > cursor:
        regions.append((cursor, central))
    for lo, hi in regions:
        kind = "prefix" if lo == 0 else "gap"
        what = "before the first member" if lo == 0 else "that no entry owns"
        out.flag(kind, f"{hi - lo} bytes {what} at offset {lo}", offset=lo)
        out.loose.append((lo, hi))
        _hidden(buf, lo, hi, out)


def _central_start(buf: Any, out: ZipScan, eocd: int) -> int:
    """Where the (lowest) central directory starts: the end of the member region."""
    fields = _EOCD.unpack(buf[eocd:eocd + 22])
    cd_size, start = int(fields[5]), int(fields[6])
    if start + cd_size != eocd and eocd - cd_size >= 0:
        start = eocd - cd_size
    loc = eocd - _EOCD64_LOC.size
    if loc >= 0 and buf[loc:loc + 4] == b"PK\x06\x07":
        rec = _EOCD64_LOC.unpack(buf[loc:loc + _EOCD64_LOC.size])[2]
        if rec + _EOCD64.size <= loc and buf[rec:rec + 4] == b"PK\x06\x06":
            start = int(_EOCD64.unpack(buf[rec:rec + _EOCD64.size])[9])
    return min(start, eocd)


def _hidden(buf: Any, lo: int, hi: int, out: ZipScan) -> None:
    """Local headers inside a region no central entry owns: a reader walking local headers
    (a streaming unzip) sees members the central directory hides."""
    pos = lo
    while True:
        pos = buf.find(_SIG_LOCAL, pos, hi)
        if pos < 0 or pos + _LOCAL.size > hi:
            return
        (_, _, flags, method, _, _, crc, csize, usize, nlen, elen) = _LOCAL.unpack(
            buf[pos:pos + _LOCAL.size])
        data = pos + _LOCAL.size + nlen + elen
        if data <= hi:
            name = _decode(bytes(buf[pos + _LOCAL.size:pos + _LOCAL.size + nlen]), flags,
                           ZipScan(), pos)
            if not csize and flags & _FLAG_DESC:  # sizes only in the data descriptor
                desc = buf.find(_SIG_DESC, data, hi)
                csize = (desc if desc >= 0 else hi) - data
                usize = int.from_bytes(buf[desc + 12:desc + 16], "little") \
                    if desc >= 0 and desc + 16 <= hi else csize if method == 0 else 1 << 62
            m = ZipMember(name, method, flags, crc, min(csize, hi - data), usize, pos,
                          source="local", data_offset=data,
                          end_offset=min(data + csize, hi))
            out.flag("hidden", f"local header for {name!r} that the central directory does "
                     "not list", name, pos)
            out.members.append(m)
        pos += 4


def read_member(buf: Any, m: ZipMember, cap: int) -> tuple[bytes | None, str | None]:
    """The member's first ``cap`` bytes (all of them if fewer), or None and why they cannot
    be had. Reads and inflates only what it returns (plus one input block)."""
    if m.data_offset < 0:
        return None, "its local header could not be read"
    end = min(len(buf), m.end_offset if m.source == "local" else
              m.data_offset + m.compressed_size)
    if m.method == 0:
        return bytes(buf[m.data_offset:min(end, m.data_offset + cap)]), None
    if m.method != 8:
        return None, f"compression method {m.method} is not stored or deflate"
    d = zlib.decompressobj(-15)
    out = bytearray()
    pos = m.data_offset
    try:
        while len(out) < cap and not d.eof:
            chunk = d.unconsumed_tail or bytes(buf[pos:min(end, pos + _INFLATE_BLOCK)])
            if not d.unconsumed_tail:
                pos += len(chunk)
            if not chunk:
                break
            out += d.decompress(chunk, cap - len(out))
    except zlib.error as e:
        return None, f"corrupt deflate data ({e})"
    return bytes(out), None
