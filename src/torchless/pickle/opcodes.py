"""The pickle opcode set (protocols 0-5) as a declarative table.

Each record names the opcode, its byte, how its inline argument is encoded
and the protocol that introduced it. The interpreter dispatches on
``code``; the table is checked against :mod:`pickletools` in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["OPCODES", "Arg", "Opcode", "by_code"]


class Arg(Enum):
    """How an opcode's inline argument is encoded (names follow pickletools)."""

    NONE = "none"
    UINT1 = "uint1"
    UINT2 = "uint2"
    INT4 = "int4"
    UINT4 = "uint4"
    UINT8 = "uint8"
    LONG1 = "long1"
    LONG4 = "long4"
    STRING1 = "string1"
    STRING4 = "string4"
    BYTES1 = "bytes1"
    BYTES4 = "bytes4"
    BYTES8 = "bytes8"
    BYTEARRAY8 = "bytearray8"
    UNICODESTRING1 = "unicodestring1"
    UNICODESTRING4 = "unicodestring4"
    UNICODESTRING8 = "unicodestring8"
    FLOAT8 = "float8"
    DECIMALNL_SHORT = "decimalnl_short"
    DECIMALNL_LONG = "decimalnl_long"
    FLOATNL = "floatnl"
    STRINGNL = "stringnl"
    STRINGNL_NOESCAPE = "stringnl_noescape"
    STRINGNL_NOESCAPE_PAIR = "stringnl_noescape_pair"
    UNICODESTRINGNL = "unicodestringnl"


@dataclass(frozen=True)
class Opcode:
    name: str
    code: int
    arg: Arg
    proto: int


def _op(name: str, code: bytes, arg: Arg, proto: int) -> Opcode:
    return Opcode(name, code[0], arg, proto)


OPCODES: tuple[Opcode, ...] = (
    _op("INT", b"I", Arg.DECIMALNL_SHORT, 0),
    _op("BININT", b"J", Arg.INT4, 1),
    _op("BININT1", b"K", Arg.UINT1, 1),
    _op("BININT2", b"M", Arg.UINT2, 1),
    _op("LONG", b"L", Arg.DECIMALNL_LONG, 0),
    _op("LONG1", b"\x8a", Arg.LONG1, 2),
    _op("LONG4", b"\x8b", Arg.LONG4, 2),
    _op("STRING", b"S", Arg.STRINGNL, 0),
    _op("BINSTRING", b"T", Arg.STRING4, 1),
    _op("SHORT_BINSTRING", b"U", Arg.STRING1, 1),
    _op("BINBYTES", b"B", Arg.BYTES4, 3),
    _op("SHORT_BINBYTES", b"C", Arg.BYTES1, 3),
    _op("BINBYTES8", b"\x8e", Arg.BYTES8, 4),
    _op("BYTEARRAY8", b"\x96", Arg.BYTEARRAY8, 5),
    _op("NEXT_BUFFER", b"\x97", Arg.NONE, 5),
    _op("READONLY_BUFFER", b"\x98", Arg.NONE, 5),
    _op("NONE", b"N", Arg.NONE, 0),
    _op("NEWTRUE", b"\x88", Arg.NONE, 2),
    _op("NEWFALSE", b"\x89", Arg.NONE, 2),
    _op("UNICODE", b"V", Arg.UNICODESTRINGNL, 0),
    _op("SHORT_BINUNICODE", b"\x8c", Arg.UNICODESTRING1, 4),
    _op("BINUNICODE", b"X", Arg.UNICODESTRING4, 1),
    _op("BINUNICODE8", b"\x8d", Arg.UNICODESTRING8, 4),
    _op("FLOAT", b"F", Arg.FLOATNL, 0),
    _op("BINFLOAT", b"G", Arg.FLOAT8, 1),
    _op("EMPTY_LIST", b"]", Arg.NONE, 1),
    _op("APPEND", b"a", Arg.NONE, 0),
    _op("APPENDS", b"e", Arg.NONE, 1),
    _op("LIST", b"l", Arg.NONE, 0),
    _op("EMPTY_TUPLE", b")", Arg.NONE, 1),
    _op("TUPLE", b"t", Arg.NONE, 0),
    _op("TUPLE1", b"\x85", Arg.NONE, 2),
    _op("TUPLE2", b"\x86", Arg.NONE, 2),
    _op("TUPLE3", b"\x87", Arg.NONE, 2),
    _op("EMPTY_DICT", b"}", Arg.NONE, 1),
    _op("DICT", b"d", Arg.NONE, 0),
    _op("SETITEM", b"s", Arg.NONE, 0),
    _op("SETITEMS", b"u", Arg.NONE, 1),
    _op("EMPTY_SET", b"\x8f", Arg.NONE, 4),
    _op("ADDITEMS", b"\x90", Arg.NONE, 4),
    _op("FROZENSET", b"\x91", Arg.NONE, 4),
    _op("POP", b"0", Arg.NONE, 0),
    _op("DUP", b"2", Arg.NONE, 0),
    _op("MARK", b"(", Arg.NONE, 0),
    _op("POP_MARK", b"1", Arg.NONE, 1),
    _op("GET", b"g", Arg.DECIMALNL_SHORT, 0),
    _op("BINGET", b"h", Arg.UINT1, 1),
    _op("LONG_BINGET", b"j", Arg.UINT4, 1),
    _op("PUT", b"p", Arg.DECIMALNL_SHORT, 0),
    _op("BINPUT", b"q", Arg.UINT1, 1),
    _op("LONG_BINPUT", b"r", Arg.UINT4, 1),
    _op("MEMOIZE", b"\x94", Arg.NONE, 4),
    _op("EXT1", b"\x82", Arg.UINT1, 2),
    _op("EXT2", b"\x83", Arg.UINT2, 2),
    _op("EXT4", b"\x84", Arg.INT4, 2),
    _op("GLOBAL", b"c", Arg.STRINGNL_NOESCAPE_PAIR, 0),
    _op("STACK_GLOBAL", b"\x93", Arg.NONE, 4),
    _op("REDUCE", b"R", Arg.NONE, 0),
    _op("BUILD", b"b", Arg.NONE, 0),
    _op("INST", b"i", Arg.STRINGNL_NOESCAPE_PAIR, 0),
    _op("OBJ", b"o", Arg.NONE, 1),
    _op("NEWOBJ", b"\x81", Arg.NONE, 2),
    _op("NEWOBJ_EX", b"\x92", Arg.NONE, 4),
    _op("PROTO", b"\x80", Arg.UINT1, 2),
    _op("STOP", b".", Arg.NONE, 0),
    _op("FRAME", b"\x95", Arg.UINT8, 4),
    _op("PERSID", b"P", Arg.STRINGNL_NOESCAPE, 0),
    _op("BINPERSID", b"Q", Arg.NONE, 1),
)

#: Highest pickle protocol this table covers.
HIGHEST_PROTOCOL = 5

_BY_CODE = {op.code: op for op in OPCODES}


def by_code(code: int) -> Opcode | None:
    """The opcode for a byte, or None if the byte is not an opcode."""
    return _BY_CODE.get(code)
