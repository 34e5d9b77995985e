"""The resolver for a DCP checkpoint's ``.metadata`` pickle.

``torch.distributed.checkpoint`` pickles its own dataclasses there (``Metadata``,
``TensorStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``, ``MetadataIndex``,
``_StorageInfo``, ``BytesStorageMetadata``, ``StorageMeta``; Megatron-Core adds the
planner's ``SavePlan`` records). These names are known here and
only here: each becomes an inert record (class, state) that :mod:`torchless.containers.dcpmeta`
reads field by field. Nothing is imported or called; in an ordinary checkpoint the same
names stay under the general policy.
"""

from __future__ import annotations

from typing import Any

from torchless.pickle.known import Known
from torchless.rules.resolver import TorchResolver

__all__ = ["DCP_CLASSES", "DcpResolver"]

_METADATA = "torch.distributed.checkpoint.metadata"
_OLD_SHARD = "torch.distributed._shard.sharded_tensor.metadata"  # torch 2.0-2.1
_PLANNER = "torch.distributed.checkpoint.planner"

#: The dataclasses DCP pickles into ``.metadata``, by (module, name).
DCP_CLASSES = frozenset({
    (_METADATA, "Metadata"),
    (_METADATA, "TensorStorageMetadata"),
    (_METADATA, "ChunkStorageMetadata"),
    (_METADATA, "BytesStorageMetadata"),
    (_METADATA, "TensorProperties"),
    (_METADATA, "MetadataIndex"),
    (_METADATA, "StorageMeta"),
    (_METADATA, "_MEM_FORMAT_ENCODING"),
    (_OLD_SHARD, "TensorProperties"),
    (_OLD_SHARD, "MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint._hf_utils", "_HFStorageInfo"),
    # the save plans Megatron-Core keeps in .metadata (``all_local_plans``)
    (_PLANNER, "SavePlan"),
    (_PLANNER, "WriteItem"),
    (_PLANNER, "WriteItemType"),
    (_PLANNER, "TensorWriteData"),
    (_PLANNER, "BytesIOWriteData"),
})


class DcpResolver(TorchResolver):
    """:class:`TorchResolver` that also keeps DCP's metadata dataclasses as inert records."""

    def _known(self, module: str, name: str, offset: int | None = None) -> Any:
        if (module, name) in DCP_CLASSES:
            return Known(module, name, rule="opaque")
        return super()._known(module, name, offset)
