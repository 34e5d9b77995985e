"""Converting a checkpoint torch saved keeps the values ``torchless.load`` reads from it:
``load(convert(src))`` equals ``load(src)``, type for type; torch.load is the oracle for
what the source holds (and, for ``torchless.save`` of live objects, what torch's own round
trip keeps)."""

from __future__ import annotations

import argparse
import collections
import datetime
import enum
import os
import subprocess
import sys
import warnings
import zoneinfo
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from torchless import Global, Opaque

pytestmark = pytest.mark.torch


def _convert(src: Path, tmp_path: Path) -> Any:
    out = tmp_path / "out.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchless.OpaqueObjectWarning)
        report = torchless.convert(src, out, verify=True)
    assert report.verified is not None and report.verified.ok
    return torchless.load(out)


class Holder:
    """An object torchless keeps as a record, holding a class in its state."""

    def __init__(self) -> None:
        self.kind = dict


def test_classes_kept_by_reference_are_plain_globals(torch: ModuleType,
                                                     tmp_path: Path) -> None:
    obj = {"cls": dict, "od": collections.OrderedDict, "nd": np.ndarray, "list": [int, set],
           "keyed": {dict: 1}, "holder": Holder()}
    torch.save(obj, tmp_path / "c.pt")
    want = torch.load(tmp_path / "c.pt", weights_only=False)
    got = torchless.load(tmp_path / "c.pt")

    def expected(cls: type) -> Global:
        return Global(cls.__module__, cls.__qualname__)

    for key in ("cls", "od", "nd"):
        assert type(got[key]) is Global and got[key] == expected(want[key]), key
    assert [type(g) for g in got["list"]] == [Global, Global]
    assert got["list"] == [expected(c) for c in want["list"]]
    assert list(got["keyed"]) == [expected(dict)] and type(next(iter(got["keyed"]))) is Global
    assert type(got["holder"].state["kind"]) is Global
    assert got["holder"].state["kind"] == expected(want["holder"].kind)
    back = _convert(tmp_path / "c.pt", tmp_path)
    for key in ("cls", "od", "nd", "list", "keyed"):
        assert back[key] == got[key], key
    assert back["holder"].state == got["holder"].state


def _utc() -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo("UTC")
    except zoneinfo.ZoneInfoNotFoundError:  # pragma: no cover - a machine without tzdata
        pytest.skip("no time zone database")


def test_a_zone_held_alone_converts_as_a_record(torch: ModuleType, tmp_path: Path) -> None:
    zone = _utc()
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=zone)
    torch.save({"zone": zone, "when": when}, tmp_path / "z.pt")
    assert torch.load(tmp_path / "z.pt", weights_only=False)["zone"] is zone
    src = torchless.load(tmp_path / "z.pt")
    assert src["zone"] is zone and src["when"] == when
    out = tmp_path / "z.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning, match="ZoneInfo"):
        torchless.convert(tmp_path / "z.pt", out)
    back = torchless.load(out)
    assert back["when"] == when and back["when"].tzinfo is zone
    record = back["zone"]  # the format has no tag for a zone alone: what pickle would call
    assert isinstance(record, Opaque)
    func, args = zone.__reduce__()  # the oracle: how the zone pickles itself
    assert record.callable == Global(func.__self__.__module__, func.__qualname__)
    assert record.args == args


@pytest.mark.parametrize("make", [
    lambda t: {"k": {t: "v"}},
    lambda t: {"s": {(1, (t,))}},
    lambda t: [collections.OrderedDict([(t, 1)])],
], ids=["dict key", "set member in a tuple", "ordered dict key"])
def test_a_tensor_key_is_refused_not_written_unloadable(torch: ModuleType, tmp_path: Path,
                                                        make: Any) -> None:
    """A tensor key loads as a NumPy array, which cannot be a key (section 2.2: readers
    refuse it), so the writer refuses it instead of writing a file no one can load."""
    t = torch.ones(2)
    obj = make(t)
    torch.save(obj, tmp_path / "k.pt")
    assert torch.load(tmp_path / "k.pt", weights_only=False) is not None  # torch reads it
    out = tmp_path / "k.safetensors"
    with pytest.raises(torchless.ConversionError, match="dict key or set member"):
        torchless.convert(tmp_path / "k.pt", out, verify=True)
    assert not out.exists()
    with pytest.raises(torchless.ConversionError, match="dict key or set member"):
        torchless.save(obj, out)
    assert not out.exists()
    torchless.convert(tmp_path / "k.pt", out, tree=False)  # the tensors alone still convert
    assert [v.tolist() for v in torchless.load(out).values()] == [[1.0, 1.0]]


def test_a_lone_surrogate_in_a_string_converts(torch: ModuleType, tmp_path: Path) -> None:
    """A path a program decoded with surrogateescape (a non-UTF-8 byte in ``sys.argv``) is
    a ``str`` no UTF-8 text holds; JSON's escapes do."""
    arg = b"/data/caf\xe9".decode("utf-8", "surrogateescape")
    obj = {"args": argparse.Namespace(data=arg), "names": {arg: 1}, "w": torch.ones(2)}
    torch.save(obj, tmp_path / "s.pt")
    want = torch.load(tmp_path / "s.pt", weights_only=False)
    assert want["args"].data == arg  # the oracle: pickle keeps the surrogate
    back = _convert(tmp_path / "s.pt", tmp_path)
    assert back["args"] == want["args"] and back["names"] == want["names"]
    assert back["w"].tolist() == [1.0, 1.0]
    assert torchless.load(tmp_path / "s.pt")["names"] == back["names"]


def _inserted(order: tuple[Any, ...]) -> set[Any]:
    out: set[Any] = set()
    for v in order:  # members whose hashes collide iterate in the order they came
        out.add(v)
    return out


def test_a_set_is_written_the_same_whatever_its_iteration_order(tmp_path: Path) -> None:
    a, b = _inserted((1, 9, 17, "x")), _inserted(("x", 17, 9, 1))
    assert a == b and list(a) != list(b)  # one set, two iteration orders
    torchless.save({"s": a, "f": frozenset(a)}, tmp_path / "a.safetensors")
    torchless.save({"s": b, "f": frozenset(b)}, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert torchless.load(tmp_path / "a.safetensors") == {"s": a, "f": frozenset(a)}


class Stage(enum.Enum):
    TRAIN = 1
    VAL = 2
    TEST = 3


def test_sets_verify_in_every_process(torch: ModuleType, tmp_path: Path) -> None:
    """Records (an Enum member torchless does not rebuild) hash by identity and ``str`` by a
    per-process salt: read again, a set iterates in another order. verify, which encodes the
    source again, must still find the converted tree identical."""
    obj = {"w": torch.ones(2), "stages": {Stage.TRAIN, Stage.VAL, Stage.TEST},
           "nans": {float("nan"), float("nan"), 1.0},
           "tags": frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})}
    torch.save(obj, tmp_path / "s.pt")
    back = _convert(tmp_path / "s.pt", tmp_path)  # converts, then verifies in this process
    assert {o.args for o in back["stages"]} == {(s.value,) for s in Stage}
    assert back["tags"] == obj["tags"]
    out = tmp_path / "out.safetensors"
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-m", "torchless", "verify", "-q",
                               str(tmp_path / "s.pt"), str(out)], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stdout + done.stderr


def test_attributes_of_live_torch_tensors_are_saved(torch: ModuleType, tmp_path: Path) -> None:
    """``torch.save`` keeps what a program set on a tensor (transformers marks parameters
    ``_is_hf_initialized``); so does ``torchless.save``, shared values staying shared."""
    shared = {"k": [1]}
    t = torch.ones(2)
    t.note, t.shared = "x", shared
    p = torch.nn.Parameter(torch.zeros(2))
    p._is_hf_initialized = True
    p.peer = t
    obj = {"t": t, "p": p, "shared": shared}
    torch.save(obj, tmp_path / "ref.pt")
    want = torch.load(tmp_path / "ref.pt", weights_only=False)
    torchless.save(obj, tmp_path / "a.safetensors")
    got = torchless.load(tmp_path / "a.safetensors", framework="pt")
    for key in ("t", "p"):
        assert type(got[key]) is type(want[key]), key
        assert sorted(vars(got[key])) == sorted(vars(want[key])), key
    assert got["t"].note == want["t"].note and got["p"]._is_hf_initialized is True
    assert got["t"].shared is got["shared"] and got["p"].peer is got["t"]
    assert want["t"].shared is want["shared"] and want["p"].peer is want["t"]
    setattr(t, "not-a-name", 1)
    with pytest.raises(torchless.ConversionError, match="not-a-name"):
        torchless.save(obj, tmp_path / "b.safetensors")


@pytest.mark.parametrize("protocol", [2, 4])
def test_datetime64_arrays_read_and_convert_as_arrays(torch: ModuleType, tmp_path: Path,
                                                      protocol: int) -> None:
    """NumPy datetime64 / timedelta64 values read as torch.load gives them (arrays, scalars
    and dtypes with their unit), and convert as arrays of that descr (section 2.6)."""
    obj = {"days": np.array(["2020-01-01", "NaT"], dtype="M8[D]"),
           "big_endian": np.arange(3).astype(">m8[ms]"),
           "ten_s": np.array([0, 10], dtype="M8[10s]"),
           "fortran": np.array([[1, 2], [3, 4]], dtype="m8[us]").T,
           "scalar": np.datetime64("2020-01-01T00:00:00", "s"), "delta": np.timedelta64(5, "ms"),
           "dtype": np.dtype(">M8[ns]")}
    torch.save(obj, tmp_path / "t.pt", pickle_protocol=protocol)
    want = torch.load(tmp_path / "t.pt", weights_only=False)
    got = torchless.load(tmp_path / "t.pt")
    for key, value in want.items():
        assert type(got[key]) is type(value), key
        assert got[key] == value if key == "dtype" else got[key].dtype == value.dtype, key
        if key != "dtype":  # by value (NaT is not equal to itself), in the native order
            assert np.asarray(got[key]).view("i8").tolist() == np.asarray(value).view(
                "i8").tolist(), key
    back = _convert(tmp_path / "t.pt", tmp_path)
    for key, value in got.items():
        assert type(back[key]) is type(value), key
        assert back[key] == value if key == "dtype" else back[key].dtype == value.dtype, key
    assert back["days"].tobytes() == got["days"].tobytes()


class FixedZone(datetime.tzinfo):
    """A time zone class of the program's own (as pytz's and dateutil's are)."""

    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(hours=2)

    def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(0)

    def tzname(self, dt: datetime.datetime | None) -> str:
        return "FZ"


def test_a_datetime_in_a_zone_of_an_unknown_class_is_a_record(torch: ModuleType,
                                                                tmp_path: Path) -> None:
    """An ordinary object is never a reason to refuse a file: the datetime is kept as the
    record of its pickled call, its zone a record too."""
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=FixedZone())
    at = datetime.time(7, 8, tzinfo=FixedZone())
    torch.save({"when": when, "at": at, "w": torch.ones(1)}, tmp_path / "z.pt")
    want = torch.load(tmp_path / "z.pt", weights_only=False)
    assert want["when"] == when and want["at"].tzname() == "FZ"
    got = torchless.load(tmp_path / "z.pt")
    for key, cls in (("when", "datetime.datetime"), ("at", "datetime.time")):
        record = got[key]
        assert isinstance(record, Opaque) and record.class_path == cls, key
        _func, args = want[key].__reduce__()  # the oracle: what the value pickles as
        assert record.args[0] == args[0], key
        assert isinstance(record.args[1], Opaque)
        assert record.args[1].class_path.endswith("FixedZone")
    with pytest.warns(torchless.OpaqueObjectWarning, match="datetime.datetime"):
        torchless.convert(tmp_path / "z.pt", tmp_path / "z.safetensors", verify=True)
    back = torchless.load(tmp_path / "z.safetensors")
    assert back["when"].args[0] == got["when"].args[0]


def test_the_order_key_of_a_set_member_is_bounded() -> None:
    """A member that repeats its parts (each frozenset held three times by the next) has
    3**40 paths; its order key looks at a bounded number of them, and still tells members
    apart by what comes first."""
    from torchless.inert.setorder import member_key

    f: frozenset[Any] = frozenset({1})
    for _ in range(40):
        f = frozenset({f, (f,), (f, 1)})
    assert len(member_key(f)) < 100_000
    assert member_key((1, f)) < member_key((2, f))
