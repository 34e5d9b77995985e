"""The public surface (issue 13): a sorted ``__all__``, error classes in ``torchless.errors``,
and one keyword vocabulary for reading across open, load, convert, verify, scan and batch."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

import torchless
import torchless.errors
from torchless.api.batch import Op, Status
from torchless.scanner.files import FileStatus, Verdict

from ..conftest import REPO

EXAMPLE = REPO / "examples" / "tiny.pt"

#: The reading keywords and their one default.
READING = {"limits": None, "strict": False, "allow_globals": (), "verify_crc": False}


def test_all_is_sorted_and_exports_exist() -> None:
    assert torchless.__all__ == sorted(torchless.__all__)
    assert all(hasattr(torchless, name) for name in torchless.__all__)


def test_every_error_class_lives_in_torchless_errors() -> None:
    exported = [getattr(torchless, n) for n in torchless.__all__]
    errors = [e for e in exported if isinstance(e, type) and issubclass(e, BaseException)
              and not issubclass(e, Warning)]
    assert errors and all(e.__module__ == "torchless.errors" for e in errors)
    for e in errors:
        assert getattr(torchless.errors, e.__name__) is e


@pytest.mark.parametrize("func", ["open", "load", "convert", "verify", "scan"])
def test_one_keyword_vocabulary_with_one_default(func: str) -> None:
    params = inspect.signature(getattr(torchless, func)).parameters
    for name, default in READING.items():
        if func == "scan" and name == "verify_crc":
            continue  # the scanner checks every CRC always
        assert name in params, (func, name)
        assert params[name].default == default, (func, name)
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (func, name)
    if "skip_unsupported" in params:
        assert params["skip_unsupported"].default is False


def test_statuses_are_literal_types() -> None:
    assert set(get_args(Status)) == {"done", "skipped", "refused", "failed"}
    assert set(get_args(FileStatus)) == {"clean", "dangerous", "anomalous", "unvetted",
                                         "unreadable", "skipped", "error"}
    assert set(get_args(Verdict)) == {"rebuilt", "opaque", "unvetted", "dangerous"}
    assert set(get_args(Op)) == {"convert", "scan", "inspect"}


class _Unknown:
    pass


def _with_unknown_class(path: Path) -> None:
    # a plain pickle naming a class outside the rules (kept inert unless strict)
    path.write_bytes(pickle.dumps({"cfg": _Unknown()}, protocol=2))


def test_strict_reaches_every_reader(tmp_path: Path) -> None:
    src = tmp_path / "cfg.pkl"
    _with_unknown_class(src)
    torchless.open(src).close()
    for call in (lambda: torchless.open(src, strict=True),
                 lambda: torchless.load(src, strict=True),
                 lambda: torchless.convert(src, tmp_path / "o.safetensors", strict=True)):
        with pytest.raises(torchless.UnsafeGlobalError):
            call()
    assert torchless.scan(src).files[0].status == "unvetted"  # the tests' own class
    assert torchless.scan(src, strict=True).files[0].status == "dangerous"


def test_allow_globals_reaches_the_scanner(tmp_path: Path) -> None:
    src = tmp_path / "f.pkl"
    src.write_bytes(b"\x80\x02cmylib.utils\ndo_something\nX\x01\x00\x00\x00x\x85R.")
    assert torchless.scan(src).files[0].status == "unvetted"  # a package nobody vetted
    assert torchless.scan(src, strict=True).files[0].status == "dangerous"
    allowed = torchless.scan(src, allow_globals=["mylib.utils.do_something"])
    assert allowed.files[0].status == "clean"


def test_verify_crc_reaches_load_and_convert(torch: Any, tmp_path: Path) -> None:
    src = tmp_path / "m.pt"
    torch.save({"w": torch.arange(64.0)}, src)
    raw = bytearray(src.read_bytes())
    at = raw.find(torch.arange(64.0).numpy().tobytes())
    raw[at] ^= 1  # one bit of the tensor's bytes: its member's CRC no longer matches
    src.write_bytes(bytes(raw))
    torchless.load(src)  # CRCs of tensor members are not checked by default
    with pytest.raises(torchless.ChecksumError):
        torchless.load(src, verify_crc=True)
    with pytest.raises(torchless.ChecksumError):
        torchless.convert(src, tmp_path / "m.safetensors", verify_crc=True)
    assert not (tmp_path / "m.safetensors").exists()


def test_verify_skip_unsupported_defaults_to_false_like_convert(torch: Any,
                                                                 tmp_path: Path) -> None:
    src, dst = tmp_path / "s.pt", tmp_path / "s.safetensors"
    torch.save({"w": torch.ones(2), "s": torch.ones(2).to_sparse()}, src)
    torchless.convert(src, dst, skip_unsupported=True)
    assert not torchless.verify(src, dst).ok
    assert torchless.verify(src, dst, skip_unsupported=True).ok
    cli = [sys.executable, "-m", "torchless", "verify", str(src), str(dst)]
    assert subprocess.run(cli, capture_output=True).returncode == 1
    assert subprocess.run([*cli, "--skip-unsupported"], capture_output=True).returncode == 0


def test_the_drop_in_is_reached_as_an_attribute() -> None:
    """``torchless.torch`` before any ``import torchless.torch`` is the drop-in module. It
    recursed without end, and so did pickling, in a program that had imported torchless,
    any value pickle names by a dotted path (from protocol 4 a memory format is
    ``torch.channels_last``, and pickle probes that path on every loaded module)."""
    code = ("import sys, pickle, types, torchless\n"
            "probe = types.ModuleType('probe')\n"
            "probe.torch = types.SimpleNamespace(value=probe)\n"
            "class Dotted:\n"
            "    def __reduce__(self): return 'torch.value'\n"
            "Dotted.__module__ = None  # as torch's memory formats: pickle searches\n"
            "probe.torch.value = Dotted()\n"
            "sys.modules['probe'] = probe\n"
            "pickle.dumps(probe.torch.value, protocol=4)\n"
            "assert torchless.torch is sys.modules['torchless.torch']\n"
            "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "False"  # reaching the drop-in does not import torch
