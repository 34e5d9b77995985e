"""Builders of parser-differential files: bytes that torch's parsers (miniz for ZIP archives,
``tarfile`` for TAR archives, tried before the legacy stream) read one way and other readers
another. Standard library only; the tests load each with torch as the oracle."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile

from tests._fuzz_inputs import ZipMember, make_zip, tar_checkpoint, zip_checkpoint

#: A pickle whose object is a call of ``posix.system`` (only ever scanned, never loaded).
PAYLOAD = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."


def obj(who: str) -> bytes:
    return pickle.dumps({"who": who}, protocol=2)


def eocd_in_comment(outer: bytes, inner: bytes) -> bytes:
    """The archive ``outer`` whose end-record comment holds the whole archive ``inner``
    (its members, its directory and its end record, offsets moved) and five more bytes:
    the last end-record signature is ``inner``'s, the record whose comment ends the file is
    ``outer``'s."""
    at = outer.rfind(b"PK\x05\x06")
    base = at + 22
    _, _, _, n, _, cd_size, cd_off, _ = struct.unpack("<4sHHHHIIH", inner[-22:])
    cd = bytearray(inner[cd_off:cd_off + cd_size])
    pos = 0
    while pos < len(cd):
        nlen, elen, clen = struct.unpack_from("<HHH", cd, pos + 28)
        struct.pack_into("<I", cd, pos + 42, struct.unpack_from("<I", cd, pos + 42)[0] + base)
        pos += 46 + nlen + elen + clen
    comment = (inner[:cd_off] + bytes(cd) + struct.pack(
        "<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, cd_size, base + cd_off, 0) + b"tail!")
    record = bytearray(outer[at:at + 22])
    struct.pack_into("<H", record, 20, len(comment))
    return outer[:at] + bytes(record) + comment


def zip_members(*pickles: tuple[str, bytes]) -> bytes:
    """A torch ZIP archive with the given object pickles (names under ``archive/``)."""
    return make_zip([*(ZipMember(f"archive/{n}", p) for n, p in pickles),
                     ZipMember("archive/version", b"3\n")])


def tar_header(name: bytes, size: int, kind: bytes = b"0", magic: bytes = b"") -> bytes:
    """One TAR header block (pre-POSIX when ``magic`` is empty), checksum filled in."""
    h = bytearray(512)
    h[:len(name)] = name
    h[100:108] = b"0000644\x00"
    h[108:116] = h[116:124] = b"0000000\x00"
    h[124:136] = b"%011o\x00" % size
    h[136:148] = b"00000000000\x00"
    h[156:157] = kind
    h[257:257 + len(magic)] = magic
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h)


def stream_then_tar(prefix: bytes, rest: bytes, archive: bytes) -> bytes:
    """A pickle stream that is also a TAR archive: ``prefix`` (opcodes), a BINSTRING that
    swallows the rest of the first 512-byte block, which is a TAR header whose member holds
    ``rest`` (the stream goes on: POP, then more opcodes); then the members of the TAR
    archive ``archive``, which torch reads instead."""
    head = prefix + b"T" + (512 - len(prefix) - 5).to_bytes(4, "little")
    body = rest + b"\0" * (-len(rest) % 512)
    return tar_header(head, len(rest)) + body + archive


def pickle_tar(archive: bytes | None = None) -> bytes:
    """A plain pickle ({"who": "pickle"}) that is also a TAR checkpoint."""
    return stream_then_tar(b"\x80\x02", b"0" + obj("pickle")[2:], archive or tar_checkpoint())


def legacy_tar(legacy: bytes, archive: bytes | None = None) -> bytes:
    """A legacy stream (from ``torch.save(..., _use_new_zipfile_serialization=False)``)
    that is also a TAR checkpoint: its magic-number pickle swallows the TAR header."""
    assert legacy[:4] == b"\x80\x02\x8a\x0a" and legacy[14:15] == b"."
    return stream_then_tar(legacy[:14], b"0." + legacy[15:], archive or tar_checkpoint())


def gnu_long_name(name: bytes) -> bytes:
    """A GNU long-name header and its data: the next member is called ``name``."""
    data = name + b"\0"
    return (tar_header(b"././@LongLink", len(data), b"L", b"ustar  \0")
            + data + b"\0" * (-len(data) % 512))


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()}


def tar_of(members: list[tuple[str, bytes, dict[str, str]]], *,
           glob: dict[str, str] | None = None, at: int = 0,
           fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A TAR archive of the members (name, bytes, PAX records); with ``glob``, a PAX global
    header before member ``at``."""
    out = io.BytesIO()
    for i, (name, raw, pax) in enumerate(members):
        if glob is not None and i == at:
            out.write(tarfile.TarInfo.create_pax_global_header(glob))
        info = tarfile.TarInfo(name)
        info.size = len(raw)
        info.pax_headers = pax
        out.write(info.tobuf(fmt, "utf-8", "surrogateescape"))
        out.write(raw + b"\0" * (-len(raw) % 512))
    out.write(b"\0" * 1024)
    return out.getvalue()


def v7(archive: bytes) -> bytes:
    """``archive`` with every header rewritten pre-POSIX (no ustar magic, version, owner
    names), as old tar programs wrote them: tarfile still reads it."""
    out = bytearray(archive)
    pos = 0
    while pos + 512 <= len(out) and out[pos:pos + 512].count(0) != 512:
        h = out[pos:pos + 512]
        size = int(h[124:136].split(b"\0")[0] or b"0", 8)
        h[257:345] = bytes(88)
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\x00 " % sum(h)
        out[pos:pos + 512] = h
        pos += 512 + (size + 511) // 512 * 512
    return bytes(out)


__all__ = ["PAYLOAD", "eocd_in_comment", "gnu_long_name", "legacy_tar", "obj", "pickle_tar",
           "stream_then_tar", "tar_header", "tar_members", "tar_of", "v7", "zip_checkpoint",
           "zip_members"]
