"""The static walk of the scanner's pickle pass (pass 1 of :mod:`.pickles`): opcode by opcode
with the interpreter's own argument readers (:data:`.arguments.ARGS`), argument lengths checked
against the bytes present, nothing allocated by a declared length, from the first byte to STOP
or to the first byte that is not a decodable opcode.

Every ``GLOBAL`` and ``INST`` names its global inline; ``EXT1/2/4`` name one through the
loader's extension registry. ``STACK_GLOBAL`` takes its operands from the stack: the walk
follows string pushes and memo puts/gets closely enough to name them when the two values just
before it are strings. A stream without ``STACK_GLOBAL`` (torch.save writes protocol 2) needs
neither followed, so the walk first follows neither: runs of fixed-width opcodes that name
nothing (ints, memo puts and gets, tuples …) are matched whole by one regular expression, and
strings are not decoded; at the first ``STACK_GLOBAL`` it starts again, following both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchless.pickle.arguments import ARGS, memo_index
from torchless.pickle.opcodes import Arg, by_code
from torchless.scanner.modelrun import FoundGlobal, new_found
from torchless.scanner.report import Action, Severity

__all__ = ["MAX_LINE", "StreamScan", "static_walk"]

_STR_PUSH = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE",
                       "BINUNICODE", "BINUNICODE8"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
#: Bytes of one text line the walk accepts (a global name, a decimal) before calling it broken.
MAX_LINE = 1 << 20


@dataclass
class StreamScan:
    """What one pickle stream holds, and where it went wrong."""

    start: int
    #: Offset after STOP, or where decoding gave up.
    end: int
    stopped: bool
    globals: list[FoundGlobal] = field(default_factory=list)
    #: (offset, message) of every place a reader would break or disagree.
    problems: list[tuple[int, str]] = field(default_factory=list)
    #: The inert value when the interpreter finished the stream, else None.
    value: Any = None
    #: Persistent ids the stream passed to BINPERSID (storages), in order.
    pids: list[Any] = field(default_factory=list)
    #: True when a Limits bound stopped the walk or the run before the end of the stream.
    limited: bool = False
    #: What torch.load would do with the stream (offsets from the stream's base).
    actions: list[Action] = field(default_factory=list)
    #: The worst severity of the actions each name (by its opcode's offset) takes part in.
    worst: dict[int, Severity] = field(default_factory=dict)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _string_arg(decode: Callable[[bytes], Any], raw: bytes) -> str | None:
    """The str a string-pushing opcode leaves on the stack, read by the interpreter's own
    argument reader, ``decode`` (a Python 2 str as ASCII text); None if it is no text."""
    try:
        value = decode(raw)
        if isinstance(value, bytes):
            value = value.decode("ascii")
    except ValueError:
        return None
    return value if isinstance(value, str) else None


#: Per opcode byte: (name, kind, n, argument type, unpack, decode): the reader of
#: :data:`.arguments.ARGS`, unpacked. kind 0: n fixed bytes (read by ``unpack``); 1: an
#: n-byte length (read by ``unpack``), then that many bytes (read by ``decode``); 2: n
#: newline-terminated lines (read by ``decode``).
_Entry = tuple[str, int, int, Arg, Callable[[Any, int], tuple[Any, ...]],
               Callable[[bytes], Any]]


def _no_unpack(data: Any, offset: int) -> tuple[Any, ...]:  # pragma: no cover - never called
    raise AssertionError("this argument has no fixed-width field")


def _table() -> list[_Entry | None]:
    """The walk's view of :data:`.arguments.ARGS`, indexed by opcode byte."""
    table: list[_Entry | None] = [None] * 256
    for code in range(256):
        op = by_code(code)
        if op is None:
            continue
        reader = ARGS[op.arg]
        unpack = reader.unpack or _no_unpack
        if reader.lines:
            table[code] = (op.name, 2, reader.lines, op.arg, unpack, reader.decode)
        else:
            table[code] = (op.name, 1 if reader.prefixed else 0, reader.width, op.arg, unpack,
                           reader.decode)
    return table


_TABLE = _table()
#: Runs of opcodes without an argument that neither name a global nor touch the memo.
_IS_SIMPLE = [e is not None and e[1] == 0 and e[2] == 0 and
              e[0] not in ("STACK_GLOBAL", "STOP", "MEMOIZE") for e in _TABLE]
_SIMPLE_RUN = re.compile(b"[" + b"".join(
    re.escape(bytes([code])) for code in range(256) if _IS_SIMPLE[code]) + b"]+")
_MEMOIZE_RUN = re.compile(b"\x94+")
#: Opcodes of a fixed width that name nothing and do not end the stream or a frame's start:
#: until a STACK_GLOBAL is met (:func:`static_walk`), a run of them is matched whole.
_IS_FIXED = [e is not None and e[1] == 0 and e[0] not in (
    "FRAME", "EXT1", "EXT2", "EXT4", "STACK_GLOBAL", "STOP") for e in _TABLE]


def _fixed_run() -> re.Pattern[bytes]:
    """Runs of :data:`_IS_FIXED` opcodes, and of strings, bytes and longs of a 1- or 4-byte
    length below 256 (one alternative per length: a pattern cannot count)."""
    def codes(keep: Callable[[int, _Entry], bool]) -> bytes:
        return b"[" + b"".join(re.escape(bytes([c])) for c, e in enumerate(_TABLE)
                               if e is not None and keep(c, e)) + b"]"

    def sized(n: int) -> bytes:
        return b"(?:" + b"|".join(re.escape(length.to_bytes(n, "little")) + b".{%d}" % length
                                  for length in range(256)) + b")"

    widths = sorted({e[2] for c, e in enumerate(_TABLE) if e is not None and _IS_FIXED[c]})
    alternatives = [codes(lambda c, e, w=w: _IS_FIXED[c] and e[2] == w) +  # type: ignore[misc]
                    (b".{%d}" % w if w else b"") for w in widths]
    alternatives += [codes(lambda c, e, n=n: e[1] == 1 and e[2] == n) + sized(n)  # type: ignore[misc]
                     for n in (1, 4)]
    return re.compile(b"(?:" + b"|".join(alternatives) + b")+", re.DOTALL)


_FIXED_RUN = _fixed_run()
#: Opcodes the walk reads without the generic decoding step: fixed-width ones that name
#: nothing and leave no text (ints, floats …), the binary memo puts and gets, and the
#: length-prefixed UTF-8 strings (their values as ``utf8_text`` reads them).
_R_FIXED, _R_PUT1, _R_PUT4, _R_GET1, _R_GET4, _R_TEXT1, _R_TEXT4 = range(1, 8)
_SPECIAL = {"BINPUT": _R_PUT1, "LONG_BINPUT": _R_PUT4, "BINGET": _R_GET1,
            "LONG_BINGET": _R_GET4, "SHORT_BINUNICODE": _R_TEXT1, "BINUNICODE": _R_TEXT4}
_ROLES = [0] * 256
_WIDTHS = [0] * 256
for _code, _entry in enumerate(_TABLE):
    if _entry is None:
        continue
    _WIDTHS[_code] = _entry[2]
    if _entry[0] in _SPECIAL:
        _ROLES[_code] = _SPECIAL[_entry[0]]
    elif _entry[1] == 0 and _entry[2] > 0 and _entry[0] not in (
            "FRAME", "PROTO", "EXT1", "EXT2", "EXT4", "PUT", "GET"):
        _ROLES[_code] = _R_FIXED


def static_walk(data: Any, start: int, end: int, scan: StreamScan,
                max_bytes: int) -> dict[int, FoundGlobal]:
    """Pass 1; returns the globals by offset and fills ``scan.end``/``stopped``/problems.
    First without following strings and the memo, which only a STACK_GLOBAL needs: if the
    walk meets one, it starts again following them."""
    noted = len(scan.problems)
    found = _walk(data, start, end, scan, max_bytes, follow=False)
    if found is None:
        del scan.problems[noted:]
        found = _walk(data, start, end, scan, max_bytes, follow=True)
        assert found is not None
    return found


def _walk(data: Any, start: int, end: int, scan: StreamScan, max_bytes: int, *,
          follow: bool) -> dict[int, FoundGlobal] | None:
    """The walk; ``follow``: follow string pushes and the memo (else None at the first
    STACK_GLOBAL)."""
    found: dict[int, FoundGlobal] = {}
    memo: dict[int, str | None] = {}
    unset = 0  # MEMOIZE slots filled with non-strings (not stored)
    prev: str | None = None  # values of the last two value-producing opcodes
    last: str | None = None
    table = _TABLE
    roles = _ROLES
    widths = _WIDTHS
    from_bytes = int.from_bytes
    find = data.find
    simple = _SIMPLE_RUN.match
    is_simple = _IS_SIMPLE
    memoize = _MEMOIZE_RUN.match
    pos = start
    frame_end = -1
    limit = start + max_bytes
    run_end = min(end, limit + 1)
    fixed = None if follow else _FIXED_RUN.match
    is_fixed = _IS_FIXED
    while True:
        if pos == frame_end:
            frame_end = -1
        code = data[pos] if pos < end else -1
        if fixed is not None and code >= 0:
            if is_fixed[code]:
                # whole opcodes only, none past the frame's end (an argument across it is
                # reported below)
                run = fixed(data, pos, frame_end if pos < frame_end < run_end else run_end)
                if run is not None:
                    pos = run.end()
                    continue
            elif (code == 0x58 or code == 0x8C) and pos <= limit:  # text no one reads
                if code == 0x8C:
                    nxt = pos + 2 + data[pos + 1] if pos + 1 < end else end + 1
                else:
                    nxt = pos + 5 + from_bytes(data[pos + 1:pos + 5], "little") \
                        if pos + 5 <= end else end + 1
                if nxt <= end and not pos < frame_end < nxt:  # else as below
                    pos = nxt
                    continue
            elif code == 0x63 and pos <= limit:  # GLOBAL, whole and inside its frame
                nl = find(b"\n", pos + 1, min(end, pos + 1 + MAX_LINE))
                if nl >= 0:
                    nxt = find(b"\n", nl + 1, min(end, nl + 1 + MAX_LINE)) + 1
                    if nxt > 0 and not pos < frame_end < nxt:  # else as below
                        found[pos] = new_found(_text(data[pos + 1:nl]),
                                               _text(data[nl + 1:nxt - 1]), pos, "GLOBAL")
                        prev, last = last, None
                        pos = nxt
                        continue
        if code >= 0 and is_simple[code]:
            if pos + 1 < run_end and is_simple[data[pos + 1]]:  # a run naming nothing
                run = simple(data, pos, run_end)
                assert run is not None
                prev = last = None
                if pos < frame_end <= run.end():
                    frame_end = -1
                pos = run.end()
                continue
            if pos <= limit:  # one such opcode
                prev, last = last, None
                pos += 1
                continue
        elif code == 0x94 and last is None:
            run = memoize(data, pos, run_end)
            if run is not None:
                unset += run.end() - pos
                if pos < frame_end <= run.end():
                    frame_end = -1
                pos = run.end()
                continue
        if pos > limit:
            scan.problems.append((pos, f"the stream is longer than max_pickle_bytes="
                                       f"{max_bytes}; the rest was not walked"))
            scan.limited = True
            break
        if pos >= end:
            scan.problems.append((pos, "the stream ends without a STOP opcode"))
            break
        entry = table[code]
        if entry is None:
            scan.problems.append((pos, f"byte 0x{code:02x} is not a pickle opcode"))
            break
        role = roles[code]
        if role:  # the commonest opcodes, whole and inside their frame: no decoding step
            at = pos + 1
            if role == _R_TEXT1:
                nxt = at + 1 + data[at] if at < end else end + 1
            elif role == _R_TEXT4:
                nxt = at + 4 + from_bytes(data[at:at + 4], "little") if at + 4 <= end \
                    else end + 1
            else:
                nxt = at + widths[code]
            if nxt <= end and not pos < frame_end < nxt:
                pos = nxt
                if role == _R_FIXED:
                    prev, last = last, None
                elif role == _R_PUT1:
                    memo[data[at]] = last
                elif role == _R_PUT4:
                    memo[from_bytes(data[at:nxt], "little")] = last
                elif role == _R_GET1:
                    prev, last = last, memo.get(data[at])
                elif role == _R_GET4:
                    prev, last = last, memo.get(from_bytes(data[at:nxt], "little"))
                elif fixed is None:
                    raw = data[at + (1 if role == _R_TEXT1 else 4):nxt]
                    try:
                        text: str | None = raw.decode("utf-8", "surrogatepass")
                    except UnicodeDecodeError:
                        text = None
                    prev, last = last, text
                continue
        name, kind, n, _, unpack, decode = entry
        at = pos + 1
        args: tuple[bytes, ...] = ()
        if kind == 0:
            nxt = at + n
            if nxt > end:
                scan.problems.append((pos, f"{name} argument is cut short"))
                break
            if n:
                args = (data[at:nxt],)
        elif kind == 1:
            if at + n > end:
                scan.problems.append((pos, f"{name} argument is cut short"))
                break
            length = int(unpack(data, at)[0])
            nxt = at + n + length
            if length < 0 or nxt > end:
                scan.problems.append((pos, f"{name} declares {length} bytes, "
                                           f"{max(0, end - at - n)} remain"))
                break
            args = (data[at + n:nxt],)
        else:
            lines = []
            nxt = at
            for _ in range(n):
                nl = find(b"\n", nxt, min(end, nxt + MAX_LINE))
                if nl < 0:
                    break
                lines.append(data[nxt:nl])
                nxt = nl + 1
            if len(lines) != n:
                scan.problems.append((pos, f"{name} text argument has no end of line"))
                break
            args = tuple(lines)
        if pos < frame_end < nxt:
            scan.problems.append((pos, f"{name} argument straddles the end of its FRAME "
                                       "(unpicklers disagree about the bytes that follow)"))
            _buried(data, at, nxt, found)
            frame_end = -1
        if name == "FRAME":
            frame_end = nxt + int(unpack(args[0], 0)[0])
        if kind == 0 and n == 0 and name not in ("STACK_GLOBAL", "STOP", "MEMOIZE"):
            prev, last = last, None
            pos = nxt
            continue
        value: str | None = None
        if name in ("GLOBAL", "INST"):
            found[pos] = new_found(_text(args[0]), _text(args[1]), pos, name)
        elif name in ("EXT1", "EXT2", "EXT4"):
            code = int(unpack(args[0], 0)[0])
            found[pos] = FoundGlobal("copyreg.extension", str(code), pos, name)
        elif name == "STACK_GLOBAL":
            if not follow:
                return None
            if prev is not None and last is not None:
                found[pos] = FoundGlobal(prev, last, pos, name)
            else:
                found[pos] = FoundGlobal("?", "?", pos, name,
                                         "operands are not two strings pushed just before it")
        elif name == "STOP":
            scan.end = nxt
            scan.stopped = True
            break
        pos = nxt
        if name in _PUTS:
            index = len(memo) + unset if name == "MEMOIZE" else _index(name, unpack, args[0])
            if index is not None:
                memo[index] = last
            continue
        if name in ("FRAME", "PROTO"):
            continue
        if name in _STR_PUSH:
            value = _string_arg(decode, args[0])
        elif name in _GETS:
            index = _index(name, unpack, args[0])
            value = memo.get(index) if index is not None else None
        prev, last = last, value
    if not scan.stopped:
        scan.end = pos
    return found


# bounded repeats: an unbounded one backtracks quadratically over a long run of name bytes
_BURIED = re.compile(rb"c([A-Za-z_][A-Za-z0-9_.]{0,255})\n([A-Za-z_][A-Za-z0-9_.]{0,255})\n")


def _buried(data: Any, lo: int, hi: int, found: dict[int, FoundGlobal]) -> None:
    """GLOBAL opcodes inside an argument that straddles a frame: some unpicklers read the
    argument only up to the frame's end and run what follows as opcodes."""
    for m in _BURIED.finditer(bytes(data[lo:min(hi, lo + MAX_LINE)])):
        offset = lo + m.start()
        found[offset] = FoundGlobal(_text(m.group(1)), _text(m.group(2)), offset, "GLOBAL")


def _index(name: str, unpack: Callable[[Any, int], tuple[Any, ...]],
           raw: bytes) -> int | None:
    """A memo index, as the interpreter reads it; None if it reads none."""
    if name in ("PUT", "GET"):
        try:
            return memo_index(raw)
        except ValueError:
            return None
    return int(unpack(raw, 0)[0])
