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


def test_save_names_tensors_as_open_names_them(torch: ModuleType, tmp_path: Path) -> None:
    """One naming function: the names ``torchless.save`` gives the tensors of a live object
    are the names ``torchless.open`` gives them in ``torch.save`` of the same object. By hand
    (docs/formats.md): a bytes key is its UTF-8 text (``b"k"`` is ``k``), an int key its
    digits, a tuple key its repr, a PackedSequence (a namedtuple) its field indices."""
    from safetensors import safe_open
    from torch.nn.utils.rnn import pack_padded_sequence

    packed = pack_padded_sequence(torch.ones(3, 2, 4), [3, 2])
    obj = {b"k": torch.ones(2), (1, b"x"): torch.zeros(1), "n": {3: torch.ones(1)},
           "p": packed, "l": [torch.ones(1), {b"\xff": torch.ones(1)}]}
    torch.save(obj, tmp_path / "o.pt")
    with torchless.open(tmp_path / "o.pt") as ckpt:
        opened = sorted(ckpt.tensors)
    with pytest.warns(torchless.OpaqueObjectWarning):
        torchless.save(obj, tmp_path / "o.safetensors")
    with safe_open(str(tmp_path / "o.safetensors"), "np") as f:
        saved = sorted(f.keys())
    expected = sorted(["k", "(1, b'x')", "n.3", "p.0", "p.1", "l.0", "l.1.\\xff"])
    assert opened == expected
    assert saved == expected
