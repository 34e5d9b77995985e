"""A pickle interpreter that never imports or calls anything.

It decodes every opcode of protocols 0-5 into plain Python data (dict, list,
tuple, set, frozenset, str, bytes, bytearray, int, float, bool, None) and
hands everything that would touch code to a :class:`Resolver`: names
(``GLOBAL``/``STACK_GLOBAL``/``INST``/``EXT*``), calls (``REDUCE``,
``NEWOBJ``, ``NEWOBJ_EX``, ``INST``/``OBJ``), ``BUILD``, persistent ids, and
``APPEND``/``SETITEM``/``ADDITEMS`` on objects that are not plain containers.
The default resolver turns them into inert :class:`~torchless.pickle.values.Global`
and :class:`~torchless.pickle.values.Opaque` records.

Limits are checked as the stream runs: every declared length against the
bytes actually present (before anything is allocated), opcode count, memo
size, values on the stack, MARK depth, container length and tuple nesting, of
tuples built by opcodes and by the resolver alike (a deeply nested tuple would
otherwise overflow the C stack when hashed as a dict key).

Only our own errors leave :meth:`Machine.run`.
"""

from __future__ import annotations

import functools
import gc
import math
import mmap
import struct
from collections.abc import Callable
from typing import Any

from torchless.core.collector import pause_collector
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    LimitError,
    PickleError,
    TruncatedInputError,
    UnsupportedError,
    UnsupportedOpcodeError,
    type_phrase,
)
from torchless.pickle.arguments import (
    c_load_int,
    c_load_long,
    float_text,
    long_bytes,
    memo_index,
    string_text,
    unicode_text,
    unpack_float8,
    unpack_int4,
    unpack_uint2,
    unpack_uint4,
    unpack_uint8,
    utf8_text,
)
from torchless.pickle.keycost import KeyCost
from torchless.pickle.opcodes import HIGHEST_PROTOCOL, OPCODES, by_code
from torchless.pickle.tensorargs import tensor_args
from torchless.pickle.values import Global, Opaque, new_global

__all__ = ["INLINE", "Machine", "Resolver", "run_pickle"]

_LOG2_10 = math.log2(10)
_LOG10_2 = math.log10(2)


@functools.lru_cache(maxsize=4)
def _power_of_ten(k: int) -> int:
    power: int = 10**k
    return power


# the argument readers of .arguments, bound once (the static walk uses the same functions)
_unpack_int4 = unpack_int4
_unpack_uint2 = unpack_uint2
_unpack_uint4 = unpack_uint4
_unpack_uint8 = unpack_uint8
_unpack_float8 = unpack_float8
_long_bytes = long_bytes
_float_text = float_text
_string_text = string_text
_unicode_text = unicode_text
_utf8_text = utf8_text


_IMMUTABLE = (tuple, frozenset)
#: What REDUCE refuses to call (the C unpickler raises for them).
_NOT_CALLABLE = (str, bytes, int, float, list, dict, tuple, type(None))
#: The values the constant opcodes push, by opcode byte: EMPTY_TUPLE, NONE, NEWTRUE, NEWFALSE.
_CONSTANTS: list[Any] = [None] * 256
_CONSTANTS[0x29], _CONSTANTS[0x4E], _CONSTANTS[0x88], _CONSTANTS[0x89] = (), None, True, False


class _Mark:
    """Sentinel for MARK on the stack-of-stacks; never escapes."""


class Resolver:
    """What the interpreter does with names, calls and updates of objects.

    This default keeps everything inert. Subclasses (the torch rules) rebuild
    what they know and may refuse what they must by raising a CheckpointError.
    ``python2_strings`` is set when the stream holds Python 2 ``str`` opcodes.
    """

    python2_strings = False
    #: The run's count of hashing work (:mod:`.keycost`), set by the :class:`Machine` that
    #: runs with this resolver: rules that build sets and dicts charge their keys to it.
    keycost: KeyCost | None = None
    #: The protocol in force (the last PROTO's argument, 0 before one), set by the
    #: :class:`Machine`: the C unpickler's find_class maps and walks names by it.
    proto = 0

    def charge_keys(self, keys: Any, offset: int | None = None) -> None:
        """Count the hashing of ``keys`` (an iterable) against the run's limit."""
        if self.keycost is not None:
            self.keycost.charge(keys, offset)

    def find_global(self, module: str, name: str, offset: int) -> Any:
        return new_global(module, name, offset)

    def unresolved_global(self, module: Any, name: Any, offset: int) -> Any:
        """STACK_GLOBAL whose operands are not two strs: the unpicklers refuse it (the
        scanner's recorder notes the name it cannot read and goes on)."""
        raise PickleError("STACK_GLOBAL operands must be str", offset=offset)

    def extension(self, code: int, offset: int) -> Any:
        return Global("copyreg._extension_registry", str(code), offset)

    def call(self, func: Any, args: Any, offset: int) -> Any:
        """REDUCE, INST and OBJ: ``func(*args)``."""
        return Opaque(func, args if isinstance(args, tuple) else (args,))

    def new_object(self, cls: Any, args: Any, kwargs: Any, offset: int) -> Any:
        """NEWOBJ and NEWOBJ_EX: ``cls.__new__(cls, *args, **kwargs)``."""
        return Opaque(
            cls,
            args if isinstance(args, tuple) else (args,),
            kwargs if isinstance(kwargs, dict) else None,
            newobj=True,
        )

    def build(self, obj: Any, state: Any, offset: int) -> Any:
        """BUILD: ``obj.__setstate__(state)``; returns what replaces obj on the stack."""
        if isinstance(obj, Opaque):
            if isinstance(obj.state, dict) and isinstance(state, dict):
                obj.state = {**obj.state, **state}
            else:
                obj.state = state
            return obj
        raise PickleError(f"BUILD applied to {type_phrase(obj)}", offset=offset)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        raise PickleError("persistent id found but this file has no storages", offset=offset)

    def append(self, obj: Any, items: list[Any], offset: int) -> None:
        """APPEND/APPENDS on something that is not a list."""
        if isinstance(obj, Opaque):
            obj.items.extend(items)
            return
        raise PickleError(f"APPEND applied to {type_phrase(obj)}", offset=offset)

    def setitems(self, obj: Any, pairs: list[tuple[Any, Any]], offset: int) -> None:
        """SETITEM/SETITEMS on something that is not a dict."""
        if isinstance(obj, Opaque):
            obj.dict_items.extend(pairs)
            return
        raise PickleError(f"SETITEM applied to {type_phrase(obj)}", offset=offset)

    def additems(self, obj: Any, items: list[Any], offset: int) -> None:
        """ADDITEMS on something that is not a set."""
        if isinstance(obj, Opaque):
            obj.items.extend(items)
            return
        raise PickleError(f"ADDITEMS applied to {type_phrase(obj)}", offset=offset)


#: The opcodes :meth:`Machine._run` handles in its loop (the ones a torch checkpoint is made
#: of, and STOP); every other opcode has an ``op_`` method, and no opcode has both
#: (:func:`_dispatch_table` checks it when each Machine class is made).
INLINE: frozenset[str] = frozenset({
    "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "BININT1", "BININT2", "BININT",
    "MARK", "BINUNICODE",
    "SHORT_BINUNICODE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "REDUCE", "BINPERSID",
    "NEWFALSE", "NEWTRUE", "NONE", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_LIST", "MEMOIZE",
    "STOP"})


def _dispatch_table(cls: type) -> list[Callable[[Any], None] | None]:
    """Each opcode byte's ``op_`` function of ``cls`` (None for the :data:`INLINE` opcodes
    and for bytes that are no opcode). An opcode handled in two places, or in none, is a
    TypeError here, when the class is made, not a silent twin or a crash on a file."""
    table: list[Callable[[Any], None] | None] = [None] * 256
    methods: dict[str, Callable[[Any], None]] = {}
    for klass in reversed(cls.__mro__):  # the class's op_ functions, overrides last
        methods.update((k, v) for k, v in vars(klass).items() if k.startswith("op_"))
    for op in OPCODES:
        method = methods.get("op_" + op.name)
        if op.name in INLINE:
            if method is not None:
                raise TypeError(f"{cls.__name__}.op_{op.name}: {op.name} is handled inline "
                                "by Machine._run, so this method would never run")
        elif method is None:
            raise TypeError(f"{cls.__name__} has no op_{op.name} and {op.name} is not "
                            "handled inline")
        else:
            table[op.code] = method
    strays = {n[3:] for n in methods} - {op.name for op in OPCODES}
    if strays:
        raise TypeError(f"{cls.__name__} has op_ methods of no opcode: {sorted(strays)}")
    return table


class Machine:
    """One run of the interpreter over one pickle stream.

    ``trace``: the scanner's mode. Where CPython's two unpicklers read one stream
    differently, the reader refuses it; a trace reads on as the C unpickler (the one
    ``torch.load`` runs) does, and notes the place in :attr:`anomalies`: an argument that
    runs across the end of its FRAME is read whole (C ignores where frames end; the Python
    unpickler refuses), a FRAME may begin inside another, STOP returns the top value
    whatever else is on the stack, and INT, LONG, GET and PUT text is read up to a NUL
    byte. Everything else (memo, limits, argument readers) is the same run.
    """

    #: Run torch's per-tensor opcode sequence at once where it appears
    #: (:mod:`.tensorargs`); the general loop alone when False (the tests compare both).
    fast_tensors = True
    _table: list[Callable[[Any], None] | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._table = _dispatch_table(cls)

    def __init__(
        self,
        data: bytes | bytearray | memoryview | mmap.mmap,
        resolver: Resolver | None = None,
        limits: Limits | None = None,
        *,
        encoding: str = "utf-8",
        trace: bool = False,
    ) -> None:
        # bytes and mmap both offer find() and slicing to bytes; anything else is copied
        self.data: Any = data if isinstance(data, (bytes, mmap.mmap)) else bytes(data)
        self.resolver = resolver if resolver is not None else Resolver()
        self.limits = limits if limits is not None else Limits()
        self.encoding = encoding
        self.pos = 0
        self.op_start = 0
        self.frame_end = -1
        self.limit = len(self.data)  # where reading must stop: end of data or of the frame
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        # values the current stack segment may still take: max_stack minus those below MARKs
        self.room = self.limits.max_stack
        # The memo: slots 0, 1, 2 … as picklers number them, in a list (a dict of a million
        # int keys was a third of the memory of opening a file of many small tensors); any
        # other index, and every one after it, in the dict. Together they hold each index
        # once: the list grows only while the dict is empty.
        self.memo_dense: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.proto = self.resolver.proto = 0
        # id(tuple or frozenset) -> (object, nesting depth); immutables only, so exact.
        self.depths: dict[int, tuple[Any, int]] = {}
        self.keycost = KeyCost(self.limits)
        self.resolver.keycost = self.keycost
        # the class's table, made once (46 bound-method lookups were a third of a short run)
        self.dispatch: list[Callable[[Any], None] | None] = self._table
        self.trace = trace
        #: trace mode: (offset, why) of each place the Python unpickler refuses what the C
        #: unpickler reads on (a frame's end crossed, a frame inside a frame …).
        self.anomalies: list[tuple[int, str]] = []

    # ---- running -------------------------------------------------------------------

    def run(self, start: int = 0) -> tuple[Any, int]:
        """Interpret one pickle starting at ``start``; return (value, offset after STOP)."""
        paused = pause_collector()
        try:
            return self._run(start)
        except CheckpointError:
            raise
        except RecursionError as e:  # pragma: no cover - defensive
            raise LimitError("max_depth", self.limits.max_depth, -1, "recursion") from e
        except MemoryError as e:
            raise LimitError("memory", 0, 0, "out of memory while unpickling",
                             offset=self.op_start) from e
        except (ValueError, TypeError, OverflowError, KeyError, IndexError,
                UnicodeError, struct.error) as e:
            raise PickleError(f"malformed pickle: {type(e).__name__}: {e}",
                              offset=self.op_start) from e
        finally:
            if paused:
                gc.enable()
            # drop the working state: no cycle outlives the run
            self.dispatch = []
            self.memo = {}
            self.memo_dense = []
            self.depths = {}
            self.keycost.sizes = {}
            self.metastack = []

    def _run(self, start: int) -> tuple[Any, int]:
        """The opcode loop. The opcodes a torch checkpoint is made of (:data:`INLINE`:
        memo, ints, strings, MARK, tuples, REDUCE, BINPERSID: 30 per tensor; and STOP) run
        here on local state, and only here; every other opcode goes to its ``op_`` method
        with the position written back first and the state read again after.
        (Four to five Python calls per opcode were most of the time of opening a file of
        many small tensors.)"""
        data = self.data
        end = len(data)
        dispatch = self.dispatch
        lim = self.limits
        max_ops = lim.max_opcodes
        max_end = start + lim.max_pickle_bytes
        max_memo = lim.max_memo
        max_str = lim.max_str_bytes
        max_depth = lim.max_depth
        memo = self.memo
        dense = self.memo_dense
        metastack = self.metastack
        resolver = self.resolver
        immutable = self._immutable
        from_bytes = int.from_bytes
        stack = self.stack
        room = self.room
        frame_end = self.frame_end
        limit = self.limit
        pos = start
        count = 0
        # Every opcode takes a byte, so the opcode count can pass max_ops only in data
        # longer than that: otherwise it is not kept. The rare checks (end of a frame, of
        # the data, of max_pickle_bytes, and the count where it matters) run when ``pos``
        # reaches ``guard``.
        counting = max_ops < end - start
        shallow = max_depth >= 1  # a tuple of no tuples is within the depth limit
        fast = self.fast_tensors
        callers: set[type] = set()  # types REDUCE found callable (none of _NOT_CALLABLE)
        guard = -1
        op = pos
        while True:
            if pos >= guard:
                if pos >= frame_end >= 0:
                    if pos > frame_end:  # trace mode: the opcode at op read across it
                        self._straddled(op, frame_end)
                    frame_end = self.frame_end = -1
                    limit = self.limit = end
                if pos > max_end:
                    raise LimitError("max_pickle_bytes", lim.max_pickle_bytes, pos - start,
                                     offset=pos)
                if pos >= end:
                    raise TruncatedInputError(
                        "pickle ends without a STOP opcode", offset=pos)
                if counting:
                    count += 1
                    if count > max_ops:
                        raise LimitError("max_opcodes", max_ops, count, offset=pos)
                else:
                    guard = limit if frame_end < 0 else frame_end
                    if guard > max_end:
                        guard = max_end + 1
            code = data[pos]
            op = pos
            if code in {0x68, 0x6A}:  # BINGET, LONG_BINGET (a set: one test, not two)
                if code == 0x68:
                    pos += 2
                    if pos > limit:
                        self._overrun_at(op, 1)
                    index = data[op + 1]
                else:
                    pos += 5
                    if pos > limit:
                        self._overrun_at(op, 4)
                    index = from_bytes(data[op + 1:pos], "little")
                value = dense[index] if index < len(dense) else self._at(op)._memo_get(index)
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append(value)
            elif code in {0x72, 0x71}:  # LONG_BINPUT, BINPUT
                if code == 0x72:
                    pos += 5
                    if pos > limit:
                        self._overrun_at(op, 4)
                    index = from_bytes(data[op + 1:pos], "little")
                else:
                    pos += 2
                    if pos > limit:
                        self._overrun_at(op, 1)
                    index = data[op + 1]
                if not stack:
                    raise PickleError("stack underflow", offset=op)
                n = len(dense)
                if index == n and not memo and index < max_memo:  # the next slot: most PUTs
                    dense.append(stack[-1])
                elif index < n:
                    dense[index] = stack[-1]
                else:
                    self.op_start = op
                    self._memo_put(index, stack[-1])
            elif code == 0x52:  # REDUCE
                if len(stack) < 2:
                    raise PickleError("stack underflow", offset=op)
                args = stack.pop()
                func = stack.pop()
                if not isinstance(args, tuple):
                    raise PickleError("REDUCE arguments are not a tuple", offset=op)
                if type(func) not in callers:  # once per type: isinstance asks the type
                    if isinstance(func, _NOT_CALLABLE):
                        raise PickleError(f"REDUCE of a non-callable {type(func).__name__}",
                                          offset=op)
                    callers.add(type(func))
                self.op_start = op  # for what run() makes of an error the resolver raises
                value = resolver.call(func, args, op)
                if isinstance(value, (tuple, frozenset)):
                    value = immutable(value)
                stack.append(value)
                pos += 1
            elif code in {0x29, 0x4E, 0x88, 0x89}:
                # EMPTY_TUPLE NONE NEWTRUE NEWFALSE
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append(_CONSTANTS[code])
                pos += 1
            elif code in {0x7D, 0x5D}:  # EMPTY_DICT, EMPTY_LIST
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append({} if code == 0x7D else [])
                pos += 1
            elif code in {0x4B, 0x4D, 0x4A}:  # BININT1, BININT2, BININT
                if code == 0x4B:
                    pos += 2
                    if pos > limit:
                        self._overrun_at(op, 1)
                    value = data[op + 1]
                elif code == 0x4D:
                    pos += 3
                    if pos > limit:
                        self._overrun_at(op, 2)
                    value = data[op + 1] | data[op + 2] << 8
                else:
                    pos += 5
                    if pos > limit:
                        self._overrun_at(op, 4)
                    value = from_bytes(data[op + 1:pos], "little", signed=True)
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append(value)
            elif code == 0x28:  # MARK
                if fast and pos + 1 < guard and data[pos + 1] == 0x28:
                    after = tensor_args(self, pos, guard)  # a tensor's arguments, at once
                    if after >= 0:
                        pos = after
                        stack = self.stack
                        continue
                if len(metastack) >= max_depth:
                    raise LimitError("max_depth", max_depth, len(metastack) + 1, "open MARKs",
                                     offset=op)
                metastack.append(stack)
                room -= len(stack)
                self.room = room
                self.stack = stack = []
                pos += 1
            elif 0x85 <= code <= 0x87:  # TUPLE1, TUPLE2, TUPLE3
                k = code - 0x84
                if len(stack) < k:
                    raise PickleError("stack underflow", offset=op)
                value = tuple(stack[-k:])
                for item in value if shallow else (0,):
                    if not shallow or isinstance(item, _IMMUTABLE):
                        self.op_start = op
                        value = immutable(value)
                        break
                del stack[-k:]
                stack.append(value)
                pos += 1
            elif code == 0x74:  # TUPLE
                if not metastack:
                    raise PickleError("no MARK on the stack", offset=op)
                items = stack
                self.stack = stack = metastack.pop()
                room += len(stack)
                self.room = room
                value = tuple(items)
                for item in value if shallow else (0,):
                    if not shallow or isinstance(item, _IMMUTABLE):
                        self.op_start = op
                        value = immutable(value)
                        break
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append(value)
                pos += 1
            elif code in {0x58, 0x8C}:  # BINUNICODE, SHORT_BINUNICODE
                if code == 0x58:
                    pos += 5
                    if pos > limit:
                        self._overrun_at(op, 4)
                    n = from_bytes(data[op + 1:pos], "little")
                else:
                    pos += 2
                    if pos > limit:
                        self._overrun_at(op, 1)
                    n = data[op + 1]
                if n > limit - pos or n > max_str:
                    self.pos = pos
                    self.op_start = op
                    self._sized(n)  # raises: runs past the data or its frame, or too long
                raw = data[pos:pos + n]
                pos += n
                try:
                    text = raw.decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    self.op_start = op
                    text = self._text(raw)  # raises with the reason
                if len(stack) >= room:
                    self._at(op)._stack_full()
                stack.append(text)
            elif code == 0x51:  # BINPERSID
                if not stack:
                    raise PickleError("stack underflow", offset=op)
                self.op_start = op
                stack[-1] = resolver.persistent_load(stack[-1], op)
                pos += 1
            elif code == 0x94:  # MEMOIZE (protocol 4 and 5 memoise with it)
                if not stack:
                    raise PickleError("stack underflow", offset=op)
                index = len(dense) + len(memo)
                if not memo and index < max_memo:
                    dense.append(stack[-1])
                else:
                    self.op_start = op
                    self._memo_put(index, stack[-1])
                pos += 1
            else:
                self.pos = pos + 1
                self.op_start = op
                if code == 0x2E:  # STOP
                    return self._stop(), self.pos
                handler = dispatch[code]
                if handler is None:
                    raise UnsupportedOpcodeError(f"unknown opcode byte 0x{code:02x}",
                                                 offset=pos)
                handler(self)
                pos = self.pos
                stack = self.stack
                room = self.room
                frame_end = self.frame_end
                limit = self.limit
                guard = -1

    def _at(self, op: int) -> Machine:
        """This machine, its current opcode set to the one at ``op`` (:meth:`_run` keeps it
        in a local, and writes it back before a method that may read it)."""
        self.op_start = op
        return self

    def _overrun_at(self, op: int, n: int) -> None:
        """The error of an argument of ``n`` bytes after the opcode at ``op`` that runs past
        the data or its frame (:meth:`_overrun`)."""
        self.op_start = op
        self.pos = op + 1
        self._overrun(n)

    def _stop(self) -> Any:
        why = ("MARK still open at STOP" if self.metastack else
               f"STOP with {len(self.stack)} values on the stack (expected 1)"
               if len(self.stack) != 1 else "")
        if why:
            if not self.trace or not self.stack:
                raise PickleError(why, offset=self.op_start)
            self._differ(self.op_start, f"{why}: both unpicklers return the top value")
        return self.stack[-1]

    def _differ(self, offset: int, why: str) -> None:
        """Trace mode: note where this stream is read as no pickler writes it, or as the
        Python unpickler would refuse it (the run reads on as the C unpickler does)."""
        self.anomalies.append((offset, why))

    def _straddled(self, op: int, frame_end: int) -> None:
        """Trace mode: the opcode at ``op`` was read across the end of its FRAME, at
        ``frame_end``."""
        code = by_code(self.data[op])
        self._differ(op, f"{code.name if code else 'opcode'} argument straddles the end of "
                     "its FRAME: the C unpickler (torch.load) reads it whole, the Python "
                     "unpickler refuses the stream")

    # ---- argument readers ----------------------------------------------------------

    def _take(self, n: int) -> bytes:
        pos = self.pos
        stop = pos + n
        if stop > self.limit:
            self._overrun(n)
        self.pos = stop
        chunk: bytes = self.data[pos:stop]
        return chunk

    def _overrun(self, n: int) -> None:
        left = len(self.data) - self.pos
        if self.frame_end >= 0 and n <= left:
            raise PickleError("opcode argument straddles the end of its FRAME",
                              offset=self.op_start)
        raise TruncatedInputError(f"expected {n} bytes, got {max(0, left)}",
                                  offset=self.op_start)

    def _line(self, decimal: bool = False) -> bytes:
        """The text argument up to the newline; a ``decimal`` one is refused by its digit
        count before it is copied."""
        data = self.data
        nl = data.find(b"\n", self.pos, self.limit)
        if nl < 0:
            if self.frame_end >= 0 and data.find(b"\n", self.pos) >= 0:
                raise PickleError("text argument straddles the end of its FRAME",
                                  offset=self.op_start)
            raise TruncatedInputError("text argument has no end of line", offset=self.op_start)
        if decimal and nl - self.pos > self.limits.max_int_digits + 2:  # sign, 'L'
            raise LimitError("max_int_digits", self.limits.max_int_digits, nl - self.pos,
                             "characters of a decimal integer", offset=self.op_start)
        if nl - self.pos > self.limits.max_str_bytes:
            raise LimitError("max_str_bytes", self.limits.max_str_bytes, nl - self.pos,
                             offset=self.op_start)
        line: bytes = data[self.pos:nl]
        self.pos = nl + 1
        return line

    def _sized(self, n: int) -> bytes:
        """Read a length-prefixed payload after checking n against what is present."""
        self._present(n)
        if n > self.limits.max_str_bytes:
            raise LimitError("max_str_bytes", self.limits.max_str_bytes, n,
                             offset=self.op_start)
        return self._take(n)

    def _present(self, n: int) -> None:
        """Refuse a declared length that is negative or runs past the data or its frame."""
        if n < 0:
            raise PickleError(f"negative length {n}", offset=self.op_start)
        left = self.limit - self.pos
        if n > left:
            if self.frame_end >= 0 and n <= len(self.data) - self.pos:
                raise PickleError("opcode argument straddles the end of its FRAME",
                                  offset=self.op_start)
            raise TruncatedInputError(
                f"declares {n} bytes but only {max(0, len(self.data) - self.pos)} remain",
                offset=self.op_start)

    def _uint1(self) -> int:
        pos = self.pos
        if pos >= self.limit:
            self._overrun(1)
        self.pos = pos + 1
        value: int = self.data[pos]
        return value

    def _uint2(self) -> int:
        return int(_unpack_uint2(self._take(2))[0])

    def _int4(self) -> int:
        return int(_unpack_int4(self._take(4))[0])

    def _uint4(self) -> int:
        return int(_unpack_uint4(self._take(4))[0])

    def _uint8(self) -> int:
        return int(_unpack_uint8(self._take(8))[0])

    def _int_text(self, line: bytes, opcode: str) -> int:
        """The value of an INT or LONG argument, as the C unpickler (what torch.load runs
        on CPython 3.10-3.13) reads it: :func:`c_load_int` / :func:`c_load_long`. CPython 3.14
        reads these opcodes in base 10 (python/cpython#126992): text only a hand-made pickle
        holds (``I010``, ``I0x10``) then reads differently; plain decimal, which every
        pickler writes, reads alike everywhere."""
        if b"\0" in line:  # C stops reading at a NUL byte (python/cpython#126996)
            if not self.trace:
                raise PickleError(f"{opcode} argument contains a NUL byte",
                                  offset=self.op_start,
                                  hint="no pickler writes one: the file was made by hand")
            self._differ(self.op_start, f"{opcode} argument contains a NUL byte: the C "
                         "unpickler reads the text before it")
            line = line[:line.index(b"\0")]
            if not line and opcode == "INT":
                return 0  # C's strtol of no digits, ended by the NUL
        body = line.strip().lstrip(b"+-").rstrip(b"L").replace(b"_", b"")
        if body[:2].lower() not in (b"0x", b"0o", b"0b") and \
                len(body) > self.limits.max_int_digits:  # decimal: counted before reading
            raise LimitError("max_int_digits", self.limits.max_int_digits, len(body),
                             f"decimal digits of {opcode} text", offset=self.op_start)
        try:
            value = c_load_int(line) if opcode == "INT" else c_load_long(line)
        except ValueError:
            raise PickleError(f"{opcode} argument {line[:40]!r} is not an integer",
                              offset=self.op_start) from None
        self._check_digits(value, f"decimal digits of {opcode} text")
        return value

    def _check_digits(self, value: int, what: str) -> None:
        """Refuse an int of more than max_int_digits decimal digits (past 4,300 Python's own
        int -> str refuses, so a later repr would crash), by its bit length, never by
        converting it to str."""
        limit = self.limits.max_int_digits
        bits = value.bit_length()
        bound = limit * _LOG2_10  # more than `limit` digits means at least this many bits
        if bits > bound - 1 and (bits - 1 >= bound + 1 or abs(value) >= _power_of_ten(limit)):
            raise LimitError("max_int_digits", limit,
                             max(int((bits - 1) * _LOG10_2) + 1, limit + 1), what,
                             offset=self.op_start)

    def _memo_index(self, line: bytes) -> int:
        """A GET/PUT index (:func:`.arguments.memo_index`)."""
        if b"\0" in line and self.trace:
            self._differ(self.op_start, "memo index contains a NUL byte: the C unpickler "
                         "reads the text before it")
            line = line[:line.index(b"\0")]
        try:
            return memo_index(line)
        except ValueError as e:
            raise PickleError(str(e), offset=self.op_start) from None

    def _text(self, raw: bytes) -> str:
        try:
            return _utf8_text(raw)
        except ValueError as e:
            raise PickleError(str(e), offset=self.op_start) from None

    def _py2_string(self, raw: bytes) -> Any:
        """STRING/BINSTRING/SHORT_BINSTRING: a Python 2 str, decoded as torch.load does."""
        self.resolver.python2_strings = True
        if self.encoding == "bytes":
            return raw
        try:
            return raw.decode(self.encoding)
        except UnicodeDecodeError as e:
            raise PickleError(
                f"a Python 2 str of {len(raw)} bytes is not {self.encoding} text ({e.reason} "
                f"at its byte {e.start})", offset=self.op_start,
                hint="the file was pickled by Python 2 and holds binary data in a str (often "
                     "a NumPy array); like torch.load by default, torchless reads such "
                     "strings only as text and cannot read this file") from None

    # ---- stack helpers -------------------------------------------------------------

    def push(self, value: Any) -> None:
        stack = self.stack
        if len(stack) >= self.room:
            self._stack_full()
        stack.append(value)

    def _stack_full(self) -> None:
        raise LimitError("max_stack", self.limits.max_stack, self.limits.max_stack + 1,
                         "values on the stack", offset=self.op_start)

    def pop(self) -> Any:
        if not self.stack:
            raise PickleError("stack underflow", offset=self.op_start)
        return self.stack.pop()

    def top(self) -> Any:
        if not self.stack:
            raise PickleError("stack underflow", offset=self.op_start)
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise PickleError("no MARK on the stack", offset=self.op_start)
        items = self.stack
        self.stack = self.metastack.pop()
        self.room += len(self.stack)
        return items

    def _depth(self, value: Any) -> int:
        """Nesting depth of a tuple or frozenset: only those deeper than 1 are recorded."""
        entry = self.depths.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else 1

    def _immutable(self, value: tuple[Any, ...] | frozenset[Any]) -> Any:
        """Record the nesting depth of a new tuple/frozenset and, when it holds another one,
        its expanded size (:class:`~.keycost.KeyCost`); refuse if too deep or too large.
        One pass over the items does both."""
        depth = 0
        extra = 0  # the expanded size beyond 1 + len(value): nested tuples' own items
        depths = self.depths
        sizes = self.keycost.sizes
        for item in value:
            if isinstance(item, (tuple, frozenset)):  # self._depth(item), inlined
                key = id(item)
                entry = depths.get(key)
                d = entry[1] if entry is not None and entry[0] is item else 1
                if d > depth:
                    depth = d
                entry = sizes.get(key)  # self.keycost.size(item), inlined
                extra += entry[1] - 1 if entry is not None and entry[0] is item else len(item)
        depth += 1
        if depth > self.limits.max_depth:
            raise LimitError("max_depth", self.limits.max_depth, depth, "nested tuples",
                             offset=self.op_start)
        if depth > 1:
            depths[id(value)] = (value, depth)
            self.keycost.keep(value, 1 + len(value) + extra, self.op_start)
        return value

    def _made(self, value: Any) -> Any:
        """What the resolver built: a tuple or frozenset (``builtins.tuple`` called on a
        list of tuples …) has its nesting checked like one built by the opcodes."""
        if isinstance(value, (tuple, frozenset)):
            return self._immutable(value)
        return value

    def _check_len(self, n: int) -> None:
        if n > self.limits.max_container_len:
            raise LimitError("max_container_len", self.limits.max_container_len, n,
                             offset=self.op_start)

    def _memo_put(self, index: int, value: Any) -> None:
        dense, memo = self.memo_dense, self.memo
        if 0 <= index < len(dense):
            dense[index] = value
            return
        count = len(dense) + len(memo)
        if index not in memo and count >= self.limits.max_memo:
            raise LimitError("max_memo", self.limits.max_memo, count + 1,
                             offset=self.op_start)
        if index == len(dense) and not memo:
            dense.append(value)
        else:
            memo[index] = value

    def _memo_get(self, index: int) -> Any:
        if 0 <= index < len(self.memo_dense):
            return self.memo_dense[index]
        try:
            return self.memo[index]
        except KeyError:
            raise PickleError(f"memo slot {index} read before it was written",
                              offset=self.op_start) from None

    # ---- opcodes: protocol and framing --------------------------------------------

    def op_PROTO(self) -> None:
        proto = self._uint1()
        if proto > HIGHEST_PROTOCOL:
            raise UnsupportedOpcodeError(f"unsupported pickle protocol {proto}",
                                         offset=self.op_start)
        self.proto = self.resolver.proto = proto

    def op_FRAME(self) -> None:
        size = self._uint8()
        if self.frame_end >= 0:
            if not self.trace:
                raise PickleError("FRAME begins before the previous frame ended",
                                  offset=self.op_start)
            self._differ(self.op_start, "FRAME begins before the previous frame ended: the "
                         "C unpickler (torch.load) reads on, the Python unpickler refuses "
                         "the stream")
        if size > len(self.data) - self.pos:
            raise TruncatedInputError(
                f"FRAME declares {size} bytes but only {len(self.data) - self.pos} remain",
                offset=self.op_start)
        if size > self.limits.max_pickle_bytes:
            raise LimitError("max_pickle_bytes", self.limits.max_pickle_bytes, size,
                             offset=self.op_start)
        self.frame_end = self.pos + size if size else -1
        self.limit = self.frame_end if size and not self.trace else len(self.data)

    # ---- opcodes: scalars -----------------------------------------------------------

    def op_INT(self) -> None:
        self.push(self._int_text(self._line(decimal=True), "INT"))

    def op_LONG(self) -> None:
        self.push(self._int_text(self._line(decimal=True), "LONG"))

    def _long_bytes(self, n: int) -> None:
        """LONG1/LONG4: refused past max_int_digits decimal digits, as INT and LONG text
        are (past 4,300 digits Python's own int -> str refuses, so a later repr would
        crash). A length longer than any value of that many digits needs is refused before
        it is read (only a hand-made pickle pads a long); the value read is then bounded
        exactly by its bit length, never by converting it to str."""
        limit = self.limits.max_int_digits
        if n > limit * _LOG2_10 / 8 + 2:
            self._present(n)
            raise LimitError("max_int_digits", limit, int((8 * n - 1) * _LOG10_2) + 1,
                             f"a binary int of {n} bytes has room for that many digits",
                             offset=self.op_start)
        value = _long_bytes(self._sized(n))
        self._check_digits(value, "decimal digits of a binary int")
        self.push(value)

    def op_LONG1(self) -> None:
        self._long_bytes(self._uint1())

    def op_LONG4(self) -> None:
        self._long_bytes(self._int4())

    def op_FLOAT(self) -> None:
        try:
            value = _float_text(self._line())
        except ValueError as e:
            raise PickleError(str(e), offset=self.op_start) from None
        self.push(value)

    def op_BINFLOAT(self) -> None:
        self.push(float(_unpack_float8(self._take(8))[0]))

    # ---- opcodes: strings and bytes ------------------------------------------------

    def op_STRING(self) -> None:
        try:
            raw = _string_text(self._line())
        except ValueError as e:
            raise PickleError(str(e), offset=self.op_start) from None
        self.push(self._py2_string(raw))

    def op_BINSTRING(self) -> None:
        self.push(self._py2_string(self._sized(self._int4())))

    def op_SHORT_BINSTRING(self) -> None:
        self.push(self._py2_string(self._sized(self._uint1())))

    def op_BINBYTES(self) -> None:
        self.push(self._sized(self._uint4()))

    def op_SHORT_BINBYTES(self) -> None:
        self.push(self._sized(self._uint1()))

    def op_BINBYTES8(self) -> None:
        self.push(self._sized(self._uint8()))

    def op_BYTEARRAY8(self) -> None:
        self.push(bytearray(self._sized(self._uint8())))

    def op_NEXT_BUFFER(self) -> None:
        raise UnsupportedError("out-of-band pickle buffers (NEXT_BUFFER) are not supported",
                               offset=self.op_start)

    def op_READONLY_BUFFER(self) -> None:
        raise UnsupportedError(
            "out-of-band pickle buffers (READONLY_BUFFER) are not supported",
            offset=self.op_start)

    def op_UNICODE(self) -> None:
        self.push(_unicode_text(self._line()))

    def op_BINUNICODE8(self) -> None:
        self.push(self._text(self._sized(self._uint8())))

    # ---- opcodes: containers -------------------------------------------------------

    def op_EMPTY_SET(self) -> None:
        self.push(set())

    def op_LIST(self) -> None:
        self.push(self.pop_mark())

    def op_DICT(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise PickleError("DICT with an odd number of items", offset=self.op_start)
        d: dict[Any, Any] = {}
        self._setitems(d, items)
        self.push(d)

    def op_FROZENSET(self) -> None:
        items = self.pop_mark()
        self.keycost.charge(items, self.op_start)
        try:
            value = frozenset(items)
        except TypeError as e:
            raise PickleError(f"unhashable set element: {e}", offset=self.op_start) from None
        self.push(self._immutable(value))

    def op_APPEND(self) -> None:
        item = self.pop()
        self._append(self.top(), [item])

    def op_APPENDS(self) -> None:
        items = self.pop_mark()
        target = self.top()
        if items:  # the C unpickler does nothing with no items, whatever the target is
            self._append(target, items)

    def _append(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            self._check_len(len(target) + len(items))
            target.extend(items)
        else:
            self.resolver.append(target, items, self.op_start)

    def op_SETITEM(self) -> None:
        value = self.pop()
        key = self.pop()
        self._setitems(self.top(), [key, value])

    def op_SETITEMS(self) -> None:
        items = self.pop_mark()
        target = self.top()
        if not items:  # as the C unpickler: nothing to do, whatever the target is
            return
        if len(items) % 2:
            raise PickleError("SETITEMS with an odd number of items", offset=self.op_start)
        self._setitems(target, items)

    def _setitems(self, target: Any, items: list[Any]) -> None:
        if isinstance(target, dict):
            self._check_len(len(target) + len(items) // 2)
            keys = items[::2]
            self.keycost.charge(keys, self.op_start)
            try:
                if type(target) is dict:  # a module's __dict__: its ~20 entries at once
                    target.update(zip(keys, items[1::2], strict=True))
                else:  # a subclass's own __setitem__ (Counter's update would add)
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
            except TypeError as e:
                raise PickleError(f"unhashable dict key: {e}", offset=self.op_start) from None
        else:
            pairs = [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
            self.resolver.setitems(target, pairs, self.op_start)

    def op_ADDITEMS(self) -> None:
        items = self.pop_mark()
        target = self.top()
        if not items:  # as the C unpickler: nothing to do, whatever the target is
            return
        if type(target) is set:
            self._check_len(len(target) + len(items))
            self.keycost.charge(items, self.op_start)
            try:
                target.update(items)
            except TypeError as e:
                raise PickleError(f"unhashable set element: {e}", offset=self.op_start) from None
        else:
            self.resolver.additems(target, items, self.op_start)

    # ---- opcodes: stack manipulation -----------------------------------------------

    def op_POP(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_POP_MARK(self) -> None:
        self.pop_mark()

    def op_DUP(self) -> None:
        self.push(self.top())

    # ---- opcodes: memo ------------------------------------------------------------

    def op_GET(self) -> None:
        self.push(self._memo_get(self._memo_index(self._line(decimal=True))))

    def op_PUT(self) -> None:
        index = self._memo_index(self._line(decimal=True))
        if index < 0:
            raise PickleError("negative PUT index", offset=self.op_start)
        self._memo_put(index, self.top())

    # ---- opcodes: names, calls and objects ----------------------------------------

    def _global_pair(self, encoding: str) -> tuple[str, str]:
        """GLOBAL's names are UTF-8, INST's ASCII (as both unpicklers decode them); an empty
        one is refused, as C does. A trace hands the resolver the names the opcode spells
        before refusing them (the scanner reports what a file tries to import)."""
        raw_module, raw_name = self._line(), self._line()
        try:
            module = raw_module.decode(encoding)
            name = raw_name.decode(encoding)
        except UnicodeDecodeError:
            why = f"global name is not {encoding} text"
        else:
            if module and name:
                return module, name
            why = "global with an empty module or name"
        if self.trace:
            self.resolver.find_global(raw_module.decode(encoding, "backslashreplace"),
                                      raw_name.decode(encoding, "backslashreplace"),
                                      self.op_start)
        raise PickleError(why, offset=self.op_start)

    def op_GLOBAL(self) -> None:
        module, name = self._global_pair("utf-8")
        self.push(self.resolver.find_global(module, name, self.op_start))

    def op_STACK_GLOBAL(self) -> None:
        name = self.pop()
        module = self.pop()
        if type(module) is not str or type(name) is not str:
            self.push(self.resolver.unresolved_global(module, name, self.op_start))
            return
        self.push(self.resolver.find_global(module, name, self.op_start))

    def _ext(self, code: int) -> None:
        if code <= 0:
            raise PickleError("EXT code must be positive", offset=self.op_start)
        self.push(self.resolver.extension(code, self.op_start))

    def op_EXT1(self) -> None:
        self._ext(self._uint1())

    def op_EXT2(self) -> None:
        self._ext(self._uint2())

    def op_EXT4(self) -> None:
        self._ext(self._int4())

    def op_NEWOBJ(self) -> None:
        args = self.pop()
        cls = self.pop()
        if not isinstance(args, tuple):
            raise PickleError("NEWOBJ arguments are not a tuple", offset=self.op_start)
        self.push(self._made(self.resolver.new_object(cls, args, None, self.op_start)))

    def op_NEWOBJ_EX(self) -> None:
        kwargs = self.pop()
        args = self.pop()
        cls = self.pop()
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise PickleError("NEWOBJ_EX operands must be a tuple and a dict",
                              offset=self.op_start)
        self.push(self._made(self.resolver.new_object(cls, args, kwargs, self.op_start)))

    def op_INST(self) -> None:
        module, name = self._global_pair("ascii")
        cls = self.resolver.find_global(module, name, self.op_start)
        args = tuple(self.pop_mark())
        self.push(self._made(self.resolver.call(cls, args, self.op_start)))

    def op_OBJ(self) -> None:
        items = self.pop_mark()
        if not items:
            raise PickleError("OBJ without a class", offset=self.op_start)
        cls = items[0]
        self.push(self._made(self.resolver.call(cls, tuple(items[1:]), self.op_start)))

    def op_BUILD(self) -> None:
        state = self.pop()
        obj = self.pop()
        self.push(self._made(self.resolver.build(obj, state, self.op_start)))

    def op_PERSID(self) -> None:
        try:
            pid = self._line().decode("ascii")
        except UnicodeDecodeError:
            raise PickleError("PERSID argument is not ASCII", offset=self.op_start) from None
        self.push(self.resolver.persistent_load(pid, self.op_start))


Machine._table = _dispatch_table(Machine)


def run_pickle(
    data: bytes | bytearray | memoryview | mmap.mmap,
    resolver: Resolver | None = None,
    limits: Limits | None = None,
    *,
    start: int = 0,
    encoding: str = "utf-8",
) -> tuple[Any, int]:
    """Interpret the pickle at ``data[start:]``; return (value, offset after STOP)."""
    lim = limits if limits is not None else Limits()
    return Machine(data, resolver, lim, encoding=encoding).run(start)
