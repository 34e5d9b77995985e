"""The PT2 archive (``torch.export.save``, a ``.pt2`` file), read without running anything.

Layout (``torch/export/pt2_archive/``, archive version 0)::

    <prefix>/archive_format                          "pt2"
    <prefix>/archive_version                         "0" (missing in the oldest: 0)
    <prefix>/models/<model>.json                     the graph (not read: it is code)
    <prefix>/data/weights/<model>_weights_config.json     fqn -> payload (path, tensor meta)
    <prefix>/data/weights/weight_<n>                 raw bytes of one storage
    <prefix>/data/constants/<model>_constants_config.json fqn -> payload
    <prefix>/data/constants/tensor_<n>               raw bytes (a tensor subclass: a
                                                     torch.save archive, read as one)
    <prefix>/data/constants/opaque_obj_<n>           a plain pickle of a Python object
    <prefix>/data/constants/custom_obj_<n>           a TorchScript-pickled script object
    <prefix>/data/sample_inputs/<model>.pt           torch.save of the example inputs

Each payload is a view (sizes, strides, storage offset) of a raw storage file whose dtype is
that of the first payload naming it, as ``torch.export.load`` builds them: tensors that
share a file alias. Tensors come under the names ``ExportedProgram.state_dict`` and
``.constants`` use (one archive of several models: ``<model>.<name>``).
"""

from __future__ import annotations

from typing import Any

from torchless.containers.torchzip import MemberStorage, TorchZip
from torchless.containers.ziparchive import ZipArchive
from torchless.core import dtypes as _dtypes
from torchless.core import jsondepth
from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import (
    ArchiveFormatError,
    CheckpointError,
    LimitError,
    StorageError,
    UnsupportedError,
    type_phrase,
)
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, make_tensor
from torchless.pickle.machine import run_pickle
from torchless.pickle.values import Global, Opaque
from torchless.rules.resolver import TorchResolver

__all__ = ["ARCHIVE_VERSION", "Pt2Archive"]

#: The PT2 archive versions torchless reads (torch 2.13 writes "0").
ARCHIVE_VERSION = 0
#: ``torch._export.serde.schema.ScalarType`` values and the dtypes they name.
_SCALAR_TYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16",
                 7: "float32", 8: "float64", 9: "complex32", 10: "complex64",
                 11: "complex128", 12: "bool", 13: "bfloat16", 28: "uint16",
                 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
                 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64"}
_STRIDED = 7  # schema.Layout.Strided
_AOTI_HINT = ("torchless reads the weights of torch.export.save archives; an AOTInductor "
              "package holds compiled code and its weights inside it: export the program "
              "again with torch.export.save, or load the package with torch")


class Pt2Archive:
    """Reads the weights and constants of a PT2 archive."""

    format = "pt2"

    def __init__(self, source: Source, limits: Limits, archive: ZipArchive, prefix: str,
                 *, verify_crc: bool = False) -> None:
        self.source = source
        self.limits = limits
        self.archive = archive
        self.prefix = prefix
        self.check = verify_crc and archive.has_crc
        value = self._text("archive_format")
        if value != "pt2":
            raise UnsupportedError(
                f"a ZIP archive whose archive_format record is {value[:40]!r}, not 'pt2'",
                hint="torchless reads PT2 archives that torch.export.save writes")
        version = self._text("archive_version").strip() if self._has("archive_version") \
            else "0"
        if not version.isdigit():
            raise ArchiveFormatError(f"archive_version record is not an integer: "
                                     f"{version[:20]!r}")
        self.archive_version = int(version)
        if self.archive_version != ARCHIVE_VERSION:
            raise UnsupportedError(
                f"PT2 archive version {self.archive_version} (torchless reads version "
                f"{ARCHIVE_VERSION}, which torch.export.save writes)",
                hint="a newer torchless may read it (pip install -U torchless)")
        byteorder = self._text("byteorder") if self._has("byteorder") else "little"
        if byteorder not in ("little", "big"):
            raise ArchiveFormatError(f"byteorder record is {byteorder[:20]!r}, not little "
                                     "or big")
        self.byteorder = byteorder
        n = len(prefix)
        self.models = sorted(name[n + 7:-5] for name in archive.entries
                             if name[n:].startswith("models/") and name.endswith(".json")
                             and "/" not in name[n + 7:])
        if not self.models:
            if any(name[n:].startswith("data/aotinductor/") for name in archive.entries):
                raise UnsupportedError("an AOTInductor package (torch._inductor."
                                       "aoti_compile_and_package): compiled code, no "
                                       "exported program", hint=_AOTI_HINT)
            raise ArchiveFormatError("a PT2 archive with no models/<name>.json (no exported "
                                     "program in it)")
        for model in self.models:
            for kind in ("weights", "constants"):
                if self._has(f"data/{kind}/{model}.pt"):
                    raise UnsupportedError(
                        f"a PT2 archive in the legacy layout ({kind} of model {model!r} "
                        f"as one torch.save file data/{kind}/{model}.pt)",
                        hint="save the program again with a newer torch.export.save, or "
                             "extract that member and read it with torchless.open")
        self.constants: list[str] = []
        self._storages: dict[str, Storage] = {}

    def _has(self, record: str) -> bool:
        return self.prefix + record in self.archive.entries

    def _bytes(self, record: str) -> bytes:
        name = self.prefix + record
        size = self.archive.entries[name].size
        if size > self.limits.max_pickle_bytes:
            raise LimitError("max_pickle_bytes", self.limits.max_pickle_bytes, size, name)
        return bytes(self.archive.data(name, check_crc=self.archive.has_crc))

    def _text(self, record: str) -> str:
        try:
            return self._bytes(record).decode("utf-8")
        except UnicodeDecodeError:
            raise ArchiveFormatError(f"record {record} is not UTF-8 text") from None

    # ---- the object -----------------------------------------------------------------

    def load(self, resolver: TorchResolver) -> Any:
        programs: dict[str, dict[str, Any]] = {}
        for model in self.models:
            values: dict[str, Any] = {}
            for kind in ("weights", "constants"):
                record = f"data/{kind}/{model}_{kind}_config.json"
                if not self._has(record):
                    raise ArchiveFormatError(f"no {self.prefix}{record} in the PT2 archive "
                                             f"(model {model!r})")
                for fqn, value in self._payloads(record, kind, resolver):
                    if fqn in values:
                        raise ArchiveFormatError(f"{fqn!r} is both a weight and a constant "
                                                 f"of model {model!r}")
                    values[fqn] = value
                    if kind == "constants":
                        self.constants.append(fqn if len(self.models) == 1
                                              else f"{model}.{fqn}")
            programs[model] = values
        return programs[self.models[0]] if len(self.models) == 1 else programs

    def _payloads(self, record: str, kind: str,
                  resolver: TorchResolver) -> list[tuple[str, Any]]:
        try:
            doc = jsondepth.loads(self._text(record), max_depth=self.limits.max_depth,
                                  what=record)
        except ValueError as e:
            raise ArchiveFormatError(f"{record} is not JSON: {e}") from None
        config = doc.get("config") if isinstance(doc, dict) else None
        if not isinstance(config, dict):
            raise ArchiveFormatError(f"{record} has no config object")
        out = []
        for fqn, meta in config.items():
            try:
                out.append((fqn, self._payload(fqn, meta, kind, resolver)))
            except CheckpointError as e:
                raise e.add_context(member=f"{self.prefix}{record}") from None
        return out

    def _payload(self, fqn: str, meta: Any, kind: str, resolver: TorchResolver) -> Any:
        if not isinstance(meta, dict) or type(meta.get("path_name")) is not str:
            raise ArchiveFormatError(f"payload {fqn!r} has no path_name")
        path = meta["path_name"]
        if "/" in path or path in ("", ".", ".."):
            raise ArchiveFormatError(f"payload {fqn!r} names the path {path[:60]!r}")
        member = f"data/{kind}/{path}"
        if not self._has(member):
            raise StorageError(f"payload {fqn!r} has no record {self.prefix}{member}")
        if kind == "constants" and path.startswith("opaque_obj_"):
            data = self._bytes(member)
            value, end = run_pickle(data, resolver, self.limits)
            if end != len(data):
                raise ArchiveFormatError(f"{len(data) - end} bytes after the pickle of "
                                         f"constant {fqn!r}")
            return value
        if kind == "constants" and path.startswith("custom_obj_"):
            return Opaque(Global("torch._C", "ScriptObject"), (member,))
        if kind == "constants" and not path.startswith("tensor_"):
            raise ArchiveFormatError(f"constant {fqn!r} is in {path[:60]!r}, neither a "
                                     "tensor nor an object record")
        if meta.get("use_pickle") is True:
            return self._pickled(member, resolver)
        tm = meta.get("tensor_meta")
        if not isinstance(tm, dict):
            raise ArchiveFormatError(f"payload {fqn!r} has no tensor_meta")
        if tm.get("layout") != _STRIDED:
            raise UnsupportedError(f"payload {fqn!r} has layout {tm.get('layout')!r}, not "
                                   "strided")
        dtype = _dtype(fqn, tm.get("dtype"))
        sizes = _ints(fqn, "sizes", tm.get("sizes"))
        strides = _ints(fqn, "strides", tm.get("strides"))
        offset = _ints(fqn, "storage_offset", [tm.get("storage_offset")])[0]
        requires_grad = tm.get("requires_grad", False)
        if type(requires_grad) is not bool or type(meta.get("is_param", False)) is not bool:
            raise ArchiveFormatError(f"payload {fqn!r}: requires_grad / is_param not a bool")
        storage = self._storage(member, path, dtype, _location(fqn, tm.get("device")))
        t = make_tensor(storage, offset, sizes, strides, storage.dtype, self.limits,
                        requires_grad=requires_grad)
        if meta.get("is_param"):
            return t.with_flags(requires_grad=requires_grad, is_parameter=True)
        return t

    def _pickled(self, member: str, resolver: TorchResolver) -> Any:
        """A tensor subclass ``torch.save``d into one record: that nested archive read as a
        checkpoint of its own, with the same rules (its globals join the archive's)."""
        name = self.prefix + member
        size = self.archive.entries[name].size
        if size > self.limits.max_pickle_bytes:
            raise LimitError("max_pickle_bytes", self.limits.max_pickle_bytes, size, name)
        inner = TorchZip(MemberSource(f"{self.source.path}:{name}",
                                      self.archive.data(name, check_crc=self.archive.has_crc)),
                         self.limits, verify_crc=self.check)
        nested = TorchResolver(self.limits, inner.persistent_load, strict=resolver.strict,
                               allow=resolver.allow)
        try:
            return inner.load(nested)
        finally:
            resolver.globals.extend(nested.globals)

    def _storage(self, member: str, key: str, dtype: DType, location: str) -> Storage:
        """The storage of one raw record: its dtype is that of the first payload naming it
        (``torch.export.load`` views the record once, in that dtype)."""
        known = self._storages.get(member)
        if known is not None:
            return known
        name = self.prefix + member
        nbytes = self.archive.entries[name].size
        if nbytes % dtype.itemsize:
            raise StorageError(f"record {name} holds {nbytes} bytes, not a whole number of "
                               f"{dtype.name} elements")
        storage = MemberStorage(self.archive, name, key, dtype, nbytes, location,
                                self.byteorder, self.check)
        self._storages[member] = storage
        return storage

    def persistent_load(self, pid: Any, offset: int) -> Any:
        raise StorageError("a pickled constant of a PT2 archive references a storage "
                           "(torch.export.save pickles constants without any)")

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        n = len(self.prefix)
        records = sorted(name[n:] for name in self.archive.entries
                         if not name[n:].startswith(("data/weights/", "data/constants/",
                                                     "models/")))
        return {"prefix": self.prefix.rstrip("/"), "archive_format": "pt2",
                "archive_version": self.archive_version, "byteorder": self.byteorder,
                "crc": self.archive.has_crc, "models": list(self.models),
                "constants": list(self.constants), "records": records}

    def module_hook(self) -> ModuleHook:
        return module_state_dict


class MemberSource(Source):
    """The bytes of one archive member, read as a file of their own (a ``torch.save``
    archive stored inside a ``.pt2``)."""

    def __init__(self, path: str, data: memoryview | bytes) -> None:
        self.path = path
        self._bytes = bytes(data)
        self.size = len(self._bytes)
        self.identity = (-1, id(self))  # no file: never the same as an output's
        self._mmap = None
        self._view = memoryview(self._bytes)

    @property
    def raw(self) -> bytes:
        return self._bytes


def _dtype(fqn: str, code: Any) -> DType:
    name = _SCALAR_TYPES.get(code) if type(code) is int else None
    found = _dtypes.by_torch_name(name) if name is not None else None
    if found is None:
        raise UnsupportedError(f"payload {fqn!r} has scalar type {code!r}, which torchless "
                               "does not know")
    return found


def _ints(fqn: str, what: str, items: Any) -> list[int]:
    """``[{"as_int": n}, …]``; a symbolic size (``as_expr``) is refused by name."""
    if not isinstance(items, list):
        raise ArchiveFormatError(f"payload {fqn!r}: {what} is {type_phrase(items)}")
    out = []
    for item in items:
        if not isinstance(item, dict) or type(item.get("as_int")) is not int:
            raise UnsupportedError(f"payload {fqn!r}: {what} holds {str(item)[:60]}, not "
                                   "a concrete int (a symbolic size)")
        out.append(item["as_int"])
    return out


def _location(fqn: str, device: Any) -> str:
    if device is None:
        return "cpu"
    if not isinstance(device, dict) or type(device.get("type")) is not str:
        raise ArchiveFormatError(f"payload {fqn!r}: device is {type_phrase(device)}")
    index = device.get("index")
    if index is not None and type(index) is not int:
        raise ArchiveFormatError(f"payload {fqn!r}: device index is {type_phrase(index)}")
    return device["type"] if index is None else f"{device['type']}:{index}"

