"""What the scanner adds for the torch ZIP archives that are not ``torch.save`` files.

* A PT2 archive (``torch.export.save``): ``torch.export.load`` reads
  ``data/sample_inputs/<model>.pt`` with ``torch.load`` (``weights_only=True``, then
  ``weights_only=False`` when that fails: ``torch/_export/serde/serialize.py``,
  ``deserialize_torch_artifact``), tensor-subclass weights and constants (``use_pickle``)
  with ``torch.load(weights_only=False)``, ``opaque_obj_*`` constants with
  ``pickle.loads`` and ``custom_obj_*`` with TorchScript's unpickler
  (``torch/export/pt2_archive/_package.py``). Each ``torch.save`` archive stored in it is
  scanned as the file of its own it is, through the same walks (to :data:`MAX_NESTED`
  archives deep), and each pickled constant as a pickle.
* A ``torch.package`` archive: ``PackageImporter.load_pickle`` unpickles a resource with
  an importer that imports the archive's own modules: the ``.py`` source in it runs when a
  pickle names one of its classes. Each module is reported as code that runs on load
  (an anomaly of kind ``code``: what it does cannot be told from the pickles), and every
  resource that starts as a pickle does is scanned as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchless.containers.pt2 import MemberSource
from torchless.containers.regions import ScanWindow
from torchless.containers.ziparchive import Entry, ZipArchive
from torchless.io.window import Window

if TYPE_CHECKING:
    from torchless.scanner.layouts import LayoutScans

__all__ = ["MAX_NESTED", "archive_kind", "nested_archives", "package_code", "unpickled"]

#: Archives inside archives (a torch.save file inside a PT2 archive …) scanned this deep.
MAX_NESTED = 4
_ZIP = b"PK\x03\x04"
_PT2_PICKLED = ("/data/constants/opaque_obj_", "/data/constants/custom_obj_")


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


def package_code(scan: LayoutScans, members: list[Entry], prefix: str) -> None:
    """Each packaged module: code the package importer runs when a pickle imports it."""
    for m in members:
        if m.listed and m.name.lower().endswith(".py"):
            module = m.name[len(prefix):-3].replace("/", ".")
            scan.flag("code", f"the archive's own module {module}: torch.package's importer "
                      "runs this source when a pickle names one of its classes (code that "
                      "runs on load; review it)", m.name)


def nested_archives(scan: LayoutScans, archive: ZipArchive, members: list[Entry],
                    prefix: str) -> None:
    """Each ``torch.save`` archive stored under ``data/`` of a PT2 archive, scanned; each
    shared library (an AOTInductor package's compiled model) reported as code."""
    data = prefix.lower() + "data/"
    for m in members:
        if m.listed and m.name.lower().endswith(".so"):
            scan.flag("code", "a shared library: loading the AOTInductor package "
                      "(torch._inductor.aoti_load_package) runs its native code", m.name)
        if not m.listed or not m.name.lower().startswith(data) or m.size < 4:
            continue
        head, _ = archive.head(m, 4)
        if head is None or bytes(head[:4]) != _ZIP:
            continue
        if scan.depth >= MAX_NESTED:
            scan.flag("limit", f"a ZIP archive nested more than {MAX_NESTED} deep: not "
                      "scanned", m.name)
            continue
        nested_scan(scan, archive, m)


def nested_scan(scan: LayoutScans, archive: ZipArchive, m: Entry) -> None:
    if m.method == 0 and 0 <= m.data_offset and m.data_offset + m.size <= scan.size:
        source: Window | MemberSource = ScanWindow(scan.source, m.data_offset,
                                               m.size, m.name)
    else:
        cap = scan.limits.max_pickle_bytes
        data, why = archive.head(m, min(m.size, cap) + 1)
        if data is None or len(data) > cap:
            scan.flag("limit" if data is not None else "member",
                      f"a nested archive that cannot be scanned: {why or 'larger than '}"
                      f"{'' if why else f'max_pickle_bytes={cap}'}", m.name)
            return
        source = MemberSource(m.name, data)
    try:
        found = scan.nested(source)  # type: ignore[arg-type]
    finally:
        source.close()
    if found.error is not None:
        scan.flag("nested", "a ZIP archive torch.load would read, but not a torch "
                  f"archive: {found.error.message}", m.name)
        return
    found.merge(m.name)
    if found.layout != "zip":
        scan.flag("nested", f"a {found.layout} file where torch.export.save writes a "
                  "torch.save archive", m.name)
