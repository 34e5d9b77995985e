"""The pickle interpreter, by layer: opcode table vs the stdlib, values vs pickle.loads,
limits and malformed streams. Oracle: CPython's own pickle on data we generate here."""

from __future__ import annotations

import _pickle
import collections
import gc
import math
import pickle
import pickletools
import struct
import sys
import threading
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchless import (
    LimitError,
    Limits,
    PickleError,
    TruncatedInputError,
    UnsafeGlobalError,
    UnsupportedError,
    UnsupportedOpcodeError,
)
from torchless.model.graph import finish
from torchless.pickle.machine import Resolver, run_pickle
from torchless.pickle.opcodes import OPCODES
from torchless.pickle.values import Global, Opaque
from torchless.rules.resolver import TorchResolver


def loads(data: bytes, limits: Limits | None = None) -> Any:
    lim = limits or Limits()
    value, end = run_pickle(data, TorchResolver(lim), lim)
    assert end == len(data)
    return finish(value, lim)


def inert(data: bytes) -> Any:
    return run_pickle(data)[0]


# ---- opcode table -------------------------------------------------------------------


def test_opcode_table_matches_pickletools() -> None:
    ours = {op.name: op for op in OPCODES}
    theirs = {op.name: op for op in pickletools.opcodes}
    assert set(ours) == set(theirs)
    for name, op in theirs.items():
        mine = ours[name]
        assert mine.code == ord(op.code), name
        assert mine.proto == op.proto, name
        expected_arg = op.arg.name if op.arg is not None else "none"
        assert mine.arg.value == expected_arg, name


def test_opcode_codes_are_unique() -> None:
    codes = [op.code for op in OPCODES]
    assert len(codes) == len(set(codes))


# ---- values: property test against pickle.loads ------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.complex_numbers(allow_nan=False),
)
hashables = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
values = st.recursive(
    scalars | st.binary().map(bytearray),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(hashables, inner, max_size=5),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=25,
)


def same(a: Any, b: Any) -> bool:
    """Equality that also checks exact types (True is not 1) and float bit patterns."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(value=values, protocol=st.integers(min_value=0, max_value=5))
def test_plain_data_matches_pickle_loads(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    expected = pickle.loads(data)
    assert same(loads(data), expected)


@pytest.mark.parametrize("protocol", range(6))
def test_shared_references_stay_shared(protocol: int) -> None:
    inner = [1, 2]
    data = pickle.dumps({"a": inner, "b": inner, "t": (inner, inner)}, protocol=protocol)
    out = loads(data)
    assert out["a"] is out["b"] is out["t"][0] is out["t"][1]


@pytest.mark.parametrize("protocol", range(6))
def test_recursive_list_keeps_its_cycle_through_the_vm_and_the_finish(protocol: int) -> None:
    x: list[Any] = [1]
    x.append(x)
    data = pickle.dumps(x, protocol=protocol)
    out = inert(data)
    assert out[1] is out
    done = loads(data)
    assert done[0] == 1 and done[1] is done  # as pickle.loads gives it


@pytest.mark.parametrize("protocol", range(6))
def test_cycle_through_a_tuple_is_patched_when_the_tuple_is_rebuilt(protocol: int) -> None:
    # the tuple holds a NumPy array (rebuilt after the run), so finishing replaces the tuple;
    # the list inside it, which points back at the tuple, must then point at the new one
    inner: list[Any] = []
    t = (inner, np.arange(3))
    inner.append(t)
    data = pickle.dumps(t, protocol=protocol)
    done = loads(data)
    assert isinstance(done[1], np.ndarray) and done[1].tolist() == [0, 1, 2]
    assert done[0][0] is done


@pytest.mark.parametrize("protocol", range(6))
def test_stdlib_values_are_rebuilt(protocol: int) -> None:
    import argparse
    import datetime
    import pathlib

    od = collections.OrderedDict([("b", 1), ("a", 2)])
    value = {
        "od": od, "ns": argparse.Namespace(lr=0.1, name="x"),
        "dt": datetime.datetime(2024, 5, 6, 7, 8, 9, 10),
        "d": datetime.date(2020, 1, 2), "td": datetime.timedelta(days=1, seconds=3),
        "tz": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
        "dd": collections.defaultdict(list, {"k": [1]}), "dq": collections.deque([1, 2], 5),
        "ct": collections.Counter("abca"), "sl": slice(1, 5, 2), "p": pathlib.PurePosixPath("a/b"),
        "r": range(1, 7, 2),
    }
    out = loads(pickle.dumps(value, protocol=protocol))
    assert out == value
    assert type(out["od"]) is collections.OrderedDict
    assert list(out["od"]) == ["b", "a"]
    assert out["dd"].default_factory is list
    assert out["dq"].maxlen == 5


@pytest.mark.parametrize("protocol", range(6))
def test_numpy_values_are_rebuilt(protocol: int) -> None:
    import numpy as np

    arr = np.arange(12, dtype=">i4").reshape(3, 4)
    value = {"a": arr, "f": np.asfortranarray(arr.astype("<f8")), "s": np.float32(1.5),
             "i": np.int64(-3), "b": np.array([True, False]), "e": np.zeros((0, 3), "<u2"),
             "state": np.random.RandomState(0).get_state()}
    data = pickle.dumps(value, protocol=protocol)
    out, expected = loads(data), pickle.loads(data)
    for key in ("a", "f", "b", "e"):
        assert out[key].dtype == expected[key].dtype
        assert out[key].flags.f_contiguous == expected[key].flags.f_contiguous
        np.testing.assert_array_equal(out[key], expected[key])
    assert out["s"] == np.float32(1.5) and out["s"].dtype == np.float32
    assert out["i"] == -3 and out["i"].dtype == np.int64
    assert out["state"][0] == "MT19937"
    np.testing.assert_array_equal(out["state"][1], value["state"][1])


class Custom:
    def __init__(self) -> None:
        self.x = 1
        self.y = [1, 2]


@pytest.mark.parametrize("protocol", range(6))
def test_unknown_class_is_an_inert_record(protocol: int) -> None:
    out = loads(pickle.dumps(Custom(), protocol=protocol))
    assert isinstance(out, Opaque)
    assert out.class_path == f"{__name__}.Custom"
    assert out.state == {"x": 1, "y": [1, 2]}


def test_default_resolver_is_fully_inert() -> None:
    out = inert(pickle.dumps(collections.OrderedDict(a=1), protocol=2))
    assert isinstance(out, Opaque)
    assert out.callable == Global("collections", "OrderedDict")


# ---- the garbage collector ------------------------------------------------------------


class _CollectorProbe(Resolver):
    """Notes whether the collector is on at each GLOBAL, i.e. during the run; ``inner``
    runs a nested pickle from inside the outer run."""

    def __init__(self, inner: bytes | None = None) -> None:
        self.seen: list[bool] = []
        self.inner = inner

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self.seen.append(gc.isenabled())
        if self.inner is not None:
            run_pickle(self.inner, _CollectorProbe())
            self.seen.append(gc.isenabled())
        return super().find_global(module, name, offset)


_NAMES_A_GLOBAL = b"cm\nn\n."


def test_collector_is_left_on_while_another_thread_runs() -> None:
    """gc.disable() is process-wide: with another thread alive, a run must not touch it."""
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        probe = _CollectorProbe()
        run_pickle(_NAMES_A_GLOBAL, probe)
        assert probe.seen == [True]
        assert gc.isenabled()
    finally:
        release.set()
        other.join()


def test_collector_paused_alone_is_restored_after_a_run_nested_or_failed() -> None:
    if threading.active_count() != 1:
        pytest.skip("another thread is alive in this test process")
    probe = _CollectorProbe(inner=_NAMES_A_GLOBAL)
    run_pickle(_NAMES_A_GLOBAL, probe)
    assert probe.seen == [False, False]  # paused, and still paused after the nested run
    assert gc.isenabled()
    with pytest.raises(PickleError):
        run_pickle(b"cm\nn\n0)0a.", _CollectorProbe())
    assert gc.isenabled()


def test_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        run_pickle(_NAMES_A_GLOBAL, _CollectorProbe())
        with pytest.raises(PickleError):
            run_pickle(b"0.")
        assert not gc.isenabled()
    finally:
        gc.enable()


# ---- NEWOBJ on known classes -------------------------------------------------------


def _newobj_program(module: str, name: str, args: bytes, fill: bytes, ex: bool) -> bytes:
    """PROTO 4, GLOBAL module.name, the argument tuple, NEWOBJ (or NEWOBJ_EX with {}),
    then ``fill`` applied to the new object."""
    head = b"\x80\x04c" + module.encode() + b"\n" + name.encode() + b"\n" + args
    return head + (b"}\x92" if ex else b"\x81") + fill + b"."


_ONE_TWO = b"(K\x01K\x02l\x85"  # ([1, 2],)
_PAIRS = b"((K\x01K\x02tl\x85"  # ([(1, 2)],)


_NEWOBJ_CASES = [
    ("builtins", "list", list, ([1, 2],), _ONE_TWO, b"(K\x03e", lambda o: o.extend([3])),
    ("builtins", "list", list, (), b")", b"K\x03a", lambda o: o.append(3)),
    ("builtins", "dict", dict, ([(1, 2)],), _PAIRS, b"(K\x03K\x04u",
     lambda o: o.update({3: 4})),
    ("builtins", "set", set, ([1, 2],), _ONE_TWO, b"(K\x03\x90", lambda o: o.add(3)),
    ("builtins", "bytearray", bytearray, (b"ab",), b"C\x02ab\x85", b"", lambda o: None),
    ("collections", "OrderedDict", collections.OrderedDict, ([(1, 2)],), _PAIRS,
     b"(K\x03K\x04u", lambda o: o.update({3: 4})),
    ("collections", "Counter", collections.Counter, ([(1, 2)],), _PAIRS, b"", lambda o: None),
    ("collections", "deque", collections.deque, ([1, 2],), _ONE_TWO, b"(K\x03e",
     lambda o: o.extend([3])),
    ("collections", "defaultdict", collections.defaultdict, ([(1, 2)],), _PAIRS,
     b"(K\x03K\x04u", lambda o: o.update({3: 4})),
    ("builtins", "frozenset", frozenset, ([1, 2],), _ONE_TWO, b"", lambda o: None),
    ("builtins", "tuple", tuple, ([1, 2],), _ONE_TWO, b"", lambda o: None),
]


@pytest.mark.parametrize("module,name,cls,args,arg_bytes,fill,apply", _NEWOBJ_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(_NEWOBJ_CASES)])
@pytest.mark.parametrize("ex", [False, True], ids=["NEWOBJ", "NEWOBJ_EX"])
def test_newobj_of_a_known_class_is_its_dunder_new(
        module: str, name: str, cls: Any, args: tuple[Any, ...], arg_bytes: bytes,
        fill: bytes, apply: Any, ex: bool) -> None:
    """What ``cls.__new__(cls, *args)`` gives in CPython (containers come out empty: their
    __init__ fills them, and NEWOBJ does not call it), then filled by the opcodes after."""
    expected = cls.__new__(cls, *args)
    apply(expected)
    out = loads(_newobj_program(module, name, arg_bytes, fill, ex))
    assert type(out) is type(expected)
    assert out == expected
    if cls is collections.defaultdict:
        assert out.default_factory is None


@pytest.mark.parametrize("name,arg_bytes", [("object", _ONE_TWO), ("int", b")")])
def test_newobj_arguments_a_builtin_refuses_are_refused(name: str, arg_bytes: bytes) -> None:
    for kwargs in (b"}", b"}X\x01\x00\x00\x00xK\x01s"):
        data = b"\x80\x04cbuiltins\n" + name.encode() + b"\n" + arg_bytes + kwargs + b"\x92."
        cls = {"object": object, "int": int}[name]
        args = ([1, 2],) if arg_bytes == _ONE_TWO else ()
        kw = {"x": 1} if len(kwargs) > 1 else {}
        try:
            cls.__new__(cls, *args, **kw)
        except TypeError:
            with pytest.raises(PickleError):
                loads(data)
        else:
            loads(data)


# ---- refusals ----------------------------------------------------------------------


def _global_call(module: str, name: str, arg: str) -> bytes:
    return (b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n"
            + b"X" + struct.pack("<I", len(arg)) + arg.encode() + b"\x85R.")


@pytest.mark.parametrize("module,name", [
    ("os", "system"), ("posix", "system"), ("builtins", "eval"), ("builtins", "exec"),
    ("builtins", "getattr"), ("builtins", "__import__"), ("subprocess", "Popen"),
    ("runpy", "_run_code"), ("importlib", "import_module"), ("pickle", "loads"),
    ("torch", "save"), ("torch.storage", "_load_from_bytes"), ("numpy", "load"),
    ("pathlib", "os.system"), ("numpy", "__builtins__"), ("functools", "reduce"),
    ("mylib.utils", "do_something"), ("__builtin__", "eval"),
])
def test_dangerous_globals_are_refused(module: str, name: str) -> None:
    with pytest.raises(UnsafeGlobalError) as info:
        loads(_global_call(module, name, "x"))
    assert info.value.names


def test_allow_globals_keeps_a_refused_function_inert() -> None:
    data = _global_call("mylib.utils", "do_something", "x")
    lim = Limits()
    out, _ = run_pickle(data, TorchResolver(lim, allow=frozenset({"mylib.utils.do_something"})),
                        lim)
    assert isinstance(out, Opaque) and out.args == ("x",)


def test_strict_refuses_unknown_classes() -> None:
    data = pickle.dumps(Custom(), protocol=2)
    lim = Limits()
    with pytest.raises(UnsafeGlobalError):
        run_pickle(data, TorchResolver(lim, strict=True), lim)


def test_extension_codes_are_refused() -> None:
    with pytest.raises(UnsafeGlobalError):
        loads(b"\x80\x02\x82\x01.")


# ---- malformed streams and limits ---------------------------------------------------


@pytest.mark.parametrize("data,error", [
    (b"", TruncatedInputError),
    (b".", PickleError),
    (b"\x80\x02N", TruncatedInputError),
    (b"\x80\x06N.", UnsupportedOpcodeError),
    (b"\xff", UnsupportedOpcodeError),
    (b"\x80\x02NN.", PickleError),
    (b"\x80\x02(N.", PickleError),
    (b"\x80\x02t.", PickleError),
    (b"\x80\x02h\x07.", PickleError),
    (b"\x80\x02q\x00.", PickleError),
    (b"\x80\x02X\xff\xff\xff\xffab.", TruncatedInputError),
    (b"\x80\x02T\xff\xff\xff\xff.", PickleError),
    (b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b".", TruncatedInputError),
    (b"\x80\x04\x95" + (1 << 62).to_bytes(8, "little") + b"N.", TruncatedInputError),
    (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00C\x10" + b"a" * 16 + b".", PickleError),
    (b"I1\x00x\n.", PickleError),
    (b"\x80\x05\x97.", UnsupportedError),
    (b"\x80\x02]K\x01s.", PickleError),
    (b"\x80\x02}K\x01a.", PickleError),
    (b"\x80\x02}]K\x01s.", PickleError),
    (b"\x80\x02X\x01\x00\x00\x00a)R.", PickleError),
    (b"\x80\x04K*K\x01\x93.", PickleError),
    (b"cmod\n\xf8\n.", PickleError),
    (b"ccollections\x00os\nOrderedDict\n.", UnsafeGlobalError),
])
def test_malformed_streams_raise_our_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        loads(data)


def test_deep_tuples_hit_the_depth_limit() -> None:
    data = b"\x80\x02N" + b"\x85" * 100_000 + b"."
    with pytest.raises(LimitError) as info:
        loads(data)
    assert info.value.limit_name == "max_depth"


def test_deep_marks_hit_the_depth_limit() -> None:
    with pytest.raises(LimitError):
        loads(b"(" * 10_000 + b"N.")


def test_memo_limit() -> None:
    data = b"\x80\x04N" + b"\x94" * 20 + b"."
    with pytest.raises(LimitError):
        loads(data, Limits(max_memo=10))
    assert loads(data, Limits(max_memo=20)) is None


def test_opcode_limit() -> None:
    data = b"\x80\x02N" + b"0N" * 50 + b"."
    with pytest.raises(LimitError):
        loads(data, Limits(max_opcodes=50))


def test_string_limit_checked_after_presence() -> None:
    payload = b"\x80\x03X\x10\x00\x00\x00" + b"a" * 16 + b"."
    with pytest.raises(LimitError):
        loads(payload, Limits(max_str_bytes=8))


def test_text_long_digit_limit() -> None:
    with pytest.raises(LimitError):
        loads(b"L" + b"9" * 5000 + b"L\n.")


def _long_opcode(value: int) -> bytes:
    """LONG1/LONG4 of ``value`` in the minimal encoding pickle writes."""
    raw = pickle.encode_long(value)
    if len(raw) < 256:
        return b"\x80\x02\x8a" + bytes([len(raw)]) + raw + b"."
    return b"\x80\x02\x8b" + struct.pack("<i", len(raw)) + raw + b"."


def test_binary_long_digit_limit_is_the_text_one() -> None:
    """A LONG4 of 4,301 digits loads in C, but Python then cannot print it (its int -> str
    limit is 4,300 digits): refused like the same number as text; 4,300 digits load."""
    for big in (10**4300, -(10**4300)):
        data = _long_opcode(big)
        assert pickle.loads(data) == big
        with pytest.raises(ValueError, match="4300"):
            repr(pickle.loads(data))
        with pytest.raises(LimitError) as info:
            loads(data)
        assert info.value.limit_name == "max_int_digits" and info.value.actual == 4301
        with pytest.raises(LimitError):  # the same number as text
            loads(b"L" + b"-" * (big < 0) + b"1" + b"0" * 4300 + b"L\n.")
    for edge in (10**4300 - 1, -(10**4300 - 1)):
        data = _long_opcode(edge)
        out = loads(data)
        assert out == pickle.loads(data)
        assert len(repr(abs(out))) == 4300


@settings(max_examples=300, deadline=None)
@given(value=st.integers(min_value=-(10**40), max_value=10**40), limit=st.integers(1, 40))
def test_binary_long_digit_limit_is_exact(value: int, limit: int) -> None:
    data = _long_opcode(value)
    lim = Limits(max_int_digits=limit)
    if len(str(abs(value))) <= limit:
        assert loads(data, lim) == value
    else:
        with pytest.raises(LimitError):
            loads(data, lim)


def test_padded_binary_long_longer_than_the_digit_limit_allows_is_refused_unread() -> None:
    data = b"\x80\x02\x8b" + struct.pack("<i", 1 << 20) + b"\x05" + bytes((1 << 20) - 1) + b"."
    assert pickle.loads(data) == 5  # C reads the padded encoding; no pickler writes one
    with pytest.raises(LimitError, match="room for"):
        loads(data)
    with pytest.raises(TruncatedInputError):  # the length is checked against the data first
        loads(data[:1000])


def test_huge_put_index_uses_a_dict_memo() -> None:
    assert loads(b"\x80\x02Nr\xff\xff\xff\xff0j\xff\xff\xff\xff.") is None


def test_float_text_forms() -> None:
    assert loads(b"F1.5\n.") == 1.5
    assert math.isinf(loads(b"Finf\n."))
    with pytest.raises(PickleError):
        loads(b"F1_0\n.")


# ---- protocol-0 text arguments against the C unpickler ------------------------------


def c_loads(data: bytes) -> Any:
    """The C unpickler torch.load runs, on plain data only (no opcode here names a global),
    decoding Python 2 strs as torchless does; its invalid-escape warnings are ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.loads(data, encoding="utf-8")


def c_reads(data: bytes) -> tuple[bool, Any]:
    """(True, value) or (False, the exception type) from the C unpickler."""
    assert pickle.loads is _pickle.loads
    try:
        return True, c_loads(data)
    except Exception as e:  # any refusal by C counts
        return False, type(e)


@pytest.mark.parametrize("line", [
    b"0", b"1", b"7", b"-1", b"10", b"-10", b"2147483648", b"-2147483649",
    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809", b"9" * 4300,
])
@pytest.mark.parametrize("text", [b"I%s", b"L%s", b"L%sL"])
def test_plain_decimal_int_text_is_read_as_the_c_unpickler_reads_it(text: bytes,
                                                                    line: bytes) -> None:
    data = text % line + b"\n."
    ok, expected = c_reads(data)
    assert ok
    assert same(loads(data), expected), data


def test_int_00_and_01_are_the_bools_the_c_unpickler_reads() -> None:
    assert c_loads(b"I00\n.") is loads(b"I00\n.") is False
    assert c_loads(b"I01\n.") is loads(b"I01\n.") is True


#: INT text no pickler writes, read as CPython 3.10-3.13's C unpickler reads it (base 0;
#: two-character text worth 0 or 1 is a bool); the values are hand arithmetic, and the test
#: also checks them against the running C unpickler where it is one of those versions
#: (3.14 reads base 10: python/cpython#126992).
_BASE_0_INT = [
    (b"010", 8), (b"-010", -8), (b"007", 7), (b"0x10", 16), (b"0X1f", 31), (b"0o17", 15),
    (b"0b101", 5), (b"+1", True), (b" 1", True), (b"-0", False), (b" 0", False),
    (b"1_000", 1000), (b" 12 ", 12), (b"0x7fffffffffffffff", 2**63 - 1),
    (b"0x8000000000000000", 2**63), (b"-0x8000000000000001", -(2**63) - 1),
]


@pytest.mark.parametrize("line,value", _BASE_0_INT)
def test_int_text_is_read_base_0_as_the_c_unpickler_reads_it(line: bytes, value: Any) -> None:
    data = b"I" + line + b"\n."
    if sys.version_info < (3, 14):
        ok, expected = c_reads(data)
        assert ok and same(expected, value), (data, expected)
    assert same(loads(data), value), data


@pytest.mark.parametrize("line", [b"08", b"0x", b"1 2", b"", b"--1", b"0o8", b"1__0"])
def test_int_text_the_c_unpickler_refuses_is_refused(line: bytes) -> None:
    data = b"I" + line + b"\n."
    if sys.version_info < (3, 14):
        assert not c_reads(data)[0], data
    with pytest.raises(PickleError):
        loads(data)


@pytest.mark.parametrize("line,value", [
    (b"010", None), (b"0x10", 16), (b"0o17", 15), (b"0b101", 5), (b"+5", 5), (b"1_000", 1000),
    (b" 5", 5), (b"00", 0), (b"-0", 0)])
def test_long_text_is_read_base_0(line: bytes, value: Any) -> None:
    data = b"L" + line + b"L\n."
    if sys.version_info < (3, 14):
        ok, expected = c_reads(data)
        assert ok == (value is not None) and (value is None or same(expected, value))
    if value is None:  # int("010", 0): a leading zero is refused in base 0
        with pytest.raises(PickleError):
            loads(data)
    else:
        assert same(loads(data), value)


@pytest.mark.parametrize("line", [b"1\x00x", b"\x001", b"1\x00"])
def test_int_text_with_a_nul_byte_is_refused(line: bytes) -> None:
    """The C unpickler stops reading at a NUL byte (python/cpython#126996): only a hand-made
    pickle has one, and reading up to it would hide the rest of the line."""
    with pytest.raises(PickleError, match="NUL"):
        loads(b"I" + line + b"\n.")


_INT_ALPHABET = st.sampled_from(list(b"0123456789" b"0000111" b"+- _\txXoObBL\x00\r"))


@settings(max_examples=400, deadline=None)
@given(chars=st.lists(_INT_ALPHABET, max_size=8), opcode=st.sampled_from([b"I", b"L"]))
def test_int_text_never_reads_a_value_the_c_unpickler_does_not(chars: list[int],
                                                             opcode: bytes) -> None:
    data = opcode + bytes(chars) + b"\n."
    ok, expected = c_reads(data)
    try:
        value = loads(data)
    except PickleError:
        return
    assert ok and same(value, expected), (data, value, expected)


@pytest.mark.parametrize("index", [
    b"0", b"00", b"+0", b"-0", b" 0", b"0 ", b"\t0", b"0_0", b"000_0 ", b"7",
])
def test_text_memo_indices_are_read_as_the_c_unpickler_reads_them(index: bytes) -> None:
    data = b"(Np" + index + b"\nKEg" + index + b"\nl."
    ok, expected = c_reads(data)
    assert ok
    assert same(loads(data), expected)


@pytest.mark.parametrize("index", [b"-1", b"9" * 30, b"0x0", b"", b"0\x00x", b"1__0"])
def test_text_memo_indices_c_refuses_or_reads_past_a_nul_are_refused(index: bytes) -> None:
    data = b"Np" + index + b"\n0g" + index + b"\n."
    ok, _ = c_reads(data)
    assert ok == (index == b"0\x00x")  # C stops at the NUL byte (python/cpython#126996)
    with pytest.raises(PickleError):
        loads(data)


@settings(max_examples=300, deadline=None)
@given(chars=st.lists(st.sampled_from(list(b"0123456789+- _\t\x0b\x1cx\x00")), max_size=6))
def test_text_memo_index_never_differs_from_the_c_unpickler(chars: list[int]) -> None:
    index = bytes(chars)
    data = b"(K\x07p" + index + b"\nNg" + index + b"\nl."
    ok, expected = c_reads(data)
    try:
        value = loads(data)
    except (PickleError, LimitError):
        return
    assert ok and same(value, expected), (data, value, expected)


@pytest.mark.parametrize("line", [b"1e500", b"-1e500", b"1.8e308", b"9" * 400])
def test_float_text_that_overflows_is_refused_like_the_c_unpickler(line: bytes) -> None:
    data = b"F" + line + b"\n."
    assert c_reads(data) == (False, OverflowError)
    with pytest.raises(PickleError, match="overflows"):
        loads(data)


@pytest.mark.parametrize("line", [
    b"1.5", b"-0.0", b"1e-400", b"1.7976931348623157e308", b"inf", b"-Infinity", b"nan",
    b"-nan", b".5", b"1.", b"+1E+05",
])
def test_float_text_is_read_as_the_c_unpickler_reads_it(line: bytes) -> None:
    data = b"F" + line + b"\n."
    ok, expected = c_reads(data)
    assert ok
    assert same(loads(data), expected)


@pytest.mark.parametrize("body,expected", [
    (b"\\q", b"\\q"), (b"\\8", b"\\8"), (b"\\N{x}", b"\\N{x}"), (b"\\u0041", b"\\u0041"),
    (b"\\400", b"\x00"), (b"\\777", b"\xff"), (b"\\0", b"\x00"), (b"\\08", b"\x008"),
    (b"\\x41\\t\\'", b"A\t'"), (b"a\\\\", b"a\\"),
])
def test_string_escapes_read_as_c_without_a_warning(body: bytes, expected: bytes) -> None:
    """Invalid escapes make codecs.escape_decode (and the C unpickler) warn; pytest runs
    with warnings as errors, so this fails if reading STRING warns at all."""
    data = b"S'" + body + b"'\n."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert pickle.loads(data, encoding="bytes") == expected
    assert run_pickle(data, encoding="bytes")[0] == expected
    if expected.isascii():  # as a str, in the default utf-8 decoding
        assert inert(data) == expected.decode("ascii")


def test_scanner_reads_string_escapes_without_a_warning() -> None:
    from torchless.scanner.pickles import scan_stream

    data = b"S'\\q'\nS'\\400'\n\x93."  # STACK_GLOBAL on the two decoded strs
    scan = scan_stream(data)
    assert [(g.module, g.name) for g in scan.globals] == [("\\q", "\x00")]


@pytest.mark.parametrize("body", [b"\\", b"a\\", b"\\x", b"\\x4", b"\\xg1", b"\\X"])
def test_string_escapes_c_refuses_are_refused(body: bytes) -> None:
    data = b"S'" + body + b"'\n."
    ok, _ = c_reads(data)
    assert ok == (body == b"\\X")
    if ok:
        assert inert(data) == "\\X"
    else:
        with pytest.raises(PickleError, match="STRING"):
            inert(data)


@settings(max_examples=500, deadline=None)
@given(body=st.lists(st.sampled_from(list(b"\\\\\\\\0137489xXaAfFgntrvbN'\"\xff\x00 ")),
                     max_size=12))
def test_string_escapes_match_the_c_unpickler(body: list[int]) -> None:
    data = b"S'" + bytes(body) + b"'\n."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            expected: Any = pickle.loads(data, encoding="bytes")
        except ValueError:
            expected = None
    if expected is None:
        with pytest.raises(PickleError):
            run_pickle(data, encoding="bytes")
    else:
        assert run_pickle(data, encoding="bytes")[0] == expected


def test_inst_names_are_ascii_and_global_names_not_empty() -> None:
    """As both CPython unpicklers read them (Lib/pickle.py load_inst decodes ASCII; C's
    load_global/load_inst refuse an empty line as truncated data)."""
    with pytest.raises(PickleError, match="ascii"):
        inert(b"(i\xc3\xa9\nC\n.")
    assert inert(b"c\xc3\xa9\nC\n.") == Global("\xe9", "C")
    for data in (b"c\nC\n.", b"cm\n\n.", b"(i\nC\n."):
        with pytest.raises(PickleError, match="empty"):
            inert(data)


class Adam:
    """Stands in for an optimizer class a config refers to."""


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_common_config_values_stay_inert_but_open(protocol: int) -> None:
    import functools
    import re
    import types
    import uuid

    value = {"opt": functools.partial(Adam, lr=1e-3), "sn": types.SimpleNamespace(a=1, b=[2]),
             "id": uuid.UUID(int=5), "pattern": re.compile("a+b")}
    out = loads(pickle.dumps(value, protocol=protocol))
    assert out["sn"] == types.SimpleNamespace(a=1, b=[2])
    opt = out["opt"]
    assert isinstance(opt, Opaque) and opt.class_path == "functools.partial"
    assert opt.state[0] == Global(__name__, "Adam")
    assert opt.state[2] == {"lr": 1e-3}
    assert out["id"].class_path == "uuid.UUID"
    assert out["pattern"].class_path == "re._compile"
    assert out["pattern"].args == ("a+b", 32)


@pytest.mark.parametrize("module,name", [
    ("torch", "sigmoid"), ("torch.nn.functional", "relu"), ("torch.special", "expit"),
    ("math", "sqrt"), ("torch.nn.modules.linear", "Linear"), ("omegaconf.dictconfig", "DictConfig"),
])
def test_inert_references_a_saved_model_may_hold(module: str, name: str) -> None:
    out = loads(b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n.")
    assert out == Global(module, name)


@pytest.mark.parametrize("name", ["save", "load"])
def test_torch_save_and_load_are_refused_even_as_references(name: str) -> None:
    with pytest.raises(UnsafeGlobalError):
        loads(b"\x80\x02ctorch\n" + name.encode() + b"\n.")


@pytest.mark.parametrize("name", ["_load_global_deps", "compile", "hub"])
def test_other_torch_functions_are_refused_when_called(name: str) -> None:
    """A reference never called runs nothing (it stays an inert Global); a call is refused."""
    assert loads(b"\x80\x02ctorch\n" + name.encode() + b"\n.") == Global("torch", name)
    with pytest.raises(UnsafeGlobalError):
        loads(b"\x80\x02ctorch\n" + name.encode() + b"\n)R.")


def test_a_dag_sharing_one_object_a_million_times_is_walked_once() -> None:
    """One dict referenced 10^6 times: the finishing walk and the tensor naming visit it once
    (a tree walk would visit it 10^6 times; this pickle is ~2 MB and must stay cheap)."""
    shared = b"}q\x00(X\x01\x00\x00\x00kK\x01u"  # {"k": 1}, memoised as 0
    data = b"\x80\x02]q\x01(" + shared + b"h\x00" * 999_999 + b"e."
    lim = Limits()
    value, _ = run_pickle(data, TorchResolver(lim), lim)
    assert len(value) == 1_000_000 and all(v is value[0] for v in value[:10])
    tree = finish(value, lim)
    assert tree[999_999] is tree[0] == {"k": 1}
    from torchless.model.graph import flatten

    assert flatten(tree, lim) == ({}, {})


class _CallsMethod:
    """Pickles as getattr(PosixPath('x'), 'touch')(): a method call torch.load would make."""

    def __reduce__(self) -> Any:
        import pathlib

        return (pathlib.PurePosixPath("x").joinpath, ("y",))


class _CallsPartialMethod:
    def __reduce__(self) -> Any:
        import functools
        import pathlib

        return (functools.partial(pathlib.PurePosixPath("x").joinpath), ("y",))


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_method_reference_is_kept_and_a_method_call_refused(protocol: int) -> None:
    import pathlib

    ref = loads(pickle.dumps({"hook": pathlib.PurePosixPath("x").joinpath}, protocol=protocol))
    assert isinstance(ref["hook"], Opaque) and ref["hook"].args[1] == "joinpath"
    for obj in (_CallsMethod(), _CallsPartialMethod()):
        with pytest.raises(UnsafeGlobalError, match="joinpath"):
            loads(pickle.dumps(obj, protocol=protocol))


def test_getattr_of_a_dunder_on_an_object_is_refused() -> None:
    data = (b"\x80\x02cbuiltins\ngetattr\n" + b"cpathlib\nPurePosixPath\nX\x01\x00\x00\x00x\x85R"
            + b"X\x09\x00\x00\x00__class__\x86R.")
    with pytest.raises(UnsafeGlobalError, match="getattr"):
        loads(data)


def _getattr_chain(n: int) -> bytes:
    """getattr(getattr(mymod.f, "a"), "a")… n times, each result through the memo."""
    step = b"q\x010cbuiltins\ngetattr\nh\x01X\x01\x00\x00\x00a\x86R"
    return b"\x80\x02cmymod\nf\n" + step * n + b"."


def test_a_short_getattr_chain_is_a_dotted_name() -> None:
    got = loads(_getattr_chain(3))
    assert isinstance(got, Global) and (got.module, got.name) == ("mymod", "f.a.a.a")


def test_a_long_getattr_chain_is_refused() -> None:
    """Each read built the whole dotted name again (quadratic: 20,000 reads, a 600 KB
    pickle, took half a minute); past 32 reads the chain is refused."""
    assert isinstance(loads(_getattr_chain(32)), Global)
    with pytest.raises(UnsafeGlobalError, match="chain of more than 32"):
        loads(_getattr_chain(5000))


@pytest.mark.parametrize("data", [b"N(\x90.", b"N(e.", b"N(u.", b"K\x01(e.", b"\x8c\x01a(u."])
def test_an_empty_mark_run_does_nothing_to_any_target(data: bytes) -> None:
    """ADDITEMS/APPENDS/SETITEMS with no items after the MARK: the C unpickler returns before
    it looks at the target (``if (len == x) return 0`` in _pickle.c), so None, an int or a
    str below the mark is read back unchanged (found by the program differential)."""
    assert run_pickle(data)[0] == _pickle.loads(data)


def test_a_long_name_named_again_is_judged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """STACK_GLOBAL of one memoised 100 KB name, 2,000 times in 12 KB of opcodes: judging
    scans the whole name, so each repeat cost its length (reading was quadratic in the
    file); the verdict is kept per name, and each use is still recorded."""
    from torchless.rules import resolver as resolver_module

    calls: list[str] = []
    real = resolver_module.judge

    def counting(module: str, name: str, **kw: Any) -> str | None:
        calls.append(name)
        return real(module, name, **kw)

    monkeypatch.setattr(resolver_module, "judge", counting)
    name = "a" * 100_000
    data = (b"\x80\x04\x8c\x05mymod\x940X" + struct.pack("<I", len(name)) + name.encode()
            + b"\x940](" + b"h\x00h\x01\x93" * 2000 + b"e.")
    lim = Limits()
    res = TorchResolver(lim)
    value, _ = run_pickle(data, res, lim)
    assert len(value) == 2000 and all(g == Global("mymod", name) for g in value)
    assert len(calls) == 1
    assert len(res.globals) == 2000


def test_a_global_called_says_it_is_inert() -> None:
    """Code that calls a saved class reference (Lightning's ``hparams_type``) gets torchless's
    error with what to do, not Python's "'Global' object is not callable"; nothing runs."""
    from torchless.errors import UnsupportedError

    ref = inert(b"cos\nsystem\n.")
    assert ref == Global("os", "system")
    with pytest.raises(UnsupportedError, match=r"os\.system is an inert reference") as e:
        ref("echo hi")
    assert "register_type" in (e.value.hint or "")
