"""The public entry points: :func:`open` a checkpoint lazily, :func:`load` it whole."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


from torchless.containers import registry
from torchless.containers.base import Container, PartialTree
from torchless.core.collector import collector_paused
from torchless.core.limits import Limits, allowing_download
from torchless.errors import (
    CheckpointError,
    UnsupportedError,
    error_boundary,
    reports_bugs,
)
from torchless.inert.schema import TensorMode, TypeRegistry
from torchless.io.opening import is_file_object, open_source
from torchless.io.remote import is_remote
from torchless.model.graph import ModuleMode, finish, flatten, keep_modules
from torchless.model.interop import record_to_torch, to_torch
from torchless.model.kinds import TensorRecord
from torchless.model.tensor import Tensor, UnsupportedTensor, with_attrs
from torchless.reader import formats
from torchless.rules.resolver import GlobalRecord, TorchResolver

__all__ = ["Checkpoint", "ReadOptions", "load", "open"]


class Checkpoint:
    """An opened checkpoint. Tensors are read only when asked for.

    Attributes:
        path: the file.
        format: ``"zip"``, ``"torchscript"``, ``"pt2"`` (torch.export.save), ``"package"``
            (torch.package), ``"legacy"``, ``"tar"``, ``"pickle"``; ``"safetensors"`` (plain
            or inert) and ``"index"`` (a sharded checkpoint's ``*.index.json``) for files
            torchless and Hugging Face write.
        tree: the whole saved object, with :class:`Tensor` leaves, modules saved
            whole replaced by their ``state_dict()`` (with ``modules="record"``: kept as
            the :class:`Opaque` records of their ``__dict__``), and unknown objects as
            :class:`Opaque` records.
        tensors: every tensor by flat name (dict keys and sequence indices joined by '.').
        unsupported: tensors that are not one array, by flat name, with what kind they
            are: sparse (``sparse_coo`` …), ``quantized``, ``nested``, ``jagged``, ``meta``
            (each also in ``records``), and kinds torchless does not read at all (a wrapper
            subclass, an uninitialized parameter …).
        records: the sparse, quantized, nested, jagged and meta tensors by flat name, as
            :class:`TensorRecord` objects holding their component tensors.
        opaque: the globals kept as inert records (class paths and offsets).
        info: container details (archive prefix, format version, byte order …).
    """

    def __init__(self, path: str, source: Any, layout: str, tree: Any,
                 tensors: dict[str, Tensor], unsupported: dict[str, UnsupportedTensor],
                 globals_: list[GlobalRecord], info: dict[str, Any]) -> None:
        self.path = path
        self._source = source
        self.format = layout
        self.tree = tree
        self.tensors: Mapping[str, Tensor] = MappingProxyType(tensors)
        self.unsupported: Mapping[str, str] = MappingProxyType(
            {k: v.kind for k, v in unsupported.items()})
        self.records: Mapping[str, TensorRecord] = MappingProxyType(
            {k: v for k, v in unsupported.items() if isinstance(v, TensorRecord)})
        self.globals: tuple[GlobalRecord, ...] = tuple(globals_)
        self.opaque: tuple[GlobalRecord, ...] = tuple(g for g in globals_ if g.verdict == "opaque")
        self.info = MappingProxyType(info)

    def numpy(self, name: str) -> np.ndarray[Any, Any]:
        """One tensor as a read-only ndarray."""
        if name in self.records:
            raise self.records[name].error(name).add_context(path=self.path)
        if name in self.unsupported:
            raise UnsupportedError(f"{self.unsupported[name]} tensors are not supported",
                                   path=self.path, member=name)
        try:
            tensor = self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path}") from None
        try:
            return tensor.numpy()
        except CheckpointError as e:
            raise e.add_context(path=self.path, member=name) from None

    def close(self) -> None:
        """Release the file. Arrays already returned stay valid."""
        self._source.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Checkpoint {self.path!r} format={self.format} "
                f"tensors={len(self.tensors)}>")


@dataclass(frozen=True)
class ReadOptions:
    """How a checkpoint is read: the keywords ``open``, ``load``, ``convert``, ``verify``,
    ``scan`` and ``batch`` share, with one meaning and one default each."""

    limits: Limits | None = None
    strict: bool = False
    allow_globals: tuple[str, ...] = ()
    verify_crc: bool = False

    def open(self, path: Any, modules: ModuleMode = "state_dict") -> Checkpoint:
        return open(path, limits=self.limits, strict=self.strict,
                    allow_globals=self.allow_globals, verify_crc=self.verify_crc,
                    modules=modules)


def open(
    path: str | os.PathLike[str],
    *,
    limits: Limits | None = None,
    strict: bool = False,
    allow_globals: Iterable[str] = (),
    root_name: str = "",
    verify_crc: bool = False,
    modules: ModuleMode = "state_dict",
    allow_full_download: bool = False,
    tag: str | None = None,
) -> Checkpoint:
    """Open a torch checkpoint without torch and without running pickle code.

    Reads only the container directory and the object pickle; tensor bytes
    stay in the file until :meth:`Tensor.numpy` is called.

    Args:
        path: the checkpoint file (its format is sniffed from its bytes); or a URL
            (``https://…`` by range requests, ``s3://``, ``hf://`` … through fsspec) or an
            open file object, read by ranges as needed (:mod:`torchless.io.remote`).
        limits: resource bounds (see :class:`Limits`).
        strict: refuse every global outside torchless's rebuild rules.
        allow_globals: exact ``"module.name"`` strings to keep as inert records
            even though the policy would refuse them (for files you trust).
        root_name: the name of the tensor when the whole file is one bare tensor.
        verify_crc: check each storage's CRC-32 when it is first read.
        modules: how a module saved whole (``torch.save(model)``) stands in ``tree``:
            ``"state_dict"`` (default), its ``state_dict()``, so that ``tensors`` are the
            names ``load_state_dict`` takes; ``"record"``, the :class:`Opaque` record of its
            pickled ``__dict__`` (as :func:`load` gives it).
        allow_full_download: an HTTP server that ignores ``Range`` sends the whole file:
            download it (to an unnamed temporary file, then read), whatever its size;
            without it, up to ``limits.max_download_bytes`` (64 MiB) is downloaded and a
            larger file refused with a :class:`LimitError`.
        tag: of a DeepSpeed run directory, the save to read (``"global_step1"``:
            zero_to_fp32's ``-t``); by default the one its ``latest`` file names. An unknown
            tag is refused (:class:`MissingFileError`), the tags present listed.

    Raises:
        CheckpointError: (a subclass of it) for anything wrong with the file.
    """
    if modules not in ("record", "state_dict"):
        raise ValueError("modules must be 'record' or 'state_dict'")
    lim = allowing_download(limits, allow_full_download) or Limits()
    spath = path if is_file_object(path) or is_remote(path) else os.fspath(path)
    spath = tagged(spath, tag, "reading")
    label = spath if isinstance(spath, str) else "<file object>"
    with error_boundary("reading", label, max_depth=lim.max_depth):
        return _open(spath, lim, strict, frozenset(allow_globals), root_name, verify_crc,
                     modules)


def tagged(path: Any, tag: str | None, doing: str) -> Any:
    """``path``, or with ``tag`` the directory of that save of the DeepSpeed run directory
    ``path`` (``tag=`` of the entry points; the ZeRO reader is imported only then). A tag
    that is not a str is a programming error (``TypeError``); an unknown one is refused."""
    if tag is None:
        return path
    from torchless.containers.zero import check_tag, tag_directory

    check_tag(tag)
    with error_boundary(doing, path if isinstance(path, str) else "<file object>"):
        return tag_directory(path, tag)


def _open(path: Any, limits: Limits, strict: bool, allow: frozenset[str], root_name: str,
          verify_crc: bool, modules: ModuleMode = "state_dict") -> Checkpoint:
    if isinstance(path, str) and not is_remote(path) and os.path.isdir(path):
        found = registry.find_directory(path)
        return _read(path, found.name, lambda: found.open(path, limits, verify_crc), None,
                     limits, strict, allow, root_name, modules)
    source = open_source(path, max_download=limits.max_download_bytes)
    try:
        kind = formats.sniff(source)
        if kind is None:
            layout = registry.find_file(source)
    except BaseException:
        source.close()
        raise
    if kind is not None:  # torchless's own outputs: safetensors, inert, index files
        opened: Checkpoint = formats.open_other(
            kind, source, limits,
            lambda shard: _open(shard, limits, strict, allow, root_name, verify_crc, modules),
            Checkpoint)
        return opened
    return _read(source.path, layout.name, lambda: layout.open(source, limits, verify_crc),
                 source, limits, strict, allow, root_name, modules)


def _read(path: str, layout: str, make: Callable[[], Container], source: Any,
          limits: Limits, strict: bool, allow: frozenset[str], root_name: str,
          modules: ModuleMode) -> Checkpoint:
    """Run the container's object pickle and finish the tree; ``source`` (or, for a
    directory layout, the container) is closed if anything fails."""
    closer = source
    try:
        with collector_paused():  # what the open builds stays alive: nothing to collect
            container = make()
            if closer is None:
                closer = container
            resolver = TorchResolver(limits, container.persistent_load, strict=strict,
                                     allow=allow)
            raw = container.load(resolver)
            hook = container.module_hook()
            tree = finish(raw, limits, hook if modules == "state_dict" else keep_modules(hook))
            part = container.weights(tree) if isinstance(container, PartialTree) else tree
            tensors, unsupported = flatten(part, limits, root_name)
        info: dict[str, Any] = {"layout": layout, **container.describe(resolver)}
        info["era"] = describe_era(container.format, info)
        return Checkpoint(path, closer, container.format, tree, tensors, unsupported,
                          resolver.globals, info)
    except BaseException:
        if closer is not None:
            closer.close()
        raise


def describe_era(fmt: str, info: dict[str, Any]) -> str:
    """Which torch versions write this layout, from what the file holds."""
    if fmt == "tar":
        return "TAR layout written by torch before 0.1.10"
    if fmt == "legacy":
        proto = info.get("pickle_protocol")
        return ("legacy stream written by torch 0.1.10-1.5 (or later torch with "
                "_use_new_zipfile_serialization=False)"
                + (", from Python 2" if info.get("python2") else "")
                + (", pickle protocol 0/1" if proto is None else f", pickle protocol {proto}"))
    if fmt == "pickle":
        return "plain pickle (no tensor storage container)"
    if fmt == "pt2":
        return (f"PT2 archive version {info.get('archive_version')} written by "
                "torch.export.save (torch >= 2.5): weights and constants, the graph not read")
    if fmt == "package":
        return "torch.package archive written by PackageExporter (its modules never imported)"
    if fmt == "dcp":
        mcore = info.get("megatron")
        return ((f"Megatron-Core dist checkpoint ({mcore.get('sharded_backend')}"
                 + (f", {mcore['common']} merged" if mcore.get("common") else "") + ") in a "
                 if isinstance(mcore, dict) else "")
                + f"torch.distributed.checkpoint directory (DCP {info.get('dcp_version')}, "
                f"{info.get('storage_format')} items, {len(info.get('shards', ()))} shard "
                "files)")
    if fmt == "zero":
        return (f"DeepSpeed ZeRO-{info.get('zero_stage')} checkpoint ({info.get('tag')}, "
                f"{info.get('world_size')} ranks): fp32 master weights consolidated from the "
                "optimizer partitions")
    if fmt == "megatron-legacy":
        return (f"Megatron-LM legacy checkpoint (iteration {info.get('iteration')}, "
                f"TP={info.get('tensor_parallel')}, PP={info.get('pipeline_parallel')}): each "
                "rank's file as saved; its tensor-parallel partitions are not merged (the "
                "files record no split axis)")
    if fmt == "ranks":
        return (f"per-rank torch.save files of {info.get('world_size')} ranks (verl / FSDP): "
                f"{info.get('distributed_tensors')} distributed tensors put together from "
                "their pieces")
    records = set(info.get("records", ()))
    if fmt == "torchscript":
        return "TorchScript archive written by torch.jit.save (torch >= 1.0)"
    extras = sorted(records & {".format_version", ".storage_alignment", ".data/serialization_id"})
    tail = f"; also records {', '.join(extras)} (newer torch 2.x)" if extras else ""
    if "byteorder" in records:
        return "ZIP layout written by torch >= 2.1 (it has the byteorder record)" + tail
    return "ZIP layout written by torch 1.6-2.0 (no byteorder record)" + tail


#: ``load(framework=...)``: safetensors' names (and the long ones safe_open takes too)
_FRAMEWORKS: dict[str, TensorMode] = {"np": "numpy", "numpy": "numpy", "pt": "torch",
                                      "torch": "torch"}


def _tensor_mode(framework: str, tensors: str | None) -> TensorMode | None:
    """``framework=`` (or the deprecated ``tensors=``) as the decoder's mode; None for a
    value load does not take (load raises it: its own ValueError, not a bug)."""
    if tensors is not None:
        import warnings

        # the caller's line: load's, the bug boundary's wrapper's, then the caller's
        warnings.warn("load(tensors=...) is deprecated: say framework='np' or framework='pt' "
                      "(safetensors' words, as safe_open takes them)", DeprecationWarning,
                      stacklevel=4)
        return tensors if tensors in ("numpy", "torch") else None  # type: ignore[return-value]
    return _FRAMEWORKS.get(framework)


@reports_bugs("loading")
def load(
    path: str | os.PathLike[str],
    *,
    framework: str = "np",
    tensors: TensorMode | None = None,
    types: TypeRegistry | None = None,
    limits: Limits | None = None,
    strict: bool = False,
    allow_globals: Iterable[str] = (),
    verify_crc: bool = False,
    copy: bool = False,
    modules: ModuleMode = "record",
    allow_full_download: bool = False,
    tag: str | None = None,
) -> Any:
    """The whole saved object: of a torch checkpoint, or of a file :func:`torchless.save`
    or :func:`torchless.convert` wrote (for another safetensors file, its tensors by name).

    Args:
        framework: what tensors become, in safetensors' words (``safe_open(path,
            framework=...)``): ``"np"`` (default, or ``"numpy"``): NumPy arrays, read-only
            views of the file unless ``copy=True``. ``"pt"`` (or ``"torch"``): writable
            torch tensors, and ``torch.nn.Parameter`` where one was saved (with
            ``requires_grad``); torch dtypes, devices and sizes of inert files become torch
            objects; torch is imported then (it must be installed), never otherwise.
        tensors: the deprecated name of ``framework`` (``"numpy"`` or ``"torch"``): it
            works, with a :class:`DeprecationWarning`.
        types: the registry of the program's own classes for inert files (default: the one
            :func:`torchless.register_type` fills).
        limits: resource bounds, as for :func:`open`.
        strict: as for :func:`open`.
        allow_globals: as for :func:`open`.
        verify_crc: as for :func:`open`.
        copy: writable NumPy copies instead of read-only views of the file.
        allow_full_download: as for :func:`open`.
        modules: ``"record"`` (default): a module saved whole (``torch.save(model)``) comes
            as the :class:`Opaque` record of its pickled ``__dict__``: ``class_path``, and
            in ``state`` every attribute torch would see (``names``, ``yaml``, ``config``,
            ``args`` …), its ``_parameters``, ``_buffers`` and ``_modules`` (submodules as
            records), nothing called. ``"state_dict"``: its ``state_dict()`` instead (a dict
            of arrays by name), as :func:`open` keeps it in ``Checkpoint.tree``. Inert and
            safetensors files hold no pickled module: for them it changes nothing.
        tag: as for :func:`open` (the save of a DeepSpeed run directory).

    Sparse, quantized, nested, jagged and meta tensors come as :class:`TensorRecord`
    objects holding their component arrays (``framework="pt"``: as torch tensors).

    Raises :class:`UnsupportedError` if the file holds tensors torchless will not read.
    """
    mode = _tensor_mode(framework, tensors)
    if mode is None:
        raise ValueError(f"framework {tensors or framework!r} is invalid for load: 'np' "
                         "(NumPy) or 'pt' (torch); safe_open reads a safetensors file for "
                         "'jax' and 'mlx'")
    tensors = mode
    limits = allowing_download(limits, allow_full_download)
    if modules not in ("record", "state_dict"):
        raise ValueError("modules must be 'record' or 'state_dict'")
    spath: Any = tagged(path if is_file_object(path) or is_remote(path) else os.fspath(path),
                        tag, "reading")
    if not (isinstance(spath, str) and not is_remote(spath) and os.path.isdir(spath)):
        source = open_source(spath, max_download=limits.max_download_bytes
                             if limits is not None else None)
        try:
            safetensors = formats.sniff(source) == "safetensors"
        except BaseException:
            source.close()
            raise
        if safetensors:
            from torchless.inert.store import load_safetensors

            return load_safetensors(source, tensors=tensors, types=types, limits=limits,
                                    copy=copy)
        source.close()
    torch = None
    if tensors == "torch":
        from torchless.torch import _import_torch

        torch = _import_torch("framework='pt'")
    lim = limits if limits is not None else Limits()
    ckpt = open(spath, limits=lim, strict=strict, allow_globals=allow_globals,
                verify_crc=verify_crc, modules=modules)
    try:
        unreadable = [(n, k) for n, k in ckpt.unsupported.items() if n not in ckpt.records]
        if unreadable:
            name, kind = unreadable[0]
            raise UnsupportedError(
                f"{kind} tensors are not supported", path=ckpt.path, member=name,
                hint="torchless.load needs every tensor; torchless.open(FILE) reads the others "
                     "(Checkpoint.tensors) and lists these in Checkpoint.unsupported")
        cache: dict[int, Any] = {}
        import numpy as np

        def leaf(t: Any) -> Any:
            out = cache.get(id(t))
            if out is None:
                try:
                    if isinstance(t, TensorRecord):
                        out = record_to_torch(t, torch) if torch is not None else t.map(
                            lambda c: with_attrs(np.array(c.numpy()) if copy else c.numpy(), c))
                    elif torch is not None:
                        out = to_torch(t, torch)
                    else:
                        out = t.numpy()
                        if copy:
                            out = np.array(out)
                        out = with_attrs(out, t)
                except CheckpointError as e:  # name the tensor
                    name = next((k for k, v in [*ckpt.tensors.items(), *ckpt.records.items()]
                                 if v is t), None)
                    raise e.add_context(member=name) from None
                cache[id(t)] = out
            return out

        try:
            return finish(ckpt.tree, lim, lambda o: None, leaf)
        except CheckpointError as e:
            raise e.add_context(path=ckpt.path) from None
    finally:
        ckpt.close()
