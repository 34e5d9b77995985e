"""How each pickle opcode argument lies in the stream and what its bytes mean: one reader per
:mod:`pickletools` argument type, shared by the interpreter (:mod:`.machine`) and the
scanner's static walk, so that the two can never decode an argument differently.

An :class:`ArgReader` says where the argument ends (a fixed number of bytes; a length prefix
and that many bytes; or newline-terminated lines) and gives the functions that read it:
``unpack`` (a fixed argument's value, or a prefixed one's length, from a buffer at an
offset) and ``decode`` (the value of its bytes, as CPython's C unpickler, which torch.load
runs, reads them). Decoders raise ValueError with the message the interpreter reports.
Limits, frames and the stack are the interpreter's business, not this module's.
"""

from __future__ import annotations

import codecs
import math
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchless.pickle.opcodes import Arg

__all__ = ["ARGS", "ArgReader", "c_load_int", "c_load_long", "float_text", "long_bytes",
           "memo_index", "string_text", "unescape_string", "unicode_text", "unpack_float8",
           "unpack_int4", "unpack_uint1", "unpack_uint2", "unpack_uint4", "unpack_uint8",
           "utf8_text"]

_C_SPACE = frozenset(b" \t\n\v\f\r")
_DIGITS = {8: frozenset(b"01234567"), 10: frozenset(b"0123456789"),
           16: frozenset(b"0123456789abcdefABCDEF")}
_C_LONG_MIN, _C_LONG_MAX = -(1 << 63), (1 << 63) - 1


def _strtol0(s: bytes) -> tuple[int, int]:
    """C's ``strtol(s, &end, 0)``: (value, index of end); end 0 when nothing converts. The
    caller checks the value against the C long range (ERANGE)."""
    i, n = 0, len(s)
    while i < n and s[i] in _C_SPACE:
        i += 1
    negative = i < n and s[i] == 0x2D
    if i < n and s[i] in b"+-":
        i += 1
    base = 10
    if i < n and s[i] == 0x30:  # '0': octal, or hex when 0x is followed by a hex digit
        if i + 2 < n and s[i + 1] in b"xX" and s[i + 2] in _DIGITS[16]:
            base, i = 16, i + 2
        else:
            base = 8
    start = i
    digits = _DIGITS[base]
    while i < n and s[i] in digits:
        i += 1
    if i == start:
        return 0, 0
    value = int(s[start:i], base)
    return (-value if negative else value), i


def c_load_int(s: bytes) -> int:
    """The INT opcode's text (without its newline) as CPython 3.10-3.13's ``load_int``
    reads it: ``strtol`` in base 0 when it converts the whole text to a C long, and a text
    of two characters worth 0 or 1 is a bool (``01``, ``00``, also ``+1``, `` 1``, ``-0``);
    otherwise ``PyLong_FromString(s, NULL, 0)``, i.e. ``int(s, 0)``. ValueError as C's."""
    if not s:
        raise ValueError("empty INT argument")
    value, end = _strtol0(s)
    if end != len(s) or not _C_LONG_MIN <= value <= _C_LONG_MAX:
        return int(s, 0)
    if len(s) == 2 and value in (0, 1):
        return bool(value)
    return value


def c_load_long(s: bytes) -> int:
    """The LONG opcode's text (without its newline) as ``load_long`` reads it: one trailing
    ``L`` dropped, then ``PyLong_FromString(s, NULL, 0)``."""
    if not s:
        raise ValueError("empty LONG argument")
    return int(s[:-1] if s.endswith(b"L") else s, 0)


# one way to match each digit: "[0-9]+\.?[0-9]*" backtracked quadratically on a long line
_FLOAT_RE = re.compile(
    rb"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)\Z",
    re.IGNORECASE,
)


def float_text(line: bytes) -> float:
    """A FLOAT argument: C reads it with ``PyOS_string_to_double(..., OverflowError)``, so
    text that overflows a double is an error, not a silent inf."""
    if not _FLOAT_RE.match(line):
        raise ValueError(f"not a float: {line[:40]!r}")
    value = float(line)
    if math.isinf(value) and line.lstrip(b"+-")[:1] not in b"iI":
        raise ValueError(f"FLOAT {line[:40]!r} overflows a double")
    return value


# look the text codecs up now, so that reading a file never triggers an import
codecs.lookup("raw_unicode_escape")
_ESCAPE_RE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{2})|(.)|\Z)", re.DOTALL)
_SIMPLE_ESCAPES = {b"\\": b"\\", b"'": b"'", b'"': b'"', b"b": b"\b", b"f": b"\f",
                   b"t": b"\t", b"n": b"\n", b"r": b"\r", b"v": b"\v", b"a": b"\a",
                   b"\n": b""}


def unescape_string(raw: bytes) -> bytes:
    """The bytes of a STRING argument (quotes removed), decoded as C's
    ``PyBytes_DecodeEscape`` does: Python's bytes-literal escapes, an octal escape past
    ``\\377`` keeps its low 8 bits, an unknown escape stays as written. Written out here
    because ``codecs.escape_decode`` warns (DeprecationWarning, an error under -W error) on
    those last two, and silencing a warning changes process-wide state.
    Raises ValueError where C does: a malformed ``\\x`` escape or a trailing backslash."""
    if b"\\" not in raw:
        return raw

    def one(m: re.Match[bytes]) -> bytes:
        octal, hexa, other = m.groups()
        if octal is not None:
            return bytes((int(octal, 8) & 0xFF,))
        if hexa is not None:
            return bytes((int(hexa, 16),))
        if other is None:
            raise ValueError("trailing \\ in string")
        if other == b"x":
            raise ValueError(f"invalid \\x escape at byte {m.start()}")
        return _SIMPLE_ESCAPES.get(other, b"\\" + other)

    return _ESCAPE_RE.sub(one, raw)


def string_text(line: bytes) -> bytes:
    """A STRING argument (a Python 2 str): quoted alike at both ends, as C's ``load_string``
    requires (nothing stripped first), its escapes decoded."""
    if len(line) < 2 or line[0] != line[-1] or line[0] not in b"\"'":
        raise ValueError("STRING argument is not quoted")
    try:
        return unescape_string(line[1:-1])
    except ValueError as e:
        raise ValueError(f"STRING argument: {e}") from None


def unicode_text(line: bytes) -> str:
    """A UNICODE argument: raw-unicode-escape text."""
    return line.decode("raw-unicode-escape")


def utf8_text(raw: bytes) -> str:
    """A BINUNICODE* argument: UTF-8, lone surrogates allowed (as ``pickle`` writes them)."""
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise ValueError(f"a str of {len(raw)} bytes is not UTF-8 ({e.reason} at its byte "
                         f"{e.start})") from None


def memo_index(line: bytes) -> int:
    """A GET/PUT index: C reads it with ``PyLong_FromString(s, NULL, 10)`` (blanks, sign,
    ``_`` and leading zeros allowed), which is ``int(line, 10)``; a NUL byte, where C would
    stop reading (python/cpython#126996), is refused, and so is an index past Py_ssize_t."""
    if b"\0" in line:
        raise ValueError("memo index contains a NUL byte")
    try:
        index = int(line, 10)
    except ValueError:
        raise ValueError(f"memo index {line[:40]!r} is not a decimal integer") from None
    if index > sys.maxsize:  # C stores indices as Py_ssize_t
        raise ValueError(f"memo index {index} is too large")
    return index


def long_bytes(raw: bytes) -> int:
    """A LONG1/LONG4 payload: little-endian two's complement."""
    return int.from_bytes(raw, "little", signed=True)


def _same(raw: bytes) -> bytes:
    return raw


def _none(raw: bytes) -> None:
    return None


@dataclass(frozen=True)
class ArgReader:
    """One argument type: where it ends and how its bytes read."""

    arg: Arg
    #: Bytes of a fixed argument, or of a prefixed argument's length; 0 for text arguments.
    width: int
    #: ``unpack(buffer, offset)``: a fixed argument's value, or a prefixed one's length.
    unpack: Callable[[Any, int], tuple[Any, ...]] | None = None
    #: A length prefix comes first and that many bytes follow it.
    prefixed: bool = False
    #: Newline-terminated lines: 1 or 2 for text arguments, else 0.
    lines: int = 0
    #: The value of the argument's bytes (a prefixed one's payload, a text one's line).
    decode: Callable[[bytes], Any] = _same


unpack_uint1 = _U1 = struct.Struct("<B").unpack_from
unpack_uint2 = _U2 = struct.Struct("<H").unpack_from
unpack_int4 = _I4 = struct.Struct("<i").unpack_from
unpack_uint4 = _U4 = struct.Struct("<I").unpack_from
unpack_uint8 = _U8 = struct.Struct("<Q").unpack_from
unpack_float8 = _F8 = struct.Struct(">d").unpack_from

#: The reader of every argument type.
ARGS: dict[Arg, ArgReader] = {r.arg: r for r in (
    ArgReader(Arg.NONE, 0, decode=_none),
    ArgReader(Arg.UINT1, 1, _U1),
    ArgReader(Arg.UINT2, 2, _U2),
    ArgReader(Arg.INT4, 4, _I4),
    ArgReader(Arg.UINT4, 4, _U4),
    ArgReader(Arg.UINT8, 8, _U8),
    ArgReader(Arg.FLOAT8, 8, _F8),
    ArgReader(Arg.LONG1, 1, _U1, prefixed=True, decode=long_bytes),
    ArgReader(Arg.LONG4, 4, _I4, prefixed=True, decode=long_bytes),
    ArgReader(Arg.STRING1, 1, _U1, prefixed=True),
    ArgReader(Arg.STRING4, 4, _I4, prefixed=True),
    ArgReader(Arg.BYTES1, 1, _U1, prefixed=True),
    ArgReader(Arg.BYTES4, 4, _U4, prefixed=True),
    ArgReader(Arg.BYTES8, 8, _U8, prefixed=True),
    ArgReader(Arg.BYTEARRAY8, 8, _U8, prefixed=True, decode=bytearray),
    ArgReader(Arg.UNICODESTRING1, 1, _U1, prefixed=True, decode=utf8_text),
    ArgReader(Arg.UNICODESTRING4, 4, _U4, prefixed=True, decode=utf8_text),
    ArgReader(Arg.UNICODESTRING8, 8, _U8, prefixed=True, decode=utf8_text),
    ArgReader(Arg.DECIMALNL_SHORT, 0, lines=1, decode=c_load_int),
    ArgReader(Arg.DECIMALNL_LONG, 0, lines=1, decode=c_load_long),
    ArgReader(Arg.FLOATNL, 0, lines=1, decode=float_text),
    ArgReader(Arg.STRINGNL, 0, lines=1, decode=string_text),
    ArgReader(Arg.STRINGNL_NOESCAPE, 0, lines=1),
    ArgReader(Arg.STRINGNL_NOESCAPE_PAIR, 0, lines=2),
    ArgReader(Arg.UNICODESTRINGNL, 0, lines=1, decode=unicode_text),
)}
