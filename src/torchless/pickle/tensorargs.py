"""A fast path of :class:`~torchless.pickle.machine.Machine` for the opcodes ``torch.save``
writes for each tensor's arguments (pickle protocol 2)::

    MARK MARK <get 'storage'> <get storage type> <key: BINUNICODE digits + PUT, or get>
    <get location> <int numel> TUPLE PUT BINPERSID <int offset> <size> <stride>
    NEWFALSE|NEWTRUE <get OrderedDict> EMPTY_TUPLE REDUCE PUT TUPLE PUT REDUCE PUT

(a get is BINGET or LONG_BINGET, a PUT BINPUT or LONG_BINPUT, an int BININT1, BININT2 or
BININT; a size or stride is EMPTY_TUPLE, one to three ints and TUPLE1-3 + PUT, or MARK, ints,
TUPLE + PUT). Thirty opcodes a tensor, one at a time, were most of the time of opening a
file of many small tensors.

It is the general loop's semantics, not torch's: nothing here knows what the values are. It
first reads the whole sequence without touching anything (one regular expression over the
bytes) and checks that no limit can be reached inside it (stack room, MARK depth, string
length; the sequence lies before the loop's ``guard``, so no frame ends, no opcode count is
kept and no byte is missing); if anything differs it changes nothing and the general loop
runs the opcodes. Then it does what the general loop does, opcode by opcode, in the same
order: the same stack segments, memo writes (dense, sparse, or the same limit error), memo
reads (or the same error), nesting records of tuples, and the same resolver calls with the
same arguments and offsets, so that errors the resolver raises are the same too.
tests/pickle/test_tensor_fast_path.py runs both over many files and compares.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING

from torchless.errors import PickleError

if TYPE_CHECKING:
    from torchless.pickle.machine import Machine

__all__ = ["tensor_args"]

_GET = rb"(h.|j.{4})"
_PUT = rb"(q.|r.{4})"
_INT = rb"(K.|M..|J.{4})"
_INTS = rb"(?:K.|M..|J.{4})"
# a size or stride: (), or the span of its ints and the tuple opcode, and its PUT
_TUPLE = (rb"(?:(\x29)|((?:" + _INTS + rb"){1,3}[\x85-\x87]|\x28(?:" + _INTS + rb")*t)"
          + _PUT + rb")")

#: Each opcode with an argument is one group (its opcode byte and argument): fewer groups
#: made the match three times faster.
_ARGS = re.compile(
    rb"\x28\x28" + _GET + _GET  # 1, 2
    + rb"(?:X(.)\x00\x00\x00([0-9]+)" + _PUT + rb"|" + _GET + rb")"  # 3, 4, 5 | 6
    + _GET + _INT + rb"t" + _PUT  # 7, 8, 9
    + rb"Q" + _INT  # 10
    + _TUPLE + _TUPLE  # 11-13, 14-16
    + rb"([\x88\x89])" + _GET + rb"\x29R" + _PUT  # 17, 18, 19
    + rb"t" + _PUT + rb"R" + _PUT,  # 20, 21
    re.DOTALL)


def _ints(span: bytes) -> tuple[list[int], bool]:
    """The ints of a tuple's span, and whether the span is MARK … TUPLE (else TUPLE1-3, whose
    count must match its opcode: None if not)."""
    marked = span[0] == 0x28
    out: list[int] = []
    i = 1 if marked else 0
    stop = len(span) - 1
    while i < stop:
        code = span[i]
        if code == 0x4B:
            out.append(span[i + 1])
            i += 2
        elif code == 0x4D:
            out.append(span[i + 1] | span[i + 2] << 8)
            i += 3
        else:
            out.append(int.from_bytes(span[i + 1:i + 5], "little", signed=True))
            i += 5
    return out, marked


_from_bytes = int.from_bytes
_long_put = struct.Struct("<BI").pack  # LONG_BINPUT of an index (below 2**32: max_memo)
_NOT_CALLABLE = (str, bytes, int, float, list, dict, tuple, type(None))
_IMMUTABLE = (tuple, frozenset)


def _shape(span: bytes | None) -> tuple[int, ...] | None:
    """The value of a size or stride (its span: ints and TUPLE1-3, or MARK, ints and TUPLE),
    or None if a TUPLE1-3 does not take as many ints as it says (then it is not the
    sequence)."""
    if span is None:
        return ()
    n = len(span)
    if n == 3 and span[0] == 0x4B and span[2] == 0x85:  # (n,): BININT1 TUPLE1
        return (span[1],)
    if n == 4 and span[0] == 0x4D and span[3] == 0x85:  # (n,): BININT2 TUPLE1
        return (span[1] | span[2] << 8,)
    ints, marked = _ints(span)
    if not marked and len(ints) != span[-1] - 0x84:
        return None
    return tuple(ints)


def tensor_args(m: Machine, pos: int, guard: int) -> int:
    """Run the sequence at ``pos`` (a MARK) if it is the one above and lies before
    ``guard``; the position after it, or -1 (nothing done) for the general loop."""
    match = _ARGS.match(m.data, pos, guard)
    if match is None:
        return -1
    (get_tag, get_kind, key_len, digits, put_key, get_key, get_location, numel_int, put_pid,
     offset_int, _, size_span, put_size, _, stride_span, put_stride, grad, get_hook, put_hooks,
     put_args, put_value) = match.groups()
    # Nothing done yet: every check that could fail inside the sequence, or make its
    # effects depend on their order, sends it to the general loop.
    lim = m.limits
    dense = m.memo_dense
    have = len(dense)
    size = _shape(size_span)
    stride = _shape(stride_span)
    if size is None or stride is None or len(m.metastack) + 2 > lim.max_depth or \
            len(m.stack) + 16 + len(size) + len(stride) > m.room or m.memo:
        return -1
    if key_len is not None and (key_len[0] != len(digits) or key_len[0] > lim.max_str_bytes):
        return -1
    # the memo: every get reads a slot written before the sequence, every put writes the
    # next new slot, in order (so no get of the sequence sees a put of it)
    gets = []
    for x in (get_tag, get_kind, get_location, get_hook, get_key or get_tag):
        index = x[1] if len(x) == 2 else _from_bytes(x[1:], "little")
        if index >= have:
            return -1
        gets.append(index)
    want = have
    for x in (put_key, put_pid, put_size, put_stride, put_hooks, put_args, put_value):
        if x is not None:
            if x[1] != want if len(x) == 2 else want >> 32 or x != _long_put(0x72, want):
                return -1
            want += 1
    if want > lim.max_memo:
        return -1

    # The effects, in the general loop's order. The stack segments and MARKs the loop
    # would make are seen by nothing here (the resolver gets values; no limit can be
    # reached), so only the values are made.
    regs = match.regs
    immutable = m._immutable
    resolver = m.resolver
    tag = dense[gets[0]]
    kind = dense[gets[1]]
    key = digits.decode("utf-8", "surrogatepass") if key_len is not None else dense[gets[4]]
    location = dense[gets[2]]
    code = numel_int[0]
    numel = numel_int[1] if code == 0x4B else int.from_bytes(numel_int[1:], "little",
                                                                 signed=code == 0x4A)
    pid = (tag, kind, key, location, numel)
    if isinstance(tag, _IMMUTABLE) or isinstance(kind, _IMMUTABLE) or \
            isinstance(key, _IMMUTABLE) or isinstance(location, _IMMUTABLE):
        m.op_start = regs[9][0] - 1  # the TUPLE before the pid's PUT
        pid = immutable(pid)
    op = regs[9][1]  # BINPERSID, after that PUT
    m.op_start = op
    storage = resolver.persistent_load(pid, op)
    code = offset_int[0]
    offset = offset_int[1] if code == 0x4B else int.from_bytes(offset_int[1:], "little",
                                                                   signed=code == 0x4A)
    hook = dense[gets[3]]
    op = regs[19][0] - 1  # the REDUCE of the hooks
    if isinstance(hook, _NOT_CALLABLE):
        raise PickleError(f"REDUCE of a non-callable {type(hook).__name__}", offset=op)
    m.op_start = op
    hooks = resolver.call(hook, (), op)
    if isinstance(hooks, _IMMUTABLE):
        hooks = immutable(hooks)
    m.op_start = regs[20][0] - 1  # the TUPLE: it holds the size, a tuple
    args = (storage, offset, size, stride, grad[0] == 0x88, hooks)
    if isinstance(storage, _IMMUTABLE) or isinstance(hooks, _IMMUTABLE):
        args = immutable(args)
    else:  # m._immutable(args), whose only tuples are the size and stride (of ints: depth
        m.depths[id(args)] = (args, 2)  # 1); max_depth >= 2 (checked above)
        m.keycost.sizes[id(args)] = (args, 7 + len(size) + len(stride))  # its expanded size
    outer = m.stack
    op = regs[21][0] - 1  # REDUCE
    if not outer:
        raise PickleError("stack underflow", offset=op)
    func = outer.pop()
    if isinstance(func, _NOT_CALLABLE):
        raise PickleError(f"REDUCE of a non-callable {type(func).__name__}", offset=op)
    m.op_start = op
    value = resolver.call(func, args, op)
    if isinstance(value, _IMMUTABLE):
        value = immutable(value)
    outer.append(value)
    if key_len is not None and size_span is not None and stride_span is not None:
        dense += (key, pid, size, stride, hooks, args, value)  # a tensor of a new storage
    else:
        if key_len is not None:
            dense.append(key)
        dense.append(pid)
        if size_span is not None:
            dense.append(size)
        if stride_span is not None:
            dense.append(stride)
        dense += (hooks, args, value)
    return match.end()
