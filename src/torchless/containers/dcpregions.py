"""The regions of a ``torch.distributed.checkpoint`` (DCP) directory, scanned as one item
(the ``dcp`` layout's walk, beside its reader :mod:`.dcp`).

What torch unpickles when it loads one (``torch/distributed/checkpoint/filesystem.py``,
``default_planner.py``):

* ``.metadata``, with ``pickle.load`` (no restriction at all);
* each item the metadata records, at its (offset, length) in its shard file, with
  ``torch.load``: tensor chunks with ``weights_only=True``, non-tensor values
  (``BytesStorageMetadata``) with ``weights_only=False``. Every item is scanned the same
  way, as the file of its own it is (a ``torch.save`` archive), whatever the metadata calls
  it: the metadata is the attacker's too, and can turn a chunk into a value.

A shard's bytes that no item covers, items that overlap, lie past the end of their shard or
name a file outside the directory are anomalies; so is an item that is not a ``torch.save``
archive, or one stored through a stream transform (compression) the scanner cannot undo.
With the safetensors serialization format, tensor chunks point at a safetensors block that
runs to the end of the shard (no pickle: nothing in it is unpickled). When ``.metadata``
cannot be read as DCP metadata, every file of the directory is scanned as a file of its own.
A Megatron-Core ``torch_dist`` directory's ``common.pt`` is read by Megatron's loader
(``torch.load``, :mod:`.megatron`): it is scanned as the checkpoint it is, not flagged.
"""

from __future__ import annotations

import os
import re

from torchless.containers import megatron
from torchless.containers.dcp import METADATA_NAME
from torchless.containers.dcpmeta import DcpMetadata, StorageInfo, parse_metadata
from torchless.containers.dcpst import is_safetensors_at
from torchless.containers.regions import RegionSink, ScanWindow
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.io.source import Source
from torchless.pickle.machine import run_pickle
from torchless.rules.dcp import DcpResolver

__all__ = ["dcp_regions"]

_PLAIN_NAME = re.compile(r"[^/\\\x00]+\Z")
#: The interval of one item in its shard: (start, end, what).
_Span = tuple[int, int, str]


def dcp_regions(path: str, limits: Limits, root: RegionSink) -> str:
    """The regions of the DCP directory ``path``; a CheckpointError when its metadata file
    cannot be opened. torch's FileSystemReader reads ``.metadata`` with plain ``pickle.load``."""
    with Source(os.path.join(path, METADATA_NAME)) as meta_source:
        root.chain(meta_source.raw, 0, meta_source.size, METADATA_NAME, "DCP metadata",
                   plain=True)
        meta = _metadata(root, meta_source, limits)
        used: set[str] = {METADATA_NAME}
        if meta is not None:
            used |= _walk_items(root, path, meta)
        read = {megatron.COMMON_NAME} if megatron.reads_common(megatron.config(path)) else set()
        _other_files(root, path, used, read, everything=meta is None)
    return "dcp"


def _metadata(root: RegionSink, source: Source, limits: Limits) -> DcpMetadata | None:
    try:
        value, _ = run_pickle(source.raw, DcpResolver(limits), limits)
        return parse_metadata(value)
    except CheckpointError as e:
        root.flag("dcp", f"the metadata cannot be read as DCP's ({e.message}): every file "
                  "of the directory was scanned as a file of its own", METADATA_NAME)
        return None


def _walk_items(root: RegionSink, path: str, meta: DcpMetadata) -> set[str]:
    """Scan every item in its window; returns the shard files the metadata names."""
    by_file: dict[str, list[tuple[str, bool, StorageInfo]]] = {}
    for (fqn, offsets), info in meta.storage.items():
        what = fqn if offsets is None else f"{fqn} {list(offsets)}"
        by_file.setdefault(info.relative_path, []).append((what, offsets is None, info))
    for name, items in sorted(by_file.items()):
        if not _PLAIN_NAME.match(name) or name in (".", ".."):
            root.flag("dcp", f"the metadata names the shard {name[:80]!r}, outside the "
                      "directory (torch reads it relative to the checkpoint's path)",
                      METADATA_NAME)
            continue
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            root.flag("dcp", f"the shard file {name!r} the metadata names is missing "
                      "(torch cannot load the checkpoint)", METADATA_NAME)
            continue
        try:
            shard = Source(full)
        except CheckpointError as e:
            root.flag("dcp", f"the shard cannot be read: {e.message}", name)
            continue
        with shard:
            _walk_shard(root, name, shard, items)
    return set(by_file)


def _walk_shard(root: RegionSink, name: str, shard: Source,
                items: list[tuple[str, bool, StorageInfo]]) -> None:
    spans: list[_Span] = []
    blocks: set[int] = set()
    for what, is_value, info in sorted(items, key=lambda i: (i[2].offset, i[0])):
        end = info.offset + info.length
        if end > shard.size:
            root.flag("dcp", f"item {what!r} at {info.offset}+{info.length} lies past the "
                      f"end of the shard ({shard.size} bytes)", name, info.offset)
            continue
        if info.transforms:
            root.flag("dcp", f"item {what!r} is stored through the stream transform(s) "
                      f"{', '.join(info.transforms)}: its pickles could not be scanned",
                      name, info.offset)
            spans.append((info.offset, end, what))
            continue
        if not is_value and is_safetensors_at(shard, info.offset) \
                and shard.read(info.offset, 4) != b"PK\x03\x04":
            if info.offset not in blocks:  # one block holds every chunk of the shard
                blocks.add(info.offset)
                spans.append((info.offset, shard.size, "the safetensors block"))
            continue
        spans.append((info.offset, end, what))
        _scan_item(root, name, shard, what, info)
    _coverage(root, name, shard.size, spans)


def _scan_item(root: RegionSink, name: str, shard: Source, what: str,
               info: StorageInfo) -> None:
    where = f"{name}@{info.offset} ({what})"
    window = ScanWindow(shard, info.offset, info.length, where)
    try:
        found = root.nested(window)  # type: ignore[arg-type]
    finally:
        window.close()
    layout = found.layout or "zip"
    if found.error is not None:
        root.flag("dcp", f"item {what!r} is not a torch.save archive: {found.error.message}",
                  name, info.offset)
    found.merge(where)
    if layout != "zip":
        root.flag("dcp", f"item {what!r} is {layout} data, not a torch.save archive (what "
                  "DCP writes; torch.load still reads it)", name, info.offset)
    shard.release(info.offset, info.length)


def _coverage(root: RegionSink, name: str, size: int, spans: list[_Span]) -> None:
    pos = 0
    last = ""
    for lo, hi, what in sorted(spans):
        if lo > pos:
            root.flag("dcp", f"{lo - pos} bytes at {pos} belong to no item of the metadata "
                      "(torch reads none of them; other tools may)", name, pos)
        elif lo < pos:
            root.flag("dcp", f"item {what!r} overlaps {last!r} (bytes {lo}..{pos}): two "
                      "items share bytes", name, lo)
        if hi >= pos:
            pos, last = hi, what
    if pos < size:
        root.flag("dcp", f"{size - pos} bytes at {pos} after the last item belong to no "
                  "item of the metadata", name, pos)


def _other_files(root: RegionSink, path: str, used: set[str], read: set[str], *,
                 everything: bool) -> None:
    """Files of the directory the metadata does not name: torch's DCP reads none of them,
    but a file among them that is a checkpoint is scanned (a loader may be pointed at it);
    when the metadata is unreadable, every file, shards included. Those in ``read`` are
    files the layout's own loader reads beside the shards (Megatron's ``common.pt``):
    scanned like the rest, an anomaly only when they are no checkpoint."""
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if entry in used or not os.path.isfile(full):
            continue
        try:
            source = Source(full)
        except CheckpointError as e:
            if everything:
                root.flag("dcp", f"cannot be read: {e.message}", entry)
            continue
        with source:
            found = root.nested(source)
        if found.error is not None:
            if everything or entry in read:
                root.flag("dcp", f"not a checkpoint torch reads: {found.error.message}", entry)
            continue
        found.merge(entry)
        if not everything and entry not in read:
            root.flag("dcp", f"a {found.layout} checkpoint the metadata does not name (DCP "
                      "does not read it)", entry)

