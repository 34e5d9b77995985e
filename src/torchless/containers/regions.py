"""What a layout hands the scanner: the regions of a file that torch would unpickle or
compile, each given to a :class:`RegionSink` the scanner implements.

Every registered layout owns one region walk beside its reader (:mod:`.registry`): the
reader's own parsers run in report mode, and each region they reach goes to the sink:

* a pickle torch unpickles (:meth:`RegionSink.pickle`, :meth:`RegionSink.chain` for pickles
  one after another); ``plain``: a header pickle torch reads with plain ``pickle.load`` (the
  legacy magic number, protocol, ``sys_info`` and storage keys, the TAR passes);
* bytes that may hold a pickle (``tentative``: members not named ``.pkl``, the bytes before,
  between and after an archive's members, what follows a stream's last storage);
* an archive torch loads from inside another (:meth:`RegionSink.nested`: a ``torch.save``
  archive in a PT2 archive, a DCP item), scanned as the file of its own it is;
* code torch compiles or imports (:meth:`RegionSink.code`: TorchScript ``code/``).

So a layout is walked by one dispatch, the registry's: a layout without a region walk cannot
be registered, and the scanner never meets a layout it has no walk for. This module imports
nothing of the scanner (it is a layer above the containers): the sink is a protocol.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from torchless.core.findings import Findings
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.io.source import Source
from torchless.io.window import Window

if TYPE_CHECKING:
    from torchless.containers.storages import PickleReader

__all__ = ["EACH_FILE", "SNIFF", "DirectoryWalk", "FileWalk", "Nested", "PickleRun",
           "RegionSink", "ScanWindow", "absorb", "sink_reader"]

#: Bytes of the start of a member or region walked to decide whether it holds a pickle.
SNIFF = 64 << 10
#: Windows smaller than this are copied to bytes, larger ones to an anonymous map.
_SMALL = 1 << 20


class PickleRun(Protocol):
    """What the sink found walking one pickle, as far as a layout's walk needs it."""

    #: Offset after STOP, or where decoding gave up.
    end: int
    stopped: bool
    #: The inert value when the stream was run to its STOP (``want_value``), else None.
    value: Any
    #: The persistent ids the stream passed (storages), in order.
    pids: list[Any]


class Nested(Protocol):
    """The scan of a file stored inside another (:meth:`RegionSink.nested`)."""

    #: The layout the file has; None when it is not a checkpoint (see ``error``).
    layout: str | None
    error: CheckpointError | None

    def merge(self, where: str) -> None:
        """Add what was found to the enclosing scan, each finding named by ``where``."""


class RegionSink(Protocol):
    """What a layout's region walk hands its regions to (the scanner)."""

    #: The findings of the file: the container parsers' report-mode anomalies go here.
    findings: Findings
    #: How many archives the file lies inside (0: a file of its own).
    depth: int
    #: Check the CRC-32 of every member, tensor data included (else of those read whole).
    verify_crc: bool

    def pickle(self, data: Any, start: int, end: int, member: str | None, what: str, *,
               tentative: bool = False, want_value: bool = False, pids: str = "storage",
               plain: bool = False, returned: bool = True) -> PickleRun | None:
        """Scan the pickle at ``data[start:end]``; None if the bytes were not walked.
        ``pids``: what the loader's persistent_load makes of an id (``"storage"``: torch's
        ZIP loader, ``"legacy"``, ``"tar"``); ``plain``: torch reads it with plain
        ``pickle.load`` (no storage names, no persistent ids); ``returned``: its value
        reaches the program (False: torch's loader consumes it, as a header's)."""

    def chain(self, data: Any, start: int, end: int, member: str | None, what: str, *,
              tentative: bool = False, plain: bool = False) -> None:
        """Pickles one after another from ``start``; ``tentative``: each may be none;
        ``plain``: read with plain ``pickle.load``."""

    def could_be_pickle(self, data: Any) -> bool:
        """Whether bytes not named as a pickle read as one torch would unpickle."""

    def broken_pickle(self, data: Any, start: int, end: int) -> tuple[int, str] | None:
        """(offset, why) where the bytes break as no pickle does before naming anything,
        or None: bytes torch would fail on before running anything are no pickle at all."""

    def flag(self, kind: str, message: str, member: str | None = None,
             offset: int | None = None) -> None:
        """An anomaly of the file."""

    def found_any(self) -> bool:
        """Whether the file's scan has found a global or an anomaly so far."""

    def code(self, member: str, data: bytes) -> None:
        """Source code torch compiles (TorchScript ``code/``)."""

    def nested(self, source: Source) -> Nested:
        """Scan ``source`` as a file of its own (the caller closes it)."""


#: The region walk of a file layout: (source, limits, sink) → the layout's name.
FileWalk = Callable[[Source, Limits, RegionSink], str]
#: The region walk of a directory layout: (path, limits, sink) → the layout's name.
DirectoryWalk = Callable[[str, Limits, RegionSink], str]
#: A directory layout whose files the scanner scans each as a file of its own (no pickle
#: torch unpickles spans them: DCP's Hugging Face safetensors shards).
EACH_FILE: Literal["each file"] = "each file"


def sink_reader(sink: RegionSink, data: Any, size: int, member: str | None,
                layout: str) -> PickleReader:
    """The :data:`~.storages.PickleReader` of a layout walked for the scanner: each pickle
    scanned and reported, its value from the inert run; None where the stream cannot be
    followed. Their values are torch's loader's own (a magic number it compares, storage
    keys it looks up, a storage record whose type's ``_dtype`` it reads), never the
    program's: ``returned=False``."""
    def read(pos: int, end: int | None, what: str, plain: bool) -> tuple[Any, int] | None:
        result = sink.pickle(data, pos, size if end is None else end, member,
                             f"{layout} {what}", want_value=True, plain=plain, returned=False)
        if result is None or not result.stopped:
            return None
        return result.value, result.end
    return read


def absorb(sink: RegionSink, found: Findings, *, skip_prefix: bool = False) -> None:
    """A report-mode parse's findings, added to the file's (``skip_prefix``: not the bytes
    before an archive, which another layout's walk owns)."""
    sink.findings.anomalies.extend(a for a in found.anomalies
                                   if not (skip_prefix and a.kind == "prefix"))
    sink.findings.truncated = sink.findings.truncated or found.truncated


class ScanWindow(Window):
    """A :class:`~torchless.io.window.Window` whose ``raw`` is a copy of its bytes: the ZIP
    walks search it (``find``) and the pickle walk matches it with regular expressions,
    which a view of the file's map does not offer both of. A large copy is an anonymous
    map, handed back to the system by :meth:`close` (the largest item of a file bounds the
    scan's memory)."""

    _copy: bytes | mmap.mmap | None = None

    @property
    def raw(self) -> Any:
        if self._copy is None:
            if self.size < _SMALL:
                self._copy = bytes(self._view)
            else:
                self._copy = mmap.mmap(-1, self.size)
                for lo in range(0, self.size, _SMALL):
                    self._copy[lo:lo + _SMALL] = self._view[lo:lo + _SMALL]
                    self.release(lo, min(_SMALL, self.size - lo))
        return self._copy

    def close(self) -> None:
        copy, self._copy = self._copy, None
        if isinstance(copy, mmap.mmap):
            try:
                copy.close()
            except BufferError:  # pragma: no cover - a view still held: freed with it
                pass
