"""``save`` and the safetensors side of ``load``: whole objects in inert files.

:func:`save` encodes an object with :class:`torchless.inert.schema.Encoder` and writes one
safetensors file atomically (:mod:`._atomic`: written unnamed or to a hidden temporary file,
flushed, then renamed over the target), so an interrupted save never leaves a half-written
checkpoint where the last good one was.
:func:`load_safetensors` reads an inert file back (or, for a plain safetensors file, a dict
of its tensors).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.inert import decode as _inert_read
from torchless.inert import encode as _inert_write
from torchless.inert import schema as _inert
from torchless.io.source import Source
from torchless.model.tensor import Tensor
from torchless.write.safetensors import plan, read_header, write_atomic

__all__ = ["load_safetensors", "save"]


def save(obj: Any, path: str | os.PathLike[str], *,
         types: _inert.TypeRegistry | None = None,
         metadata: dict[str, str] | None = None) -> None:
    """Write ``obj`` (plain Python, NumPy arrays, torch tensors …) as an inert file.

    The result is a safetensors file: every tensor and array of ``obj`` is an entry any
    safetensors reader can load, and ``__metadata__`` holds the rest of the object as a
    JSON tree (``docs/inert-format.md``). Nothing in it can run code when loaded.
    :func:`torchless.load` returns an equal object, shared references and cycles included.

    Args:
        obj: the object. torch is used only if the program imported it and ``obj`` holds
            torch tensors.
        path: the file to write; replaced atomically if it exists.
        types: the registry of the program's own classes (default: the one
            :func:`torchless.register_type` fills).
        metadata: extra ``__metadata__`` entries (str -> str).

    Raises:
        ConversionError: ``obj`` holds something the format cannot hold (a lambda, an open
            file …), named by its path in ``obj``; nothing is written.

    Warns:
        OpaqueObjectWarning: ``obj`` holds objects of classes ``types`` does not know,
            stored as inert records (class path and state), as ``convert`` warns: they load
            back as :class:`torchless.Opaque`, not as the objects.
    """
    dst = os.fspath(path)
    encoder = _inert_write.Encoder(types=types)
    try:
        tree = encoder.encode(obj)
    except CheckpointError as e:
        raise e.add_context(path=dst) from None
    meta = {"format": "pt", **(metadata or {}), _inert.FORMAT_KEY: _inert.VERSION,
            _inert.TREE_KEY: tree}
    header, planned = plan(encoder.tensors, meta)
    write_atomic(dst, header, planned, force=True)
    if encoder.lowered:
        warnings.warn(f"{dst}: {_inert.opaque_summary(encoder.lowered)}; they load back as "
                      "records, not objects (torchless.register_type makes a class load as "
                      "itself)", _inert.OpaqueObjectWarning, stacklevel=2)


def load_safetensors(path: str | Source, *, tensors: _inert.TensorMode = "numpy",
                     types: _inert.TypeRegistry | None = None, limits: Limits | None = None,
                     copy: bool = False,
                     on_tensor: Callable[[Tensor, dict[str, Any]], Any] | None = None) -> Any:
    """The object of an inert file; for another safetensors file, ``{name: tensor}`` in
    file order. ``path``: the file, or its open source (closed here); ``on_tensor``: as for
    :func:`torchless.inert.decode.decode`."""
    with path if isinstance(path, Source) else Source(path) as src:
        path = src.path
        try:
            header = read_header(src.buffer, (limits or Limits()).max_depth)
            data = src.buffer[header.data_start:]
            if _inert.FORMAT_KEY in header.metadata:
                return _inert_read.decode(header.metadata, header.entries, data, tensors=tensors,
                                          types=types, limits=limits, copy=copy,
                                          on_tensor=on_tensor)
            return _inert_read.plain(header.entries, data, tensors=tensors, copy=copy,
                                     on_tensor=on_tensor)
        except CheckpointError as e:
            raise e.add_context(path=path) from None
