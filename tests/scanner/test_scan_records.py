"""The scanner's fast record makers and its memo of header pickles give what the plain
constructors and a fresh run give."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from torchless.core.limits import Limits
from torchless.pickle.values import Global, new_global
from torchless.scanner.modelrun import FoundGlobal, new_found
from torchless.scanner.plain import HEADERS, PlainStreams
from torchless.scanner.report import Action, GlobalRef, new_action, new_global_ref

_ACTION = ("call", "torch._utils._rebuild_tensor_v2", "vetted", "a rule", 12, "REDUCE",
           "(1, 2)", 3, "archive/data.pkl")
_REF = ("torch", "FloatStorage", 40, "GLOBAL", "rebuilt", None, "")
_FOUND = ("collections", "OrderedDict", 7, "STACK_GLOBAL", "")
_GLOBAL = ("collections", "OrderedDict", 7)


@pytest.mark.parametrize(("make", "cls", "args"), [
    (new_action, Action, _ACTION), (new_global_ref, GlobalRef, _REF),
    (new_found, FoundGlobal, _FOUND), (new_global, Global, _GLOBAL)])
def test_maker_builds_the_dataclass_itself(make: Any, cls: type, args: tuple[Any, ...]) -> None:
    made, plain = make(*args), cls(*args)
    assert type(made) is cls
    assert made == plain and hash(made) == hash(plain)
    # every field set, none more (a field added to the class must be added to its maker)
    assert vars(made) == {f.name: getattr(plain, f.name) for f in dataclasses.fields(cls)}
    assert dataclasses.asdict(made) == dataclasses.asdict(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.offset = 0


def test_made_action_counts_like_the_constructed_one() -> None:
    made = new_action(*_ACTION)
    assert made.count == 1
    assert made.counted(4) == Action(*_ACTION, count=4)
    moved = Action(*_ACTION[:4], 112, _ACTION[5], _ACTION[6], 103, "m", count=4)
    assert made.counted(4).at(100, "m") == moved
    assert vars(made.counted(4).at(100, "m")) == vars(moved)
    no_origin = Action(*_ACTION[:7], None, None)
    assert no_origin.at(5, "m") == Action(*_ACTION[:4], 17, *_ACTION[5:7], None, "m")


# torch.save's legacy header pickles (protocol 2), as pickle writes them
_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
_SYS_INFO = pickle.dumps({"protocol_version": 1001, "little_endian": True,
                          "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)


def test_memo_answers_only_the_same_bytes_under_the_same_limits() -> None:
    memo, limits = PlainStreams(), Limits()
    value = pickle.loads(_SYS_INFO)
    memo.keep("legacy sys_info", _SYS_INFO, 0, len(_SYS_INFO), value, limits)
    data = b"junk" + _SYS_INFO + b"tail"
    got = memo.find("legacy sys_info", data, 4, len(data), limits)
    assert got == (value, 4 + len(_SYS_INFO))
    assert got is not None and got[0] is not value and got[0]["type_sizes"] is not \
        value["type_sizes"]  # a fresh copy each time
    assert memo.find("legacy magic number", data, 4, len(data), limits) is None
    assert memo.find("legacy sys_info", data, 4, len(data), Limits()) is None  # other limits
    assert memo.find("legacy sys_info", data, 3, len(data), limits) is None
    assert memo.find("legacy sys_info", data, 4, 4 + len(_SYS_INFO) - 1, limits) is None
    other = _SYS_INFO.replace(b"little", b"LITTLE")
    assert memo.find("legacy sys_info", other, 0, len(other), limits) is None


def test_memo_keeps_no_stream_whose_outcome_may_depend_on_other_bytes() -> None:
    memo, limits = PlainStreams(), Limits()
    framed = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=4)  # PROTO, FRAME to the STOP
    memo.keep("legacy magic number", framed, 0, len(framed), 1, limits)
    assert memo.find("legacy magic number", framed, 0, len(framed), limits) == (1, len(framed))
    # a FRAME that reaches past the STOP: what follows decides whether a reader runs it
    long_frame = framed[:3] + (len(framed) - 10).to_bytes(8, "little") + framed[11:]
    memo.keep("legacy magic number", long_frame, 0, len(long_frame), 1, limits)
    assert memo.find("legacy magic number", long_frame, 0, len(long_frame), limits) is None
    memo.keep("legacy magic number", _MAGIC, 0, len(_MAGIC), object(), limits)  # no plain data
    assert memo.find("legacy magic number", _MAGIC, 0, len(_MAGIC), limits) is None


def test_memo_is_bounded() -> None:
    memo, limits = PlainStreams(), Limits()
    for n in range(1000):
        raw = pickle.dumps(n * 1000003 + (n << 40), protocol=2)
        memo.keep("legacy magic number", raw, 0, len(raw), n, limits)
    assert sum(len(v) for v in memo._by_length.values()) <= 16 * 8
    assert {"legacy magic number", "legacy sys_info"} <= HEADERS
