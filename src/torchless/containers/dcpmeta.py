"""A DCP checkpoint's ``.metadata``, read from the inert records of its pickle.

``torch.distributed.checkpoint`` (``filesystem.py``, ``metadata.py``) writes::

    Metadata(state_dict_metadata = {fqn: TensorStorageMetadata | BytesStorageMetadata},
             planner_data = {fqn: (key, key, ...)},      # the unflattening path, or None
             storage_data = {MetadataIndex(fqn, offsets): _StorageInfo(relative_path,
                                                                       offset, length,
                                                                       transform_descriptors)},
             storage_meta = StorageMeta(...), version = "1.0.0")
    TensorStorageMetadata(properties = TensorProperties(dtype, ...), size = torch.Size,
                          chunks = [ChunkStorageMetadata(offsets, sizes), ...])

Every field is checked here (types, ranks, bounds) before the container trusts it; a record
of any other class where one of these is expected is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchless.core.dtypes import DType
from torchless.errors import FormatError, type_phrase
from torchless.pickle.values import NOTSET, Global, Opaque

__all__ = ["Chunk", "DcpMetadata", "StorageInfo", "TensorMeta", "parse_metadata"]

_HINT = ("the .metadata file is not what torch.distributed.checkpoint writes: the checkpoint "
         "is damaged or was made by another tool")


@dataclass(frozen=True)
class Chunk:
    """One saved piece of a global tensor: where it starts and its extent, per dimension."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclass(frozen=True)
class TensorMeta:
    dtype: DType
    size: tuple[int, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class StorageInfo:
    """Where an item's bytes are: a file of the directory, an offset and a length."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True)
class DcpMetadata:
    #: fqn -> the tensor's metadata, or None for a non-tensor (pickled bytes) value
    items: dict[str, TensorMeta | None]
    #: (fqn, chunk offsets or None for a value) -> where its bytes are
    storage: dict[tuple[str, tuple[int, ...] | None], StorageInfo]
    #: fqn -> path of keys into the nested state dict (None: the fqn is a top-level key)
    paths: dict[str, tuple[str | int, ...]]
    version: str | None


def _bad(message: str) -> FormatError:
    return FormatError(f".metadata: {message}", member=".metadata", hint=_HINT)


def _record(value: Any, *names: str) -> Any:
    """The state of an inert record of one of the classes ``names`` (``module.Class``)."""
    if not isinstance(value, Opaque) or not isinstance(value.callable, Global) \
            or value.callable.path not in names:
        raise _bad(f"expected {names[0].rsplit('.', 1)[-1]}, found {_describe(value)}")
    if value.args:
        raise _bad(f"{value.callable.name} is built with arguments {value.args!r:.80}")
    return value.state


def _describe(value: Any) -> str:
    return f"a {value.class_path} record" if isinstance(value, Opaque) else type_phrase(value)


def _fields(value: Any, *names: str) -> dict[str, Any]:
    state = _record(value, *names)
    if state is NOTSET:
        return {}
    if not isinstance(state, dict) or not all(type(k) is str for k in state):
        raise _bad(f"the state of {names[0].rsplit('.', 1)[-1]} is {type_phrase(state)}")
    return state


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
            type(v) is int and v >= 0 for v in value):
        raise _bad(f"{what} is {type_phrase(value)}, not a sequence of non-negative ints")
    return tuple(value)


_M = "torch.distributed.checkpoint.metadata."
_PROPS = (_M + "TensorProperties", "torch.distributed._shard.sharded_tensor.metadata."
          "TensorProperties")


def _tensor(fqn: str, f: dict[str, Any]) -> TensorMeta:
    props = _record(f.get("properties"), *_PROPS)
    dtype = props[0] if isinstance(props, tuple) and props else (
        props.get("dtype") if isinstance(props, dict) else None)
    if not isinstance(dtype, DType):
        raise _bad(f"{fqn!r}: the tensor's dtype is {type_phrase(dtype)}")
    size = _ints(f.get("size"), f"{fqn!r}: size")
    raw_chunks = f.get("chunks")
    if not isinstance(raw_chunks, list):
        raise _bad(f"{fqn!r}: chunks is {type_phrase(raw_chunks)}, not a list")
    chunks = []
    for c in raw_chunks:
        cf = _fields(c, _M + "ChunkStorageMetadata")
        chunk = Chunk(_ints(cf.get("offsets"), f"{fqn!r}: chunk offsets"),
                      _ints(cf.get("sizes"), f"{fqn!r}: chunk sizes"))
        if len(chunk.offsets) != len(size) or len(chunk.sizes) != len(size):
            raise _bad(f"{fqn!r}: a chunk has {len(chunk.sizes)} dimensions, the tensor "
                       f"{len(size)}")
        if any(o + s > n for o, s, n in zip(chunk.offsets, chunk.sizes, size, strict=True)):
            raise _bad(f"{fqn!r}: chunk at {list(chunk.offsets)} of size {list(chunk.sizes)} "
                       f"lies outside the tensor's size {list(size)}")
        chunks.append(chunk)
    return TensorMeta(dtype, size, tuple(chunks))


def _storage_info(value: Any) -> StorageInfo:
    f = _fields(value, "torch.distributed.checkpoint.filesystem._StorageInfo")
    path, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
    transforms = f.get("transform_descriptors") or ()
    if type(path) is not str or type(offset) is not int or type(length) is not int \
            or offset < 0 or length < 0:
        raise _bad(f"storage entry {f!r:.120} is not (relative_path, offset, length)")
    if not isinstance(transforms, (list, tuple)) or not all(
            type(t) is str for t in transforms):
        raise _bad(f"transform_descriptors is {type_phrase(transforms)}")
    return StorageInfo(path, offset, length, tuple(transforms))


#: Megatron-Core's subclass of ``Metadata`` (its ``MCoreSavePlanner`` writes it, with one
#: more field, ``mcore_data``; megatron/core/dist_checkpointing/strategies/torch.py).
MCORE_METADATA = "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata"


def parse_metadata(value: Any) -> DcpMetadata:
    f = _fields(value, _M + "Metadata", MCORE_METADATA)
    sdm = f.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        raise _bad(f"state_dict_metadata is {type_phrase(sdm)}")
    items: dict[str, TensorMeta | None] = {}
    for fqn, meta in sdm.items():
        if type(fqn) is not str:
            raise _bad(f"a state_dict key is {type_phrase(fqn)}, not a str")
        if isinstance(meta, Opaque) and isinstance(meta.callable, Global) \
                and meta.callable.path == _M + "BytesStorageMetadata":
            items[fqn] = None
        else:
            items[fqn] = _tensor(fqn, _fields(meta, _M + "TensorStorageMetadata",
                                              _M + "BytesStorageMetadata"))
    storage: dict[tuple[str, tuple[int, ...] | None], StorageInfo] = {}
    raw_storage = f.get("storage_data")
    if not isinstance(raw_storage, dict):
        raise _bad(f"storage_data is {type_phrase(raw_storage)}, not a dict (a storage "
                   "layer other than the file system's)")
    for index, info in raw_storage.items():
        idx = _fields(index, _M + "MetadataIndex")
        fqn, offsets = idx.get("fqn"), idx.get("offset")
        if type(fqn) is not str:
            raise _bad(f"MetadataIndex.fqn is {type_phrase(fqn)}")
        key = (fqn, None if offsets is None else _ints(offsets, f"{fqn!r}: index offset"))
        storage[key] = _storage_info(info)
    planner = f.get("planner_data")
    paths: dict[str, tuple[str | int, ...]] = {}
    if planner is not None:
        if not isinstance(planner, dict):
            raise _bad(f"planner_data is {type_phrase(planner)}, not a dict")
        for fqn, path in planner.items():
            if type(fqn) is not str or not isinstance(path, (tuple, list)) or not path \
                    or not all(type(p) in (str, int) for p in path):
                raise _bad(f"planner_data entry {fqn!r:.60} is not a path of str/int keys")
            if any(type(p) is int and p < 0 for p in path):
                raise _bad(f"planner_data entry {fqn!r:.60} has a negative list index")
            paths[fqn] = tuple(path)
    version = f.get("version")
    return DcpMetadata(items, storage, paths, version if type(version) is str else None)
