"""The scanner's trace against the reader's run and against CPython's C unpickler, on opcode
programs hypothesis writes.

The scanner runs the one interpreter in trace mode with its recording resolver
(:func:`torchless.scanner.modelrun.trace`). A program here is mostly valid (a model of the
stack picks opcodes that fit) and sometimes not: strings, ints, None, the containers,
MARK/POP/DUP, the memo (PUT, BINPUT, LONG_BINPUT and MEMOIZE, overwriting filled slots too;
GET, BINGET, LONG_BINGET), GLOBAL, STACK_GLOBAL (on strings, or on anything), INST, REDUCE,
NEWOBJ, BUILD, BINPERSID, FRAMEs (of the right length or not), extra values at STOP.

* against the reader's run (the default :class:`~torchless.pickle.machine.Resolver`): where
  it reaches STOP, the trace reaches it with the same globals (module, name, offset), the same
  memo, the same calls, and no anomaly; where it breaks, the trace saw the same before the
  break, and goes on (noting it) where only the reader is strict: an unreadable STACK_GLOBAL,
  a frame crossed;
* against the C unpickler, the oracle (``find_class`` records (module, name) and returns a
  harmless stub class; in tests only): where C reads the program the trace reaches STOP and
  resolved the same names in the same order, and its memo has C's slots (``memo_len`` counts
  filled slots); where C refuses it, the names C resolved come first in the trace's.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchless.core.limits import Limits
from torchless.pickle.machine import Machine, Resolver
from torchless.pickle.values import Global, Opaque
from torchless.rules.allowlist import FORWARDS
from torchless.scanner.model import Made
from torchless.scanner.modelrun import trace
from torchless.scanner.pickles import scan_stream

#: Names the programs import: none forwards a call (the model's and the reader's values then
#: differ in kind, which the comparison of calls would see as a difference).
NAMES = [("os", "system"), ("collections", "OrderedDict"), ("builtins", "print"),
         ("mylib", "Thing"), ("torch._utils", "_rebuild_tensor_v2"), ("__builtin__", "set"),
         ("a.b", "c")]
STRINGS = ["os", "system", "collections", "OrderedDict", "x", "", "a.b"]
HASHABLE = "sintgo"  # str, int, None, tuple (of these), global, object made by a call


class _Pid:
    def __init__(self, pid: Any) -> None:
        self.pid = pid


def canon(value: Any, seen: set[int] | None = None) -> Any:
    """A value as plain data, names by offset, objects made by calls as one token."""
    seen = set() if seen is None else seen
    if isinstance(value, Global):
        return ("G", value.offset)
    if isinstance(value, (Opaque, Made)):
        return ("R",)
    if hasattr(value, "pid"):
        return ("P", canon(value.pid, seen))
    if isinstance(value, (list, dict, set, tuple, frozenset)):
        if id(value) in seen:
            return ("cycle",)
        seen = seen | {id(value)}
        if isinstance(value, dict):
            return ("dict", [(canon(k, seen), canon(v, seen)) for k, v in value.items()])
        return (type(value).__name__, [canon(v, seen) for v in value])
    return (type(value).__name__, value)


def _logged(resolver: Resolver, log: list[Any]) -> None:
    """Wrap the resolver's calls (on the instance: the machine looks them up there) so that
    each is logged as the interpreter asks it."""
    call, new, build = resolver.call, resolver.new_object, resolver.build

    def logged_call(func: Any, args: Any, offset: int) -> Any:
        log.append(("call", offset, canon(func), canon(args)))
        return call(func, args, offset)

    def logged_new(cls: Any, args: Any, kwargs: Any, offset: int) -> Any:
        log.append(("new", offset, canon(cls), canon(args), canon(kwargs)))
        return new(cls, args, kwargs, offset)

    def logged_build(obj: Any, state: Any, offset: int) -> Any:
        log.append(("build", offset, canon(obj), canon(state)))
        return build(obj, state, offset)

    resolver.call = logged_call  # type: ignore[method-assign]
    resolver.new_object = logged_new  # type: ignore[method-assign]
    resolver.build = logged_build  # type: ignore[method-assign]


class _Reader(Resolver):
    """The default resolver, recording names and giving persistent ids a value."""

    def __init__(self) -> None:
        self.names: list[tuple[str, str, int]] = []

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self.names.append((module, name, offset))
        return super().find_global(module, name, offset)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        return _Pid(pid)


def _outcome(m: Machine) -> tuple[Any, Any]:
    """(value or the error's type, message and offset; memo at STOP) of ``m``'s run."""
    try:
        value, end = m._run(0)
    except Exception as e:  # run() maps the builtin ones to a PickleError at op_start
        offset = getattr(e, "offset", None)
        return ("error", type(e).__name__, getattr(e, "message", str(e)),
                m.op_start if offset is None else offset), None
    memo = {**dict(enumerate(m.memo_dense)), **m.memo}
    return ("value", canon(value), end), canon(memo)


class _Stub:
    """What the C unpickler gets for every name: a class that takes any call or update."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def c_names(data: bytes) -> tuple[bool, list[tuple[str, str]], list[int]]:
    """(whether C read it, the names its find_class was asked for, its memo's slots)."""
    asked: list[tuple[str, str]] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            asked.append((module, name))
            return _Stub

        def persistent_load(self, pid: Any) -> Any:
            return _Stub()

    # a file C can peek into reads frames as bytes do (pickle.loads); out of a bare BytesIO
    # an argument across a frame's end is read from after the frame (test_frames.py)
    u = Recording(io.BufferedReader(io.BytesIO(data)), encoding="utf-8")  # type: ignore[arg-type]
    try:
        u.load()
    except Exception:
        return False, asked, []
    return True, asked, sorted(u.memo.copy())


# ---- writing programs ----------------------------------------------------------------------

def _text_line(s: str) -> bytes:
    return s.encode() + b"\n"


class Model:
    def __init__(self) -> None:
        self.stack: list[str] = []
        self.marks: list[list[str]] = []
        self.memo: dict[int, str] = {}


def _choices(m: Model) -> list[str]:
    s = m.stack
    out = ["str", "str", "int", "none", "empty", "mark", "global", "named", "named"]
    if s and s[-1] in "go":
        out += ["call"] * 4
    if s:
        out += ["pop", "dup", "put", "put", "put", "tuple1", "persid"]
    if m.memo:
        out += ["get", "get"]
    if len(s) >= 2:
        out += ["tuple2", "stack_global"]
        if s[-1] == "s" and s[-2] == "s":
            out += ["stack_global"] * 3
        if s[-2] in "go" and s[-1] == "t":
            out += ["reduce", "reduce"]
        if s[-2] == "g" and s[-1] == "t":
            out.append("newobj")
        if s[-2] == "o":
            out.append("build")
        if s[-2] == "l":
            out.append("append")
    if len(s) >= 3:
        out.append("tuple3")
        if s[-3] == "d" and s[-2] in HASHABLE:
            out.append("setitem")
    if m.marks:
        out += ["tuple", "list", "inst", "pop_mark"]
        if len(s) % 2 == 0 and all(k in HASHABLE for k in s[::2]):
            out.append("dict")
    return out


def _tuple_kind(items: list[str]) -> str:
    return "t" if all(k in HASHABLE for k in items) else "T"


@st.composite
def step_put(draw: st.DrawFn, m: Model) -> bytes:
    """A memo write of the top of the stack: MEMOIZE (slot memo_len, the filled slots, as C
    counts them), or PUT, BINPUT, LONG_BINPUT of a slot in use (overwritten) or a new one."""
    form = draw(st.integers(0, 3))
    if form == 0:
        index = len(m.memo)
        code = b"\x94"
    else:
        known = sorted(m.memo)
        index = draw(st.sampled_from(known) if known and draw(st.booleans())
                     else st.integers(0, len(m.memo) + 2))
        code = (b"q" + bytes([index]), b"r" + struct.pack("<I", index),
                b"p%d\n" % index)[form - 1]
    m.memo[index] = m.stack[-1]
    return code


@st.composite
def step(draw: st.DrawFn, m: Model) -> bytes:
    s = m.stack
    op = draw(st.sampled_from(_choices(m)))
    if op == "str":
        text = draw(st.sampled_from(STRINGS)).encode()
        form = draw(st.integers(0, 3))
        s.append("s")
        if form == 0:
            return b"\x8c" + bytes([len(text)]) + text
        if form == 1:
            return b"X" + struct.pack("<I", len(text)) + text
        if form == 2:
            return b"V" + text + b"\n"
        return b"S'" + text + b"'\n"
    if op == "int":
        n = draw(st.integers(0, 70000))
        s.append("i")
        return draw(st.sampled_from([b"K" + bytes([n % 256]), b"M" + struct.pack("<H", n % 65536),
                                     b"J" + struct.pack("<i", n - 5), b"I%d\n" % n]))
    if op == "none":
        s.append("n")
        return b"N"
    if op == "call":  # arguments for what is on top, and REDUCE
        args = draw(st.sampled_from([b")", b"\x8c\x01x\x85", b"K\x01N\x86"]))
        s[-1] = "o"
        return args + b"R"
    if op == "named":  # a STACK_GLOBAL on a name's two strings, through the memo or not
        out = b""
        for text in draw(st.sampled_from(NAMES)):
            raw = text.encode()
            out += b"\x8c" + bytes([len(raw)]) + raw
            if draw(st.booleans()):
                s.append("s")
                out += draw(step_put(m))  # MEMOIZE, or a PUT that may overwrite a slot
                index = draw(st.sampled_from([i for i, k in m.memo.items() if k == "s"]))
                out += b"0" + (b"h" + bytes([index]) if index < 256 else b"j" + struct.pack(
                    "<I", index))
                s.pop()
        s.append("g")
        return out + b"\x93"
    if op == "empty":
        code, kind = draw(st.sampled_from([(b")", "t"), (b"]", "l"), (b"}", "d")]))
        s.append(kind)
        return code
    if op == "mark":
        m.marks.append(s)
        m.stack = []
        return b"("
    if op == "global":
        module, name = draw(st.sampled_from(NAMES))
        s.append("g")
        return b"c" + _text_line(module) + _text_line(name)
    if op == "pop":
        s.pop()
        return b"0"
    if op == "dup":
        s.append(s[-1])
        return b"2"
    if op == "put":
        return draw(step_put(m))
    if op == "get":
        index = draw(st.sampled_from(sorted(m.memo)))
        s.append(m.memo[index])
        return draw(st.sampled_from([b"h" + bytes([index]), b"j" + struct.pack("<I", index),
                                     b"g%d\n" % index]))
    if op == "persid":
        s[-1] = "p"
        return b"Q"
    if op.startswith("tuple") and op != "tuple":
        n = int(op[-1])
        items = s[-n:]
        del s[-n:]
        s.append(_tuple_kind(items))
        return bytes([0x84 + n])
    if op == "stack_global":
        del s[-2:]
        s.append("g")
        return b"\x93"
    if op in ("reduce", "newobj", "build"):
        del s[-2:]
        s.append("o")
        return {"reduce": b"R", "newobj": b"\x81", "build": b"b"}[op]
    if op == "append":
        s.pop()
        return b"a"
    if op == "setitem":
        del s[-2:]
        return b"s"
    items = m.stack
    m.stack = m.marks.pop()
    if op == "tuple":
        m.stack.append(_tuple_kind(items))
        return b"t"
    if op == "list":
        m.stack.append("l")
        return b"l"
    if op == "dict":
        m.stack.append("d")
        return b"d"
    if op == "inst":
        module, name = draw(st.sampled_from(NAMES))
        m.stack.append("o")
        return b"i" + _text_line(module) + _text_line(name)
    return b"1"  # POP_MARK


@st.composite
def program(draw: st.DrawFn) -> bytes:
    """PROTO, up to 30 opcodes, what is open closed (mostly), STOP; FRAMEs some of the time,
    of the wrong length some of those."""
    m = Model()
    chunks = [b"\x80" + bytes([draw(st.sampled_from([2, 4]))])]
    for _ in range(draw(st.integers(1, 30))):
        chunks.append(draw(step(m)))
    if draw(st.integers(0, 4)):
        while m.marks:
            m.stack = m.marks.pop()
            m.stack.append("T")
            chunks.append(b"t")
        while len(m.stack) > 1:
            m.stack.pop()
            chunks.append(b"0")
        if not m.stack:
            chunks.append(b"N")
    chunks.append(b".")
    if draw(st.integers(0, 3)) == 0:
        framed = [chunks[0]]
        i = 1
        wrong = draw(st.booleans())
        while i < len(chunks):
            n = draw(st.integers(1, 5))
            body = b"".join(chunks[i:i + n])
            size = len(body) + (draw(st.sampled_from([0, -1, 1, 2])) if wrong else 0)
            framed.append(b"\x95" + struct.pack("<Q", max(size, 0)) + body)
            i += n
        chunks = framed
    return b"".join(chunks)


# ---- the tests ---------------------------------------------------------------------------

def _runs(data: bytes) -> tuple[Any, ...]:
    lim = Limits()
    reader = _Reader()
    reader_log: list[Any] = []
    _logged(reader, reader_log)
    outcome_r, memo_r = _outcome(Machine(data, reader, lim))
    machine, recorder = trace(data, lim)
    trace_log: list[Any] = []
    _logged(recorder, trace_log)
    outcome_t, memo_t = _outcome(machine)
    found = [(g.module, g.name, g.offset) for g in
             (recorder.found[k] for k in sorted(recorder.found))]
    unresolved = {g.offset for g in recorder.found.values() if g.unresolved}
    return (outcome_r, memo_r, reader.names, reader_log, outcome_t, memo_t, found,
            unresolved, trace_log, machine.anomalies)


def test_the_programs_have_teeth() -> None:
    """Hand-made cases of each way the two runs part: a STACK_GLOBAL on ints (C refuses it
    too), a frame crossed by an argument and two values at STOP (C reads both)."""
    for data, c_reads in ((b"\x80\x04K\x01K\x02\x93N\x85R.", False),
                          (b"\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00\x8c\x05hello.", True),
                          (b"\x80\x04NN.", True)):
        outcome_r, _, _, _, outcome_t, _, _, unresolved, _, anomalies = _runs(data)
        assert outcome_r[0] == "error" and outcome_t[0] == "value"
        assert bool(unresolved) != bool(anomalies)
        assert c_names(data)[0] == c_reads


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=program())
def test_trace_sees_what_the_reader_and_c_see(data: bytes) -> None:
    assert not set(NAMES) & {tuple(p.rsplit(".", 1)) for p in FORWARDS}
    (outcome_r, memo_r, names_r, log_r, outcome_t, memo_t, found, unresolved, log_t,
     anomalies) = _runs(data)
    if outcome_r[0] == "value":
        assert (outcome_t, memo_t, found, log_t, anomalies) == \
            (outcome_r, memo_r, names_r, log_r, [])
    else:
        assert found[:len(names_r)] == names_r
        assert log_t[:len(log_r)] == log_r
        where, why = outcome_r[3], outcome_r[2]
        if "STACK_GLOBAL operands" in why:
            assert where in unresolved  # named unreadable, and the trace went on
        noted = {offset for offset, _ in anomalies}
        if "straddles" in why or "FRAME begins" in why:
            assert where in noted  # read on as C reads bytes, and noted
        if ("at STOP" in why or "STOP with" in why) and outcome_t[0] == "value":
            assert where in noted  # C returns the top value (an empty segment fails both)
    ok, asked, slots = c_names(data)
    traced = [(module, name) for module, name, offset in found if offset not in unresolved]
    if ok:
        assert outcome_t[0] == "value", (outcome_t, data)
        assert traced == asked
        assert memo_t is not None and sorted(k for k, _ in _memo_slots(memo_t)) == slots
    else:
        assert traced[:len(asked)] == asked
    # what the scanner reports is the trace's: the same names at the same offsets
    scan = scan_stream(data)
    assert [(g.module, g.name, g.offset) for g in scan.globals] == found
    assert scan.stopped == (outcome_t[0] == "value")


def _memo_slots(memo: Any) -> list[tuple[int, Any]]:
    kind, pairs = memo
    assert kind == "dict"
    return [(key[1], value) for key, value in pairs]
