"""The ZIP reader of torch archives (torch >= 1.6 and TorchScript), for reading and scanning.

Our own parser, not :mod:`zipfile`: two ZIP readers that disagree about a file are how
scanners get bypassed, so there is one, with two modes (:mod:`torchless.core.findings`):

* **strict** (``torchless.open``): refuses every archive that a reasonable reader could see
  differently from torch's (miniz);
* **report** (``torchless.scan``): the same checks, each recorded as an anomaly, and parsing
  goes on: every end record that could be the real one, every central entry (duplicates
  too), the local headers no entry lists (``members`` with ``listed`` false) and the byte
  ranges no member owns (``loose``), so that the scanner reaches every byte some reader
  would interpret.

It reads the end-of-central-directory record torch's reader (miniz) reads, the last
signature in the file (ZIP64 included), every central entry, and each local header, and
looks members up as miniz does, ignoring ASCII case (:meth:`ZipArchive.resolve`). It checks:
one end record, the one whose comment ends the file (so that readers agree on it), entry
count, no data before the first local header, between members or between the central
directory and its end record, no flags but UTF-8 and data-descriptor, stored or deflate
only, names that are relative paths without tricks, no links, no duplicates (nor names equal
but for case), local header equal to central entry, data descriptors that agree, sizes
inside the file.

The local headers of a file are read when it is opened; those of a remote file
(:class:`~torchless.io.remote.RemoteSource`) each when its member is first read, so that
opening costs a few requests. The checks do not depend on the source: what needs only the
central directory runs at open for both (a member counting by the least it can take), and a
member's exact end is checked against the next member when its local header is read.
"""

from __future__ import annotations

import operator

from torchless.containers.zipformat import (
    ALLOWED_FLAGS,
    CENTRAL,
    DEFLATED,
    EOCD,
    EOCD64,
    EOCD64_LOC,
    JOIN_HINT,
    REPACK_HINT,
    SATURATED,
    SIG_CENTRAL,
    SIG_EOCD64,
    SIG_EOCD64_LOC,
    STORED,
    Entry,
    any_name,
    member_name,
    zip64_field,
    zip64_values,
)
from torchless.containers.ziplayout import MemberLayout
from torchless.containers.zipmembers import MemberReader
from torchless.core.findings import Anomaly, Findings, Mode
from torchless.core.limits import Limits
from torchless.errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    CheckpointError,
    LimitError,
    TruncatedInputError,
    UnsafePathError,
    UnsupportedError,
)
from torchless.io.detect import ZIP_EOCD_SIZE, zip_end_records
from torchless.io.source import Source

__all__ = ["Entry", "ZipArchive", "zip64_field"]

_MULTI_DISK = "multi-disk (split) ZIP archives are not supported"
_CENTRAL_SIZE = CENTRAL.size
_by_offset = operator.attrgetter("header_offset", "end_offset")
_central = CENTRAL.unpack_from


class ZipArchive(MemberLayout, MemberReader):
    """The directory of a ZIP file on a :class:`Source`, validated (``mode="strict"``) or
    described (``mode="report"``: see :attr:`anomalies`, :attr:`members`, :attr:`loose`)."""

    def __init__(self, source: Source, limits: Limits, *, mode: Mode = "strict") -> None:
        self.source = source
        self.limits = limits
        self.findings = Findings(mode)
        self._bytes = source.read if self.findings.strict else self._clipped
        #: Members by name (the first of each name), as the reader looks them up.
        self.entries: dict[str, Entry] = {}
        self._folded: dict[bytes, Entry] = {}  # by raw name, ASCII lower-cased (miniz)
        #: Every member found, in directory order: duplicates, and in report mode those of
        #: every candidate directory and the local headers no entry lists.
        self.members: list[Entry] = []
        #: Byte ranges no member owns but some reader might read: (start, end).
        self.loose: list[tuple[int, int]] = []
        self._cd_start = source.size  # where member data must end: the central directory
        self._order: list[Entry] = []  # members by offset, for the checks between them
        self._rank: dict[int, int] = {}  # id(member) -> its index in _order (remote files)
        #: Whether the CRCs mean anything: torch.save(..., compute_crc32=False) writes 0.
        self.has_crc = False
        self._parse()

    @property
    def anomalies(self) -> list[Anomaly]:
        """What report mode found (strict mode raises the first instead)."""
        return self.findings.anomalies

    def resolve(self, name: str) -> str | None:
        """The member torch's reader finds for ``name``: miniz compares names byte by byte
        ignoring ASCII case (``archive/data.PKL`` is ``archive/data.pkl``), so this is the
        name to pass to :meth:`data`; None when no member has it."""
        e = self._folded.get(name.encode("utf-8").lower())
        return None if e is None else e.name

    # ---- directory ----------------------------------------------------------------

    def _parse(self) -> None:
        records = self._end_records()
        if not records:
            self._hidden(0, self.source.size)  # what a reader walking local headers sees
            return
        seen: set[int] = set()
        for eocd in records:
            self._directory(eocd, seen)
        self.has_crc = any(e.crc for e in self.members if e.size)
        for e in self.members:
            key = e.raw_name.lower()
            if key == e.raw_name:
                key = e.raw_name  # one bytes object for both: a name in lower case already
            first = self._folded.get(key)
            if first is not None:
                same = first.raw_name == e.raw_name
                self.findings("duplicate", AmbiguousArchiveError(
                    f"duplicate archive member {e.name!r}" if same else
                    f"archive members {first.name!r} and {e.name!r} differ only in case: "
                    "torch's reader (miniz) looks names up ignoring case, so which one it "
                    "loads is not the one other readers load"), e.name, e.header_offset)
            else:
                self._folded[key] = e
            self.entries.setdefault(e.name, e)
        eager = not (self.source.remote and self.findings.strict)
        if eager:
            plain, fully = self._plain_local, self._check_local_fully  # _check_local
            self._starts = sorted(e.header_offset for e in self.members)
            for e in self.members:
                if not plain(e):
                    fully(e)
            self._starts = []
            self._window = b""
        self._order = sorted((e for e in self.members if e.located or not eager),
                             key=_by_offset)
        self._tile(self._order, 0, self._cd_start)
        if not eager:
            self._rank = {id(e): i for i, e in enumerate(self._order)}

    def _end_records(self) -> list[int]:
        """The end records to read, torch's first: miniz takes the last end-record signature
        with room for a record before the end of the file, whatever its comment length says,
        even one inside another record's comment. Readers that want the record whose comment
        ends the file would read another directory: a differential (report mode reads both)."""
        f, size = self.findings, self.source.size
        found, exact = zip_end_records(self.source)
        if not found:
            f("eocd", TruncatedInputError(
                "file too short to hold a ZIP end-of-directory record" if size < ZIP_EOCD_SIZE
                else "no ZIP end-of-directory record (truncated archive?)"),
              report="no ZIP end-of-directory record near the end of the file")
            return []
        last = found[0]
        if exact and exact[0] != last:
            f("eocd", AmbiguousArchiveError(
                f"the last ZIP end-of-directory signature (at byte {last}, the one torch "
                f"reads) lies inside the comment of the end record at byte {exact[0]} "
                "(the one other ZIP readers read): they would load different archives"),
              offset=last)
            return [last, *exact]
        if len(exact) > 1:
            f("eocd", AmbiguousArchiveError(
                "several ZIP end-of-directory records end at the end of the file; "
                "readers would disagree about which directory is real"), offset=exact[-1])
            return exact
        if not exact:
            end = last + ZIP_EOCD_SIZE + int.from_bytes(
                self.source.read(last + 20, 2), "little")
            f("trailing", ArchiveFormatError(
                "ZIP end-of-directory record does not end at the end of the file "
                "(trailing data or a wrong comment length)"), offset=min(end, size),
              report=f"{size - min(end, size)} bytes after the ZIP end record (or a wrong "
                     "comment length)")
            if end < size:
                self.loose.append((end, size))
        return [last]

    def _directory(self, eocd: int, seen: set[int]) -> None:
        src, f = self.source, self.findings
        _, disk, cd_disk, n_here, n_total, cd_size, cd_off, _ = EOCD.unpack(
            src.read(eocd, EOCD.size))
        if disk != 0 or cd_disk != 0 or n_here != n_total:
            f("eocd", UnsupportedError(_MULTI_DISK, hint=JOIN_HINT), offset=eocd,
              report="end record describes a multi-disk (split) archive")
        cd_end = eocd
        loc = eocd - EOCD64_LOC.size
        if loc >= 0 and src.read(loc, 4) == SIG_EOCD64_LOC:
            z64 = self._zip64(loc)
            if z64 is not None:
                n64, size64, off64, cd_end = z64
                if any(small not in (sat, big) for small, big, sat in (
                        (n_total, n64, 0xFFFF), (cd_size, size64, SATURATED),
                        (cd_off, off64, SATURATED))):
                    f("eocd", AmbiguousArchiveError(
                        "ZIP64 end record disagrees with the classic end record"), offset=eocd)
                n_total, cd_size, cd_off = n64, size64, off64
        elif n_total == 0xFFFF or SATURATED in (cd_size, cd_off):
            f("eocd", ArchiveFormatError("ZIP64 fields without a ZIP64 end-of-directory locator"),
              offset=eocd)
        if n_total > self.limits.max_archive_entries:
            f("limit", LimitError("max_archive_entries", self.limits.max_archive_entries, n_total))
        delta = 0  # report mode: members placed as if the archive started at this byte
        if cd_off + cd_size > cd_end:
            f("eocd", ArchiveFormatError(
                f"central directory (offset {cd_off}, {cd_size} bytes) runs past the "
                "end-of-directory record"), offset=eocd)
        elif cd_off + cd_size < cd_end:
            delta = cd_end - cd_size - cd_off
            f("prefix", ArchiveFormatError("data between the central directory and its end "
                                           "record"), offset=0,
              report=f"member offsets are relative to byte {delta}: {delta} bytes before the "
                     "archive (self-extractor / concatenation layout)")
        if n_total * CENTRAL.size > cd_size:
            f("eocd", ArchiveFormatError(
                f"end record claims {n_total} entries but the central directory has room "
                f"for at most {cd_size // CENTRAL.size}"), offset=eocd)
        start = cd_off + delta
        self._cd_start = min(self._cd_start, start, eocd)
        if start in seen:
            return
        seen.add(start)
        self._central(start, min(cd_end, src.size), cd_end, n_total, delta, eocd)

    def _zip64(self, loc: int) -> tuple[int, int, int, int] | None:
        """(entries, directory size, directory offset, ZIP64 end record offset), or None
        (report mode) when the locator points at no ZIP64 end record."""
        src, f = self.source, self.findings
        _, disk, rec, disks = EOCD64_LOC.unpack(src.read(loc, EOCD64_LOC.size))
        if disk != 0 or disks != 1:  # miniz refuses every disk count but 1
            f("eocd", UnsupportedError(_MULTI_DISK, hint=JOIN_HINT), offset=loc,
              report=f"ZIP64 end-record locator counts {disks} disks (torch reads only 1)")
        if rec + EOCD64.size > loc:
            f("eocd", ArchiveFormatError("ZIP64 end-of-directory record offset is invalid"),
              offset=loc)
            return None
        sig, rec_size, _, _, d, cdd, n_here, n_total, cd_size, cd_off = EOCD64.unpack(
            src.read(rec, EOCD64.size))
        if sig != SIG_EOCD64:
            f("eocd", ArchiveFormatError("bad ZIP64 end-of-directory signature"), offset=rec)
            return None
        if d != 0 or cdd != 0 or n_here != n_total:
            f("eocd", UnsupportedError(_MULTI_DISK, hint=JOIN_HINT), offset=rec)
        if rec + 12 + rec_size != loc:
            f("eocd", ArchiveFormatError("data between the ZIP64 end record and its locator"),
              offset=rec)
        if cd_size > SATURATED:
            f("eocd", UnsupportedError("a central directory of 4 GiB or more (torch's reader "
                                       "refuses it too)"), offset=rec)
        return n_total, cd_size, cd_off, rec

    def _central(self, start: int, limit: int, cd_end: int, n_total: int, delta: int,
                 eocd: int) -> None:
        """The central entries in ``[start, limit)``."""
        f = self.findings
        cd = self.source.read(start, limit - start) if start < limit else b""
        pos = count = 0
        most = min(n_total, self.limits.max_archive_entries)
        members = self.members
        while pos < len(cd):
            if count >= most:
                if count >= n_total and cd[pos:pos + 4] != SIG_CENTRAL:  # bytes, no entry
                    f("gap", ArchiveFormatError(
                        f"central directory holds more entries than the {n_total} declared"),
                      offset=start + pos, report=f"{cd_end - start - pos} bytes between the "
                                                 "central directory and its end record")
                    self.loose.append((start + pos, cd_end))
                    return
                if count == n_total:
                    f("eocd", ArchiveFormatError(f"central directory holds more entries than "
                                                 f"the {n_total} declared"), offset=start + pos)
                if count >= self.limits.max_archive_entries:
                    break  # report mode: the count is over the limit, listed as such
            entry, pos = self._central_entry(cd, start, pos, delta)
            if entry is None:
                break
            members.append(entry)
            count += 1
        if count != n_total:
            f("eocd", ArchiveFormatError(
                f"end record declares {n_total} entries, central directory holds {count}"),
              offset=eocd)

    def _central_entry(self, cd: bytes, base: int, pos: int,
                       delta: int) -> tuple[Entry | None, int]:
        f = self.findings
        if pos + _CENTRAL_SIZE > len(cd):
            f("eocd", ArchiveFormatError("central directory entry cut short"), offset=base + pos)
            return None, pos
        (sig, made_by, _need, flags, method, _t, _d, crc, csize, usize, nlen, elen, clen,
         disk, _iattr, eattr, hoff) = _central(cd, pos)
        if sig != SIG_CENTRAL:
            f("eocd", ArchiveFormatError(f"bad central directory signature at byte {base + pos}"),
              offset=base + pos)
            return None, pos
        at = base + pos
        body = pos + _CENTRAL_SIZE
        end = body + nlen + elen + clen
        if end <= len(cd):
            raw_name, extra = cd[body:body + nlen], cd[body + nlen:body + nlen + elen]
        else:
            f("eocd", ArchiveFormatError("central directory entry runs past the directory"),
              offset=at)
            raw_name = self._bytes(base + body, nlen, "member name")
            extra = self._bytes(base + body + nlen, elen, "extra field")
        try:
            name = member_name(raw_name, flags)
        except CheckpointError as problem:
            name = any_name(raw_name, flags)
            f("name", problem, name, at)
        if not (flags & ~ALLOWED_FLAGS or (method != STORED and method != DEFLATED)
                or disk == 0xFFFF or csize == SATURATED or usize == SATURATED
                or hoff == SATURATED or made_by >> 8 == 3 or (method == STORED
                                                             and csize != usize)):
            # a plain entry (every torch writes): none of the checks below has a finding
            return Entry(name, method, flags, crc, csize, usize, hoff + delta,
                         is_dir=name.endswith("/"), raw_name=raw_name), end
        if flags & ~ALLOWED_FLAGS:
            bad = flags & ~ALLOWED_FLAGS
            what = "encrypted" if bad & 0x41 else f"marked with unknown flag bits 0x{bad:04x}"
            f("flags", UnsupportedError(f"archive member {name!r} is {what}; torchless reads "
                                        "only plain stored or deflated members",
                                        hint=REPACK_HINT), name, at)
        if method not in (STORED, DEFLATED):
            f("method", UnsupportedError(
                f"archive member {name!r} uses compression method {method} "
                "(only stored and deflate are supported)", hint=REPACK_HINT), name, at)
        if disk == 0xFFFF:  # a ZIP64 disk number: miniz refuses it as multi-disk
            f("header", UnsupportedError(f"archive member {name!r} lies on another disk of a "
                                         "split archive", hint=JOIN_HINT), name, at)
        if SATURATED in (csize, usize, hoff):
            (usize, csize, hoff), wrong = zip64_values(extra, usize, csize, hoff, name)
            if wrong is not None:
                f("header", wrong, name, at)
        if (made_by >> 8) == 3 and (eattr >> 16) & 0o170000 == 0o120000:
            f("link", UnsafePathError(f"archive member {name!r} is a symbolic link"), name, at)
        if method == STORED and csize != usize:
            f("header", ArchiveFormatError(
                f"stored member {name!r} declares {csize} compressed but {usize} bytes"),
              name, at)
        return Entry(name, method, flags, crc, csize, usize, hoff + delta,
                     is_dir=name.endswith("/"), raw_name=raw_name), end
