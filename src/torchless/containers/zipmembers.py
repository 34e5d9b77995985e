"""A ZIP member's bytes: stored ones as views of the file map, deflated ones inflated with
the output bounded by the declared size, whole (:meth:`MemberReader.data`), block by block
(:meth:`MemberReader.iter_member`) or, for the scanner, the first bytes of any member that
can be read at all, never raising (:meth:`MemberReader.head`)."""

from __future__ import annotations

import zlib
from collections.abc import Generator, Iterator

from torchless.containers.zipformat import DEFLATED, STORED, Entry
from torchless.core.limits import Limits
from torchless.errors import ArchiveFormatError, ChecksumError, LimitError, TruncatedInputError
from torchless.io.source import Source

__all__ = ["MemberReader"]

_RATIO_FLOOR = 64 << 20
#: Compressed bytes fed to the inflater at a time when streaming a member.
_INFLATE_INPUT = 1 << 20


class MemberReader:
    """The member-reading half of :class:`~.ziparchive.ZipArchive`."""

    source: Source
    limits: Limits
    entries: dict[str, Entry]

    def _located(self, name: str) -> Entry:  # pragma: no cover - ZipArchive defines it
        raise NotImplementedError

    def data(self, name: str, *, check_crc: bool) -> memoryview | bytes:
        """A member's bytes: a view of the map if stored, inflated bytes if deflated."""
        e = self._located(name)
        raw = self.source.view(e.data_offset, e.compressed_size, name)
        if e.method == STORED:
            out: memoryview | bytes = raw
        else:
            out = self._inflate(e, raw)
        if check_crc and zlib.crc32(out) != e.crc:
            raise ChecksumError(f"CRC-32 of member {name!r} does not match its bytes")
        return out

    def copy(self, name: str, *, check_crc: bool) -> bytes:
        """A member's bytes as a copy read with ``pread`` (a record or the pickle, not a
        tensor): opening never faults the file's map in around them (see
        :mod:`torchless.io.source`)."""
        e = self._located(name)
        raw = self.source.read(e.data_offset, e.compressed_size, name)
        out = raw if e.method == STORED else self._inflate(e, memoryview(raw))
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
        return self.entries[name].method == DEFLATED

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
        if e.method == STORED:
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

    def head(self, e: Entry, cap: int) -> tuple[bytes | None, str | None]:
        """The first ``cap`` bytes of a member (all of them if fewer) as far as the file
        holds them, or None and why they cannot be had; never raises. Reads and inflates
        only what it returns (plus one input block). For the scanner, which must look into
        members the reader refuses: one whose data runs past the file is read up to its
        end, one found only by its local header up to where its data seems to end."""
        if e.data_offset < 0:
            return None, "its local header could not be read"
        end = min(self.source.size, e.end_offset if not e.listed else
                  e.data_offset + e.compressed_size)
        buf = self.source.buffer
        if e.method == STORED:
            return bytes(buf[e.data_offset:min(end, e.data_offset + cap)]), None
        if e.method != DEFLATED:
            return None, f"compression method {e.method} is not stored or deflate"
        d = zlib.decompressobj(-15)
        out = bytearray()
        pos = e.data_offset
        try:
            while len(out) < cap and not d.eof:
                chunk = d.unconsumed_tail or bytes(buf[pos:min(end, pos + _INFLATE_INPUT)])
                if not d.unconsumed_tail:
                    pos += len(chunk)
                if not chunk:
                    break
                out += d.decompress(chunk, cap - len(out))
        except zlib.error as err:
            return None, f"corrupt deflate data ({err})"
        return bytes(out), None
