"""What every container reader provides, and the plain-pickle reader (the simplest one) with
its region walks (:func:`plain_regions`, and :func:`npy_regions` for a NumPy object array).

A container turns a file into (object pickle, storages): ``load(resolver)`` runs the
object pickle with the resolver, calling back ``persistent_load`` for each storage it
names; ``format`` and ``describe()`` say what the file is; ``module_hook`` tells the
finishing walk how to recognise modules saved whole.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torchless.containers.regions import SNIFF, RegionSink
from torchless.core.limits import Limits
from torchless.errors import NotACheckpointError, PickleError, UnsupportedOpcodeError
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import MissingStorage
from torchless.pickle.machine import run_pickle
from torchless.rules.resolver import TorchResolver

__all__ = ["ARCHIVE_OF_FILES", "CHECKPOINT_SUFFIXES", "Container", "PartialTree", "PlainPickle",
           "archive_of_files", "npy_regions", "plain_regions"]


class Container(Protocol):
    @property
    def format(self) -> str: ...

    def load(self, resolver: TorchResolver) -> Any: ...

    def persistent_load(self, pid: Any, offset: int) -> Any: ...

    def describe(self, resolver: TorchResolver) -> dict[str, Any]: ...

    def module_hook(self) -> ModuleHook: ...


@runtime_checkable
class PartialTree(Protocol):
    """A container whose tree holds more than its tensors (ZeRO: the optimizer's moments
    beside the consolidated weights): ``Checkpoint.tensors`` are those of ``weights(tree)``,
    and ``convert`` writes them only, as the layout's own tools do."""

    def weights(self, tree: Any) -> Any: ...


#: How an archive of checkpoint files is described (the scanner reports it, never skips it).
ARCHIVE_OF_FILES = "an archive of files"
#: Member names that are checkpoints of their own: an archive of them is a packed model folder.
CHECKPOINT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".safetensors", ".pkl", ".tar",
                       ".index.json")


def archive_of_files(kind: str, names: list[str]) -> NotACheckpointError | None:
    """The error for a ZIP or TAR archive that packs checkpoint files (a zipped model
    folder), or None when none of ``names`` is one."""
    inner = [n for n in names if n.lower().endswith(CHECKPOINT_SUFFIXES)]
    if not inner:
        return None
    shown = ", ".join(repr(n) for n in inner[:3]) + (" …" if len(inner) > 3 else "")
    return NotACheckpointError(
        f"{ARCHIVE_OF_FILES} (a {kind} with {len(names)} files, among them {shown}), not a "
        f"torch checkpoint: {'unzip' if kind == 'ZIP' else 'unpack'} it",
        hint=f"{'unzip' if kind == 'ZIP' else 'unpack'} it, then open or scan the "
             "checkpoint files it holds")


class PlainPickle:
    """A pickle with no container: configs, ``training_args.bin``, a lone ``data.pkl``.

    Persistent ids have no storage to point at: tensors built on them are listed as
    unsupported (data-less) by name instead of failing the whole file.
    """

    format = "pickle"

    def __init__(self, source: Source, limits: Limits) -> None:
        self.source = source
        self.limits = limits

    def persistent_load(self, pid: Any, offset: int) -> Any:
        return MissingStorage(pid)

    def load(self, resolver: TorchResolver) -> Any:
        src = self.source
        # torch.load reads a plain pickle as a legacy stream's magic number, with plain
        # pickle.load: a storage name there is an import (rules/findclass)
        resolver.plain = True
        try:
            value, end = run_pickle(src.raw, resolver, self.limits)
        except UnsupportedOpcodeError as e:
            if resolver.globals:
                raise
            # bytes that break as no pickle does before naming anything: torch fails on them
            # too, before running anything (random data, a file of another kind)
            raise NotACheckpointError(
                f"not a checkpoint: the bytes are not a pickle ({e.message}) and no other "
                f"format torch reads (starts with {bytes(src.raw[:8]).hex()})",
                offset=e.offset,
                hint="check that you passed the right file: it is none of the formats "
                     "torch.load reads (ZIP, TAR, legacy stream, pickle)") from None
        if end != src.size:
            raise PickleError(f"{src.size - end} bytes after the pickle's STOP opcode "
                              "(never interpreted)", offset=end,
                              hint="a plain pickle checkpoint is one pickle; more data after "
                                   "it is a legacy torch file with a damaged magic number, "
                                   "or a second pickle hidden from readers that stop at the "
                                   "first: get the file again and do not torch.load it")
        return value

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        raw = self.source.raw
        return {"pickle_protocol": raw[1] if self.source.size > 1 and raw[0] == 0x80 else None,
                "python2": resolver.python2_strings}

    def module_hook(self) -> ModuleHook:
        return module_state_dict


def plain_regions(source: Source, limits: Limits, sink: RegionSink) -> str:
    """A plain pickle, and every pickle after it. Bytes whose walk breaks on something no
    pickle holds (an unknown opcode …) before naming any global are no pickle at all: torch
    would fail on them before running anything."""
    buf, size = source.raw, source.size
    broken = sink.broken_pickle(buf, 0, min(size, SNIFF))
    if broken is not None:
        at, why = broken
        raise NotACheckpointError(
            f"not a checkpoint: the bytes are not a pickle ({why} at byte {at}) and no "
            f"other format torch reads (starts with {bytes(buf[:8]).hex()})",
            hint="check that you passed the right file: it is none of the formats "
                 "torch.load reads (ZIP, TAR, legacy stream, pickle)")
    # torch.load reads a plain pickle as a legacy stream's magic number: pickle.load
    sink.chain(buf, 0, size, None, "plain", plain=True)
    return "pickle"


def npy_regions(source: Source, limits: Limits, sink: RegionSink) -> str:
    """A NumPy ``.npy`` file: no layout torch reads (the registry refuses it), but
    ``numpy.load(allow_pickle=True)`` unpickles an object array's data, a plain pickle after
    the header; the scanner walks it as one before asking the registry."""
    buf, size = source.raw, source.size
    major = buf[6] if size > 7 else 0
    width = 2 if major == 1 else 4
    if size < 8 + width:
        sink.flag("npy", "NumPy header cut short")
        return "npy"
    n = int.from_bytes(buf[8:8 + width], "little")
    header = bytes(buf[8 + width:8 + width + n]).decode("latin-1")
    start = 8 + width + n
    if "'O'" in header or "'|O'" in header:
        sink.chain(buf, start, size, None, "NumPy object-array", plain=True)
    return "npy"
