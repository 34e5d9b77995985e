"""The pickle VM against CPython's C unpickler on opcode programs written directly.

``test_pickle_vm`` feeds the VM what ``pickle.dumps`` writes; a file need not come from
``pickle.dumps``. Here hypothesis writes the program itself, opcode by opcode, from every
plain-data opcode of protocols 0-5 (ints and floats in each encoding, text and binary strings,
bytes, the containers and their fillers, MARK/POP/DUP, the memo, FRAME, PROTO, STOP), mostly
valid (a model of the stack picks what fits) and sometimes not (any opcode, wrong lengths,
frames cut in the wrong place). The oracle is ``pickle.loads``, the C unpickler
``torch.load(weights_only=False)`` runs.
For each program:

* both read it: the values are equal as graphs (exact types, float bits so NaN and -0.0
  count, dict and set order, and the same sharing of mutable objects, cycles included);
* C refuses it: the VM refuses it too, with one of our errors, never another value;
* the VM alone refuses it: only for a reason listed in ``DEVIATIONS`` (a limit, or a place
  where we are stricter than CPython by design).

No program contains a byte that is GLOBAL, INST, OBJ, REDUCE, BUILD, NEWOBJ(_EX),
STACK_GLOBAL, PERSID, BINPERSID, EXT1/2/4 or NEXT_BUFFER anywhere, as opcode or argument,
so however the C unpickler parses it, nothing is looked up or called.
"""

from __future__ import annotations

import math
import pickle
import struct
import warnings
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchless import CheckpointError, LimitError
from torchless.pickle.machine import run_pickle

#: Opcodes that name or call code: never sent to pickle.loads, at any offset.
CODE_BYTES = frozenset(b"ciobR\x81\x92\x93PQ\x82\x83\x84\x97")
#: PUT and LONG_BINPUT: the C unpickler grows its memo array to twice the index (a
#: LONG_BINPUT of 2**32-1 asks for 64 GiB), so these bytes appear only as the opcodes the
#: generator writes, with small indices; every other occurrence is rewritten too.
_MEMO_ALLOC = frozenset(b"pr")
_NEUTRAL = bytes(b if b not in CODE_BYTES | _MEMO_ALLOC else ord("x") for b in range(256))

#: Where the VM refuses what the C unpickler (of this Python) reads, and why. Each entry:
#: a phrase of our error message, and when it is allowed, given the program.
DEVIATIONS: list[tuple[str, str, Callable[[bytes], bool]]] = [
    ("contains a NUL byte",
     "C reads INT/LONG text up to a NUL byte (python/cpython#126996)",
     lambda data: b"\x00" in data),
    ("memo index contains a NUL",
     "C reads a GET/PUT index up to a NUL byte (python/cpython#126996)", lambda data: True),
    ("not a float",
     "C reads FLOAT text up to a NUL byte (python/cpython#126996)",
     lambda data: b"\x00" in data),
    ("straddles the end of its FRAME",
     "a C unpickler without python/cpython#154848 (this 3.11 among them) reads across frame "
     "boundaries, which pickletools and the pure-Python unpickler refuse: two readings of "
     "one file", lambda data: b"\x95" in data),
    ("FRAME begins before the previous frame ended",
     "as above: such a C unpickler accepts a frame inside a frame",
     lambda data: b"\x95" in data),
    ("values on the stack (expected 1)",
     "C returns the top of the stack at STOP and drops the rest; a well-formed pickle "
     "leaves exactly one value", lambda data: True),
    ("MARK still open at STOP",
     "C returns the top value at STOP whatever MARKs are open; a well-formed pickle "
     "closes them", lambda data: True),
    ("READONLY_BUFFER",
     "out-of-band buffers are not supported; C's READONLY_BUFFER leaves bytes as they are "
     "and turns a bytearray into a memoryview", lambda data: b"\x98" in data),
    ("APPEND applied to",
     "C appends to anything with append/extend (of plain data, a bytearray); the VM fills "
     "lists and leaves other objects to the resolver", lambda data: b"\x96" in data),
    ("SETITEM applied to",
     "C runs obj[key] = value on anything that takes it (a list, a bytearray); the VM "
     "fills dicts and leaves other objects to the resolver", lambda data: True),
]


def allowed(error: CheckpointError, data: bytes) -> bool:
    if isinstance(error, LimitError):
        return True
    message = str(error)
    return any(phrase in message and when(data) for phrase, _, when in DEVIATIONS)


# ---- comparing values --------------------------------------------------------------------


def same_graph(a: Any, b: Any, pairs: dict[int, int] | None = None) -> bool:
    """Equal as object graphs: exact types, float bits, order of dicts and sets, and each
    mutable object (or tuple) of ``a`` matched to one of ``b`` wherever it recurs."""
    pairs = {} if pairs is None else pairs
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return same_graph(a.real, b.real) and same_graph(a.imag, b.imag)
    if not isinstance(a, (list, dict, set, frozenset, tuple, bytearray)):
        return bool(a == b)
    if id(a) in pairs:
        return pairs[id(a)] == id(b)
    if (isinstance(a, (list, dict, set, bytearray)) or len(a)) and id(b) in pairs.values():
        return False
    pairs[id(a)] = id(b)
    if len(a) != len(b):
        return False
    if isinstance(a, bytearray):
        return a == b
    if isinstance(a, dict):
        return all(same_graph(ka, kb, pairs) and same_graph(a[ka], b[kb], pairs)
                   for ka, kb in zip(a, b, strict=True))
    if isinstance(a, (set, frozenset)) and any(_has_nan(x) for x in a):
        # a NaN hashes by its address (Python >= 3.10): where it lands in a set differs
        # between any two readers, so such a set is compared as a bag
        left = list(b)
        for x in a:
            match = next((i for i, y in enumerate(left) if same_graph(x, y, dict(pairs))), None)
            if match is None:
                return False
            same_graph(x, left.pop(match), pairs)
        return True
    return all(same_graph(x, y, pairs) for x, y in zip(a, b, strict=True))


def _has_nan(x: Any) -> bool:
    if isinstance(x, float):
        return x != x
    if isinstance(x, complex):
        return x != x
    return isinstance(x, (tuple, frozenset)) and any(_has_nan(y) for y in x)


def c_unpickler(data: bytes) -> tuple[bool, Any]:
    """(True, value) or (False, the exception) from pickle.loads, Python 2 strs decoded as
    UTF-8 as torch.load does; the DeprecationWarning it gives for S'\\q' is ignored."""
    assert not CODE_BYTES & set(data)
    assert all(i < 1 << 16 for i in _memo_puts(data)), data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return True, pickle.loads(data, encoding="utf-8")
        except Exception as e:  # any refusal by C counts as one
            return False, e


def _memo_puts(data: bytes) -> list[int]:
    """The index of every PUT and LONG_BINPUT opcode C could read, wherever it starts."""
    out = []
    for at, byte in enumerate(data):
        if byte == ord("r"):
            out.append(int.from_bytes(data[at + 1:at + 5], "little"))
        elif byte == ord("p"):
            text = data[at + 1:data.find(b"\n", at)] if b"\n" in data[at:] else b""
            out.append(int(text) if text.strip().isdigit() else 0)
    return out


def check(data: bytes) -> None:
    ok, expected = c_unpickler(data)
    try:
        value, _ = run_pickle(data)
    except CheckpointError as e:
        if ok:
            assert allowed(e, data), f"refused what C reads as {expected!r}: {e}\n{data!r}"
        return
    assert ok, f"read {value!r} where C refuses ({expected!r})\n{data!r}"
    assert same_graph(value, expected), f"read {value!r}, C reads {expected!r}\n{data!r}"


# ---- writing programs --------------------------------------------------------------------

_INT_TEXT = [b"0", b"1", b"-1", b"00", b"01", b"10", b"-10", b"2147483648", b"010", b"0x1f",
             b"+1", b" 1", b"-0", b"1_0", b"1 ", b"08", b"1\x00x", b"", b"9" * 25, b"1L"]
_FLOAT_TEXT = [b"1.5", b"-0.0", b"nan", b"-inf", b"1e308", b"1e309", b"1e-400", b".5", b"1.",
               b" 1", b"1_0.5", b"1.5\x00x", b"0x1p3", b"", b"Infinity"]
_MEMO_TEXT = [b"0", b"1", b" 0", b"0 ", b"+1", b"00", b"0_1", b"-1", b"1\x00", b"", b"x"]
_TEXT_CHARS = st.sampled_from(list("az09 '\"\\\n\x00\xe9\u20ac\U0001f600\ud800"))
_ESCAPED_CHARS = st.sampled_from(list(b"az09 '\"\\\\\\xXnt0477\xff"))


@st.composite
def scalar(draw: st.DrawFn, noise: bool) -> tuple[bytes, str]:
    """One opcode that pushes a scalar, and its kind: ``h`` hashable, ``b`` bytearray; with
    ``noise``, some arguments are malformed (wrong quotes or lengths, bytes not text)."""
    kind = draw(st.integers(0, 18))
    n = draw(st.integers(-(2**70), 2**70))
    small = draw(st.integers(0, 255))
    if kind == 0:
        return draw(st.sampled_from([b"N", b"\x88", b"\x89"])), "h"
    if kind == 1:
        text = draw(st.sampled_from(_INT_TEXT) | st.just(str(n % 2**40).encode()))
        return b"I" + text + b"\n", "h"
    if kind == 2:
        return b"J" + struct.pack("<i", n % 2**32 - 2**31), "h"
    if kind == 3:
        return draw(st.sampled_from([b"K" + bytes([small]),
                                     b"M" + struct.pack("<H", n % 2**16)])), "h"
    if kind == 4:
        text = draw(st.sampled_from(_INT_TEXT) | st.just(str(n).encode()))
        return b"L" + text + draw(st.sampled_from([b"L\n", b"\n"])), "h"
    if kind == 5:
        raw = pickle.encode_long(n) + draw(st.sampled_from([b"", b"\x00", b"\xff"]))
        if draw(st.booleans()):
            return b"\x8a" + bytes([len(raw)]) + raw, "h"
        return b"\x8b" + struct.pack("<i", len(raw)) + raw, "h"
    if kind == 6:
        f = draw(st.floats(allow_nan=True, allow_infinity=True))
        text = draw(st.sampled_from(_FLOAT_TEXT) | st.just(repr(f).encode()))
        return b"F" + text + b"\n", "h"
    if kind == 7:
        return b"G" + struct.pack(">d", draw(st.floats())), "h"
    if kind == 8:
        quote = draw(st.sampled_from([b"'", b'"']))
        body = bytes(draw(st.lists(_ESCAPED_CHARS, max_size=8))).replace(b"\n", b"")
        end = draw(st.sampled_from([quote, quote, b"'" if quote == b'"' else b'"', b""])
                   if noise else st.just(quote))
        return b"S" + quote + body + end + b"\n", "h"
    raw = draw(st.binary(max_size=12)) if noise and draw(st.booleans()) else \
        draw(st.text(max_size=6)).encode("utf-8")
    if kind == 9:
        return b"T" + struct.pack("<i", len(raw)) + raw, "h"
    if kind == 10:
        return b"U" + bytes([len(raw)]) + raw, "h"
    if kind == 11:
        return b"B" + struct.pack("<I", len(raw)) + raw, "h"
    if kind == 12:
        return b"C" + bytes([len(raw)]) + raw, "h"
    if kind == 13:
        return b"\x8e" + struct.pack("<Q", len(raw)) + raw, "h"
    if kind == 14:
        return b"\x96" + struct.pack("<Q", len(raw)) + raw, "b"
    text = "".join(draw(st.lists(_TEXT_CHARS, max_size=6)))
    if kind == 15:
        line = text.encode("raw-unicode-escape").replace(b"\n", b"\\u000a")
        return b"V" + line + b"\n", "h"
    utf8 = text.encode("utf-8", "surrogatepass")
    if noise and draw(st.integers(0, 4)) == 0:  # a lying length
        utf8 = utf8[:-1] or b"\xff"
    if kind == 16:
        return b"X" + struct.pack("<I", len(utf8)) + utf8, "h"
    if kind == 17:
        return b"\x8c" + bytes([len(utf8)]) + utf8, "h"
    return b"\x8d" + struct.pack("<Q", len(utf8)) + utf8, "h"


class Model:
    """What the program has pushed so far, as kinds: ``h`` hashable, ``b`` bytearray,
    ``l`` list, ``d`` dict, ``s`` set, ``t``/``T`` tuple (of hashables or not), ``f``
    frozenset; a list per MARK level, and the memo."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.marks: list[list[str]] = []
        self.memo: dict[int, str] = {}

    def push(self, kind: str) -> None:
        self.stack.append(kind)

    def pop_mark(self) -> list[str]:
        items = self.stack
        self.stack = self.marks.pop()
        return items


def _tuple_kind(items: list[str]) -> str:
    return "t" if all(k in "htf" for k in items) else "T"


def _choices(m: Model) -> list[str]:
    """Opcodes that fit the model's state."""
    s = m.stack
    out = ["scalar", "scalar", "scalar", "empty", "mark"]
    if s:
        out += ["pop", "dup", "put", "put", "tuple1"]
    if len(s) >= 2:
        out.append("tuple2")
    if len(s) >= 3:
        out.append("tuple3")
    if m.memo:
        out += ["get", "get"]
    if len(s) >= 2 and s[-2] == "l":
        out.append("append")
    if len(s) >= 3 and s[-3] == "d" and s[-2] in "htf":
        out.append("setitem")
    if m.marks:
        out += ["list", "tuple", "pop_mark"]
        below = m.marks[-1][-1:] or [""]
        if below[0] == "l":
            out += ["appends", "appends"]
        if all(k in "htf" for k in s):
            out.append("frozenset")
            if below[0] == "s":
                out += ["additems", "additems"]
        if len(s) % 2 == 0 and all(k in "htf" for k in s[::2]):
            out.append("dict")
            if below[0] == "d":
                out += ["setitems", "setitems"]
    return out


def _memo_index(draw: st.DrawFn, m: Model, wide: bool) -> int:
    """A memo index (usually one in use) none of whose bytes is rewritten."""
    top = (1 << 16) - 1 if wide else 255
    known = [i for i in m.memo if i <= top]
    if known and draw(st.booleans()):
        index = draw(st.sampled_from(sorted(known)))
    else:
        index = draw(st.integers(0, top))
    return index if not (CODE_BYTES | _MEMO_ALLOC) & set(index.to_bytes(4, "little")) else 0


@st.composite
def step(draw: st.DrawFn, m: Model, noise: bool) -> tuple[bytes, bool]:
    """One opcode that fits the model (which it then updates), or with ``noise`` sometimes
    any; and whether it is a memo PUT, whose bytes are left as written."""
    if noise and draw(st.integers(0, 7)) == 0:
        return draw(st.sampled_from([
            b"(", b"0", b"1", b"2", b"l", b"t", b"d", b"\x91", b"\x85", b"\x86", b"\x87",
            b"a", b"e", b"s", b"u", b"\x90", b"\x94", b"h\x00", b"q\x00", b"\x98",
            b"\x80\x02", b"\x80\x06", b"\xff", b".", b"g0\n"])), False
    op = draw(st.sampled_from(_choices(m)))
    if op == "put":
        return _put(draw, m), True
    return _step(draw, m, op, noise), False


def _put(draw: st.DrawFn, m: Model) -> bytes:
    form = draw(st.integers(0, 3))
    if form == 0:
        index = len(m.memo)
        code = b"\x94"
    elif form == 1:
        index = _memo_index(draw, m, False)
        code = b"q" + bytes([index])
    elif form == 2:
        index = _memo_index(draw, m, True)
        code = b"r" + struct.pack("<I", index)
    else:
        text = draw(st.sampled_from(_MEMO_TEXT))
        index = int(text) if text.strip().isdigit() else -1
        code = b"p" + text + b"\n"
    if index >= 0:
        m.memo[index] = m.stack[-1]
    return code


def _step(draw: st.DrawFn, m: Model, op: str, noise: bool) -> bytes:
    s = m.stack
    if op == "scalar":
        code, kind = draw(scalar(noise))
        m.push(kind)
        return code
    if op == "empty":
        code, kind = draw(st.sampled_from([(b"]", "l"), (b"}", "d"), (b")", "t"),
                                           (b"\x8f", "s")]))
        m.push(kind)
        return code
    if op == "mark":
        m.marks.append(s)
        m.stack = []
        return b"("
    if op == "pop":
        s.pop()
        return b"0"
    if op == "dup":
        s.append(s[-1])
        return b"2"
    if op == "get":
        index = draw(st.sampled_from(sorted(m.memo)))
        m.push(m.memo[index])
        form = draw(st.integers(0, 2))
        if form == 0 and index < 256:
            return b"h" + bytes([index])
        if form == 1:
            return b"j" + struct.pack("<I", index)
        return b"g" + draw(st.sampled_from([b"", b" "])) + str(index).encode() + b"\n"
    if op.startswith("tuple") and op != "tuple":
        n = int(op[-1])
        items = s[-n:]
        del s[-n:]
        m.push(_tuple_kind(items))
        return bytes([0x84 + n])
    if op == "append":
        s.pop()
        return b"a"
    if op == "setitem":
        del s[-2:]
        return b"s"
    items = m.pop_mark()
    if op in ("list", "tuple", "frozenset", "dict"):
        m.push({"list": "l", "tuple": _tuple_kind(items), "frozenset": "f", "dict": "d"}[op])
        return {"list": b"l", "tuple": b"t", "frozenset": b"\x91", "dict": b"d"}[op]
    return {"pop_mark": b"1", "appends": b"e", "additems": b"\x90", "setitems": b"u"}[op]


@st.composite
def program(draw: st.DrawFn) -> bytes:
    """PROTO (or not), up to 24 opcodes, closing what is open (mostly), STOP; the chunks
    grouped into FRAMEs some of the time. One program in four is noisy: opcodes that do
    not fit, malformed arguments, frames of the wrong length."""
    m = Model()
    noise = draw(st.integers(0, 3)) == 0
    chunks = [b"\x80" + bytes([draw(st.integers(0, 5))])] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 24))):
        chunk, is_put = draw(step(m, noise))
        chunks.append(chunk if is_put else chunk.translate(_NEUTRAL))
    if not noise or draw(st.integers(0, 3)):
        while m.marks:
            m.pop_mark()
            chunks.append(draw(st.sampled_from([b"l", b"t"])))
            m.push("l")
        if len(m.stack) > 1:
            chunks.insert(1 if chunks and chunks[0][:1] == b"\x80" else 0, b"(")
            chunks.append(b"l")
    chunks.append(b".")
    if draw(st.integers(0, 3)) == 0:
        framed: list[bytes] = []
        i = 0
        while i < len(chunks):
            n = draw(st.integers(1, 4))
            body = b"".join(chunks[i:i + n])
            size = len(body) + (draw(st.sampled_from([0, -1, 1])) if noise else 0)
            head = (b"\x95" + struct.pack("<Q", max(size, 0))).translate(_NEUTRAL)
            framed.append(head + body)
            i += n
        chunks = framed
    return b"".join(chunks)


# ---- the tests ---------------------------------------------------------------------------


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=program())
def test_programs_read_as_the_c_unpickler_reads_them(data: bytes) -> None:
    check(data)


def test_the_comparison_can_fail() -> None:
    """same_graph tells apart what == does not: types, NaN bits, sharing, order."""
    shared: list[Any] = [1]
    assert not same_graph([True], [1])
    assert not same_graph(0.0, -0.0)
    assert same_graph(math.nan, math.nan)
    assert not same_graph([shared, shared], [[1], [1]])
    assert not same_graph([[1], [1]], [shared, shared])
    assert not same_graph({1: 1, 2: 2}, {2: 2, 1: 1})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    other: list[Any] = []
    other.append(other)
    assert same_graph(cyclic, other)
    assert not same_graph(cyclic, [[]])


def test_listed_deviations_are_real() -> None:
    """Each deviation: a program C reads and the VM refuses for that listed reason."""
    for data in (b"I1\x00x\n.", b"Np0\x00\n.", b"F1.5\x00x\n.", b"NN.", b"(N.", b"C\x01a\x98.",
                 b"\x96\x00\x00\x00\x00\x00\x00\x00\x00K\x01a.", b"]K\x00aK\x00K\x01s.",
                 b"\x95\x03\x00\x00\x00\x00\x00\x00\x00K\x01K\x02\x86.",
                 b"\x95" + struct.pack("<Q", 11) + b"\x95" + struct.pack("<Q", 2) + b"K\x01."):
        ok, _ = c_unpickler(data)
        assert ok, data
        try:
            run_pickle(data)
        except CheckpointError as e:
            assert allowed(e, data), (data, e)
        else:
            raise AssertionError(f"the VM reads {data!r}: not a deviation")
