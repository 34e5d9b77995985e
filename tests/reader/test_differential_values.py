"""Differential tests for plain values torch.save writes in forms the other differential
files do not: each file is written by real torch and read back by ``torch.load`` (the
oracle); torchless must read the same values and ``convert`` must keep them.

Torch is only imported through the ``torch`` fixture, so without torch these tests skip.
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless

pytestmark = pytest.mark.torch


def _torch_load(torch: ModuleType, path: Path) -> Any:
    return torch.load(path, weights_only=False)  # our own file: nothing foreign runs


def _same_numpy(exp: Any, act: Any) -> bool:
    return (type(act) is type(exp) and act.dtype == exp.dtype
            and getattr(act, "shape", ()) == getattr(exp, "shape", ())
            and np.asarray(act).tobytes() == np.asarray(exp).tobytes()
            and bool(np.all(np.asarray(act) == np.asarray(exp))))


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_empty_numpy_string_scalars(torch: ModuleType, tmp_path: Path, fmt: str,
                                    protocol: int) -> None:
    """``np.str_("")`` and ``np.bytes_(b"")`` pickle with a dtype of item size 0 (``<U0``,
    ``|S0``) and no bytes: NumPy has no buffer to view, yet torch.load reads them, and so
    must torchless; an array of ``V0`` elements likewise. ``convert`` keeps the scalars."""
    obj = {"text": np.str_(""), "raw": np.bytes_(b""), "void": np.void(b""),
           "voids": np.zeros((2, 3), dtype="V0"), "names": [np.str_("a"), np.str_("")]}
    path = tmp_path / "strings.pt"
    torch.save(obj, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    expected = _torch_load(torch, path)
    loaded = torchless.load(path)
    for key in ("text", "raw", "void", "voids"):
        assert _same_numpy(expected[key], loaded[key]), (key, loaded[key], expected[key])
    assert [type(v) for v in loaded["names"]] == [type(v) for v in expected["names"]]
    assert loaded["names"] == expected["names"]

    del obj["void"], obj["voids"]  # the inert format has no dtype of item size 0 for these
    torch.save(obj, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    expected = _torch_load(torch, path)
    out = tmp_path / "strings.safetensors"
    report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    again = torchless.load(out)
    for key in ("text", "raw"):
        assert _same_numpy(expected[key], again[key]), (key, again[key], expected[key])
    assert again["names"] == expected["names"]
    assert [v.dtype for v in again["names"]] == [v.dtype for v in expected["names"]]


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("protocol", [4, 5])
def test_memory_formats_named_through_a_torch_submodule(torch: ModuleType, tmp_path: Path,
                                                       fmt: str, protocol: int) -> None:
    """From protocol 4, pickle writes a memory format as ``<module>`` + ``torch.<format>``
    (its ``__reduce__`` is the dotted text; protocols 2 and 3 cannot pickle it at all):
    torch.load walks to the value, torchless reads the inert ``Global("torch", <format>)``
    where it refused an attribute walk, and ``scan`` calls the file clean."""
    formats = ["channels_last", "contiguous_format", "preserve_format", "channels_last_3d"]
    obj = {"formats": [getattr(torch, f) for f in formats], "w": torch.arange(4.0)}
    path = tmp_path / "formats.pt"
    torch.save(obj, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    assert b"torch.channels_last" in path.read_bytes()  # the dotted form this test is about
    expected = _torch_load(torch, path)
    loaded = torchless.load(path)
    assert all(isinstance(g, torchless.Global) and g.module == "torch" for g in loaded["formats"])
    assert [getattr(torch, g.name) for g in loaded["formats"]] == expected["formats"]
    np.testing.assert_array_equal(loaded["w"], expected["w"].numpy())
    assert torchless.scan(path).files[0].status == "clean"
    out = tmp_path / "formats.safetensors"
    report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    assert torchless.load(out)["formats"] == loaded["formats"]


def _quantized_model(torch: ModuleType, kind: str) -> Any:
    """A model of torch's quantized modules, weights in packed attributes (no parameters)."""
    torch.manual_seed(0)
    q = torch.ao.quantization
    nn = torch.nn
    if kind == "dynamic":
        float_model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2, bias=False),
                                    nn.LSTM(2, 3), nn.GRUCell(3, 3))
        return q.quantize_dynamic(float_model, {nn.Linear, nn.LSTM, nn.GRUCell},
                                  dtype=torch.qint8)
    if kind == "embedding":
        float_model = nn.Sequential(nn.Embedding(10, 4), nn.EmbeddingBag(10, 4))
        float_model[0].qconfig = q.float_qparams_weight_only_qconfig
        float_model[1].qconfig = q.QConfig(
            activation=q.PlaceholderObserver,
            weight=q.PerChannelMinMaxObserver.with_args(
                dtype=torch.quint4x2, qscheme=torch.per_channel_affine_float_qparams,
                ch_axis=0))
        return q.convert(q.prepare(float_model))
    float_model = nn.Sequential(q.QuantStub(), nn.Conv2d(1, 2, 3), nn.ReLU(),
                                nn.Conv2d(2, 2, 1, bias=False), nn.Flatten(),
                                nn.Linear(32, 4), nn.ReLU(), nn.Linear(4, 2),
                                q.DeQuantStub()).eval()
    float_model = q.fuse_modules(float_model, [["1", "2"], ["5", "6"]])
    float_model.qconfig = q.get_default_qconfig("fbgemm")
    prepared = q.prepare(float_model)
    prepared(torch.randn(8, 1, 6, 6))
    return q.convert(prepared)


def _check_entry(torch: ModuleType, exp: Any, act: Any, where: str) -> None:
    from tests import _expected_names as en
    from tests import _kinds_oracle as ko

    if isinstance(exp, torch.Tensor) and exp.is_quantized:
        assert isinstance(act, torchless.TensorRecord), where
        assert not ko.differences(ko.parts_of_record(act), ko.torch_parts(exp)), where
    elif isinstance(exp, torch.Tensor):
        assert isinstance(act, np.ndarray), (where, type(act))
        assert str(act.dtype) == str(exp.dtype).removeprefix("torch."), where
        assert act.shape == tuple(exp.shape), where
        assert np.ascontiguousarray(act).tobytes() == en.tensor_bytes(exp), where
    elif isinstance(exp, tuple):
        assert isinstance(act, tuple) and len(act) == len(exp), where
        for i, (e, a) in enumerate(zip(exp, act, strict=True)):
            _check_entry(torch, e, a, f"{where}.{i}")
    elif isinstance(exp, torch.dtype):
        assert act.name == str(exp).removeprefix("torch."), where


@pytest.mark.parametrize("kind", ["dynamic", "static", "embedding"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_quantized_model_saved_whole(torch: ModuleType, tmp_path: Path, kind: str,
                                     protocol: int) -> None:
    """``torch.save(quantized_model)``: the module becomes its ``state_dict()``, whose
    weights, ``scale`` and ``zero_point`` come from the quantized modules' own
    ``_save_to_state_dict`` (packed ScriptObjects, plain numbers, a convolution's tuple
    state; no parameters). They were lost: such modules read as nothing, their tensors
    nowhere. The oracle is the saved model's own ``state_dict()`` (torch 2.13 cannot call
    it on a quantized convolution it loaded: the module's tuple state leaves out its hooks)."""
    from tests import _expected_names as en

    path = tmp_path / "quantized.pt"
    with warnings.catch_warnings():  # torch deprecates its eager quantization API
        warnings.simplefilter("ignore")
        model = _quantized_model(torch, kind)
        torch.save(model, path, pickle_protocol=protocol)
        _torch_load(torch, path)  # torch reads the file
        expected = model.state_dict()
    loaded = torchless.load(path, modules="state_dict")
    assert list(loaded) == list(expected)
    for key, value in expected.items():
        if isinstance(value, (torch.Tensor, tuple, torch.dtype)):
            _check_entry(torch, value, loaded[key], key)
    names = [name for name, _ in en.expected_names(model).leaves]
    with torchless.open(path) as ckpt:
        assert sorted([*ckpt.tensors, *ckpt.unsupported]) == sorted(names)
        assert ckpt.unsupported  # the quantized weights, as records
    out = tmp_path / "quantized.safetensors"
    with warnings.catch_warnings():  # the dynamic LSTM's packed weights stay inert records
        warnings.simplefilter("ignore", torchless.OpaqueObjectWarning)
        report = torchless.convert(path, out, verify=True, skip_unsupported=True)
    assert report.verified is not None and report.verified.ok
    # the inert output keeps the module's record (its class and attributes), as load() of
    # the source gives it; the state dict above is the modules="state_dict" view of it
    back, record = torchless.load(out), torchless.load(path)
    assert isinstance(back, torchless.Opaque) and isinstance(record, torchless.Opaque)
    assert back.callable == record.callable


def test_a_child_module_with_a_state_of_its_own_is_kept(torch: ModuleType,
                                                        tmp_path: Path) -> None:
    """A module whose class pickles a ``__getstate__`` tuple cannot become a state dict;
    as a child of a module saved whole it was dropped with its tensors. It stays an inert
    record under its name, its tensor named inside it."""
    from tests._statemodules import Packed

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Packed())
    path = tmp_path / "packed.pt"
    torch.save(model, path)
    expected = _torch_load(torch, path).state_dict()
    loaded = torchless.load(path, modules="state_dict")
    assert list(loaded) == ["0.weight", "0.bias", "1"]
    assert isinstance(loaded["1"], torchless.Opaque)
    with torchless.open(path) as ckpt:
        assert list(ckpt.tensors) == ["0.weight", "0.bias", "1.0._parameters.w"]
        np.testing.assert_array_equal(ckpt.tensors["1.0._parameters.w"].numpy(),
                                      expected["1.w"].detach().numpy())


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_numpy_datetimes(torch: ModuleType, tmp_path: Path, fmt: str, protocol: int) -> None:
    """datetime64 / timedelta64 arrays, scalars and dtypes (their dtype pickles a unit in its
    metadata) read as torch.load reads them, where they were inert records; ``convert``
    keeps them. The generic unit (``np.datetime64("NaT")``), which no inert descr names,
    stays an inert record."""
    obj = {"stamps": np.array(["2020-01-01T00:00:01.5", "NaT"], dtype="M8[ns]"),
           "steps": np.arange(4).astype("m8[25s]"), "day": np.datetime64("2024-02-29"),
           "hours": np.timedelta64(7, "h"), "swapped": np.array([1, 2], dtype=">M8[D]"),
           "unit": np.dtype("m8[ms]"), "grid": np.arange(6).astype("M8[s]").reshape(2, 3).T}
    path = tmp_path / "times.pt"
    torch.save({**obj, "generic": np.datetime64("NaT")}, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    expected = _torch_load(torch, path)
    loaded = torchless.load(path)
    assert isinstance(loaded["generic"], torchless.Opaque)
    for key in obj:
        _same_bits(expected[key], loaded[key], key)  # bits: NaT != NaT
    out = tmp_path / "times.safetensors"
    with warnings.catch_warnings():  # the generic NaT is an inert record
        warnings.simplefilter("ignore", torchless.OpaqueObjectWarning)
        report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    again = torchless.load(out)
    for key in obj:
        _same_bits(expected[key], again[key], key)


def _same_bits(exp: Any, act: Any, where: str) -> None:
    assert type(act) is type(exp), where
    if isinstance(exp, np.dtype):
        assert act == exp, where
        return
    assert act.dtype == exp.dtype and np.shape(act) == np.shape(exp), where
    assert np.asarray(act).tobytes() == np.asarray(exp).tobytes(), where


def test_a_bare_time_zone_converts_as_an_inert_record(torch: ModuleType,
                                                      tmp_path: Path) -> None:
    """A ``zoneinfo.ZoneInfo`` value (not on a datetime) reads as torch.load reads it; the
    inert format names zones only on datetimes, so ``convert`` stores it as the inert record
    of its own ``__reduce__`` (it refused, calling ``ZoneInfo._unpickle`` nameless)."""
    import zoneinfo

    zone = zoneinfo.ZoneInfo("UTC")
    path = tmp_path / "zone.pt"
    torch.save({"zone": zone, "w": torch.ones(2)}, path)
    assert torchless.load(path)["zone"] is _torch_load(torch, path)["zone"]
    out = tmp_path / "zone.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning, match="ZoneInfo._unpickle"):
        report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    stored = torchless.load(out)["zone"]
    func, args = zone.__reduce__()
    assert isinstance(stored, torchless.Opaque)
    assert (stored.callable.module, stored.callable.name) == (func.__self__.__module__,
                                                              func.__qualname__)
    assert stored.args == args


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("protocol", [1, 2, 5])
def test_ellipsis_and_not_implemented(torch: ModuleType, tmp_path: Path, fmt: str,
                                      protocol: int) -> None:
    """``...`` and ``NotImplemented`` have no opcode: pickle writes them as globals of
    ``builtins`` (``__builtin__`` at protocols below 3), a module whose other names are
    refused. They are constants, not code: torchless reads them as torch.load does, the scan
    calls the file clean, and ``convert`` keeps them (``$const``)."""
    obj = {"index": (slice(None), ...), "rest": ..., "missing": NotImplemented,
           "nested": [1, {"k": ...}], "w": torch.arange(3.0)}
    path = tmp_path / "consts.pt"
    torch.save(obj, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    expected = _torch_load(torch, path)
    loaded = torchless.load(path)
    assert loaded["index"] == expected["index"] and loaded["index"][1] is Ellipsis
    assert loaded["rest"] is Ellipsis and loaded["missing"] is NotImplemented
    assert loaded["nested"] == [1, {"k": ...}] == expected["nested"]
    assert torchless.scan(path).exit_code == 0

    out = tmp_path / "consts.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no inert record: the constants themselves
        report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    again = torchless.load(out)
    assert again["index"] == (slice(None), ...) and again["rest"] is Ellipsis
    assert again["missing"] is NotImplemented and again["nested"] == [1, {"k": ...}]


#: A namedtuple pickle can find again (module level).
Pair = collections.namedtuple("Pair", "first second")


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("protocol", [1, 2])
def test_namedtuples_named_by_index_at_every_protocol(torch: ModuleType, tmp_path: Path,
                                                      fmt: str, protocol: int) -> None:
    """Protocols 0 and 1 pickle a namedtuple (and ``PackedSequence``, one) as
    ``copyreg._reconstructor(cls, tuple, fields)``, protocol 2 as ``cls.__new__(cls,
    *fields)``: the same object, so the same names, by index (``p.0``), as the naming rule's
    oracle gives them; they were ``p.args.2.0`` at protocols 0 and 1."""
    from tests import _expected_names as en

    obj = {"pair": Pair(torch.ones(2), torch.arange(3)),
           "packed": torch.nn.utils.rnn.pack_sequence([torch.ones(3), torch.ones(2)]),
           "nested": [Pair(torch.zeros(1), Pair(torch.ones(1), 5))]}
    path = tmp_path / "tuples.pt"
    torch.save(obj, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=fmt == "zip")
    expected = en.expected_names(_torch_load(torch, path))
    with torchless.open(path) as ckpt:
        assert sorted(ckpt.tensors) == sorted(name for name, _ in expected.leaves)
        assert "pair.0" in ckpt.tensors and "nested.0.1.0" in ckpt.tensors


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_named_fixed_offset_time_zones_survive_convert(torch: ModuleType, tmp_path: Path,
                                                       fmt: str) -> None:
    """``timezone(offset, name)`` keeps its name through ``convert`` (``;tzname=`` in the
    inert tree), where the name was dropped silently and only the offset came back."""
    import datetime

    named = datetime.timezone(-datetime.timedelta(hours=5, minutes=30), "EST;tzname=x")
    obj = {"at": datetime.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=named),
           "clock": datetime.time(1, 2, 3, tzinfo=named),
           "utc": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc),
           "plain": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone(
               datetime.timedelta(hours=2))), "w": torch.ones(1)}
    path = tmp_path / "zones.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
    expected = _torch_load(torch, path)
    out = tmp_path / "zones.safetensors"
    report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    again = torchless.load(out)
    for key in ("at", "clock", "utc", "plain"):
        assert again[key] == expected[key]
        assert again[key].tzinfo.tzname(None) == expected[key].tzinfo.tzname(None), key
    assert again["at"].tzinfo.tzname(None) == "EST;tzname=x"
