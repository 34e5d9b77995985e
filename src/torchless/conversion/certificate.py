"""The conversion certificate: what an output was made from and how, and every tensor's
digest, in the output's own ``__metadata__`` (``convert(certificate=True)``,
``convert --certificate``); checked by :func:`verify_certificate` (``verify --certificate
OUT [SRC]``) against the output alone, or against the source as well.

``__metadata__["torchless.certificate"]`` is compact JSON with sorted keys
(``docs/certificate.md`` is the reference)::

    {"schema": 1, "torchless": "0.1.0", "digest": "blake2b-128",
     "sources": [{"path": "model.ckpt", "size": 123, "sha256": "<64 hex>"}],
     "transforms": {"key": null, "ema": false, "include": [], "exclude": [],
                    "strip_prefix": null, "rename": [], "dtype": "BF16",
                    "dtype_filter": [], "dedupe": false, "skip_unsupported": false,
                    "tree": true},
     "tensors": {"w": {"src": "<32 hex>", "out": "<32 hex>"},
                 "enc.w": {"src": …, "out": …, "from": "model.w", "file": 0},
                 "torchless.tree.3": {"src": …, "out": …, "tree": true}}}

* ``sources``: each file the output's tensors were read from: a local file's ``path`` (as
  given), ``size`` and ``sha256``; a directory checkpoint (DCP, ZeRO …) its ``path`` and
  ``files`` (each ``name`` relative to it, ``size``, ``sha256``); a URL its ``url``,
  ``size`` and what the server gave to identify the version (``etag``,
  ``last_modified``): a remote file is not read again to be hashed.
* ``transforms``: the options of the conversion; a pattern or rename rule given as a Python
  function is ``null`` (it cannot be replayed: the names are then checked as recorded).
* ``tensors``: per output tensor, ``src`` the digest of its source bytes before any cast
  and ``out`` of the bytes written (equal unless it was cast), both
  :data:`torchless.write.digest.ALGORITHM` of the contiguous C-order little-endian bytes;
  ``from`` the source's flat name when it differs, ``file`` the index of its source when
  there are several, ``tree`` for an array of the stored object tree (not a tensor of the
  source's flat mapping).

The header is written first with placeholder digests of the same length, the data is
written and hashed as it goes (:mod:`torchless.write.digest`), then the header is written
again in place, before the file is flushed and published.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchless._version import __version__
from torchless.core import jsondepth as _json
from torchless.core.limits import Limits
from torchless.errors import ConversionError, FormatError
from torchless.io.remote import RemoteSource, is_remote
from torchless.write.digest import ALGORITHM, HEX_DIGITS, PLACEHOLDER, Digests
from torchless.write.safetensors import plan

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from torchless.conversion.select import Selection
    from torchless.model.tensor import Tensor
    from torchless.write.cast import Cast

__all__ = ["METADATA_KEY", "SCHEMA", "Certificate", "parse", "transforms_of"]

#: The ``__metadata__`` key of the certificate.
METADATA_KEY = "torchless.certificate"
#: The certificate's schema version.
SCHEMA = 1
_SHA_PLACEHOLDER = "0" * 64
_READ_BYTES = 4 << 20


def _given(pattern: str) -> str | None:
    """A recorded pattern of :class:`Selection` (``"'glob'"``), or None for a function."""
    return pattern[1:-1] if pattern.startswith("'") and pattern.endswith("'") else None


def transforms_of(key: str | None, selection: Selection | None, cast: Cast | None, *,
                  dedupe: bool, skip_unsupported: bool, tree: bool) -> dict[str, Any]:
    """The ``transforms`` record of a conversion."""
    return {
        "key": key,
        "ema": bool(selection and selection.ema),
        "include": [_given(g) for g, _ in selection.include] if selection else [],
        "exclude": [_given(g) for g, _ in selection.exclude] if selection else [],
        "strip_prefix": selection.strip_prefix if selection else None,
        "rename": [_given(g) for g, _ in selection.rename] if selection else [],
        "dtype": cast.dtype.safetensors if cast else None,
        "dtype_filter": list(cast.filters) if cast else [],
        "dedupe": dedupe, "skip_unsupported": skip_unsupported, "tree": tree,
    }


class _Hashes:
    """sha256 of source files, each read once in a worker thread (beside the writing)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._done: dict[str, Future[str]] = {}

    def of(self, path: str) -> Future[str]:
        real = os.path.realpath(path)
        if real not in self._done:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="torchless-sha256")
            self._done[real] = self._pool.submit(sha256_file, path)
        return self._done[real]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def sha256_file(path: str) -> str:
    """The sha256 of a file's bytes (read in blocks)."""
    import hashlib  # with a certificate only: not at start-up

    h = hashlib.sha256()
    buf = bytearray(_READ_BYTES)
    view = memoryview(buf)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    except OSError as e:
        raise ConversionError(f"cannot read the source to hash it: {e.strerror}",
                              path=path) from None
    return h.hexdigest()


def _file_record(path: str, hashes: _Hashes) -> dict[str, Any]:
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise ConversionError(f"cannot read the source for its certificate: {e}",
                              path=path) from None
    return {"path": path, "size": size, "sha256": hashes.of(path)}


def _source_record(path: str, source: Any, hashes: _Hashes) -> dict[str, Any]:
    """The ``sources`` entry of one source (``source``: its open :class:`Source`, if any)."""
    if is_remote(path):
        if not isinstance(source, RemoteSource):  # pragma: no cover - a bug of ours
            raise ConversionError("a URL read without a remote source", path=path)
        return {"url": path, "size": source.size, **source.validators}
    if os.path.isdir(path):
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(root, name)
                if os.path.isfile(full):
                    rec = _file_record(full, hashes)
                    rec["name"] = os.path.relpath(full, path).replace(os.sep, "/")
                    del rec["path"]
                    files.append(rec)
        return {"path": path, "files": files}
    return _file_record(path, hashes)


def _resolved(value: Any, final: bool) -> Any:
    """A record with its pending sha256 values filled in (placeholders until ``final``)."""
    if isinstance(value, dict):
        return {k: _resolved(v, final) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v, final) for v in value]
    if hasattr(value, "result"):
        return value.result() if final else _SHA_PLACEHOLDER
    return value


@dataclass
class Certificate:
    """The certificate of one conversion: its sources, its transforms, and the digests of
    the tensors written (one :class:`Digests` for every output file of the run)."""

    transforms: dict[str, Any]
    sources: list[dict[str, Any]] = field(default_factory=list)
    digests: Digests = field(default_factory=Digests)
    _hashes: _Hashes = field(default_factory=_Hashes)
    _index: dict[str, int] = field(default_factory=dict)

    def add_source(self, path: str, source: Any = None) -> int:
        """Record a source (once) and start hashing it; its index in ``sources``."""
        if path not in self._index:
            self._index[path] = len(self.sources)
            self.sources.append(_source_record(path, source, self._hashes))
        return self._index[path]

    def observe(self, name: str) -> Any:
        """The source-bytes feed of a cast tensor (:meth:`Cast.apply`'s ``observe``)."""
        return self.digests.source(name)

    def text(self, tensors: Mapping[str, tuple[str | None, str | None]],
             final: bool) -> str:
        """The certificate of one output file: ``tensors``, output name -> (source path,
        source flat name; None for an array of the object tree), placeholders for the
        digests and source hashes until ``final``."""
        hexes = self.digests.hexdigests() if final else {}
        used = sorted({self._index[p] for p, _ in tensors.values() if p is not None})
        renumber = {old: new for new, old in enumerate(used)}
        records: dict[str, Any] = {}
        for name, (path, source_name) in tensors.items():
            if final and name not in hexes:  # pragma: no cover - a bug of ours
                raise ConversionError(f"the tensor {name!r} was written without its digest",
                                      member=name)
            src, out = hexes.get(name, (PLACEHOLDER, PLACEHOLDER))
            rec: dict[str, Any] = {"src": src, "out": out}
            if source_name is None:
                rec["tree"] = True
            elif source_name != name:
                rec["from"] = source_name
            if path is not None and len(used) > 1:
                rec["file"] = renumber[self._index[path]]
            records[name] = rec
        doc = {"schema": SCHEMA, "torchless": __version__, "digest": ALGORITHM,
               "sources": [_resolved(self.sources[i], final) for i in used],
               "transforms": self.transforms, "tensors": records}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True)

    def stamp(self, tensors: Mapping[str, Tensor], metadata: dict[str, str],
              origin: Mapping[str, tuple[str | None, str | None]]) -> Callable[[], bytes]:
        """Put one output's certificate in its ``metadata`` (placeholders: :meth:`text`);
        the function that gives that output's header again, digests filled in, once its
        data is written and hashed (``write_into``'s ``final_header``)."""
        metadata[METADATA_KEY] = self.text(origin, final=False)

        def final() -> bytes:
            return plan(tensors, {**metadata, METADATA_KEY: self.text(origin, True)})[0]

        return final

    def close(self) -> None:
        self._hashes.close()
        self.digests.close()


def parse(metadata: Mapping[str, str], path: str,
          max_depth: int = Limits.max_depth) -> dict[str, Any]:
    """The certificate in a safetensors file's ``__metadata__``, its shape checked."""
    text = metadata.get(METADATA_KEY)
    if text is None:
        raise FormatError("the file holds no torchless certificate (__metadata__["
                          f"{METADATA_KEY!r}])", path=path,
                          hint="convert with --certificate (certificate=True) to write one")
    try:
        doc = _json.loads(text, max_depth=max_depth, what="the certificate")
    except json.JSONDecodeError as e:
        raise FormatError(f"the certificate is not JSON: {e}", path=path) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise FormatError(f"the certificate is not of schema {SCHEMA}", path=path,
                          hint="verify it with the torchless version that wrote it")
    if doc.get("digest") != ALGORITHM:
        raise FormatError(f"the certificate's digest is {doc.get('digest')!r}, not "
                          f"{ALGORITHM!r}", path=path)
    why = _malformed(doc)
    if why:
        raise FormatError(f"the certificate is malformed: {why}", path=path,
                          hint="the file was edited or damaged: convert it again")
    return doc


_TRANSFORM_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str, type(None)), "ema": (bool,), "strip_prefix": (str, type(None)),
    "dtype": (str, type(None)), "dedupe": (bool,), "skip_unsupported": (bool,),
    "tree": (bool,)}
_HEX = frozenset("0123456789abcdef")


def _is_hex(value: object, digits: int) -> bool:
    return isinstance(value, str) and len(value) == digits and set(value) <= _HEX


def _malformed(doc: dict[str, Any]) -> str | None:
    """What is wrong with a certificate's shape (None: nothing)."""
    sources, transforms, tensors = doc.get("sources"), doc.get("transforms"), doc.get("tensors")
    if not isinstance(sources, list) or not all(isinstance(r, dict) for r in sources):
        return "sources is not a list of objects"
    for rec in sources:
        files = rec.get("files", [])
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(
                f.get("name"), str) for f in files):
            return "a source's files are not a list of named objects"
        for f in [rec, *files]:
            if not isinstance(f.get("size", 0), int) or (
                    "sha256" in f and not _is_hex(f["sha256"], 64)):
                return "a source's size or sha256 is malformed"
        if not any(isinstance(rec.get(k), str) for k in ("path", "url")):
            return "a source has neither path nor url"
    if not isinstance(transforms, dict):
        return "transforms is not an object"
    for k, types in _TRANSFORM_TYPES.items():
        if not isinstance(transforms.get(k), types):
            return f"transforms.{k} is malformed"
    for k in ("include", "exclude", "rename", "dtype_filter"):
        v = transforms.get(k)
        if not isinstance(v, list) or not all(
                isinstance(x, str) or (x is None and k != "dtype_filter") for x in v):
            return f"transforms.{k} is not a list of strings"
    if not isinstance(tensors, dict):
        return "tensors is not an object"
    for name, rec in tensors.items():
        if not isinstance(rec, dict) or not all(
                _is_hex(rec.get(k), HEX_DIGITS) for k in ("src", "out")):
            return f"the digests of {name!r} are malformed"
        if not isinstance(rec.get("from", ""), str) or type(rec.get("file", 0)) is not int \
                or rec.get("file", 0) < 0 or rec.get("tree", False) not in (True, False):
            return f"the record of {name!r} is malformed"
    return None


def replayable(transforms: Mapping[str, Any]) -> bool:
    """Whether every pattern of ``transforms`` was recorded (none was a function)."""
    return not any(v is None for k in ("include", "exclude", "rename")
                   for v in transforms.get(k, ()))


def recorded_patterns(values: Iterable[str | None]) -> list[str]:
    return [v for v in values if v is not None]
