"""How ``torch.load(weights_only=False)`` in torch 2.13 resolves a name a pickle gives.

One statement of torch's ``find_class``, as data and one function, for the reader
(:class:`~torchless.rules.resolver.TorchResolver`) and the scanner
(:mod:`torchless.scanner.model`) alike; what the name then *means* (a rebuild rule, a
verdict) is theirs.

Three loaders read the pickles of a checkpoint (``torch/serialization.py``):

``"torch"``
    ``_load``'s ``UnpicklerWrapper`` (a ZIP archive's ``data.pkl``). Its ``find_class``:
    (1) a name containing ``"Storage"`` that is a key of torch's storage table
    (``torch.storage._storage_type_to_dtype_map``: :data:`TORCH_STORAGE_NAMES`) becomes a
    ``StorageType``, whatever the module, and nothing is imported; any other such name
    (``KeyError``) falls through; (2) the module is renamed by ``load_module_mapping``
    (:data:`LOAD_MODULE_MAPPING`); (3) the C unpickler's own ``find_class`` runs.
``"legacy"``
    ``_legacy_load``'s ``UnpicklerWrapper`` (the object pickle of a legacy stream and of a
    TAR checkpoint): step (1) alone, no ``load_module_mapping``. The reader and the scanner
    resolve it as ``"torch"`` on purpose: a ``torch.tensor`` module (torch < 1.8) then reads
    as ``torch._tensor`` where torch 2.13 fails the import, which adds actions to a scan (a
    superset) and reads a file torch would refuse; no other name differs.
``"plain"``
    ``pickle_module.load``: the legacy stream's magic number, protocol version, sys_info and
    storage keys, and the TAR ``storages`` and ``tensors`` members (counts, records, views).
    Only step (3): a storage name there is an import like any other.

Step (3), CPython's ``_pickle_Unpickler_find_class_impl`` (the same in 3.10 to 3.14, and
``pickle._Unpickler.find_class`` mirrors it): with ``fix_imports`` on (torch never turns it
off) and the protocol in force below 3, ``_compat_pickle.NAME_MAPPING`` maps the pair, else
``IMPORT_MAPPING`` the module; then ``__import__(module)`` (an empty module name raises
before any import); then at protocol 4 or more a dotted name is walked attribute by
attribute (a ``<locals>`` segment stops the walk), below 4 it is one ``getattr``. The
protocol in force is the argument of the last ``PROTO`` opcode (0 when there is none).
``EXT1``/``EXT2``/``EXT4`` name a global through ``copyreg``'s extension registry of the
loading process, which no file shows: :data:`EXTENSION`.

torch's ``weights_only`` unpickler (``_weights_only_unpickler.py``) resolves ``GLOBAL``
against an allowlist of objects and never imports; it is not modelled here (the scanner
models ``weights_only=False``).
"""

from __future__ import annotations

import _compat_pickle
from dataclasses import dataclass
from typing import Literal

__all__ = ["EXTENSION", "LOAD_MODULE_MAPPING", "TORCH_STORAGE_NAMES", "Failure", "Import",
           "Loader", "Resolution", "StorageName", "find_class"]

Loader = Literal["torch", "legacy", "plain"]

#: ``torch.storage._storage_type_to_dtype_map()`` in torch 2.13: the names ``StorageType``
#: accepts. ``UntypedStorage`` and the names of newer dtypes (float8 …) are not among them:
#: torch writes ``torch.storage.UntypedStorage`` for those, a real import.
TORCH_STORAGE_NAMES: frozenset[str] = frozenset({
    "BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
    "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
    "LongStorage", "QInt32Storage", "QInt8Storage", "QUInt2x4Storage", "QUInt4x2Storage",
    "QUInt8Storage", "ShortStorage"})

#: ``_load``'s ``load_module_mapping`` (torch PR 51633), applied before the C unpickler's.
LOAD_MODULE_MAPPING: dict[str, str] = {"torch.tensor": "torch._tensor"}

#: Why an extension code is never vetted.
EXTENSION = ("names a global through the loading process's copyreg extension registry "
             "(what it names is not in the file)")


@dataclass(frozen=True)
class StorageName:
    """torch's ``StorageType(name)``: no import."""

    name: str


@dataclass(frozen=True)
class Import:
    """``__import__(module)``, then ``getattr`` along ``path`` (one step below protocol 4)."""

    module: str
    path: tuple[str, ...]

    @property
    def name(self) -> str:
        """The attribute path as one dotted name."""
        return ".".join(self.path)


@dataclass(frozen=True)
class Failure:
    """The unpickler raises before importing anything."""

    reason: str


Resolution = StorageName | Import | Failure


def find_class(module: str, name: str, proto: int, loader: Loader) -> Resolution:
    """What torch 2.13's loader ``loader`` does with ``GLOBAL module name`` (or
    ``STACK_GLOBAL``, ``INST``) at protocol ``proto`` (see the module docstring)."""
    if loader != "plain" and "Storage" in name and name in TORCH_STORAGE_NAMES:
        return StorageName(name)
    if loader == "torch":
        module = LOAD_MODULE_MAPPING.get(module, module)
    if proto < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    if not module:
        return Failure("an empty module name: the import raises ValueError")
    if proto >= 4 and "." in name:
        return Import(module, tuple(name.split(".")))
    return Import(module, (name,))
