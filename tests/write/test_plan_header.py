"""The safetensors header :func:`torchless.write.safetensors.plan` formats entry by entry must
be exactly the text ``json.dumps`` makes of the same header dict (the oracle: the standard
library's encoder, compact, non-ASCII as UTF-8), for names JSON must escape too; names
safetensors cannot hold are refused as before."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest

from torchless.core import dtypes
from torchless.errors import InvalidKeyError
from torchless.model.tensor import Storage, Tensor
from torchless.write.safetensors import plan

_RANK = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64",
         "I64", "U64"]


def _tensor(dtype: str, shape: tuple[int, ...]) -> Tensor:
    dt = dtypes.by_torch_name(dtype)
    assert dt is not None
    n = math.prod(shape) * dt.itemsize
    storage = Storage("0", dt, n, lambda: bytes(n))
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return Tensor(storage, dt, shape, stride, 0)


def _expected(tensors: dict[str, Tensor], metadata: dict[str, str]) -> bytes:
    """The header built as a dict and encoded by json.dumps, in safetensors' order (dtype
    rank as the package lists it, widest first, then name)."""
    order = sorted(tensors, key=lambda n: (-_RANK.index(tensors[n].dtype.safetensors or ""), n))
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    pos = 0
    for name in order:
        t = tensors[name]
        end = pos + t.nbytes
        header[name] = {"dtype": t.dtype.safetensors, "shape": list(t.shape),
                        "data_offsets": [pos, end]}
        pos = end
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


NAMES = ["a", "w.0", 'quote"d', "back\\slash", "tab\there", "nl\n", "ctl\x01\x1f", "é", "日本",
         "emoji\U0001f600", "sep\u2028\u2029", "del\x7f", "", " ", "$ref", "0", "10", "9"]


def test_header_text_is_json_dumps_of_the_header() -> None:
    kinds = [("float32", (3, 4)), ("float16", (5,)), ("int64", ()), ("bool", (0, 2)),
             ("bfloat16", (2, 1, 3)), ("uint8", (300,)), ("float64", (1,))]
    tensors = {name: _tensor(*kinds[i % len(kinds)]) for i, name in enumerate(NAMES)}
    metadata = {"source": "m\u00e9.pt", "format": "pt", "x\"y": "a\nb", "tree": '{"$t":1}'}
    header, planned = plan(tensors, metadata)
    assert header == _expected(tensors, metadata)
    assert [p.name for p in planned] == [n for n in json.loads(header[8:]) if n != "__metadata__"]
    assert plan({}, {})[0] == _expected({}, {})


@pytest.mark.parametrize("bad", ["__metadata__", "lone\ud800"])
def test_names_safetensors_cannot_hold_are_refused(bad: str) -> None:
    tensors = {"ok": _tensor("float32", (2,)), bad: _tensor("float32", (2,))}
    with pytest.raises(InvalidKeyError) as info:
        plan(tensors, {})
    assert info.value.member is not None and info.value.member.startswith(bad[:4])


def test_metadata_that_is_not_unicode_is_refused() -> None:
    with pytest.raises(InvalidKeyError, match="metadata is not valid Unicode"):
        plan({"a": _tensor("float32", (1,))}, {"k": "v\udc80"})
