"""The interpreter's fast path for torch's per-tensor argument sequence
(:mod:`torchless.pickle.tensorargs`) against the general loop: over many files torch writes
(odd ones too), over damaged copies of them, and over sequences hypothesis writes (every
encoding of each part, memo slots of every kind, wrong puts and gets, damaged bytes, tight
limits), both must give the same values, the same memo, the same resolver calls and the same
errors."""

from __future__ import annotations

import collections
import random
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchless.containers.torchzip import TorchZip
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.io.source import Source
from torchless.model.tensor import Storage, Tensor
from torchless.pickle import machine as machine_module
from torchless.pickle.machine import Machine, Resolver
from torchless.rules.resolver import TorchResolver


def _cases(torch: ModuleType) -> dict[str, tuple[Any, int]]:
    """Objects to torch.save, with the pickle protocol."""
    t = torch.arange(24, dtype=torch.float32)
    big = torch.zeros(70_000, dtype=torch.uint8)
    lin = torch.nn.Linear(3, 2)
    conv = torch.nn.Conv2d(2, 3, 3)
    grad = torch.ones(3, requires_grad=True)
    many = {f"w{i}": torch.full((2,), float(i)) for i in range(300)}  # LONG_BINPUT/GET
    return {
        "flat": ({f"layer{i}.weight": torch.ones(4) for i in range(40)}, 2),
        # sizes of 256-65535 elements, one dimension: BININT2 TUPLE1
        "mid_1d": ({f"m{i}": torch.ones(256 + i * 300) for i in range(8)}, 2),
        "flat_proto4": ({f"layer{i}.weight": torch.ones(4) for i in range(40)}, 4),
        "many": (many, 2),
        "shared_views": ({"a": t, "b": t[3:9], "c": t.view(4, 6), "d": t.view(4, 6).t(),
                          "e": t[::5], "f": t.view(2, 3, 4)[:, 1]}, 2),
        "scalars_and_dims": ({"s": torch.tensor(3.5), "e": torch.zeros(0, 5),
                              "w": torch.zeros(300, 2), "x": torch.zeros(2, 70_000),
                              "four": torch.zeros(1, 2, 3, 4), "five": torch.zeros(1, 1, 1, 1, 2),
                              "big": big, "bigview": big[65_600:]}, 2),
        "grad_and_params": ({"g": grad, "p": torch.nn.Parameter(torch.ones(2, 2)),
                             "q": torch.nn.Parameter(torch.ones(3), requires_grad=False),
                             "state": lin.state_dict(), "conv": conv.state_dict()}, 2),
        "module_whole": (lin, 2),
        "nested": ([{"x": (torch.ones(1), [torch.zeros(2, 2)])}, collections.OrderedDict(
            y=torch.ones(3, dtype=torch.float16), z=torch.ones(2, dtype=torch.int64))], 2),
        "deep": ({"a": torch.ones(2), "b": [[[torch.ones(3), torch.ones(4)], 1], 2],
                  "c": torch.ones(5)}, 2),
        "dtypes": ({str(d): torch.ones(3, dtype=d) for d in (
            torch.bool, torch.int8, torch.int16, torch.int32, torch.bfloat16, torch.float64,
            torch.complex64)}, 2),
    }


def _pickle_of(torch: ModuleType, tmp_path: Path, name: str, obj: Any, proto: int) -> Path:
    path = tmp_path / f"{name}.pt"
    torch.save(obj, path, pickle_protocol=proto)
    return path


def _canon(value: Any, ids: dict[int, int]) -> Any:
    """The value as plain data, with which objects are shared (by first-seen number)."""
    seen = ids.get(id(value))
    if seen is not None:
        return ("same", seen)
    if isinstance(value, (Tensor, Storage, tuple, list, dict)) or hasattr(value, "__dict__"):
        ids[id(value)] = len(ids)
    if isinstance(value, Tensor):
        return ("tensor", value.dtype.name, value.shape, value.stride, value.storage_offset,
                value.requires_grad, value.is_parameter, _canon(value.storage, ids),
                _canon(value.attrs, ids))
    if isinstance(value, Storage):
        return ("storage", value.key, value.dtype.name, value.nbytes, value.location)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [_canon(v, ids) for v in value])
    if isinstance(value, dict):
        return (type(value).__name__, [(_canon(k, ids), _canon(v, ids))
                                       for k, v in value.items()],
                _canon(vars(value), ids) if hasattr(value, "__dict__") else None)
    if hasattr(value, "__slots__") and not hasattr(value, "__dict__"):
        return (type(value).__name__, [_canon(getattr(value, s, None), ids)
                                       for s in type(value).__slots__])
    if hasattr(value, "__dict__"):
        return (type(value).__name__, _canon(vars(value), ids))
    return (type(value).__name__, repr(value))


class _Counting(TorchResolver):
    """Records every call the interpreter makes, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, Any, int]] = []

    def call(self, func: Any, args: Any, offset: int) -> Any:
        self.log.append(("call", func, offset))
        return super().call(func, args, offset)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        self.log.append(("pid", pid, offset))
        return super().persistent_load(pid, offset)


def _run(path: Path, fast: bool, data: bytes | None = None,
         limits: Limits | None = None) -> tuple[Any, Any, Any, int]:
    """(outcome, memo, resolver log, fast-path hits) of one path over the file's data.pkl
    (or ``data`` in its place); outcome is the value, or the error's type, text and
    offset."""
    lim = limits or Limits()
    hits = 0
    real = machine_module.tensor_args

    def counting(m: Machine, pos: int, guard: int) -> int:
        nonlocal hits
        after = real(m, pos, guard)
        hits += after >= 0
        return after

    with Source(path) as src:
        tz = TorchZip(src, lim)
        name = tz._member(tz.object_record)
        raw = data if data is not None else tz.archive.copy(name, check_crc=False)
        resolver = _Counting(lim, tz.persistent_load)
        m = Machine(raw, resolver, lim)
        m.fast_tensors = fast
        machine_module.tensor_args = counting
        memo: list[Any] = []
        try:
            try:
                value, end = m._run(0)
                memo = [m.memo_dense, m.memo]
                outcome: Any = (_canon(value, {}), end)
            finally:
                machine_module.tensor_args = real
        except CheckpointError as e:
            outcome = (type(e).__name__, str(e), e.offset)
        except Exception as e:  # what run() turns into a PickleError: the same for both
            outcome = (type(e).__name__, str(e), m.op_start)
        ids: dict[int, int] = {}
        return outcome, _canon(memo, ids), _canon(resolver.log, ids), hits


@pytest.fixture(scope="module")
def saved(torch: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("fastpath")
    return {name: _pickle_of(torch, tmp, name, obj, proto)
            for name, (obj, proto) in _cases(torch).items()}


def test_both_paths_agree_on_files_torch_writes(saved: dict[str, Path]) -> None:
    total = 0
    for name, path in saved.items():
        fast, general = _run(path, True), _run(path, False)
        assert general[3] == 0
        assert fast[:3] == general[:3], name
        assert not isinstance(fast[0][0], str), f"{name}: {fast[0]}"  # a value, no error
        total += fast[3]
    # the fast path ran for most tensors (not for a storage's first tensor of a dtype, whose
    # type is a GLOBAL, nor in protocol 4, which memoises with MEMOIZE)
    assert total >= 300 + 30


def test_both_paths_agree_on_damaged_copies(saved: dict[str, Path]) -> None:
    """Single-byte changes inside the sequences, and cuts: every outcome (value, memo,
    resolver calls, or error with its offset) is the general loop's."""
    rng = random.Random(16)
    hits = 0
    for name in ("flat", "shared_views", "scalars_and_dims", "grad_and_params", "many"):
        path = saved[name]
        with zipfile.ZipFile(path) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
        marks = [i for i in range(len(data) - 1) if data[i:i + 2] == b"(("]
        for _ in range(60):
            at = rng.choice(marks) + rng.randrange(0, 60)
            if at >= len(data):
                continue
            damaged = bytearray(data)
            damaged[at] = rng.choice([rng.randrange(256), damaged[at] ^ 1, 0x68, 0x71,
                                      0x28, 0x74, 0x52, 0x4B, 0x85, 0x29])
            fast, general = _run(path, True, bytes(damaged)), _run(path, False, bytes(damaged))
            assert fast[:3] == general[:3], (name, at, damaged[at])
            hits += fast[3]
        cut = data[:rng.choice(marks) + 30]
        assert _run(path, True, cut)[:3] == _run(path, False, cut)[:3]
    assert hits > 1000


def test_stack_and_depth_limits_met_anywhere_in_the_sequence(saved: dict[str, Path]) -> None:
    """Limits swept so that the general loop meets them at every point of a sequence: the
    fast path must leave each of those to it."""
    for max_stack in range(4, 40):
        lim = Limits(max_stack=max_stack)
        assert _run(saved["flat"], True, limits=lim)[:3] == \
            _run(saved["flat"], False, limits=lim)[:3], max_stack
    for max_depth in range(1, 9):
        lim = Limits(max_depth=max_depth)
        assert _run(saved["deep"], True, limits=lim)[:3] == \
            _run(saved["deep"], False, limits=lim)[:3], max_depth


def test_a_storage_key_over_the_string_limit_is_the_general_loops_error(
        saved: dict[str, Path]) -> None:
    path = saved["many"]  # strings and GLOBAL lines of at most 18 characters
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    key = b"X\x03\x00\x00\x00123"
    assert data.count(key) == 1
    damaged = data.replace(key, b"X\x19\x00\x00\x00" + b"1234567890" * 2 + b"12345")
    lim = Limits(max_str_bytes=20)
    fast, general = _run(path, True, damaged, lim), _run(path, False, damaged, lim)
    assert fast[:3] == general[:3]
    assert fast[0][0] == "LimitError"


@pytest.mark.parametrize("limits", [
    Limits(max_memo=45), Limits(max_stack=20), Limits(max_depth=3), Limits(max_depth=2),
    Limits(max_str_bytes=1), Limits(max_opcodes=400), Limits(max_pickle_bytes=900)])
def test_limits_inside_the_sequence_are_the_general_loops(saved: dict[str, Path],
                                                           limits: Limits) -> None:
    path = saved["shared_views"]
    fast, general = _run(path, True, limits=limits), _run(path, False, limits=limits)
    assert fast[:3] == general[:3]


def test_a_memo_slot_rewritten_or_read_ahead_goes_the_general_way(
        saved: dict[str, Path]) -> None:
    """A put that overwrites an older slot, or a get of a slot the sequence itself writes,
    makes the order of memo effects matter: the general loop runs it, with the same result."""
    path = saved["flat"]
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    start = data.index(b"((", data.index(b"((") + 2)  # the second tensor's sequence
    put = data.index(b"q", start + 12)  # the key's BINPUT
    older = bytearray(data)
    older[put + 1] = 3  # overwrites slot 3 ('storage'), read again by the next tensor
    ahead = bytearray(data)
    loc = data.index(b"h\x06", start)  # the location's get, made to read the key's slot
    ahead[loc + 1] = data[put + 1]
    for damaged in (bytes(older), bytes(ahead)):
        fast, general = _run(path, True, damaged), _run(path, False, damaged)
        assert fast[:3] == general[:3]
    assert _run(path, True, bytes(older))[3] < _run(path, True)[3]


def test_the_fast_path_is_on_by_default_and_reads_like_torch(torch: ModuleType,
                                                            saved: dict[str, Path]) -> None:
    import torchless

    assert Machine.fast_tensors
    path = saved["shared_views"]
    want = torch.load(path, weights_only=True)
    got = torchless.load(path)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].shape == tuple(v.shape)
        assert got[k].strides == tuple(s * v.element_size() for s in v.stride())
        assert (got[k] == v.numpy()).all()


def _hand_made(sparse: bool, func: bool) -> bytes:
    """A protocol-2 pickle: the names a tensor needs memoised, optionally a memo slot far
    ahead (the rest of the memo is then kept sparse) and the rebuild function on the stack,
    then one tensor's sequence."""
    head = (b"\x80\x02X\x07\x00\x00\x00storageq\x000ctorch\nFloatStorage\nq\x010"
            b"X\x03\x00\x00\x00cpuq\x020ccollections\nOrderedDict\nq\x030"
            b"ctorch._utils\n_rebuild_tensor_v2\nq\x040")
    if sparse:
        head += b"Nq\xff0"
    body = (b"((h\x00h\x01X\x01\x00\x00\x000q\x05h\x02K\x04tq\x06QK\x00K\x04\x85q\x07"
            b"K\x01\x85q\x08\x89h\x03)Rq\x09tq\x0aRq\x0b.")
    return head + (b"h\x04" if func else b"") + body


def _hand_run(data: bytes, fast: bool, limits: Limits, nbytes: int) -> tuple[Any, Any]:
    """(outcome, resolver log) of one path over a hand-made pickle whose one storage holds
    ``nbytes`` bytes; outcome is the value and memo, or the error's type, text and offset."""
    storage = Storage("0", TorchResolver(limits).find_global("torch", "FloatStorage", 0).dtype,
                      nbytes, lambda: b"\0" * nbytes)
    resolver = _Counting(limits, lambda pid, offset: storage)
    m = Machine(data, resolver, limits)
    m.fast_tensors = fast
    try:
        value, _ = m._run(0)
        outcome: Any = (_canon(value, {}), _canon([m.memo_dense, m.memo], {}))
    except CheckpointError as e:
        outcome = (type(e).__name__, str(e), e.offset)
    except Exception as e:  # what run() turns into a PickleError: the same for both
        outcome = (type(e).__name__, str(e), m.op_start)
    return outcome, _canon(resolver.log, {})


@pytest.mark.parametrize(("sparse", "func"), [(False, True), (True, True), (False, False)])
def test_hand_made_sequences_agree(sparse: bool, func: bool) -> None:
    data = _hand_made(sparse, func)
    outcomes = [_hand_run(data, fast, Limits(), 16) for fast in (True, False)]
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0][0] == "PickleError") == (not func)


@pytest.mark.parametrize("size", [b"M\x04\x01\x85", b"M\x04\x01\x86", b"M\x04\x01\x87",
                                  b"M\x04\x01K\x01\x86", b"K\x04\x86", b"(M\x04\x01t"])
def test_sizes_of_one_int_agree(size: bytes) -> None:
    """A size of one BININT2 (the shortcut of :func:`tensorargs._shape`) and the spans that
    look like it but whose tuple opcode takes another number of items."""
    data = _hand_made(False, True).replace(b"K\x04\x85q\x07", size + b"q\x07")
    assert size + b"q\x07" in data
    outcomes = [_hand_run(data, fast, Limits(), 2000) for fast in (True, False)]
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("max_depth", [3, 4, 5])
def test_the_arguments_tuple_counts_its_depth(max_depth: int) -> None:
    """The tuple of a tensor's arguments (size and stride inside: depth 2), fetched from the
    memo and nested twice more, is over a max_depth of 3 both ways."""
    data = _hand_made(False, True)
    assert data.endswith(b"Rq\x0b.")
    data = data[:-1] + b"0h\x0a\x85\x85."  # POP the tensor; ((args,),)
    outcomes = [_hand_run(data, fast, Limits(max_depth=max_depth), 16)
                for fast in (True, False)]
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0][0] == "LimitError") == (max_depth == 3), outcomes[0]


# ---- sequences hypothesis writes ------------------------------------------------------------

class _Plain(Resolver):
    """The default resolver, logging every call and persistent id in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, Any, int]] = []

    def call(self, func: Any, args: Any, offset: int) -> Any:
        self.log.append(("call", func, args, offset))
        return super().call(func, args, offset)

    def persistent_load(self, pid: Any, offset: int) -> Any:
        self.log.append(("pid", pid, None, offset))
        return ("storage", pid)


#: What the memo holds before the sequence: strings, names, a nested tuple (tracked for
#: depth and hashing cost), ints, None.
_SLOTS = [b"X\x07\x00\x00\x00storage", b"ctorch\nFloatStorage\n", b"X\x03\x00\x00\x00cpu",
          b"ccollections\nOrderedDict\n", b"ctorch._utils\n_rebuild_tensor_v2\n",
          b"K\x01K\x02\x86\x85", b"K\x07", b"N", b"X\x01\x00\x00\x000"]


@st.composite
def _get(draw: st.DrawFn, have: int, usual: int) -> bytes:
    index = usual if draw(st.integers(0, 15)) < 15 else draw(st.integers(0, have + 2))
    if draw(st.integers(0, 3)) == 0:
        return b"j" + index.to_bytes(4, "little")
    return b"h" + bytes([index % 256])


@st.composite
def _int(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(-(2**31), 2**31 - 1))
    return draw(st.sampled_from([b"K" + bytes([n % 256]), b"M" + (n % 65536).to_bytes(2, "little"),
                                 b"J" + n.to_bytes(4, "little", signed=True)]))


@st.composite
def _tensor_sequence(draw: st.DrawFn) -> tuple[bytes, Limits]:
    """Slots filled, the rebuild function on the stack (mostly), one tensor's sequence in
    any of the forms tensorargs reads or near them, STOP; a byte damaged now and then."""
    order = draw(st.permutations(range(len(_SLOTS))))
    head = b"\x80\x02"
    for slot, which in enumerate(order):
        put = b"q" + bytes([slot]) if draw(st.integers(0, 3)) else b"r" + slot.to_bytes(4, "little")
        head += _SLOTS[which] + put + b"0"
    have = len(_SLOTS)
    where = {which: slot for slot, which in enumerate(order)}
    nxt = [have]

    def put() -> bytes:
        index = nxt[0] if draw(st.integers(0, 20)) < 20 else draw(st.integers(0, have + 8))
        nxt[0] += 1
        if draw(st.integers(0, 3)) == 0 or index > 255:
            return b"r" + index.to_bytes(4, "little")
        return b"q" + bytes([index])

    def shape() -> bytes:
        form = draw(st.integers(0, 3))
        if form == 0:
            return b")"
        count = draw(st.integers(0, 4))
        ints = b"".join(draw(_int()) for _ in range(count))
        if form == 1:
            return b"(" + ints + b"t" + put()
        n = count if 1 <= count <= 3 and draw(st.integers(0, 5)) < 5 else draw(st.integers(1, 3))
        return ints + bytes([0x84 + n]) + put()

    func = draw(_get(have, where[4])) if draw(st.integers(0, 5)) < 5 else b""
    body = b"((" + draw(_get(have, where[0])) + draw(_get(have, where[1]))
    if draw(st.booleans()):
        digits = str(draw(st.integers(0, 10**6))).encode()
        length = len(digits) + (draw(st.sampled_from([0] * 8 + [1, -1])))
        body += b"X" + bytes([length % 256]) + b"\x00\x00\x00" + digits + put()
    else:
        body += draw(_get(have, where[8]))
    body += draw(_get(have, where[2])) + draw(_int()) + b"t" + put() + b"Q" + draw(_int())
    body += shape() + shape() + draw(st.sampled_from([b"\x88", b"\x89"]))
    body += draw(_get(have, where[3])) + b")R" + put() + b"t" + put() + b"R" + put() + b"."
    data = bytearray(head + func + body)
    if draw(st.integers(0, 5)) == 5:
        at = draw(st.integers(len(head), len(data) - 1))
        data[at] = draw(st.sampled_from([draw(st.integers(0, 255)), data[at] ^ 1, 0x71, 0x28,
                                         0x74, 0x85, 0x29, 0x52]))
    limits = draw(st.sampled_from([Limits(), Limits(), Limits(), Limits(),
                                   Limits(max_stack=draw(st.integers(3, 30))),
                                   Limits(max_depth=draw(st.integers(1, 5))),
                                   Limits(max_memo=draw(st.integers(8, 20))),
                                   Limits(max_str_bytes=draw(st.integers(0, 8)))]))
    return bytes(data), limits


def _plain_run(data: bytes, fast: bool, limits: Limits) -> tuple[Any, Any, int]:
    """(outcome and memo, resolver log, fast-path hits) of one path."""
    hits = 0
    real = machine_module.tensor_args

    def counting(m: Machine, pos: int, guard: int) -> int:
        nonlocal hits
        after = real(m, pos, guard)
        hits += after >= 0
        return after

    resolver = _Plain()
    m = Machine(data, resolver, limits)
    m.fast_tensors = fast
    machine_module.tensor_args = counting
    try:
        value, end = m._run(0)
        outcome: Any = (_canon(value, {}), end, _canon([m.memo_dense, m.memo], {}),
                        sorted(d for _, d in m.depths.values()))
    except CheckpointError as e:
        outcome = (type(e).__name__, str(e), e.offset)
    except Exception as e:  # what run() turns into a PickleError: the same for both
        outcome = (type(e).__name__, str(e), m.op_start)
    finally:
        machine_module.tensor_args = real
    return outcome, _canon(resolver.log, {}), hits


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_tensor_sequence())
def test_both_paths_agree_on_written_sequences(case: tuple[bytes, Limits]) -> None:
    data, limits = case
    fast, general = _plain_run(data, True, limits), _plain_run(data, False, limits)
    assert fast[:2] == general[:2], data
    assert general[2] == 0


def test_the_written_sequences_take_the_fast_path() -> None:
    """The generator's teeth: many of its sequences run the fast path (the others are near
    misses: damaged, a wrong put or get, a tuple opcode that takes another count, a limit)."""
    hits: list[int] = []

    @settings(max_examples=400, derandomize=True, database=None, deadline=None)
    @given(case=_tensor_sequence())
    def run(case: tuple[bytes, Limits]) -> None:
        hits.append(_plain_run(*case[:1], True, case[1])[2])

    run()
    # Hypothesis's draws differ with what ran before in the process (derandomize or not):
    # 11 to 69 of 200 took the fast path in different runs, so the bound is loose; none
    # taking it (a pattern that no longer matches what torch writes) fails
    assert sum(hits) >= len(hits) / 50
