"""The safetensors format: a streaming, atomic writer and a minimal header reader.

File layout (https://github.com/huggingface/safetensors, "Format")::

    offset 0      u64 little-endian N: the header length in bytes
    offset 8      N bytes of UTF-8 JSON, padded with spaces (0x20) to a multiple of 8
    offset 8+N    the data section: every tensor's bytes, contiguous, row-major,
                  little-endian, with no holes and no overlaps

The header is one JSON object: ``"__metadata__"`` (str -> str) and, per tensor,
``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` with offsets
relative to the data section.

Layout choices, taken from the ``safetensors`` package itself so that its output and ours
agree on everything but the ``__metadata__`` key order (which it leaves to a hash map):

* tensors are ordered by dtype, widest alignment first in the package's own dtype order
  (:data:`_DTYPE_RANK`), then by name (code point order, which is UTF-8 byte order); the
  header lists them in that same data order;
* compact JSON (no spaces), non-ASCII characters written as UTF-8, keys of ``__metadata__``
  sorted (so two conversions of one file are byte-identical);
* header padded with spaces to a multiple of 8, the data section starting right after it.

The bytes go out in the fewest system calls, and memory stays bounded whatever the model
size. A contiguous little-endian tensor whose bytes lie in the source file (a stored ZIP
member, a legacy storage) is copied by the kernel (``os.copy_file_range``, else
``os.sendfile``: :data:`.stream.KERNEL_COPY`) straight from the file when it is at least
:data:`.stream.KERNEL_MIN_BYTES`, tensors adjacent in the file joined into one call; its pages never
enter the process. Smaller ones are gathered into one buffer of :data:`.stream.GATHER_BYTES`
and written together (one system call per tensor costs more than the copy): read into it with
``os.preadv`` where their place in the file is known (pieces that follow each other in the
file, ZIP headers between them, in one call: :data:`.stream.READ_GAP_BYTES`), else copied from
the source's map, its pages handed back every :data:`.stream.RELEASE_BYTES`. Measured on ext4 with
``benchmarks/copy_methods.py --sync`` (medians of 3 on a shared machine): writes from the map
took 0.70x ``copy_file_range``'s time at 512 MiB but 5.4x at 2 GiB (and 1.47x ``cp`` at 8 GiB
in issue 16), ``sendfile`` within 7 % of ``copy_file_range``; for 11,200-byte pieces,
gathering took half the CPU time of one ``sendfile`` each (0.10 s against 0.20 s for 20,000),
the same wall time once fsynced. Where the kernel will not copy
between the two files, the runs are written from the map in blocks of
:data:`.stream.COPY_BLOCK_BYTES`, releasing pages behind. A contiguous little-endian tensor whose
storage is a deflated ZIP member is inflated and written in blocks of at most
:data:`INFLATE_CHUNK_BYTES` (the storage is not kept in memory); any other tensor is made
contiguous and little-endian in chunks of at most :data:`CHUNK_BYTES`. The header goes
first, then the data, then one ``fsync``; every :data:`.stream.WRITEBACK_BYTES` written the
kernel is asked to start writing them to the disk, so that the ``fsync`` waits for little.

Writing is atomic (:mod:`._atomic`): the bytes go to an unnamed file in DST's directory
(``O_TMPFILE``; elsewhere a hidden ``.<name>.<random>.tmp``), are flushed, and only then get
DST's name; without ``force`` an existing file is never replaced. Any error,
``KeyboardInterrupt`` included, leaves no file behind and DST as it was.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchless.core import jsondepth as _json
from torchless.core.limits import Limits
from torchless.errors import ConversionError, FormatError, InvalidKeyError, UnsupportedError
from torchless.model.chunks import chunks, is_plain
from torchless.model.tensor import Tensor
from torchless.write import atomic as _atomic
from torchless.write import stream as _stream
from torchless.write.digest import Digests
from torchless.write.stream import Progress, Release

__all__ = ["MAX_HEADER_BYTES", "Planned", "Progress", "SafetensorsHeader", "check_name", "plan",
           "read_header", "write_atomic", "write_into"]

#: The safetensors package refuses headers larger than this (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000
#: torch's sizes are int64; NumPy's arrays have at most 64 dimensions (``Limits.max_ndim``).
_INT64_MAX = (1 << 63) - 1
_MAX_NDIM = 64
#: The safetensors ``Dtype`` enum order; data is laid out highest rank first.
_DTYPE_RANK = {name: i for i, name in enumerate((
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"))}
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
             "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
             "C64": 8, "F64": 8, "I64": 8, "U64": 8}

#: The absolute offset of a tensor's bytes in the open source file, or None.
FileOffset = Callable[[Tensor], int | None]


def check_name(name: str) -> bytes:
    """The name as UTF-8, or :class:`InvalidKeyError` if safetensors cannot hold it."""
    if name == "__metadata__":
        raise InvalidKeyError("the name '__metadata__' is reserved by safetensors",
                              member=name)
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKeyError(f"tensor name {name!r} is not valid Unicode (lone surrogate)",
                              member=name.encode("utf-8", "backslashreplace").decode()
                              ) from None


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor's place in the output file."""

    name: str
    tensor: Tensor
    begin: int
    end: int


def plan(tensors: Mapping[str, Tensor],
         metadata: Mapping[str, str]) -> tuple[bytes, list[Planned]]:
    """The padded header (with its 8-byte length prefix) and where each tensor goes."""
    if "__metadata__" in tensors or not _encodable("".join(tensors)):
        for name in tensors:  # raises for the name that is refused
            check_name(name)
    names: dict[Any, str] = {}  # safetensors dtype name by DType
    keyed = []
    for i, (name, t) in enumerate(tensors.items()):
        dtype = names.get(t.dtype)
        if dtype is None:
            dtype = names[t.dtype] = _st_dtype(t)
        keyed.append((-_DTYPE_RANK[dtype], name, i, dtype, t))
    keyed.sort()  # names are distinct: no two keys get past them
    planned: list[Planned] = []
    # the JSON text json.dumps(header, ensure_ascii=False, separators=(",", ":")) makes of
    # {"__metadata__": sorted metadata, name: {"dtype", "shape", "data_offsets"}, ...},
    # each entry formatted here (a dict each cost 20,000 small tensors 40 ms)
    parts = ['{"__metadata__":' + json.dumps(dict(sorted(metadata.items())),
                                             ensure_ascii=False, separators=(",", ":"))]
    pos = 0
    for _, name, _, dtype, t in keyed:
        shape = t.shape
        end = pos + t.nbytes
        planned.append(Planned(name, t, pos, end))
        parts.append(f'{_quote(name)}:{{"dtype":"{dtype}","shape":[{",".join(map(str, shape))}'
                     f'],"data_offsets":[{pos},{end}]}}')
        pos = end
    try:
        text = (",".join(parts) + "}").encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidKeyError(f"metadata is not valid Unicode: {e.reason}") from None
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise ConversionError(
            f"the safetensors header would be {len(text)} bytes; readers refuse more than "
            f"{MAX_HEADER_BYTES}")
    return struct.pack("<Q", len(text)) + text, planned


_quote: Callable[[str], str] = json.encoder.encode_basestring


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 once encoded (every name at once: 20,000 small
    tensors, one call rather than :func:`check_name` each)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _st_dtype(t: Tensor) -> str:
    name = t.dtype.safetensors
    if name is None or name not in _DTYPE_RANK:
        raise ConversionError(f"safetensors has no dtype for torch.{t.dtype.name}")
    return name


# ---- writing ------------------------------------------------------------------------------


def write_atomic(
    dst: str,
    header: bytes,
    planned: Sequence[Planned],
    *,
    force: bool,
    src_fd: int | None = None,
    file_offset: FileOffset | None = None,
    progress: Progress | None = None,
    release: Release | None = None,
) -> int:
    """Write the file and publish it atomically (:mod:`._atomic`); returns the bytes
    written. The other arguments are those of :func:`write_into`."""
    with _atomic.Output(dst, force=force) as out:
        done = write_into(out, header, planned, src_fd=src_fd, file_offset=file_offset,
                          progress=progress, release=release)
        _atomic.commit([out], force=force)
    return done


def write_into(
    out: _atomic.Output,
    header: bytes,
    planned: Sequence[Planned],
    *,
    src_fd: int | None = None,
    file_offset: FileOffset | None = None,
    progress: Progress | None = None,
    release: Release | None = None,
    needed: int | None = None,
    held: int = 0,
    digests: Digests | None = None,
    final_header: Callable[[], bytes] | None = None,
) -> int:
    """Write the whole file into ``out`` (not yet published) and flush it to the disk.

    Returns the bytes written. ``file_offset(t)`` says where a tensor's bytes are in the file
    behind ``src_fd`` (None when they are not a plain byte range there); ``release`` is told
    which of those bytes have been written. On a full disk the error says the bytes
    ``needed`` (default: this file's) and those free, counting the ``held`` bytes of the
    run's earlier outputs (:meth:`Output.error`).

    With ``digests``, every tensor's bytes are hashed as they are written
    (:mod:`.digest`); then ``final_header()``, called once the data is written and hashed,
    gives the header again (the same length: the digests in it filled in), written in place
    before the file is flushed."""
    if needed is None:
        needed = len(header) + sum(p.end - p.begin for p in planned)
    writer = _stream.Writer(out.fd, src_fd, progress, release)
    try:
        writer.write(header)
        for p in planned:
            _write_tensor(writer, p, file_offset, out.directory, digests)
        writer.flush()
        if digests is not None:
            digests.wait()
        if final_header is not None:
            _rewrite_header(out.fd, header, final_header())
    except OSError as e:
        raise out.error(e, needed, held) from None
    finally:
        writer.close()
        if digests is not None:
            digests.close()
    if writer.done != writer.queued:  # pragma: no cover - a bug of ours
        raise ConversionError(f"wrote {writer.done} bytes of {writer.queued}")
    out.finish(needed, held)
    return writer.done


def _rewrite_header(fd: int, first: bytes, header: bytes) -> None:
    if len(header) != len(first):  # pragma: no cover - a bug of ours
        raise ConversionError(f"the final header has {len(header)} bytes, the first "
                              f"{len(first)}")
    done = 0
    while done < len(header):
        done += os.pwrite(fd, header[done:], done)


def _write_tensor(writer: _stream.Writer, p: Planned, file_offset: FileOffset | None,
                  spill_dir: str, digests: Digests | None = None) -> None:
    t = p.tensor
    h = digests.output(p.name) if digests is not None else None
    n = p.end - p.begin
    start = writer.queued
    if n and is_plain(t) and not t.storage.streams:
        begin = t.storage_offset * t.dtype.itemsize
        buf = t.storage.buffer()
        offset = None
        if file_offset is not None and (writer.can_read or n >= _stream.KERNEL_MIN_BYTES):
            offset = file_offset(t)
        if h is not None and digests is not None:
            digests.mapped(h, memoryview(buf).cast("B")[begin:begin + n],
                           None if offset is None else offset + begin, writer.release,
                           writer.src_fd is not None)
        if offset is not None and n < _stream.KERNEL_MIN_BYTES and n <= _stream.GATHER_BYTES:
            writer.read(offset + begin, n)  # small ones are gathered, read from the file
        else:
            mapped = memoryview(buf).cast("B")[begin:begin + n]
            writer.copy(None if offset is None else offset + begin, mapped)
    else:
        for block in chunks(t, spill_dir):
            if h is not None:
                h.update(block)
            writer.write(block)
    if writer.queued - start != n:  # pragma: no cover - a bug of ours
        raise ConversionError(f"wrote {writer.queued - start} bytes for a tensor of {n}",
                              member=p.name)


# ---- reading a header back ----------------------------------------------------------------


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked safetensors header: entries by name, in file order."""

    metadata: dict[str, str]
    entries: dict[str, tuple[str, tuple[int, ...], int, int]]  # dtype, shape, begin, end
    data_start: int
    header_bytes: bytes


def read_header(buf: memoryview | bytes, max_depth: int = Limits.max_depth) -> SafetensorsHeader:
    """Parse and check a safetensors header: valid JSON nested at most ``max_depth`` deep,
    known dtypes, shapes that match the byte ranges, ranges that tile the data section with
    no holes or overlaps."""
    try:
        return _read_header(buf, max_depth)
    except FormatError as e:
        if "hint" not in e.__dict__:  # not the hint for a torch checkpoint
            e.hint = ("the safetensors file is damaged or was edited: write it again "
                      "(torchless convert --force) or fetch it again")
        raise


def _read_header(buf: memoryview | bytes, max_depth: int) -> SafetensorsHeader:
    if len(buf) < 8:
        raise FormatError("too short for a safetensors header")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if bytes(buf[8:9]) != b"{":
        raise FormatError(f"not a safetensors file: it starts with {bytes(buf[:12]).hex()}, "
                          "not a header length and a JSON header",
                          hint="pass a .safetensors file here; a torch checkpoint is the "
                               "source, not the output")
    if n > MAX_HEADER_BYTES or 8 + n > len(buf):
        raise FormatError(f"safetensors header declares {n} bytes; the file has {len(buf)}",
                          hint="the file is cut short or is not a safetensors file: write "
                               "it again (torchless convert --force)")
    raw = bytes(buf[8:8 + n])
    try:
        obj = _json.loads(raw.decode("utf-8"), max_depth=max_depth, what="the safetensors header")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"safetensors header is not UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict):
        raise FormatError("safetensors header is not a JSON object")
    meta = obj.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FormatError("safetensors __metadata__ is not a str -> str object")
    entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in obj.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"safetensors entry {name!r} is malformed")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _ITEMSIZE or not isinstance(shape, list) or not all(
                type(s) is int and s >= 0 for s in shape) or not isinstance(offs, list) or len(
                offs) != 2 or not all(type(o) is int for o in offs):
            raise FormatError(f"safetensors entry {name!r} is malformed")
        if any(x > _INT64_MAX for x in (*shape, *offs)):
            raise FormatError(f"safetensors entry {name!r}: a size or offset overflows 64 bits")
        if len(shape) > _MAX_NDIM:
            raise UnsupportedError(
                f"safetensors entry {name!r} has {len(shape)} dimensions; NumPy holds at most "
                f"{_MAX_NDIM}", hint="read this file with the safetensors package and torch")
        begin, end = offs
        if not 0 <= begin <= end or end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
            raise FormatError(f"safetensors entry {name!r}: offsets {offs} do not match "
                              f"{dtype} x {shape}")
        entries[name] = (dtype, tuple(shape), begin, end)
    pos = 0
    for _, _, begin, end in sorted(entries.values(), key=lambda e: (e[2], e[3])):
        if begin != pos:
            raise FormatError(f"safetensors data has a hole or overlap at {begin} "
                              f"(expected {pos})")
        pos = end
    if 8 + n + pos != len(buf):
        raise FormatError(f"safetensors data section is {len(buf) - 8 - n} bytes, the header "
                          f"describes {pos}")
    return SafetensorsHeader(dict(meta), entries, 8 + n, raw)
