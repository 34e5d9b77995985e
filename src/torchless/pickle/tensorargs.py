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
tests/pickling/test_tensor_fast_path.py runs both over many files and compares.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from torchless.errors import PickleError

if TYPE_CHECKING:
    from torchless.pickle.machine import Machine

__all__ = ["tensor_args"]

_GET = rb"(?:h(.)|j(.{4}))"
_PUT = rb"(?:q(.)|r(.{4}))"
_INT = rb"(?:K(.)|M(..)|J(.{4}))"
_INTS = rb"(?:K.|M..|J.{4})"
# a size or stride: (), or the span of its ints and the tuple opcode, and its PUT
_TUPLE = (rb"(?:(\x29)|((?:" + _INTS + rb"){1,3}[\x85-\x87]|\x28(?:" + _INTS + rb")*t)()"
          + _PUT + rb")")

_ARGS = re.compile(
    rb"\x28\x28" + _GET + _GET  # 1-2, 3-4
    + rb"(?:X(.)\x00\x00\x00([0-9]+)()" + _PUT + rb"|" + _GET + rb")"  # 5-6, 7, 8-9 | 10-11
    + _GET + _INT  # 12-13, 14-16
    + rb"()t" + _PUT  # 17, 18-19
    + rb"()Q" + _INT  # 20, 21-23
    + _TUPLE + _TUPLE  # 24-28, 29-33
    + rb"([\x88\x89])" + _GET + rb"\x29()R" + _PUT  # 34, 35-36, 37, 38-39
    + rb"()t" + _PUT + rb"()R" + _PUT,  # 40, 41-42, 43, 44-45
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


_NOT_CALLABLE = (str, bytes, int, float, list, dict, tuple, type(None))
_IMMUTABLE = (tuple, frozenset)


def _shape(span: bytes | None) -> tuple[int, ...] | None:
    """The value of a size or stride (its span: ints and TUPLE1-3, or MARK, ints and TUPLE),
    or None if a TUPLE1-3 does not take as many ints as it says (then it is not the
    sequence)."""
    if span is None:
        return ()
    if len(span) == 3 and span[0] == 0x4B and span[2] == 0x85:  # (n,): BININT1 TUPLE1
        return (span[1],)
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
    (a1, a4, b1, b4, key_len, digits, _, kp1, kp4, k1, k4, l1, l4, n1, n2, n4, _, pp1, pp4, _,
     o1, o2, o4, _, size_span, _, sp1, sp4, _, stride_span, _, tp1, tp4, grad, h1, h4, _,
     hp1, hp4, _, ap1, ap4, _, rp1, rp4) = match.groups()
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
    gets = [a1[0] if a1 is not None else int.from_bytes(a4, "little"),
            b1[0] if b1 is not None else int.from_bytes(b4, "little"),
            l1[0] if l1 is not None else int.from_bytes(l4, "little"),
            h1[0] if h1 is not None else int.from_bytes(h4, "little")]
    if key_len is None:
        gets.append(k1[0] if k1 is not None else int.from_bytes(k4, "little"))
    if max(gets) >= have:
        return -1
    puts = [] if key_len is None else [kp1[0] if kp1 is not None
                                        else int.from_bytes(kp4, "little")]
    puts.append(pp1[0] if pp1 is not None else int.from_bytes(pp4, "little"))
    if size_span is not None:
        puts.append(sp1[0] if sp1 is not None else int.from_bytes(sp4, "little"))
    if stride_span is not None:
        puts.append(tp1[0] if tp1 is not None else int.from_bytes(tp4, "little"))
    puts.append(hp1[0] if hp1 is not None else int.from_bytes(hp4, "little"))
    puts.append(ap1[0] if ap1 is not None else int.from_bytes(ap4, "little"))
    puts.append(rp1[0] if rp1 is not None else int.from_bytes(rp4, "little"))
    if puts != list(range(have, have + len(puts))) or have + len(puts) > lim.max_memo:
        return -1

    # The effects, in the general loop's order. The stack segments and MARKs the loop
    # would make are seen by nothing here (the resolver gets values; no limit can be
    # reached), so only the values are made.
    immutable = m._immutable
    resolver = m.resolver
    tag = dense[gets[0]]
    kind = dense[gets[1]]
    key = digits.decode("utf-8", "surrogatepass") if key_len is not None else dense[gets[4]]
    location = dense[gets[2]]
    numel = n1[0] if n1 is not None else int.from_bytes(n2, "little") if n2 is not None \
        else int.from_bytes(n4, "little", signed=True)
    pid = (tag, kind, key, location, numel)
    if isinstance(tag, _IMMUTABLE) or isinstance(kind, _IMMUTABLE) or \
            isinstance(key, _IMMUTABLE) or isinstance(location, _IMMUTABLE):
        m.op_start = match.start(17)  # the TUPLE
        pid = immutable(pid)
    op = match.start(20)  # BINPERSID
    m.op_start = op
    storage = resolver.persistent_load(pid, op)
    offset = o1[0] if o1 is not None else int.from_bytes(o2, "little") if o2 is not None \
        else int.from_bytes(o4, "little", signed=True)
    hook = dense[gets[3]]
    op = match.start(37)  # REDUCE of the hooks
    if isinstance(hook, _NOT_CALLABLE):
        raise PickleError(f"REDUCE of a non-callable {type(hook).__name__}", offset=op)
    m.op_start = op
    hooks = resolver.call(hook, (), op)
    if isinstance(hooks, _IMMUTABLE):
        hooks = immutable(hooks)
    m.op_start = match.start(40)  # the TUPLE: it holds the size, a tuple
    args = immutable((storage, offset, size, stride, grad[0] == 0x88, hooks))
    outer = m.stack
    made = [pid, args] if key_len is None else [key, pid, args]
    if size_span is not None:
        made.insert(-1, size)
    if stride_span is not None:
        made.insert(-1, stride)
    made.insert(-1, hooks)
    op = match.start(43)  # REDUCE
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
    made.append(value)
    dense.extend(made)
    return match.end()
