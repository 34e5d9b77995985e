"""Dict keys and set members in the inert tree. Every file convert or save writes must load
back: a tensor used as a key (hashable in torch, an unhashable array when read) is refused
when writing, with nothing written; an opaque record's ``__setitem__`` arguments are not dict
keys, so any value is kept there (a pickle may call ``obj[[1, 2]] = v``)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import torchless
from tests._fuzz_inputs import _global, _uni, state_dict_pickle, tensor_ops, zip_checkpoint
from torchless import ConversionError, Global, Opaque


def test_tensor_keys_are_refused_by_save(torch: ModuleType, tmp_path: Path) -> None:
    t = torch.ones(2)
    for obj in ({t: 1}, {("a", t): 1}, {frozenset({("a", t)}): 1}, {t}, frozenset({(1, t)})):
        out = tmp_path / "o.safetensors"
        with pytest.raises(ConversionError, match="holds a tensor"):
            torchless.save({"x": obj}, out)
        assert not out.exists()


def test_a_checkpoint_with_a_tensor_key(torch: ModuleType, tmp_path: Path) -> None:
    """torch.save writes it and torch.load reads it; convert with the tree refuses (before,
    it wrote a file its own load refused), the tensors alone convert."""
    t = torch.arange(3.0)
    torch.save({"w": t, "lookup": {t: "x"}}, tmp_path / "k.pt")
    out = tmp_path / "k.safetensors"
    with pytest.raises(ConversionError, match="holds a tensor"):
        torchless.convert(tmp_path / "k.pt", out)
    assert not out.exists()
    torchless.convert(tmp_path / "k.pt", out, tree=False, verify=True)
    got = torchless.load(out)
    assert got["w"].tolist() == [0.0, 1.0, 2.0]


def test_opaque_setitem_arguments_need_not_be_hashable(tmp_path: Path) -> None:
    record = Opaque(Global("mymod", "Thing"))
    record.dict_items = [([1, 2], "list key"), ({"a": 1}, "dict key")]
    torchless.save({"r": record}, tmp_path / "o.inert")
    got = torchless.load(tmp_path / "o.inert")["r"]
    assert isinstance(got, Opaque) and got.dict_items == record.dict_items


def test_converted_pickle_with_a_list_setitem_on_a_record_loads(tmp_path: Path) -> None:
    """``mymod.Thing()[[1]] = 7`` as opcodes: the record keeps the call, the converted file
    keeps it too and loads (it failed with 'a list cannot be a dict key')."""
    thing = _global("mymod", "Thing") + b")R" + b"]K\x01a" + b"K\x07s"
    data = state_dict_pickle([("w", tensor_ops("0", 2, 0, (2,), (1,)))])
    data = data[:-1] + _uni("x") + thing + b"s."
    src = tmp_path / "t.pt"
    src.write_bytes(zip_checkpoint(data, {"0": bytes(8)}))
    out = tmp_path / "t.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning):
        torchless.convert(src, out, verify=True)
    got = torchless.load(out)["x"]
    assert isinstance(got, Opaque) and got.dict_items == [([1], 7)]
