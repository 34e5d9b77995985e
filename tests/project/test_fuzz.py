"""Structured fuzzing (hypothesis): hostile bytes may only ever raise torchless's errors.

What is fuzzed, briefly enough for CI (a few hundred examples, well under a minute):

* **every container**: real checkpoints from ``tests/data`` (ZIP, TorchScript, legacy
  streams, TAR) and containers built byte by byte (TAR, ZIP, plain pickles, see
  ``tests/_fuzz_inputs.py``), mutated by byte flips, truncations, insertions, deletions,
  splices of two seeds and interesting integers written over length and offset fields;
* **the pickle VM**: random opcode streams drawn from the opcode table
  (``torchless.pickle.opcodes``) with plausible arguments (and sometimes lying lengths),
  run by the VM alone with both resolvers, and as a file through ``torchless.open``, bare
  and as the ``data.pkl`` of a ZIP checkpoint.

Each input is opened with ``torchless.open``, every tensor is read with ``.numpy()``, and
then ``torchless.load`` reads it whole. The only exceptions allowed are
:class:`torchless.CheckpointError` subclasses, and not the catch-all wrapper torchless puts
around its own bugs. Each example's peak traced memory stays under what the limits allow
for an input of its size, and its time under a few seconds.

A last test checks that reading time grows linearly: inputs of size n and 4n of
pathological-but-valid shapes (thousands of tensors on one storage, one list referenced
from everywhere through the memo, long protocol-0 text) take at most 12 times as long.

The coverage-guided counterpart (atheris) lives under ``fuzz/``; see ``docs/fuzzing.md``.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchless
from torchless.model.graph import finish, flatten
from torchless.model.tensor import MissingStorage
from torchless.pickle.machine import run_pickle
from torchless.pickle.opcodes import OPCODES, Opcode
from torchless.rules.resolver import TorchResolver

from .._fuzz_inputs import (
    INTERESTING,
    MUTATORS,
    all_seeds,
    assemble,
    nested_tuples_pickle,
    read_everything,
    splice,
    state_dict_pickle,
    tensor_ops,
    tuple_call_chain_pickle,
    zip_checkpoint,
)

#: Seeds up to this size are mutated (TorchScript is the exception: its only seed is 2 MiB).
SEED_MAX = 64 << 10
#: What the limits let a small input take: a deflated member under the ratio floor may
#: inflate to 64 MiB whatever its ratio; everything else is a small multiple of the input.
MEMORY_FLOOR = 80 << 20
MEMORY_PER_INPUT_BYTE = 200
#: Seconds one example may take (a small input read twice; generous for a busy machine).
EXAMPLE_SECONDS = 5.0

#: Multiplies every example count, for a longer local run: TORCHLESS_FUZZ_SCALE=100 pytest ...
SCALE = max(1, int(os.environ.get("TORCHLESS_FUZZ_SCALE", "1")))

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.data_too_large])


def _kind(name: str, raw: bytes) -> str:
    if raw[:4] == b"PK\x03\x04":
        return "torchscript" if b"constants.pkl" in raw else "zip"
    if raw[257:262] == b"ustar":
        return "tar"
    if name.startswith("plain_"):
        return "pickle"
    return "legacy"


def _seeds_by_kind() -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for name, raw in all_seeds(max_bytes=3 << 20).items():
        kind = _kind(name, raw)
        if len(raw) <= SEED_MAX or kind == "torchscript":
            out.setdefault(kind, {})[name] = raw
    return out


SEEDS = _seeds_by_kind()
ALL_SMALL = {n: r for group in SEEDS.values() for n, r in group.items() if len(r) <= SEED_MAX}
ALL_NAMES = sorted(ALL_SMALL)


def test_every_container_has_seeds() -> None:
    assert {k: len(v) > 0 for k, v in SEEDS.items()} == {
        "zip": True, "torchscript": True, "legacy": True, "tar": True, "pickle": True}


def check_bytes(raw: bytes, path: Path) -> str:
    """Read ``raw`` as a checkpoint file; assert the error surface, memory and time."""
    path.write_bytes(raw)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        outcome = _read(path)
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    budget = MEMORY_FLOOR + MEMORY_PER_INPUT_BYTE * len(raw)
    assert peak < budget, f"peak traced memory {peak} over {budget} for {len(raw)} bytes"
    assert elapsed < EXAMPLE_SECONDS + len(raw) / 1e6, f"took {elapsed:.1f} s"
    return outcome


def _read(path: Path) -> str:
    return read_everything(path)


# ---- mutations ------------------------------------------------------------------------

def _mutation() -> st.SearchStrategy[tuple[Any, ...]]:
    """One mutation as data (name, arguments), so a failing example prints what was done."""
    pos = st.integers(0, 1 << 24)
    return st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("truncate"), pos),
        st.tuples(st.just("insert"), pos, st.binary(max_size=64)),
        st.tuples(st.just("delete"), pos, st.integers(1, 512)),
        st.tuples(st.just("overwrite_int"), pos, st.sampled_from([1, 2, 4, 8]),
                  st.one_of(st.sampled_from(INTERESTING), st.integers(0, (1 << 64) - 1)),
                  st.booleans()),
        st.tuples(st.just("splice"), st.sampled_from(ALL_NAMES), pos, pos),
    )


def _apply(raw: bytes, mutation: tuple[Any, ...]) -> bytes:
    name, *args = mutation
    if name == "splice":
        return splice(raw, ALL_SMALL[args[0]], args[1], args[2])
    out: bytes = MUTATORS[name](raw, *args)
    return out


def _mutate(data: st.DataObject, seeds: dict[str, bytes]) -> bytes:
    name = data.draw(st.sampled_from(sorted(seeds)), label="seed")
    raw = seeds[name]
    for m in data.draw(st.lists(_mutation(), min_size=1, max_size=4), label="mutations"):
        raw = _apply(raw, m)
    return raw


@pytest.mark.parametrize(("kind", "examples"), [
    ("zip", 90), ("legacy", 60), ("tar", 50), ("pickle", 40), ("torchscript", 8)])
def test_mutated_checkpoints_raise_only_our_errors(kind: str, examples: int,
                                                   tmp_path: Path) -> None:
    seeds = SEEDS[kind]

    @settings(FUZZ, max_examples=examples * SCALE)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        check_bytes(_mutate(data, seeds), tmp_path / "mutated.pt")

    run()


def test_unmutated_seeds_are_read(tmp_path: Path) -> None:
    """The mutation tests start from files that read: most seeds are valid checkpoints."""
    outcomes = []
    for name in ALL_NAMES[::2]:
        (tmp_path / "seed.pt").write_bytes(ALL_SMALL[name])
        outcomes.append(_read(tmp_path / "seed.pt"))
    assert outcomes.count("read") > 0.9 * len(outcomes)


# ---- random opcode streams --------------------------------------------------------------

#: Opcodes that only push, weighted up so that streams build something before they fail.
_PUSHERS = [op for op in OPCODES if op.name in {
    "NONE", "NEWTRUE", "BININT1", "BININT", "SHORT_BINUNICODE", "BINUNICODE", "EMPTY_LIST",
    "EMPTY_DICT", "EMPTY_TUPLE", "MARK", "GLOBAL", "SHORT_BINBYTES", "BINFLOAT"}]
_OP = st.sampled_from(list(OPCODES) + _PUSHERS * 3)
_ARG_INT = st.one_of(st.integers(0, 300), st.sampled_from(INTERESTING),
                     st.integers(-(1 << 70), 1 << 70))
_STEP = st.tuples(_OP, _ARG_INT, st.binary(max_size=24),
                  st.one_of(st.none(), st.none(), st.none(), st.sampled_from(INTERESTING)))


@st.composite
def opcode_streams(draw: st.DrawFn) -> bytes:
    steps: list[tuple[Opcode, int, bytes, int | None]] = draw(st.lists(_STEP, max_size=48))
    return assemble(steps, proto=draw(st.integers(0, 5)))


def _missing(pid: Any, offset: int) -> Any:
    return MissingStorage(pid)


@settings(FUZZ, max_examples=200 * SCALE)
@given(opcode_streams())
def test_random_opcode_streams_vm(stream: bytes) -> None:
    limits = torchless.Limits()
    try:
        run_pickle(stream, None, limits)
    except torchless.CheckpointError:
        pass
    try:
        value, _ = run_pickle(stream, TorchResolver(limits, _missing), limits)
        flatten(finish(value, limits), limits)
    except torchless.CheckpointError:
        pass


def test_opcode_stream_generator_reaches_stop() -> None:
    """The generator's arguments are well formed: a plain stream of pushers runs."""
    by_name = {op.name: op for op in OPCODES}
    stream = assemble([(by_name["EMPTY_LIST"], 0, b"", None), (by_name["MARK"], 0, b"", None),
                       (by_name["SHORT_BINUNICODE"], 0, b"abc", None),
                       (by_name["BININT"], -5, b"", None), (by_name["LONG1"], 1 << 70, b"", None),
                       (by_name["FLOAT"], 7, b"", None), (by_name["APPENDS"], 0, b"", None)])
    assert run_pickle(stream)[0] == ["abc", -5, 1 << 70, 7 / 3.0]


@settings(FUZZ, max_examples=60 * SCALE)
@given(opcode_streams(), st.booleans())
def test_random_opcode_streams_as_files(tmp_path_factory: pytest.TempPathFactory,
                                        stream: bytes, in_zip: bool) -> None:
    raw = zip_checkpoint(stream, {"0": struct.pack("<4f", 1, 2, 3, 4)}) if in_zip else stream
    check_bytes(raw, tmp_path_factory.mktemp("ops") / "ops.pt")


# ---- time linear in the input ----------------------------------------------------------


def _many_tensors(n: int) -> bytes:
    """n tensors, each a different view of one storage, in a ZIP checkpoint."""
    tensors = [(f"layer{i}.weight", tensor_ops("0", 64, i % 60, (2, 2), (2, 1)))
               for i in range(n)]
    return zip_checkpoint(state_dict_pickle(tensors), {"0": bytes(256)})


def _shared_memo(n: int) -> bytes:
    """One 16-item list memoised once and referenced n times (a DAG, not a tree)."""
    body = b"](" + b"K\x07" * 16 + b"e\x94"  # list at memo 0
    body += b"](" + b"h\x00" * n + b"e"
    return b"\x80\x04" + body + b"\x86."  # a 2-tuple (shared list, list of references)


def _text_protocol0(n: int) -> bytes:
    """A protocol-0 list of n decimal ints and n quoted strings (one line each)."""
    return b"(l" + b"".join(b"I%d\naS'item%d'\na" % (i * 7919, i) for i in range(n)) + b"."


def _best_seconds(path: Path, repeats: int = 5) -> float:
    """The least CPU time of a few reads: other load on the machine only ever adds time, and
    CPU time leaves out the waits for a busy machine's scheduler."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        assert _read(path) == "read"
        times.append(time.process_time() - t0)
    return min(times)


@pytest.mark.parametrize(("build", "n"), [
    (_many_tensors, 200), (_shared_memo, 5000), (_text_protocol0, 1500)])
def test_time_is_linear_in_input_size(build: Callable[[int], bytes], n: int,
                                      tmp_path: Path) -> None:
    """16x the input must take far less than the 256x a quadratic reader would: the bound
    (64x) leaves room for a noisy machine and still catches anything quadratic.

    A quadratic reader is over the bound on every try; a noisy machine only on some, so the
    pair is measured up to three times and the best ratio counts."""
    small, large = tmp_path / "small.pt", tmp_path / "large.pt"
    small.write_bytes(build(n))
    large.write_bytes(build(16 * n))
    assert 14 < large.stat().st_size / small.stat().st_size < 18
    _read(small)  # warm up
    tries = []
    for _ in range(3):
        t_small = max(_best_seconds(small), 1e-3)
        t_large = _best_seconds(large)
        tries.append((t_large / t_small, t_small, t_large))
        if t_large < 64 * t_small:
            break
    ratio, t_small, t_large = min(tries)
    assert ratio < 64, f"{build.__name__}: {t_small:.3f} s for n={n}, {t_large:.3f} s for 16n"


# ---- regressions: crashes the fuzzers and the limit proofs found --------------------------

_CRASHERS = {
    # a dict keyed by a tuple 1,000,000 deep: hashing the key recursed in C (SIGSEGV)
    "nested_tuples": nested_tuples_pickle(1_000_000),
    # the same key built by 250,000 calls of builtins.tuple([previous]) (a rebuild rule)
    "tuple_call_chain": tuple_call_chain_pickle(250_000),
}


@pytest.mark.parametrize("name", sorted(_CRASHERS))
def test_regression_deep_tuple_key_is_refused_not_a_crash(name: str, tmp_path: Path) -> None:
    """Was: the interpreter died of a C stack overflow (exit -11) inside torchless.open.
    Run in a child process so that a regression fails this test instead of killing pytest."""
    path = tmp_path / f"{name}.pkl"
    path.write_bytes(_CRASHERS[name])
    code = ("import sys, torchless\n"
            "try:\n"
            "    torchless.open(sys.argv[1])\n"
            "except torchless.LimitError as e:\n"
            "    print(e.limit_name)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "max_depth"


def test_regression_tuples_nested_within_max_depth_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.pkl"
    path.write_bytes(nested_tuples_pickle(200))
    with torchless.open(path) as ckpt:
        key = next(iter(ckpt.tree))
    depth = 0
    while isinstance(key, tuple):
        key, depth = key[0], depth + 1
    assert depth == 200


def test_regression_invalid_float_text_is_linear(tmp_path: Path) -> None:
    """Was: the protocol-0 FLOAT pattern matched each digit two ways and backtracked
    quadratically on a line that does not end as a float: 20,000 digits took 52 s."""
    path = tmp_path / "float.pkl"
    path.write_bytes(b"F" + b"1" * 200_000 + b"x\n.")
    t0 = time.perf_counter()
    with pytest.raises(torchless.PickleError, match="not a float"):
        torchless.open(path)
    assert time.perf_counter() - t0 < 2.0


def _long_flat_names(key_bytes: int, depth: int, tensors: int) -> bytes:
    """One long key memoised once and used at every level of a ``depth``-deep dict chain
    that ends in ``tensors`` entries: every flat tensor name repeats the key ``depth``
    times, so the names take key_bytes x depth x tensors bytes from a tiny input."""
    body = b"\x80\x02X" + struct.pack("<I", key_bytes) + b"k" * key_bytes + b"\x940"
    body += tensor_ops("0", 1, 0, (1,), (1,)) + b"q\x010"
    body += b"}(" + b"".join(b"J" + struct.pack("<i", i) + b"h\x01" for i in range(tensors))
    body += b"u" + b"q\x020}h\x00h\x02s" * depth + b"."
    return zip_checkpoint(body, {"0": bytes(4)})


def test_flat_tensor_names_take_bounded_memory(tmp_path: Path) -> None:
    """Was: flat tensor names were not bounded: a 21 kB file made 100 MB of names
    (_graph.flatten). Limits.max_name_bytes now refuses it, counted before any name is
    built (check_bytes allows torchless errors and bounds the memory traced)."""
    raw = _long_flat_names(20_000, 100, 50)
    check_bytes(raw, tmp_path / "names.pt")
