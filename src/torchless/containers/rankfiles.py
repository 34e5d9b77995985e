"""The ``torch.save`` archives of a directory of rank files (DeepSpeed ZeRO partitions, verl
and FSDP rank files, Megatron's ``mp_rank_XX``), read one after another through one
``persistent_load``. Each file's map stays open with the checkpoint, with a descriptor, so a
piece of a tensor that is one plain range of its file is streamed with ``pread``
(:class:`torchless.containers.dcpchunks.Piece`) instead of through the map."""

from __future__ import annotations

import os
from typing import Any

from torchless.containers.torchzip import TorchZip
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, StorageError
from torchless.io.source import Source
from torchless.model.tensor import Storage
from torchless.rules.resolver import TorchResolver

__all__ = ["RankFiles"]


class RankFiles:
    """The rank files read so far, by the member name each was read as."""

    def __init__(self, limits: Limits, verify_crc: bool) -> None:
        self.limits = limits
        self.verify_crc = verify_crc
        self._files: dict[str, tuple[Source, int | None]] = {}
        self._current: TorchZip | None = None

    def read(self, path: str, member: str, resolver: TorchResolver) -> Any:
        """The object the archive at ``path`` holds; errors name it as ``member``."""
        try:
            src = Source(path)
            try:
                fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                fd = None  # its pieces are then read through the map
            self._files[member] = (src, fd)
            self._current = TorchZip(src, self.limits, verify_crc=self.verify_crc)
            return self._current.load(resolver)
        except CheckpointError as e:
            raise e.add_context(member=member) from None
        finally:
            self._current = None

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        if self._current is None:  # pragma: no cover - only archives run pickles here
            raise StorageError("a storage outside an archive")
        return self._current.persistent_load(pid, offset)

    def file(self, member: str) -> tuple[Source | None, int | None]:
        """The file read as ``member`` and its descriptor (None, None if none was)."""
        return self._files.get(member, (None, None))

    def close(self) -> None:
        for src, fd in self._files.values():
            src.close()
            if fd is not None:
                os.close(fd)
        self._files.clear()
