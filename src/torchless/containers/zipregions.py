"""The regions of a torch ZIP archive (the ``zip`` layout: ``torch.save``, TorchScript, PT2,
``torch.package``), walked by the reader's own parser in report mode
(:class:`~.ziparchive.ZipArchive`) and handed to a :class:`~.regions.RegionSink`:

* every member (not only ``data.pkl``): a pickle when its name ends in ``pkl`` (any case:
  torch's reader ignores case) or when torch unpickles it whatever its name (see
  :func:`unpickled`), else bytes that may hold one; its CRC-32 checked against the recorded
  one where it is read whole anyway (or every member's, with ``verify_crc``);
* the bytes no member owns (before, between and after the members);
* TorchScript code: every ``.py`` member under ``code/``;
* a PT2 archive (``torch.export.save``): ``torch.export.load`` reads
  ``data/sample_inputs/<model>.pt`` with ``torch.load`` (``weights_only=True``, then
  ``weights_only=False`` when that fails: ``torch/_export/serde/serialize.py``,
  ``deserialize_torch_artifact``), tensor-subclass weights and constants (``use_pickle``)
  with ``torch.load(weights_only=False)``, ``opaque_obj_*`` constants with
  ``pickle.loads`` and ``custom_obj_*`` with TorchScript's unpickler
  (``torch/export/pt2_archive/_package.py``). Each ``torch.save`` archive stored in it is a
  nested archive (to :data:`MAX_NESTED` archives deep), each pickled constant a pickle;
* a ``torch.package`` archive: ``PackageImporter.load_pickle`` unpickles a resource with
  an importer that imports the archive's own modules: the ``.py`` source in it runs when a
  pickle names one of its classes. Each module is reported as code that runs on load
  (an anomaly of kind ``code``: what it does cannot be told from the pickles), and every
  resource that starts as a pickle does is a pickle.
"""

from __future__ import annotations

import zlib
from typing import Any

from torchless.containers.pt2 import MemberSource
from torchless.containers.regions import SNIFF, RegionSink, ScanWindow, absorb
from torchless.containers.torchzip import not_a_torch_zip
from torchless.containers.ziparchive import Entry, ZipArchive
from torchless.core.limits import Limits
from torchless.io.source import Source
from torchless.io.window import Window

__all__ = ["MAX_NESTED", "archive_kind", "unpickled", "zip_regions"]

#: Archives inside archives (a torch.save file inside a PT2 archive …) scanned this deep.
MAX_NESTED = 4
#: Bytes of a stored member checksummed at a time (then handed back to the page cache).
_CRC_BLOCK = 64 << 20
#: Members larger than this are not inflated just to check their CRC.
_CRC_INFLATE_CAP = 64 << 20
_ZIP = b"PK\x03\x04"
_PT2_PICKLED = ("/data/constants/opaque_obj_", "/data/constants/custom_obj_")


def _remember() -> dict[int, bytes]:
    """Where whole ``code/`` members read for the pickle sniff are kept for the code walk,
    which would read them again (by ``id()`` of the entry)."""
    return {}


def zip_regions(source: Source, limits: Limits, sink: RegionSink, *,
                skip_prefix: bool = False) -> str:
    """The archive's regions (``skip_prefix``: the bytes before the archive belong to
    another layout's walk: a polyglot); returns ``zip``, ``torchscript``, ``pt2`` or
    ``package``."""
    return _ZipWalk(source, limits, sink).run(skip_prefix=skip_prefix)


def archive_kind(names: list[str]) -> tuple[str | None, str]:
    """``("pt2" | "package" | None, prefix)`` of an archive, from its listed member names
    (torch's reader looks names up ignoring case)."""
    lower = {n.lower() for n in names}
    for n in names:
        if "/" not in n:
            continue
        prefix = n.split("/", 1)[0] + "/"
        if (prefix + "archive_format").lower() in lower:
            return "pt2", prefix
        if (prefix + ".data/extern_modules").lower() in lower:
            return "package", prefix
        break
    return None, ""


def unpickled(kind: str | None, prefix: str, name: str) -> bool | None:
    """Whether torch would unpickle the member whatever its first byte (True), if it starts
    as a pickle does (None: a package resource), or not directly (False)."""
    if kind is None:
        return False
    low = name.lower()
    if kind == "pt2":
        return any(low.startswith(prefix.lower() + p[1:]) for p in _PT2_PICKLED)
    if kind == "package":
        rest = low[len(prefix):]
        if low.startswith(prefix.lower()) and not rest.startswith(".data/") \
                and not rest.endswith(".py") and rest != "byteorder":
            return None
    return False


class _ZipWalk:
    """The walk of one archive."""

    def __init__(self, source: Source, limits: Limits, sink: RegionSink) -> None:
        self.source = source
        self.buf: Any = source.raw
        self.size = source.size
        self.limits = limits
        self.sink = sink
        self.archive = ZipArchive(source, limits, mode="report")
        self._crcs: dict[tuple[int, int, int, int], int | None] = {}
        self._code = _remember()

    def run(self, *, skip_prefix: bool) -> str:
        archive, sink = self.archive, self.sink
        absorb(sink, archive.findings, skip_prefix=skip_prefix)
        for lo, hi in archive.loose:
            if not (skip_prefix and lo == 0):
                sink.chain(self.buf, lo, hi, None, "unowned", tentative=True)
        members = [m for m in archive.members if not m.is_dir]
        lows = [m.name.lower() for m in members]  # torch's reader ignores case
        names = [m.name for m in members if m.listed]
        listed = [low for m, low in zip(members, lows, strict=True) if m.listed]
        kind, prefix = archive_kind(names)
        for m, low in zip(members, lows, strict=True):
            self.member(m, unpickled(kind, prefix, m.name), low)
        self.script(members, lows)
        if kind == "pt2":
            self.nested_archives(members, prefix)
        elif kind == "package":
            self.package_code(members, prefix)
        pickles = [n for n, low in zip(names, listed, strict=True)
                   if low == "data.pkl" or low.endswith("/data.pkl")]
        if len(pickles) > 1:
            sink.flag("torch", f"{len(pickles)} data.pkl records ({', '.join(pickles[:4])}): "
                      "readers pick different ones")
        prefixes = sorted({n.split("/", 1)[0] for n in names if "/" in n})
        if len(prefixes) > 1:
            sink.flag("torch", f"members under {len(prefixes)} top-level directories "
                      f"({', '.join(prefixes[:4])}): several checkpoints in one archive")
        if kind is not None:
            return kind
        if not sink.found_any() and not pickles:
            raise not_a_torch_zip(names)
        script = any(low.endswith("/constants.pkl") for low in listed)
        code = any("/code/" in low for low in listed)
        if script and not code:
            sink.flag("torch", "constants.pkl without code/: a torch.save archive dressed as "
                      "TorchScript (loaders dispatch it to torch.jit.load)")
        return "torchscript" if script and code else "zip"

    def script(self, members: list[Entry], lows: list[str]) -> None:
        """The TorchScript code in the archive (torch finds ``code/`` and ``.py`` ignoring
        case; ``lows``: the members' names in lower case)."""
        cap = self.limits.max_pickle_bytes
        for m, name in zip(members, lows, strict=True):
            if "code/" not in name or not name.endswith(".py"):
                continue
            data = self._code.get(id(m))
            if data is None or len(data) > cap:
                data, _ = self.archive.head(m, cap)
            if data is None:
                continue
            self.sink.code(m.name, data)

    def member(self, m: Entry, pickled: bool | None = False, low: str | None = None) -> None:
        """``pickled``: torch unpickles the member whatever it holds (True), or if it
        starts with PROTO (None: a torch.package resource); ``low``: its name in lower
        case."""
        archive, sink, limits = self.archive, self.sink, self.limits
        low = m.name.lower() if low is None else low
        # data.pkl, constants.pkl, *.debug_pkl; any case (torch's reader ignores case)
        is_pickle = low.endswith("pkl") or pickled is True
        if pickled is None and m.size > 2:
            head, _ = archive.head(m, 2)
            is_pickle = is_pickle or (head is not None and head[:1] == b"\x80")
        if is_pickle and m.size > limits.max_pickle_bytes:
            sink.flag("limit", f"pickle member of {m.size} bytes is larger than "
                      f"max_pickle_bytes={limits.max_pickle_bytes}; not scanned", m.name)
            return
        cap = min(m.size + 1, limits.max_pickle_bytes + 1) if is_pickle else SNIFF
        data, why = archive.head(m, cap)
        if data is None:
            if why and m.method in (0, 8):
                sink.flag("member", f"cannot be read: {why}", m.name, m.data_offset)
            return
        if len(data) < cap and "code/" in low:
            self._code[id(m)] = data  # the whole member: script() reads it again
        if not is_pickle and not sink.could_be_pickle(data):  # most members: tensor data
            self._check_crc(m, data, whole=False)
            return
        self._check_crc(m, data, whole=True)
        if not is_pickle:
            if m.size > len(data):
                data, _ = archive.head(m, min(m.size, limits.max_pickle_bytes))
                if data is None:
                    return
        if is_pickle:
            sink.chain(data, 0, min(len(data), m.size), m.name, "member")
        else:
            sink.pickle(data, 0, len(data), m.name, "member", tentative=True)

    def _check_crc(self, m: Entry, head: bytes, *, whole: bool) -> None:
        """The member's CRC-32 against the recorded one. ``whole``: the member is a pickle
        (or reads as one), so its CRC is checked even where its bytes are not all in
        ``head``; the CRC of other members (tensor data, which torch reads unchecked and no
        unpickler runs) only when ``head`` holds them all, or with ``verify_crc``."""
        if m.method == 8 and len(head) > m.size:
            self.sink.flag("member", f"inflates to more than the {m.size} bytes declared",
                           m.name, m.data_offset)
            return
        if not self.archive.has_crc or m.method not in (0, 8) or not m.listed:
            return
        in_hand = len(head) >= (m.compressed_size if m.method == 0 else m.size)
        if not (whole or in_hand or self.sink.verify_crc):
            return
        key = (m.data_offset, m.compressed_size, m.method, m.size)
        if key not in self._crcs:
            self._crcs[key] = self._crc(m, head)
        crc = self._crcs[key]
        if crc is not None and crc != m.crc:
            self.sink.flag("crc", "CRC-32 of the bytes differs from the recorded one (torch "
                           "does not check it)", m.name, m.data_offset)

    def _crc(self, m: Entry, head: bytes) -> int | None:
        if m.data_offset < 0 or m.data_offset + m.compressed_size > self.size:
            return None  # reported as out of bounds by the ZIP pass
        if m.method == 0:
            if len(head) == m.compressed_size:  # the whole member, as head() read it
                return zlib.crc32(head)
            crc = 0
            for lo in range(m.data_offset, m.data_offset + m.compressed_size, _CRC_BLOCK):
                hi = min(lo + _CRC_BLOCK, m.data_offset + m.compressed_size)
                crc = zlib.crc32(self.buf[lo:hi], crc)
                self.source.release(lo, hi - lo)  # keep the resident set small
            return crc
        if m.size <= len(head):
            data: bytes | None = head
        elif m.size <= _CRC_INFLATE_CAP:
            data, _ = self.archive.head(m, m.size + 1)
        else:
            return None
        if data is None:
            return None
        if len(data) != m.size:
            self.sink.flag("member", f"inflates to {len(data)} bytes, {m.size} declared",
                           m.name, m.data_offset)
            return None
        return zlib.crc32(data)

    # ---- PT2 and torch.package --------------------------------------------------------

    def package_code(self, members: list[Entry], prefix: str) -> None:
        """Each packaged module: code the package importer runs when a pickle imports it."""
        for m in members:
            if m.listed and m.name.lower().endswith(".py"):
                module = m.name[len(prefix):-3].replace("/", ".")
                self.sink.flag("code", f"the archive's own module {module}: torch.package's "
                               "importer runs this source when a pickle names one of its "
                               "classes (code that runs on load; review it)", m.name)

    def nested_archives(self, members: list[Entry], prefix: str) -> None:
        """Each ``torch.save`` archive stored under ``data/`` of a PT2 archive, scanned; each
        shared library (an AOTInductor package's compiled model) reported as code."""
        sink = self.sink
        data = prefix.lower() + "data/"
        for m in members:
            if m.listed and m.name.lower().endswith(".so"):
                sink.flag("code", "a shared library: loading the AOTInductor package "
                          "(torch._inductor.aoti_load_package) runs its native code", m.name)
            if not m.listed or not m.name.lower().startswith(data) or m.size < 4:
                continue
            head, _ = self.archive.head(m, 4)
            if head is None or bytes(head[:4]) != _ZIP:
                continue
            if sink.depth >= MAX_NESTED:
                sink.flag("limit", f"a ZIP archive nested more than {MAX_NESTED} deep: not "
                          "scanned", m.name)
                continue
            self.nested(m)

    def nested(self, m: Entry) -> None:
        sink = self.sink
        if m.method == 0 and 0 <= m.data_offset and m.data_offset + m.size <= self.size:
            source: Window | MemberSource = ScanWindow(self.source, m.data_offset,
                                                       m.size, m.name)
        else:
            cap = self.limits.max_pickle_bytes
            data, why = self.archive.head(m, min(m.size, cap) + 1)
            if data is None or len(data) > cap:
                sink.flag("limit" if data is not None else "member",
                          f"a nested archive that cannot be scanned: {why or 'larger than '}"
                          f"{'' if why else f'max_pickle_bytes={cap}'}", m.name)
                return
            source = MemberSource(m.name, data)
        try:
            found = sink.nested(source)  # type: ignore[arg-type]
        finally:
            source.close()
        if found.error is not None:
            sink.flag("nested", "a ZIP archive torch.load would read, but not a torch "
                      f"archive: {found.error.message}", m.name)
            return
        found.merge(m.name)
        if found.layout != "zip":
            sink.flag("nested", f"a {found.layout} file where torch.export.save writes a "
                      "torch.save archive", m.name)
