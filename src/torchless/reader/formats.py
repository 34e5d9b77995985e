"""torchless reads what it writes: safetensors files (plain, or inert with their object tree)
and sharded-checkpoint index files open as a :class:`Checkpoint` like any torch file.

These are not container layouts of the registry: a safetensors file holds no pickle and its
tree is decoded by :mod:`torchless.inert` (a layer above the containers), and an index names
other files. :func:`sniff` looks at a file's bytes (never its name) and :func:`open_other`
builds the checkpoint; the scanner keeps calling safetensors files "not a checkpoint" (they
cannot run code).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchless.core import dtypes as _dtypes
from torchless.core import jsondepth
from torchless.core.limits import Limits
from torchless.errors import FormatError, LimitError, UnsafePathError, UnsupportedError
from torchless.inert import schema as _schema
from torchless.io.detect import looks_like_safetensors, starts_as_json_object
from torchless.io.source import Source
from torchless.model.graph import finish, flatten
from torchless.model.tensor import Storage, Tensor

if TYPE_CHECKING:
    from torchless.write.safetensors import SafetensorsHeader

__all__ = ["MAX_INDEX_BYTES", "entry_tensors", "open_other", "read_index", "sniff"]

#: An index of a few hundred thousand tensor names is a few dozen MB; more is not an index.
MAX_INDEX_BYTES = 64 << 20


def sniff(source: Source) -> str | None:
    """``"safetensors"``, ``"index"`` (a JSON object with a ``weight_map``) or None."""
    size = source.size
    head = bytes(source.read(0, min(size, 512), "file header")) if size else b""
    if looks_like_safetensors(head + b" ", size):
        return "safetensors"
    if starts_as_json_object(head) and size <= MAX_INDEX_BYTES and \
            b'"weight_map"' in source.read(0, size, "index"):
        return "index"
    return None


class _Shards:
    """Closes every shard of an index (what a checkpoint holds open)."""

    def __init__(self) -> None:
        self.opened: list[Any] = []

    def close(self) -> None:
        for c in self.opened:
            c.close()


def open_other(kind: str, source: Source, limits: Limits,
               open_file: Callable[[str], Any], make: Callable[..., Any]) -> Any:
    """A checkpoint of a safetensors or index file (``source``, which it owns from now on:
    closed with it, or here on failure). ``open_file(path)`` opens a shard and ``make(...)``
    builds the :class:`Checkpoint` (both from :mod:`.checkpoint`)."""
    if kind == "safetensors":
        return _safetensors(source, limits, make)
    try:
        return _index(source, limits, open_file, make)
    finally:
        source.close()  # the index is read whole: its shards are what stays open


def _safetensors(source: Source, limits: Limits, make: Callable[..., Any]) -> Any:
    # the writer's header parser and the inert decoder only when such a file is met: a
    # torch checkpoint's inspect never imports them
    from torchless.inert import decode as _decode
    from torchless.write.safetensors import read_header

    path = source.path
    try:
        header = read_header(source.buffer, limits.max_depth)
        data = source.buffer[header.data_start:]
        inert = _schema.FORMAT_KEY in header.metadata
        if inert:
            raw = _decode.decode(header.metadata, header.entries, data, limits=limits,
                                 on_tensor=lambda t, f: t)
            era = (f"inert file written by torchless (format {header.metadata[_schema.FORMAT_KEY]}"
                   "): safetensors tensors and the object tree")
        else:
            raw = _plain(header, data)
            era = "safetensors file (tensors only)"
        tree = finish(raw, limits, lambda o: None)
        tensors, unsupported = flatten(tree, limits, "")
        meta = {k: v for k, v in header.metadata.items() if k != _schema.TREE_KEY}
        info = {"layout": "safetensors", "era": era, "metadata": meta, "inert": inert,
                "tensor_order": list(header.entries)}
        return make(path, source, "safetensors", tree, tensors, unsupported, [], info)
    except BaseException:
        source.close()
        raise


def entry_tensors(source: Source, limits: Limits) -> tuple[dict[str, Tensor], dict[str, str]]:
    from torchless.write.safetensors import read_header

    """The entries of the safetensors file ``source`` (the one a checkpoint of it holds
    open) as lazy tensors in file order: the names a safetensors reader sees (an inert
    file's NumPy arrays too, which its tree holds as arrays)."""
    header = read_header(source.buffer, limits.max_depth)
    return _plain(header, source.buffer[header.data_start:]), header.metadata


def _plain(header: SafetensorsHeader, data: memoryview) -> dict[str, Tensor]:
    """Each entry as a lazy tensor viewing the map (nothing read yet)."""
    by_st = {d.safetensors: d for d in _dtypes.DTYPES if d.safetensors is not None}
    lazy: dict[str, Tensor] = {}
    for name, (st, shape, begin, end) in header.entries.items():
        view = data[begin:end]
        storage = Storage(name, by_st[st], end - begin, lambda v=view: v)  # type: ignore[misc]
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        lazy[name] = Tensor(storage, by_st[st], shape, stride, 0)
    return lazy


def read_index(source: Source, limits: Limits) -> tuple[dict[str, str], dict[str, Any]]:
    """An index's ``weight_map`` (tensor name -> shard file name, checked to be a plain name
    in the index's directory) and its ``metadata``."""
    if source.size > MAX_INDEX_BYTES:
        raise LimitError("index bytes", MAX_INDEX_BYTES, source.size, "an index file")
    raw = source.read(0, source.size, "index")
    try:
        doc = jsondepth.loads(raw.decode("utf-8"), max_depth=limits.max_depth, what="the index")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"the index is not UTF-8 JSON: {e}") from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
        raise FormatError("the index has no weight_map of tensor name -> shard file")
    for shard in set(wmap.values()):
        if shard in ("", ".", "..") or "/" in shard or "\\" in shard or "\0" in shard:
            raise UnsafePathError(f"the index names the shard {shard!r}, which is not a plain "
                                  "file name in the index's directory")
    meta = doc.get("metadata")
    return wmap, meta if isinstance(meta, dict) else {}


def _index(source: Source, limits: Limits, open_file: Callable[[str], Any],
           make: Callable[..., Any]) -> Any:
    path = source.path
    wmap, meta = read_index(source, limits)
    if source.remote or not os.path.isfile(path):
        raise UnsupportedError("an index names its shards as files beside it, and this one "
                               "was given without a local path to find them by",
                               hint="pass the index's path (a file object of it has no "
                                    "directory)")
    folder = os.path.dirname(os.path.abspath(path))
    shards = _Shards()
    try:
        opened: dict[str, Any] = {}
        for shard in dict.fromkeys(wmap.values()):
            opened[shard] = open_file(os.path.join(folder, shard))
            shards.opened.append(opened[shard])
        tensors: dict[str, Tensor] = {}
        for name, shard in wmap.items():
            ckpt = opened[shard]
            if name not in ckpt.tensors:
                raise FormatError(f"the index puts {name!r} in {shard}, which does not hold it",
                                  hint="the index and its shards do not belong together: "
                                       "fetch them again, all from one revision")
            tensors[name] = ckpt.tensors[name]
        unsupported: dict[str, Any] = {}
        for ckpt in opened.values():  # nothing vanishes: what the index leaves out too
            for name, t in ckpt.tensors.items():
                tensors.setdefault(name, t)
            for name in ckpt.unsupported:
                unsupported.setdefault(name, _Kind(ckpt.unsupported[name]))
        info = {"layout": "index", "era": f"index of {len(opened)} shard file(s): "
                + ", ".join(opened), "shards": list(opened), "metadata": meta}
        tree = dict(tensors)
        return make(path, shards, "index", tree, tensors, unsupported, [], info)
    except BaseException:
        shards.close()
        raise


class _Kind:
    """What :class:`Checkpoint` reads of an unsupported tensor: its kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
