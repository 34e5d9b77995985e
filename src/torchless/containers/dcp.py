"""A ``torch.distributed.checkpoint`` (DCP) directory, as FSDP, torchtitan, Megatron-Core's
``torch_dist``, accelerate and composer write it::

    DIR/.metadata          pickle of DCP's dataclasses (see :mod:`.dcpmeta`)
    DIR/__<rank>_<n>.distcp  the items each rank wrote: every tensor chunk and every
                           non-tensor value is a whole ``torch.save`` archive at the
                           (offset, length) ``.metadata`` records for it; with the
                           safetensors serialization format, tensor chunks are instead
                           one safetensors block at the end of the shard (:mod:`.dcpst`)

The object is the state dict ``dcp_to_torch_save`` rebuilds: every item placed along its
``planner_data`` path (as ``torch.distributed.checkpoint._traverse.set_element`` does),
tensors assembled from their chunks (:mod:`.dcpchunks`), values read with the caller's
rules from their own archives. Chunks are read with torch's rules alone
(``torch.load(weights_only=True)`` is how torch reads them). A Megatron-Core ``torch_dist``
directory's ``common.pt`` is merged in as Megatron's loader does (:mod:`.megatron`).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from typing import Any

from torchless.containers import megatron
from torchless.containers.dcpchunks import Piece, assembled, coverage
from torchless.containers.dcpmeta import Chunk, DcpMetadata, StorageInfo, TensorMeta, parse_metadata
from torchless.containers.dcpst import SafetensorsBlock, hf_metadata, is_safetensors_at, read_block
from torchless.containers.torchzip import TorchZip
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    FormatError,
    LimitError,
    PickleError,
    StorageError,
    TruncatedInputError,
    UnsafePathError,
    UnsupportedError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.io.window import Window
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor, UnsupportedTensor
from torchless.pickle.machine import run_pickle
from torchless.rules.dcp import DcpResolver
from torchless.rules.resolver import TorchResolver

__all__ = ["METADATA_NAME", "DcpDirectory", "is_dcp_dir"]

METADATA_NAME = ".metadata"
_SHARD = re.compile(r"__(\d+)_(\d+)\.distcp\Z")
_PLAIN_NAME = re.compile(r"[^/\\\x00]+\Z")
_ZIP = b"PK\x03\x04"
_HINT = ("the DCP checkpoint is incomplete or damaged (a rank's shard missing or cut "
         "short?): copy the whole directory again")


def is_dcp_dir(path: str) -> bool:
    """A directory holding DCP's ``.metadata`` file."""
    return os.path.isfile(os.path.join(path, METADATA_NAME))


class DcpDirectory:
    """Reads one DCP checkpoint directory: its metadata, shard files, chunks and values."""

    format = "dcp"
    #: what the converter's writer asks of a checkpoint's source: not one mapped file (the
    #: tensors' bytes come from several shards, streamed chunk by chunk)
    remote = False
    size = 0

    def __init__(self, path: str, limits: Limits, *, verify_crc: bool = False,
                 hf_sharded: bool = False) -> None:
        self.path = path
        self.limits = limits
        self.verify_crc = verify_crc
        self._files: dict[str, Source] = {}
        self._fds: dict[str, int] = {}
        self._blocks: dict[tuple[str, int], SafetensorsBlock] = {}
        self._others: list[Source] = []  # files beside the shards (Megatron's common.pt)
        self._current: TorchZip | None = None
        self.storage_format = "torch_save"
        #: Megatron-Core's checkpointing config (metadata.json), None for plain DCP
        self.megatron = None if hf_sharded else megatron.config(path)
        try:
            if hf_sharded:
                self.storage_format = "safetensors (HuggingFaceStorageWriter, one file a rank)"
                self.meta = hf_metadata(path, self._file, limits)
            else:
                self.meta = self._read_metadata()
            for key, info in self.meta.storage.items():
                self._check_range(key[0], info)
        except BaseException:
            self.close()
            raise

    def _read_metadata(self) -> DcpMetadata:
        with Source(os.path.join(self.path, METADATA_NAME)) as src:
            if src.size > self.limits.max_pickle_bytes:
                raise LimitError("max_pickle_bytes", self.limits.max_pickle_bytes, src.size,
                                 METADATA_NAME)
            try:
                value, end = run_pickle(src.raw, DcpResolver(self.limits), self.limits)
                if end != src.size:
                    raise PickleError(f"{src.size - end} bytes after the pickle's STOP opcode",
                                      offset=end)
                meta = parse_metadata(value)
            except CheckpointError as e:
                raise e.add_context(member=METADATA_NAME) from None
        count = len(meta.items) + sum(len(m.chunks) for m in meta.items.values() if m)
        if count > self.limits.max_tensors:
            raise LimitError("max_tensors", self.limits.max_tensors, count, METADATA_NAME)
        return meta

    def _file(self, name: str) -> Source:
        src = self._files.get(name)
        if src is None:
            if not _PLAIN_NAME.match(name) or name in (".", ".."):
                raise UnsafePathError(f"the metadata names the shard {name[:80]!r}, which is "
                                      "not a plain file name in the checkpoint's directory")
            full = os.path.join(self.path, name)
            if not os.path.isfile(full):
                raise StorageError(f"the shard file {name!r} the metadata names is missing",
                                   hint=_HINT)
            src = self._files[name] = Source(full)
            try:
                self._fds[name] = os.open(full, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                pass  # chunks are then read through the map
        return src

    def _check_range(self, fqn: str, info: StorageInfo) -> None:
        src = self._file(info.relative_path)
        if info.offset + info.length > src.size:
            raise TruncatedInputError(
                f"{fqn!r}: its bytes at {info.offset}+{info.length} lie past the end of "
                f"{info.relative_path} ({src.size} bytes)", member=fqn, hint=_HINT)

    # ---- the object ----------------------------------------------------------------

    def load(self, resolver: TorchResolver) -> Any:
        tree: dict[Any, Any] = {}
        for fqn, meta in self.meta.items.items():
            try:
                value = self._value(fqn, resolver) if meta is None else self._tensor(fqn, meta)
            except CheckpointError as e:  # the item, then where in its archive
                e.member = fqn if e.member is None else f"{fqn}: {e.member}"
                raise
            _place(tree, self.meta.paths.get(fqn, (fqn,)), value, self.limits)
        if megatron.reads_common(self.megatron):
            return megatron.merge(self._common(resolver), tree)
        return tree

    def _common(self, resolver: TorchResolver) -> dict[Any, Any]:
        """Megatron's ``common.pt``, the base its loader merges the sharded state into."""
        full = os.path.join(self.path, megatron.COMMON_NAME)
        if not os.path.isfile(full):
            raise StorageError(f"{megatron.COMMON_NAME} is missing: Megatron-Core's "
                               "loader starts from it (metadata.json names the torch common "
                               "backend)", hint=_HINT)
        try:
            src = Source(full)
            self._others.append(src)
            self._current = TorchZip(src, self.limits, verify_crc=self.verify_crc)
            common = self._current.load(resolver)
        except CheckpointError as e:
            raise e.add_context(member=megatron.COMMON_NAME) from None
        finally:
            self._current = None
        if not isinstance(common, dict):
            raise FormatError(f"{megatron.COMMON_NAME} holds {type_phrase(common)}, not the "
                              "dict Megatron-Core saves", member=megatron.COMMON_NAME)
        return common

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        if self._current is None:  # pragma: no cover - only archives run pickles here
            raise StorageError("a storage outside an archive")
        return self._current.persistent_load(pid, offset)

    def _info(self, fqn: str, offsets: tuple[int, ...] | None) -> StorageInfo:
        info = self.meta.storage.get((fqn, offsets))
        if info is None:
            where = "" if offsets is None else f" (the chunk at {list(offsets)})"
            raise StorageError(f"the metadata lists {fqn!r}{where} but records no bytes for it",
                               hint=_HINT)
        return info

    def _archive(self, info: StorageInfo) -> TorchZip:
        src = self._file(info.relative_path)
        window = Window(src, info.offset, info.length,
                        f"{info.relative_path}@{info.offset}")
        if info.length < 4 or window.read(0, 4) != _ZIP:
            raise FormatError(f"the item at {info.offset} of {info.relative_path} is not a "
                              "torch.save archive", offset=info.offset, hint=_HINT)
        return TorchZip(window, self.limits, verify_crc=self.verify_crc)  # type: ignore[arg-type]

    def _value(self, fqn: str, resolver: TorchResolver) -> Any:
        info = self._info(fqn, None)
        if info.transforms:
            raise UnsupportedError(
                f"the value is stored through the stream transform(s) "
                f"{', '.join(info.transforms)}, which torchless does not read",
                hint="load the checkpoint with torch's DCP and save it again without "
                     "_extensions (compression)")
        self._current = self._archive(info)
        try:
            return self._current.load(resolver)
        finally:
            self._current = None
            self._file(info.relative_path).release(info.offset, info.length)

    def _tensor(self, fqn: str, meta: TensorMeta) -> Tensor | UnsupportedTensor:
        infos = [self._info(fqn, c.offsets) for c in meta.chunks]
        transforms = sorted({t for i in infos for t in i.transforms})
        if transforms:
            return UnsupportedTensor(f"DCP chunks stored through the stream transform(s) "
                                     f"{', '.join(transforms)}")
        total = math.prod(meta.size)
        if len(meta.size) > self.limits.max_ndim:
            raise LimitError("max_ndim", self.limits.max_ndim, len(meta.size), fqn)
        if total * meta.dtype.itemsize > self.limits.max_tensor_bytes:
            raise LimitError("max_tensor_bytes", self.limits.max_tensor_bytes,
                             total * meta.dtype.itemsize, fqn)
        missing, overlap = coverage(meta)
        if missing:
            return UnsupportedTensor(f"partly saved DCP tensor: its chunks cover "
                                     f"{total - missing} of {total} elements")
        if overlap:
            return UnsupportedTensor("DCP tensor whose chunks overlap (the value depends on "
                                     "the order they are read)")
        pieces = [self._piece(fqn, meta, c, i) for c, i in zip(meta.chunks, infos, strict=True)]
        return assembled(fqn, meta, pieces)

    def _piece(self, fqn: str, meta: TensorMeta, chunk: Chunk, info: StorageInfo) -> Piece:
        src = self._file(info.relative_path)
        if is_safetensors_at(src, info.offset) and src.read(info.offset, 4) != _ZIP:
            t = self._from_block(fqn, chunk, info, src)
        else:
            zc = self._archive(info)
            t = zc.load(TorchResolver(self.limits, zc.persistent_load, strict=True))
            # the pages the parse touched (headers, the archive's tail): the process keeps
            # none of a shard's map resident; a later read faults them back in
            src.release(info.offset, info.length)
        if not isinstance(t, Tensor):
            raise FormatError(f"the chunk at {list(chunk.offsets)} holds {type_phrase(t)}, "
                              "not a tensor", hint=_HINT)
        if t.dtype != meta.dtype or t.shape != chunk.sizes:
            raise FormatError(
                f"the chunk at {list(chunk.offsets)} is {t.dtype.name} {list(t.shape)}; the "
                f"metadata says {meta.dtype.name} {list(chunk.sizes)}", hint=_HINT)
        return Piece(chunk, t, src, self._fds.get(info.relative_path))

    def _from_block(self, fqn: str, chunk: Chunk, info: StorageInfo, src: Source) -> Tensor:
        if self.storage_format == "torch_save":
            self.storage_format = "safetensors"
        key = (info.relative_path, info.offset)
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = read_block(src, info.offset, self.limits)
        entry = block.entries.get(fqn)
        if entry is None:
            raise StorageError(f"the safetensors block of {info.relative_path} has no "
                               f"{fqn!r}", hint=_HINT)
        saved = block.offsets.get(fqn, chunk.offsets)
        if saved != chunk.offsets:
            raise FormatError(f"the block's DCP_SHARDING_INFO puts {fqn!r} at {list(saved)}, "
                              f"the metadata at {list(chunk.offsets)}", hint=_HINT)
        dtype, shape, begin, n = entry
        storage = Storage(f"{info.relative_path}:{fqn}", dtype, n,
                          lambda: src.view(begin, n, fqn))
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return Tensor(storage, dtype, shape, stride, 0)

    # ---- what it is ----------------------------------------------------------------

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        items = Counter(i.relative_path for i in self.meta.storage.values())
        shards = []
        for name in sorted(self._files):
            m = _SHARD.match(name)
            shards.append({"file": name, "rank": int(m.group(1)) if m else None,
                           "bytes": self._files[name].size, "items": items[name]})
        layout = {fqn: [{"offsets": list(c.offsets), "sizes": list(c.sizes),
                         "file": self.meta.storage[(fqn, c.offsets)].relative_path}
                        for c in m.chunks]
                  for fqn, m in self.meta.items.items()
                  if m is not None and (fqn, m.chunks[0].offsets if m.chunks else ())
                  in self.meta.storage}
        extra = {} if self.megatron is None else {"megatron": {
            "sharded_backend": self.megatron.get("sharded_backend"),
            "common": megatron.COMMON_NAME if megatron.reads_common(self.megatron) else None}}
        return {**extra, "dcp_version": self.meta.version, "storage_format": self.storage_format,
                "shards": shards,
                "ranks": sorted({s["rank"] for s in shards if s["rank"] is not None}),
                "values": sum(m is None for m in self.meta.items.values()),
                "chunks": layout}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def release(self, offset: int, n: int) -> None:
        """Nothing: each chunk hands back its own shard's pages as it is streamed."""

    def close(self) -> None:
        for src in [*self._files.values(), *self._others]:
            src.close()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _place(root: dict[Any, Any], path: tuple[str | int, ...], value: Any,
           limits: Limits) -> None:
    """``torch.distributed.checkpoint._traverse.set_element``: containers made on the way
    (a dict before a str key, a list before an int one), lists padded with None."""
    def extend(lst: list[Any], idx: int) -> None:
        if idx >= limits.max_container_len:
            raise LimitError("max_container_len", limits.max_container_len, idx + 1,
                             "planner_data")
        lst.extend([None] * (idx + 1 - len(lst)))

    cur: Any = root
    for prev, key in itertools.pairwise(path):
        default: Any = {} if type(key) is str else []
        if isinstance(cur, dict):
            cur = cur.setdefault(prev, default)
        elif isinstance(cur, list) and type(prev) is int:
            extend(cur, prev)
            if cur[prev] is None:
                cur[prev] = default
            cur = cur[prev]
        else:
            cur = None
        if not isinstance(cur, (dict, list)):
            raise FormatError(f"planner_data path {list(path)!r:.100} runs through a value "
                              "that is not a container", member=METADATA_NAME)
    key = path[-1]
    if isinstance(cur, list):
        if type(key) is not int:
            raise FormatError(f"planner_data path {list(path)!r:.100} indexes a list by "
                              f"{type_phrase(key)}", member=METADATA_NAME)
        extend(cur, key)
    cur[key] = value


def refuse_member(path: str) -> None:
    """A file of a DCP checkpoint opened alone (a shard, or the metadata): refused with
    what it is and what to open instead. Shards are runs of archives and ``.metadata`` a
    pickle of DCP's classes: neither is a checkpoint by itself."""
    name, directory = os.path.basename(path), os.path.dirname(path) or "."
    if _SHARD.match(name) or (name.endswith(".distcp") and is_dcp_dir(directory)):
        what = "a shard file of a torch.distributed.checkpoint (DCP) checkpoint"
    elif name == METADATA_NAME and (is_dcp_dir(directory) and any(
            n.endswith(".distcp") for n in os.listdir(directory))):
        what = "the metadata of a torch.distributed.checkpoint (DCP) checkpoint"
    else:
        return
    from torchless.errors import NotACheckpointError

    raise NotACheckpointError(
        f"this is {what}: open its directory, which holds the .metadata file and every "
        "rank's shards", path=path,
        hint=f"pass the directory: torchless.open({directory!r}) / torchless inspect "
             f"{directory} / torchless convert {directory} -o model.safetensors")
