"""The argument readers (torchless.pickle.arguments): one per pickletools argument type, used by
the interpreter, which the reader and the scanner both run.

Oracles: pickletools' argument descriptors (where each argument ends), and CPython's C
unpickler (``pickle.loads``: what torch.load runs) on one-opcode pickles built here, for what
the bytes mean. The last tests show the interpreter binds the readers, and that the scanner
reads a memo index as C does.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import struct
from typing import Any

import pytest

from torchless.pickle import arguments, machine
from torchless.pickle.arguments import ARGS, ArgReader
from torchless.pickle.opcodes import OPCODES, Arg
from torchless.scanner.pickles import scan_stream

_WIDTH_FROM = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
               pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
               pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
               pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}


def _signed(reader: ArgReader) -> bool:
    assert reader.unpack is not None
    return bool(reader.unpack(b"\xff" * reader.width, 0)[0] < 0)


@pytest.mark.parametrize("op", pickletools.opcodes, ids=lambda op: op.name)
def test_where_each_argument_ends_matches_pickletools(op: Any) -> None:
    reader = ARGS[Arg(op.arg.name if op.arg is not None else "none")]
    if op.arg is None:
        assert (reader.width, reader.prefixed, reader.lines) == (0, False, 0)
    elif op.arg.n >= 0:
        assert (reader.width, reader.prefixed, reader.lines) == (op.arg.n, False, 0)
    elif op.arg.n == pickletools.UP_TO_NEWLINE:
        assert (reader.width, reader.prefixed) == (0, False)
        assert reader.lines == (2 if op.arg.name.endswith("_pair") else 1)
    else:
        width, signed = _WIDTH_FROM[op.arg.n]
        assert (reader.width, reader.prefixed, reader.lines) == (width, True, 0)
        assert _signed(reader) == signed


def test_every_argument_type_has_a_reader() -> None:
    assert set(ARGS) == set(Arg) == {op.arg for op in OPCODES}


def _same_as_c(opcode: bytes, raw: bytes, arg: Arg) -> None:
    """``ARGS[arg].decode`` reads from ``raw`` (a text line, or a payload after its length
    prefix) what the C unpickler reads from the opcode with that argument."""
    reader = ARGS[arg]
    if reader.lines:
        stream = opcode + raw + b"\n"
    else:
        assert reader.prefixed
        prefix = {1: "<B", 4: "<i" if _signed(reader) else "<I", 8: "<Q"}[reader.width]
        stream = opcode + struct.pack(prefix, len(raw)) + raw
    try:
        theirs: Any = pickle.loads(b"\x80\x02" + stream + b".")
    except (ValueError, pickle.UnpicklingError, OverflowError):
        theirs = ValueError
    try:
        ours: Any = reader.decode(raw)
    except ValueError:
        ours = ValueError
    if isinstance(theirs, float) and math.isnan(theirs):
        assert isinstance(ours, float) and math.isnan(ours), raw
        return
    assert (type(ours), ours) == (type(theirs), theirs), raw


@pytest.mark.parametrize("text", [b"0", b"1", b"01", b"00", b"+1", b" 1", b"-0", b"7", b"-12",
                                  b"010", b"0x1f", b"0o17", b"1_000", b"99999999999999999999",
                                  b"0x", b"abc", b"1.5", b""])
def test_decimal_int(text: bytes) -> None:
    _same_as_c(b"I", text, Arg.DECIMALNL_SHORT)


@pytest.mark.parametrize("text", [b"5L", b"-12L", b"0x10L", b"7", b"12345678901234567890L",
                                  b"L", b"1.0L"])
def test_decimal_long(text: bytes) -> None:
    _same_as_c(b"L", text, Arg.DECIMALNL_LONG)


@pytest.mark.parametrize("text", [b"1.5", b"-0", b"1e10", b"inf", b"-Infinity", b"nan", b"1e400",
                                  b".5", b"5.", b"1_0.0", b"0x1p3", b" 1.0", b"abc"])
def test_float_text(text: bytes) -> None:
    _same_as_c(b"F", text, Arg.FLOATNL)


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@pytest.mark.parametrize("text", [b"'abc'", b'"abc"', b"'a\\x41'", b"'\\101\\n'", b"'\\q'",
                                  b"'abc", b"abc", b"'a\"", b"'\\x4'", b"'a\\'", b"''"])
def test_quoted_string(text: bytes) -> None:
    try:
        theirs: Any = pickle.loads(b"S" + text + b"\n.", encoding="latin-1")
    except (ValueError, pickle.UnpicklingError):
        theirs = ValueError
    try:
        ours: Any = arguments.string_text(text).decode("latin-1")
    except ValueError:
        ours = ValueError
    assert ours == theirs


@pytest.mark.parametrize("raw", [b"abc", "é€".encode(), b"\xed\xa0\x80", b"\xff", b""])
def test_utf8_text(raw: bytes) -> None:
    _same_as_c(b"X", raw, Arg.UNICODESTRING4)
    assert ARGS[Arg.UNICODESTRING4].decode is arguments.utf8_text


@pytest.mark.parametrize("text", [b"abc", b"\\u00e9", b"\\U0001f600", b"\\x41"])
def test_raw_unicode_escape_text(text: bytes) -> None:
    _same_as_c(b"V", text, Arg.UNICODESTRINGNL)


@pytest.mark.parametrize("raw", [b"", b"\x01", b"\xff", b"\x00\x80", b"\xff\x7f", bytes(9)])
def test_long_bytes(raw: bytes) -> None:
    _same_as_c(b"\x8a", raw, Arg.LONG1)


@pytest.mark.parametrize("text", [b"0", b" 1", b"+1", b"01", b"010", b"1_0", b"12 "])
def test_memo_index(text: bytes) -> None:
    """An index as GET's text: the C unpickler reads it in base 10 (not INT's base 0); it
    finds the slot a plain PUT of the index this reader reads filled."""
    index = arguments.memo_index(text)
    assert pickle.loads(b"N" + b"p%d\n" % index + b"0g" + text + b"\n.") is None


@pytest.mark.parametrize("text", [b"x", b"", b"0x1", b"1\x00"])
def test_memo_index_refused(text: bytes) -> None:
    """Not an index; C stops at a NUL byte (reading ``1``), which only a hand-made pickle
    holds: refused too."""
    with pytest.raises(ValueError):
        arguments.memo_index(text)
    if b"\x00" not in text:
        with pytest.raises((ValueError, pickle.UnpicklingError)):
            pickle.loads(b"Np0\n0g" + text + b"\n.")


def test_fixed_width_readers() -> None:
    assert pickle.loads(b"M\xff\xff.") == ARGS[Arg.UINT2].unpack(b"\xff\xff", 0)[0]  # type: ignore[misc]
    assert pickle.loads(b"J\xfe\xff\xff\xff.") == ARGS[Arg.INT4].unpack(b"\xfe\xff\xff\xff", 0)[0]  # type: ignore[misc]
    raw = struct.pack(">d", 2.5)
    assert pickle.loads(b"G" + raw + b".") == ARGS[Arg.FLOAT8].unpack(raw, 0)[0]  # type: ignore[misc]


def test_interpreter_binds_the_readers() -> None:
    """The interpreter binds the readers of the table once (the scanner runs the same
    interpreter, so no second copy of them exists)."""
    for arg, bound in [(Arg.UINT2, machine._unpack_uint2), (Arg.INT4, machine._unpack_int4),
                       (Arg.UINT4, machine._unpack_uint4), (Arg.UINT8, machine._unpack_uint8),
                       (Arg.FLOAT8, machine._unpack_float8)]:
        assert bound is ARGS[arg].unpack
    for arg, bound in [(Arg.FLOATNL, machine._float_text), (Arg.STRINGNL, machine._string_text),
                       (Arg.UNICODESTRINGNL, machine._unicode_text),
                       (Arg.UNICODESTRING1, machine._utf8_text), (Arg.LONG4, machine._long_bytes)]:
        assert bound is ARGS[arg].decode


def _su(s: str) -> bytes:
    return b"\x8c" + bytes([len(s)]) + s.encode()


def test_scanner_reads_memo_indices_as_the_c_unpickler_does() -> None:
    """A GET whose index text has a sign (C reads ``+0`` as 0: int(s, 10)): the scanner's
    run names the STACK_GLOBAL it feeds as the C unpickler resolves it."""
    data = (b"\x80\x04" + _su("collections") + b"\x940" + _su("OrderedDict") + b"\x940"
            + b"g+0\ng+1\n\x93)R.")
    looked_up: list[tuple[str, str]] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            looked_up.append((module, name))
            return dict

    assert Recording(io.BytesIO(data)).load() == {}
    scan = scan_stream(data)
    assert scan.stopped and not scan.problems
    (found,) = scan.globals
    assert [(found.module, found.name)] == looked_up == [("collections", "OrderedDict")]
    assert (found.unresolved, found.offset) == ("", data.index(b"\x93"))
