"""What a file's first bytes say: the sniffs of torch's layouts (the container registry tries
them in order), the known formats that are not checkpoints, and a ZIP archive's end record at
the end of a file (a polyglot's mark)."""

from __future__ import annotations

from torchless.errors import AmbiguousArchiveError, NotACheckpointError, TruncatedInputError
from torchless.io.source import Source

__all__ = ["LEGACY_MAGIC", "ZIP_EOCD_SIG", "ZIP_EOCD_SIZE", "ZIP_MAX_COMMENT", "has_zip_tail",
           "head_of", "is_legacy", "is_pickle", "is_tar", "is_zip", "refuse_other_formats",
           "refuse_unrecognised", "starts_as_json_object", "tar_checksum", "tar_number",
           "tar_polyglot", "zip_end_records"]

#: The magic number torch's legacy stream starts with (as a pickled int).
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_BINARY = b"\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")
_LEGACY_TEXT = b"L" + str(LEGACY_MAGIC).encode() + b"L\n"


_OTHER_FORMATS: tuple[tuple[int, bytes, str], ...] = (
    (0, b"GGUF", "a GGUF model file (llama.cpp), not a torch checkpoint"),
    (0, b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras .h5?), not a torch checkpoint"),
    (0, b"\x93NUMPY", "a NumPy .npy array file, not a torch checkpoint"),
    (0, b"\x1f\x8b", "a gzip-compressed file; decompress it first if it holds a checkpoint"),
    (0, b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive, not a torch checkpoint"),
    (0, b"BZh", "a bzip2-compressed file, not a torch checkpoint"),
    (0, b"\xfd7zXZ\x00", "an xz-compressed file, not a torch checkpoint"),
    (0, b"\x28\xb5\x2f\xfd", "a zstd-compressed file, not a torch checkpoint"),
    (0, b"\x89PNG\r\n\x1a\n", "a PNG image, not a torch checkpoint"),
    (0, b"\xff\xd8\xff", "a JPEG image, not a torch checkpoint"),
    (0, b"version https://git-lfs", "a Git LFS pointer file: the real checkpoint was never "
                                    "downloaded (run `git lfs pull`)"),
    (0, b"Rar!", "a RAR archive, not a torch checkpoint"),
    (0, b"PK\x05\x06", "an empty ZIP archive (no members), not a torch checkpoint"),
)


def looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 10:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def starts_as_json_object(head: bytes) -> bool:
    """Whether a file's first bytes start as a JSON object does (whitespace, then ``{``):
    what an index file (``*.index.json``) must start with."""
    return head.lstrip()[:1] == b"{"


def _looks_like_text(head: bytes) -> str | None:
    stripped = head.lstrip().lower()
    if stripped.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")):
        return ("an HTML/XML page (a download that returned an error or login page?), "
                "not a torch checkpoint")
    if stripped.startswith((b"{", b"[")) and b"\x00" not in head:
        return "a JSON text file, not a torch checkpoint"
    return None


#: A ZIP end-of-central-directory record: its signature, its size before the comment, and
#: the longest comment it can declare (so it lies in the last 22 + 65,535 bytes).
ZIP_EOCD_SIG = b"PK\x05\x06"
ZIP_EOCD_SIZE = 22
ZIP_MAX_COMMENT = 0xFFFF


def zip_end_records(source: Source) -> tuple[list[int], list[int]]:
    """Where ZIP end-of-directory records could start: every signature with room for the
    record before the end of the file, last first, and those of them whose declared comment
    ends exactly at the end of the file (the ones a ZIP reader takes). The one search of a
    file's tail, for the layout sniffers, the ZIP reader and the scanner alike (kept on the
    source: each of them asks)."""
    known = source.zip_ends if isinstance(source, Source) else None  # a Window has none
    if known is not None:
        return list(known[0]), list(known[1])
    size = source.size
    if size < ZIP_EOCD_SIZE:
        return [], []
    lo = max(0, size - ZIP_EOCD_SIZE - ZIP_MAX_COMMENT)
    tail = source.read(lo, size - lo, "file tail")
    found: list[int] = []
    exact: list[int] = []
    i = len(tail) - ZIP_EOCD_SIZE
    while i >= 0:
        i = tail.rfind(ZIP_EOCD_SIG, 0, i + 4)
        if i < 0:
            break
        found.append(lo + i)
        if i + ZIP_EOCD_SIZE + int.from_bytes(tail[i + 20:i + 22], "little") == len(tail):
            exact.append(lo + i)
        i -= 1
    if isinstance(source, Source):
        source.zip_ends = (tuple(found), tuple(exact))
    return found, exact


def has_zip_tail(source: Source) -> bool:
    """True if a ZIP end-of-directory record ends exactly at the end of the file."""
    return bool(zip_end_records(source)[1])


def is_zip(head: bytes, size: int) -> bool:
    return head.startswith(b"PK\x03\x04")


def is_legacy(head: bytes, size: int) -> bool:
    """The legacy stream's magic number, pickled in binary (protocols 2+) or as text."""
    if head.startswith(b"\x80") and len(head) >= 2 and head[1] >= 2:
        body = head[2:]
        if body[:1] == b"\x95":  # protocol 4+ opens with a FRAME
            body = body[9:]
        if body.startswith(_LEGACY_BINARY):
            return True
    return head.startswith(_LEGACY_TEXT)


def tar_number(field: bytes) -> int | None:
    """A numeric TAR header field read exactly as :mod:`tarfile` reads it (base-256 after a
    0x80/0xFF byte, else text up to the first NUL, stripped, as an octal int), or None
    where :mod:`tarfile` finds the header invalid."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[:1] == b"\xff" else n
    try:
        return int(field.split(b"\x00", 1)[0].decode("ascii").strip() or "0", 8)
    except ValueError:
        return None


_LOW = bytes(range(128))


def tar_checksum(header: bytes) -> bool:
    """Whether a 512-byte block's checksum field matches the block, summed unsigned or
    signed (both are accepted by :mod:`tarfile`, as by GNU tar)."""
    stored = tar_number(header[148:156])
    if stored is None:
        return False
    rest = header[:148] + header[156:512]
    unsigned = 256 + sum(rest)
    # signed: each byte above 127 counts 256 less (the bytes that delete() keeps)
    return stored == unsigned or stored == unsigned - 256 * len(rest.translate(None, _LOW))


def is_tar(head: bytes, size: int) -> bool:
    """A TAR archive as torch's legacy loader tests it, by opening it with :mod:`tarfile`:
    the first block is a header whose checksum matches and whose numeric fields read, with
    or without the ustar magic (pre-POSIX and GNU headers are accepted as well). torch
    tries this before reading a file as a legacy stream or a pickle, so a pickle can also
    be a TAR archive that torch reads instead."""
    if len(head) < 512 or head[:512].count(0) == 512:
        return False
    header = head[:512]
    fields = [(100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337),
              (337, 345)]
    if header[156:157] == b"S":  # GNU sparse: tarfile reads its map from the header too
        fields += [(a, a + 12) for a in range(386, 482, 12)] + [(483, 495)]
    return tar_checksum(header) and all(tar_number(header[a:b]) is not None
                                        for a, b in fields)


def tar_polyglot(head: bytes, size: int) -> str | None:
    """What else a file that :mod:`tarfile` opens starts as (a ZIP archive, a legacy stream,
    a pickle), or None. torch tries ZIP first, then TAR, then the legacy stream, so in each
    case torch and another reader load different content."""
    if not is_tar(head, size):
        return None
    if is_zip(head, size):
        return "a ZIP archive"
    if is_legacy(head, size):
        return "a legacy torch stream"
    if is_pickle(head, size):
        return "a pickle"
    return None


def is_pickle(head: bytes, size: int) -> bool:
    """A pickle's first opcode (tried after every other format was ruled out)."""
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return True
    return head[:1] != b"" and head[:1] in b"(]}cNIJKLMFSTUVXG\x8a"


def refuse_other_formats(head: bytes, size: int) -> None:
    """Name what the file is when it is a known non-checkpoint format (GGUF, safetensors,
    an image, a compressed file, an HTML error page …)."""
    for offset, magic, what in _OTHER_FORMATS:
        if head[offset:offset + len(magic)] == magic:
            raise NotACheckpointError(f"this is {what}")
    if looks_like_safetensors(head, size):
        raise NotACheckpointError(
            "this is a safetensors file, not a torch checkpoint; read it with "
            "torchless.load() or the safetensors package")
    text = _looks_like_text(head)
    if text:
        raise NotACheckpointError(f"this is {text}")


def refuse_unrecognised(source: Source, head: bytes) -> None:
    if head[:1] == b"\x08" and b"onnx" in head.lower():
        raise NotACheckpointError("this looks like an ONNX model, not a torch checkpoint")
    if has_zip_tail(source):
        raise AmbiguousArchiveError(
            "a ZIP archive with other data before it (torch needs the archive at offset 0)")
    raise NotACheckpointError(
        f"not a checkpoint: an unrecognised file (starts with {head[:8].hex()}), none of "
        "the formats torch.load reads (ZIP, TAR, legacy stream, pickle)",
        hint="check that you passed the right file (a partial or failed download is a "
             "common cause)")


def head_of(source: Source) -> bytes:
    if source.size == 0:
        raise TruncatedInputError("the file is empty")
    return bytes(source.read(0, min(source.size, 512), "file header"))
