"""Where each member of a ZIP archive lies, for :class:`~.ziparchive.ZipArchive`: its local
header against its central entry, its data descriptor, and the tiling of members (from byte
0 to the central directory, no overlap, no byte that is no member's). In report mode also the
local headers that no central entry lists (what a streaming unzip would see), and the byte
ranges that no member owns. Each check is a finding: raised in strict mode, recorded in
report mode (:mod:`torchless.core.findings`).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable

from torchless.containers.zipformat import (
    ALLOWED_FLAGS,
    FLAG_DESCRIPTOR,
    LOCAL,
    SATURATED,
    SIG_DESCRIPTOR,
    SIG_LOCAL,
    Entry,
    any_name,
    descriptor_is_zip64,
    zip64_field,
)
from torchless.core.findings import Findings
from torchless.errors import AmbiguousArchiveError, ArchiveFormatError
from torchless.io.source import Source

__all__ = ["MemberLayout"]

#: Bytes read at a time for local headers and data descriptors.
_WINDOW = 4 << 10
#: Most bytes one read-ahead block spans when it covers the headers of the members that
#: follow (a run of neighbouring members, one ``pread``).
_SPAN = 256 << 10
#: Widest mean spacing of the headers a block covers: past it a block per header copies
#: fewer bytes than the system calls it saves cost (a ``pread`` costs about as much as
#: copying 16 KiB).
_DENSE = 16 << 10
_LOCAL_SIZE = LOCAL.size
_local = LOCAL.unpack_from
_DESCRIPTOR = struct.Struct("<III")  # crc, compressed size, size
_DESCRIPTOR64 = struct.Struct("<IQQ")
_field = struct.Struct("<HH").unpack_from  # an extra field's tag and size
_PADDING = 0x4246  # "FB": the field torch's writer pads a member's data to 64 bytes with


class MemberLayout:
    """The local-header half of :class:`~.ziparchive.ZipArchive`."""

    source: Source
    findings: Findings
    entries: dict[str, Entry]
    members: list[Entry]
    loose: list[tuple[int, int]]
    _cd_start: int
    _order: list[Entry]
    _rank: dict[int, int]

    #: ``n`` bytes at ``offset``: :meth:`Source.read` in strict mode (past the end of the
    #: file an error), :meth:`_clipped` in report mode.
    _bytes: Callable[[int, int, str], bytes]

    _window_at = -1
    _window = b""
    #: Where the members' local headers start, in order: what a read-ahead block covers.
    _starts: list[int] = []

    def _header(self, offset: int, n: int, what: str) -> bytes:
        """``n`` bytes of a local header or data descriptor. The members of a file of many
        small tensors lie a few hundred bytes apart: the bytes come from a block of
        :data:`_WINDOW` read ahead with one ``pread``, not one system call each (a remote
        file: the bytes alone, one range request each)."""
        if self._cover(offset, n, what):
            i = offset - self._window_at
            return self._window[i:i + n]
        return self._bytes(offset, n, what)

    def _cover(self, offset: int, n: int, what: str) -> bool:
        """Whether the read-ahead block now holds the ``n`` bytes at ``offset`` (read anew
        if it did not); False for a remote file, or bytes that are not all in the file."""
        at = self._window_at
        if at <= offset and offset + n <= at + len(self._window):
            return True
        size = self.source.size
        if self.source.remote or offset < 0 or offset + n > size:
            return False
        self._window = self.source.read(offset, min(size - offset, max(n, self._ahead(offset))),
                                        what)
        self._window_at = offset
        return True

    def _ahead(self, offset: int) -> int:
        """How many bytes to read at ``offset``: :data:`_WINDOW`, or, where the local headers
        of the next members lie close together (tensors of a few KiB each), up to the block
        of :data:`_WINDOW` at the last of them within :data:`_SPAN`, so that one ``pread``
        covers the run (a file of 30,000 tensors of 11 KiB made one call per member)."""
        starts = self._starts
        k = bisect_right(starts, offset)
        j = bisect_right(starts, offset + _SPAN - _WINDOW, k)
        if j > k and starts[j - 1] - offset <= (j - k) * _DENSE:
            return starts[j - 1] - offset + _WINDOW
        return _WINDOW

    def _clipped(self, offset: int, n: int, what: str) -> bytes:
        """As many of the ``n`` bytes at ``offset`` as the file holds."""
        offset = min(max(0, offset), self.source.size)
        return self.source.read(offset, max(0, min(n, self.source.size - offset)), what)

    def _tile(self, ordered: list[Entry], cursor: int, stop: int | None) -> None:
        """Members (by offset) must tile the archive's data from ``cursor``: each starts
        where the one before it ends (none overlap, no byte between them is no member's),
        and the last ends at ``stop``, where the central directory starts. A member whose
        local header is not read yet (a remote one) counts by the least it can take; the
        bytes after it are checked when it is read."""
        before: Entry | None = None
        for e in ordered:
            if e.header_offset < cursor:
                self.findings("overlap", AmbiguousArchiveError(
                    f"archive members {before.name if before else '?'!r} and {e.name!r} "
                    "overlap"), e.name, e.header_offset)
            elif e.header_offset > cursor and (before is None or before.located):
                self._unowned(cursor, e.header_offset, before, e)
            end = e.end_offset if e.located else e.least_end()
            if end > cursor:
                cursor = end
            before = e
        if stop is not None and cursor < stop and (before is None or before.located):
            self._unowned(cursor, stop, before, None)

    def _unowned(self, lo: int, hi: int, before: Entry | None, after: Entry | None) -> None:
        if lo == 0:
            error = AmbiguousArchiveError(f"{hi} bytes of data before the first archive member")
        elif after is None or before is None:
            error = AmbiguousArchiveError("unaccounted bytes between the last archive member "
                                          "and the central directory")
        else:
            error = AmbiguousArchiveError(f"{hi - lo} unaccounted bytes between archive "
                                          f"members {before.name!r} and {after.name!r}")
        what = "before the first member" if lo == 0 else "that no entry owns"
        self.findings("prefix" if lo == 0 else "gap", error, offset=lo,
                      report=f"{hi - lo} bytes {what} at offset {lo}")
        self.loose.append((lo, hi))
        self._hidden(lo, hi)

    def _located(self, name: str) -> Entry:
        e = self.entries[name]
        if not e.located and not e.is_dir:
            self._check_local(e)
            i = self._rank.get(id(e))
            if i is not None:
                last = i + 1 == len(self._order)
                self._tile(self._order[i:i + 2], e.header_offset,
                           self._cd_start if last else None)
        return e

    def _check_local(self, e: Entry) -> None:
        """One member's local header against its central entry; sets where its data is."""
        if not self._plain_local(e):
            self._check_local_fully(e)

    def _plain_local(self, e: Entry) -> bool:
        """The common case of :meth:`_check_local_fully`, read in place from the read-ahead
        block: a local header that repeats its central entry exactly (flags, method, name,
        and CRC and sizes or a descriptor's zeros), its data inside the archive data, and a
        data descriptor, if any, that agrees. Then every check of the full path passes, and
        this sets what it sets; on anything else (nothing is changed) False, and the full
        path decides. A file of 30,000 small tensors spent a quarter of its open here."""
        h = e.header_offset
        raw = e.raw_name
        limit = self._cd_start
        need = _LOCAL_SIZE + len(raw)
        if h + _LOCAL_SIZE > limit:
            return False
        at, win = self._window_at, self._window
        if not (at <= h and h + need <= at + len(win)):  # self._cover, inlined for a hit
            if not self._cover(h, need, "local header"):
                return False
            at, win = self._window_at, self._window
        i = h - at
        (sig, _need, flags, method, _t, _d, crc, csize, usize, nlen, elen) = _local(win, i)
        if sig != SIG_LOCAL or nlen != len(raw) or flags != e.flags or method != e.method \
                or flags & ~ALLOWED_FLAGS or not win.startswith(raw, i + _LOCAL_SIZE):
            return False
        descriptor = flags & FLAG_DESCRIPTOR
        if (crc or csize or usize or not descriptor) and (
                crc != e.crc or csize != e.compressed_size or usize != e.size):
            return False
        data = h + need + elen
        end = data + e.compressed_size
        if end > limit:
            return False
        if descriptor:
            n = max(0, min(24, limit - end))
            extra = h + need  # the extra field
            if not (at <= extra and extra + elen <= at + len(win)):
                if not self._cover(extra, elen, "local extra field"):
                    return False
                at, win = self._window_at, self._window
            j = extra - at
            if elen >= 4 and _field(win, j) == (_PADDING, elen - 4):
                local_zip64 = False  # one field, torch's alignment padding
            else:
                try:
                    local_zip64 = zip64_field(win[j:j + elen]) is not None
                except ValueError:
                    return False
            if not self._cover(end, n, "data descriptor"):
                return False
            win = self._window
            k = end - self._window_at
            if n >= 4 and win.startswith(SIG_DESCRIPTOR, k):
                k, n, end = k + 4, n - 4, end + 4
            form = _DESCRIPTOR64 if local_zip64 or e.size >= SATURATED or \
                e.compressed_size >= SATURATED else _DESCRIPTOR  # descriptor_is_zip64
            if n < form.size or form.unpack_from(win, k) != (e.crc, e.compressed_size, e.size):
                return False
            end += form.size
        e.data_offset = data
        e.end_offset = end
        e.located = True
        return True

    def _check_local_fully(self, e: Entry) -> None:
        """:meth:`_check_local` with every finding."""
        src, f = self.source, self.findings
        limit = self._cd_start
        h = e.header_offset
        if h + LOCAL.size > limit:
            f("bounds", ArchiveFormatError(f"member {e.name!r}: local header offset {h} lies "
                                           "outside the archive data"), e.name, h)
            if h + LOCAL.size > src.size:
                return
        # the header and the name it should hold, in one read (clipped to the file)
        head = self._header(h, min(LOCAL.size + len(e.raw_name), src.size - h), "local header")
        (sig, _need, flags, method, _t, _d, crc, csize, usize, nlen, elen) = LOCAL.unpack_from(
            head)
        if sig != SIG_LOCAL:
            f("header", ArchiveFormatError(f"member {e.name!r}: bad local header signature"),
              e.name, h)
            return
        raw_name = head[LOCAL.size:] if nlen == len(head) - LOCAL.size else \
            self._bytes(h + LOCAL.size, nlen, "local header name")
        if raw_name != e.raw_name:
            f("header", AmbiguousArchiveError(
                f"member {e.name!r}: local header names it {raw_name[:60]!r}"), e.name, h)
        if method != e.method:
            f("header", AmbiguousArchiveError(
                f"member {e.name!r}: local header says method {method}, central "
                f"directory says {e.method}"), e.name, h)
        bad = flags & ~ALLOWED_FLAGS
        if (flags ^ e.flags) & FLAG_DESCRIPTOR or (bad and bad != e.flags & ~ALLOWED_FLAGS):
            f("flags" if bad else "header", AmbiguousArchiveError(
                f"member {e.name!r}: local and central flags differ"), e.name, h)
        if not flags & FLAG_DESCRIPTOR or crc or csize or usize:
            if crc != e.crc:
                f("header", AmbiguousArchiveError(
                    f"member {e.name!r}: local header CRC differs from the central one"),
                  e.name, h)
            if (csize, usize) != (e.compressed_size, e.size) and \
                    (csize, usize) != (SATURATED, SATURATED):
                f("header", AmbiguousArchiveError(
                    f"member {e.name!r}: local header sizes differ from the central ones"),
                  e.name, h)
        e.data_offset = h + LOCAL.size + nlen + elen
        e.end_offset = e.data_offset + e.compressed_size
        if e.end_offset > limit:
            f("bounds", ArchiveFormatError(
                f"member {e.name!r}: {e.compressed_size} bytes of data at offset "
                f"{e.data_offset} run past the archive data"), e.name, e.data_offset)
            if e.end_offset > src.size:
                e.end_offset = src.size
                return
        if flags & FLAG_DESCRIPTOR:
            extra = self._header(h + LOCAL.size + nlen, elen, "local extra field")
            try:
                local_zip64 = zip64_field(extra) is not None
            except ValueError as err:
                f("header", ArchiveFormatError(f"member {e.name!r}: local header: {err}"),
                  e.name, h)
                local_zip64 = False
            e.end_offset = self._descriptor(e, limit, local_zip64)
        e.located = True

    def _descriptor(self, e: Entry, limit: int, local_zip64: bool) -> int:
        """Where the data descriptor after a member's data ends, checked against the
        central entry (its width: :func:`.zipformat.descriptor_is_zip64`)."""
        pos = e.end_offset
        head = self._header(pos, max(0, min(24, limit - pos)), "data descriptor")
        if head[:4] == SIG_DESCRIPTOR:
            head, pos = head[4:], pos + 4
        fmt = "<IQQ" if descriptor_is_zip64(local_zip64, e) else "<III"
        need = struct.calcsize(fmt)
        if len(head) < need:
            self.findings("descriptor", ArchiveFormatError(
                f"member {e.name!r}: data descriptor cut short"), e.name, pos)
            return e.end_offset
        if struct.unpack_from(fmt, head) != (e.crc, e.compressed_size, e.size):
            self.findings("descriptor", AmbiguousArchiveError(
                f"member {e.name!r}: data descriptor disagrees with the central directory"),
                e.name, pos)
        return pos + need

    def _hidden(self, lo: int, hi: int) -> None:
        """Local headers inside bytes no central entry owns (report mode: strict mode has
        refused those bytes already): a reader walking local headers (a streaming unzip)
        sees members the central directory hides. Each becomes a member, ``listed`` false,
        its data up to its descriptor or the end of the region."""
        buf = self.source.raw
        pos = lo
        while True:
            pos = buf.find(SIG_LOCAL, pos, hi)
            if pos < 0 or pos + LOCAL.size > hi:
                return
            (_, _, flags, method, _, _, crc, csize, usize, nlen, elen) = LOCAL.unpack(
                buf[pos:pos + LOCAL.size])
            data = pos + LOCAL.size + nlen + elen
            if data <= hi:
                raw_name = bytes(buf[pos + LOCAL.size:pos + LOCAL.size + nlen])
                name = any_name(raw_name, flags)
                if not csize and flags & FLAG_DESCRIPTOR:  # sizes only in the descriptor
                    desc = buf.find(SIG_DESCRIPTOR, data, hi)
                    csize = (desc if desc >= 0 else hi) - data
                    usize = int.from_bytes(buf[desc + 12:desc + 16], "little") \
                        if desc >= 0 and desc + 16 <= hi else csize if method == 0 else 1 << 62
                self.findings.note("hidden", f"local header for {name!r} that the central "
                                   "directory does not list", name, pos)
                self.members.append(Entry(
                    name, method, flags, crc, min(csize, hi - data), usize, pos,
                    data_offset=data, end_offset=min(data + csize, hi), raw_name=raw_name,
                    listed=False, located=True))
            pos += 4
