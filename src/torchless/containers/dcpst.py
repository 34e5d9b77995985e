"""The safetensors blocks of a DCP checkpoint saved with
``FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)``, and the
directories ``HuggingFaceStorageWriter(save_distributed=True)`` writes.

Such a shard holds the rank's pickled values first (``torch.save`` archives) and then one
safetensors file of its tensor chunks, keyed by fully qualified name; ``__metadata__`` has
``DCP_SHARDING_INFO`` (JSON: ``{fqn: {"saved_offsets": [...]}}``), which must agree with the
chunk the ``.metadata`` records. The block is parsed strictly: JSON nested at most
``max_depth`` deep, known dtypes, byte ranges that tile its data section and match each
shape.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchless.containers.dcpmeta import Chunk, DcpMetadata, StorageInfo, TensorMeta
from torchless.core import jsondepth as _json
from torchless.core.dtypes import DTYPES, DType
from torchless.core.limits import Limits
from torchless.errors import FormatError
from torchless.io.source import Source

__all__ = ["SafetensorsBlock", "hf_metadata", "is_hf_sharded_dir", "is_safetensors_at",
           "read_block"]

#: The files ``HuggingFaceStorageWriter(save_distributed=True)`` names, one per rank.
HF_SHARD = re.compile(r"shard-\d+-model-\d+-of-\d+\.safetensors\Z")

_BY_NAME: dict[str, DType] = {d.safetensors: d for d in DTYPES if d.safetensors}
_MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class SafetensorsBlock:
    #: name -> (dtype, shape, absolute begin in the file, length)
    entries: dict[str, tuple[DType, tuple[int, ...], int, int]]
    #: name -> saved_offsets from DCP_SHARDING_INFO (empty when absent)
    offsets: dict[str, tuple[int, ...]]


def is_safetensors_at(source: Source, offset: int) -> bool:
    if offset + 9 > source.size:
        return False
    head = source.read(offset, 9)
    return head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] <= source.size - offset - 8


def read_block(source: Source, offset: int, limits: Limits) -> SafetensorsBlock:
    """The safetensors file that starts at ``offset`` and runs to the end of ``source``."""
    (n,) = struct.unpack("<Q", source.read(offset, 8, "safetensors header length"))
    if n > _MAX_HEADER or offset + 8 + n > source.size:
        raise FormatError(f"safetensors header at {offset} declares {n} bytes; the file has "
                          f"{source.size - offset - 8} after it", offset=offset)
    try:
        obj = _json.loads(source.read(offset + 8, n).decode("utf-8"),
                          max_depth=limits.max_depth, what="the safetensors header")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"safetensors header at {offset} is not UTF-8 JSON: {e}",
                          offset=offset) from None
    if not isinstance(obj, dict):
        raise FormatError("safetensors header is not a JSON object", offset=offset)
    meta = obj.pop("__metadata__", None) or {}
    data = offset + 8 + n
    entries: dict[str, tuple[DType, tuple[int, ...], int, int]] = {}
    spans = []
    for name, info in obj.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"safetensors entry {name!r} is malformed", offset=offset)
        dtype, shape, offs = _BY_NAME.get(info["dtype"]), info["shape"], info["data_offsets"]
        if dtype is None or not isinstance(shape, list) or not all(
                type(s) is int and s >= 0 for s in shape) or not isinstance(offs, list) \
                or len(offs) != 2 or not all(type(o) is int for o in offs) \
                or not 0 <= offs[0] <= offs[1] \
                or offs[1] - offs[0] != math.prod(shape) * dtype.itemsize:
            raise FormatError(f"safetensors entry {name!r} is malformed or its offsets do "
                              "not match its dtype and shape", offset=offset)
        entries[name] = (dtype, tuple(shape), data + offs[0], offs[1] - offs[0])
        spans.append((offs[0], offs[1]))
    pos = 0
    for begin, end in sorted(spans):
        if begin != pos:
            raise FormatError(f"safetensors data has a hole or overlap at {begin}",
                              offset=offset)
        pos = end
    if data + pos != source.size:
        raise FormatError(f"safetensors data section is {source.size - data} bytes, its "
                          f"header describes {pos}", offset=offset)
    return SafetensorsBlock(entries, _sharding(meta, offset, limits))


def _sharding(meta: Any, offset: int, limits: Limits) -> dict[str, tuple[int, ...]]:
    text = meta.get("DCP_SHARDING_INFO") if isinstance(meta, dict) else None
    if text is None:
        return {}
    try:
        info = _json.loads(text, max_depth=limits.max_depth, what="DCP_SHARDING_INFO") \
            if isinstance(text, str) else None
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict):
        raise FormatError("DCP_SHARDING_INFO is not a JSON object", offset=offset)
    out = {}
    for name, v in info.items():
        saved = v.get("saved_offsets") if isinstance(v, dict) else None
        if not isinstance(saved, list) or not all(type(x) is int and x >= 0 for x in saved):
            raise FormatError(f"DCP_SHARDING_INFO of {name!r} has no saved_offsets list",
                              offset=offset)
        out[name] = tuple(saved)
    return out


def is_hf_sharded_dir(path: str) -> bool:
    """A directory of per-rank safetensors files as DCP's Hugging Face writer leaves them
    when it saves distributed without consolidating (no ``.metadata``, no index)."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return ".metadata" not in names and any(HF_SHARD.match(n) for n in names)


def hf_metadata(path: str, open_file: Callable[[str], Source], limits: Limits) -> DcpMetadata:
    """What ``HuggingFaceStorageReader.read_metadata`` makes of the directory: every
    ``*.safetensors`` file's tensors as chunks at their ``DCP_SHARDING_INFO`` offsets (zeros
    without it), each global size the largest extent its chunks reach."""
    found: dict[str, tuple[DType, list[Chunk]]] = {}
    storage: dict[tuple[str, tuple[int, ...] | None], StorageInfo] = {}
    for name in sorted(n for n in os.listdir(path) if n.endswith(".safetensors")):
        src = open_file(name)
        block = read_block(src, 0, limits)
        for key in sorted(block.entries):  # safe_open's keys(), which torch's reader uses
            dtype, shape, _, _ = block.entries[key]
            offsets = block.offsets.get(key, (0,) * len(shape))
            if len(offsets) != len(shape):
                raise FormatError(f"{name}: DCP_SHARDING_INFO gives {key!r} "
                                  f"{len(offsets)} offsets for {len(shape)} dimensions")
            if (key, offsets) in storage:
                raise FormatError(f"{key!r} at {list(offsets)} is in both "
                                  f"{storage[(key, offsets)].relative_path} and {name}")
            known = found.setdefault(key, (dtype, []))
            if known[0] != dtype:
                raise FormatError(f"{key!r} is {known[0].name} in one file and {dtype.name} "
                                  f"in {name}")
            known[1].append(Chunk(offsets, shape))
            storage[(key, offsets)] = StorageInfo(name, 0, src.size)
    items: dict[str, TensorMeta | None] = {}
    for key, (dtype, chunks) in found.items():
        size = tuple(max(c.offsets[d] + c.sizes[d] for c in chunks)
                     for d in range(len(chunks[0].sizes)))
        items[key] = TensorMeta(dtype, size, tuple(chunks))
    return DcpMetadata(items, storage, {}, None)
