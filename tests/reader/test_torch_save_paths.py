"""Issue 12: nothing torch sees goes missing or wrong.

Every save path of PyTorch's test_serialization.py that torch on CPU can write, and every
object kind issue 12 names, is written once per session by ``tests/_savepaths.py``. For
each file:

- ``test_names_match_torch``: ``Checkpoint.tensors`` / ``.unsupported`` hold exactly the
  names the flat-name rule gives torch.load's object (``tests/_expected_names.py``, which
  walks the torch object and never calls torchless), each tensor with torch's dtype, shape
  and bytes; set members compare as a multiset under the set's name.
- ``test_load_matches_torch``: ``torchless.load`` gives torch's plain values (ints, strs,
  lists, dicts …; arrays where torch has tensors, compared by bytes; a TensorRecord with
  torch's parts where torch has a sparse, quantized, nested or meta tensor), or refuses
  with UnsupportedError where torch holds tensors torchless does not read.
- ``test_no_silent_omission``: every tensor and storage torch's object reaches is in
  ``.tensors`` or ``.unsupported`` under its expected name; also run over every fixture and
  corpus file torch.load can read (``test_no_silent_omission_real_file``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from tests.conftest import DATA, SHARED

pytestmark = pytest.mark.torch

# ---- the cases (names checked against tests/_savepaths.py by test_case_list_is_complete) ----

_BOTH = ("zip", "legacy")
_CLASSIC = ("uint8", "int8", "int16", "int32", "int64", "float32", "float64", "complex64",
            "complex128", "float16", "bfloat16", "bool")
VARIANTS: dict[str, tuple[str, ...]] = {
    "mixin_data": _BOTH,
    "mixin_data_bytesio": _BOTH,
    "filelike_write_only": _BOTH,
    "fake_zip": _BOTH,
    "eye": _BOTH,
    "sparse": tuple(f"{k}-{f}" for k in ("coo", "csr", "csc", "bsr", "bsc") for f in _BOTH),
    "old_tensor_v1": _BOTH,
    "old_tensor_v2": _BOTH,
    "tar_backward_compat": (),
    "module_whole_linear": _BOTH,
    "different_dtype_unallocated": tuple(
        f"{f}-{n}-{_CLASSIC[(i + 5) % 12]}-{form}" for f in _BOTH for i, n in enumerate(_CLASSIC)
        for form in ("tensor-storage", "storage-storage", "tensor-tensor")),
    "basic_types": _BOTH,
    "tensor_and_two_tensor": _BOTH,
    "new_old_format_compat": _BOTH,
    "container_network1": _BOTH,
    "legacy_followed_by_more": (),
    "jit_linear": (),
    "pathlike_conv": (),
    "meta_state_dict": (),
    "lr_scheduler": (),
    "optimizer_state": (),
    "python_attr": ("tensor", "parameter"),
    "nested_class": (),
    "reduce_print": (),
    "namedtuple_point": (),
    "args_and_build_state": (),
    "dataclass_slots": ("all", "some"),
    "blocklisted_global": (),
    "two_tensor": ("protocol2", "protocol5"),
    "zoneinfo_datetime": (),
    "math_bits": ("conj", "neg", "neg_conj"),
    "lstm_byteorder": ("record", "no-record"),
    "no_byteorder_record": _CLASSIC,
    "mmap_state_dict": (),
    "v3_dtype_views": ("float8_e5m2", "float8_e4m3fn", "complex32", "uint16", "uint32",
                       "uint64"),
    "byte_literal": ("bytes", "bytearray"),
    "filewriter_metadata": (),
    "skip_data": ("real", "fake"),
    "skip_data_views": ("real", "fake"),
    "skip_data_meta": (),
    "crc32_disabled": (),
    "two_tensor_root": (),
    "njt_root": (),
    "preserves_dtype": _CLASSIC,
    "linear_state_dict": (),
    "storage_alignment_4096": (),
    "sequential_20": (),
    "uintx_intx": ("uint4", "int4"),
    "wrapper_subclass_slots": (),
    "getstate_subclass": (),
    "empty_subclass": ("one", "empty"),
    "parameter_two_tensor": (),
    "set_of_ints": (),
    "pickle_protocol": tuple(f"{f}-p{p}" for f in _BOTH for p in range(1, 6)),
    "every_dtype": _BOTH,
    "parameters": _BOTH,
    "module_whole_nested": _BOTH,
    "checkpoint_dict": _BOTH,
    "quantized": ("per_tensor", "per_channel"),
    "numpy_values": (),
    "tensor_dict_keys": (),
    "sets_of_tensors": _BOTH,
    "namespaces": (),
    "build_args_with_tensors": (),
    "newobj_ex_kwargs": ("protocol2", "protocol4"),
    "lazy_linear_state_dict": (),
    "lazy_linear_whole": (),
    "tensor_attributes": _BOTH,
    "storages": _BOTH,
    "storage_root": ("typed-zip", "typed-legacy", "untyped-zip"),
    "legacy_storage_views": (),
    "legacy_storage_view_and_tensor": (),
    "sequences_by_index": (),
    "torch_values": _BOTH,
    "generator": (),
    "njt_in_dict": (),
    "omegaconf": ("plain", "tensor"),
    "self_reference": _BOTH,
}
CASE_NAMES: list[str] = [f"{base}[{v}]" if v else base
                         for base, variants in VARIANTS.items() for v in variants or ("",)]



# ---- fixtures: every file written once, torch's reading of each once ------------------------


@pytest.fixture(scope="session")
def sp(torch: ModuleType) -> ModuleType:
    from tests import _savepaths

    return _savepaths


@pytest.fixture(scope="session")
def en(torch: ModuleType) -> ModuleType:
    from tests import _expected_names

    return _expected_names


@pytest.fixture(scope="session")
def generated(sp: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return dict(sp.generate(tmp_path_factory.mktemp("savepaths")))


@pytest.fixture(scope="session")
def oracle(sp: ModuleType, en: ModuleType,
           generated: dict[str, Any]) -> Callable[[str], tuple[Any, Any]]:
    """torch.load of a case and the expected names of what it returned, computed once."""
    cache: dict[str, tuple[Any, Any]] = {}

    def get(name: str) -> tuple[Any, Any]:
        if name not in cache:
            obj = sp.load(generated[name].path)
            cache[name] = (obj, en.expected_names(obj))
        return cache[name]

    return get


# ---- torchless's side -------------------------------------------------------------------------


def _raw(tensor: torchless.Tensor) -> bytes:
    """The tensor's elements in C order, little-endian (raw bytes where NumPy has no dtype)."""
    if tensor.numel == 0:
        return b""
    if tensor.dtype.numpy is not None:
        arr = tensor.numpy()
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return bytes(np.ascontiguousarray(arr).tobytes())
    size = tensor.dtype.itemsize  # bits / float4 types: view the bytes as opaque items
    view = np.ndarray(tensor.shape, dtype=np.dtype((np.void, size)),
                      buffer=tensor.storage.buffer(), offset=tensor.storage_offset * size,
                      strides=tuple(s * size for s in tensor.stride))
    return bytes(np.ascontiguousarray(view).tobytes())


def torchless_entries(ckpt: torchless.Checkpoint, coarse: bool) -> list[tuple[str, Hashable]]:
    out: list[tuple[str, Hashable]] = []
    for name, t in ckpt.tensors.items():
        key: Hashable = "leaf" if coarse else (
            "tensor", t.dtype.name, tuple(t.shape), hashlib.sha256(_raw(t)).hexdigest())
        out.append((name, key))
    out += [(name, "leaf" if coarse else ("unsupported",)) for name in ckpt.unsupported]
    return out


def _describe(counter: Counter[tuple[str, Hashable]]) -> list[str]:
    return sorted(f"{name!r}: {key}" for name, key in counter.elements())


def _refusal_allowed(refused_ok: tuple[str, ...], err: torchless.CheckpointError) -> bool:
    names = getattr(err, "names", ())
    return isinstance(err, torchless.UnsafeGlobalError) and bool(names) \
        and set(names) <= set(refused_ok)


def fail(message: str) -> None:
    """Fail with the message alone: a traceback through the library adds nothing here, and
    pytest formatting one per expected failure (xfail) costs most of this file's run time."""
    pytest.fail(message, pytrace=False)


def _open(path: Path, refused_ok: tuple[str, ...]) -> torchless.Checkpoint | None:
    """torchless.open, or None for a refusal the case allows; any other error fails."""
    try:
        return torchless.open(path)
    except torchless.CheckpointError as e:
        if _refusal_allowed(refused_ok, e):
            return None
        fail(f"torchless.open raised {type(e).__name__}: {e}")
    raise AssertionError("unreachable")


# ---- 1. the names and the tensors ------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_names_match_torch(name: str, generated: dict[str, Any], oracle: Any,
                           en: ModuleType) -> None:
    case = generated[name].case
    _, exp = oracle(name)
    ckpt = _open(generated[name].path, case.refused_ok)
    if ckpt is None:
        assert not exp.leaves, "a refused file must not hide tensors torch reads"
        return
    with ckpt:
        have = en.canonical(torchless_entries(ckpt, coarse=False), exp.sets)
    want = en.canonical(exp.entries(), exp.sets)
    if have != want:
        fail(f"{case.source}\nmissing or wrong: {_describe(want - have)}\n"
             f"unexpected: {_describe(have - want)}")


# ---- 2. torchless.load against torch.load's plain values -------------------------------------


def _plain_mismatches(en: ModuleType, exp: Any, act: Any, where: str,
                      active: set[int]) -> list[str]:
    """Where torchless.load's value differs from torch's, for plain values only (other
    torch objects are not compared: torchless keeps them as inert records)."""
    import torch

    from tests import _kinds_oracle as ko

    if id(exp) in active:
        return []
    if isinstance(exp, torch.Tensor) and en.unsupported_kind(exp) in ko.RECORD_KINDS:
        if not isinstance(act, torchless.TensorRecord):
            return [f"{where}: {type(act).__name__} where torch has a "
                    f"{en.unsupported_kind(exp)} tensor"]
        return [f"{where}: {d}" for d in ko.differences(ko.parts_of_record(act),
                                                        ko.torch_parts(exp))]
    if isinstance(exp, torch.Tensor) or isinstance(exp, (torch.TypedStorage,
                                                        torch.UntypedStorage)):
        leaf = en.leaf_of(exp)
        if not isinstance(act, np.ndarray):
            return [f"{where}: {type(act).__name__} where torch has a tensor"]
        raw = np.ascontiguousarray(act)
        if raw.dtype.byteorder == ">":
            raw = raw.astype(raw.dtype.newbyteorder("<"))
        if tuple(act.shape) != leaf.shape or hashlib.sha256(raw.tobytes()).hexdigest() \
                != leaf.sha256:
            return [f"{where}: array {act.shape} differs from torch's {leaf.shape}"]
        return []
    if isinstance(exp, torch.nn.Module):
        exp = exp.state_dict()
    if exp is None or type(exp) in (bool, int, float, str, bytes):
        same = type(act) is type(exp) and (act == exp or (exp != exp and act != act))
        return [] if same else [f"{where}: {act!r} != torch's {exp!r}"]
    if type(exp) in (set, frozenset) and all(
            type(v) in (bool, int, float, str, bytes) for v in exp):
        return [] if act == exp else [f"{where}: {act!r} != torch's {exp!r}"]
    active = active | {id(exp)}
    if type(exp) in (list, tuple):
        if type(act) is not type(exp) or len(act) != len(exp):
            return [f"{where}: {type(act).__name__} {act!r:.80} != torch's "
                    f"{type(exp).__name__} of {len(exp)}"]
        return [m for i, (e, a) in enumerate(zip(exp, act, strict=True))
                for m in _plain_mismatches(en, e, a, f"{where}.{i}", active)]
    if isinstance(exp, dict) and type(exp).__module__ in ("builtins", "collections") \
            and all(type(k) in (str, int) for k in exp):
        if not isinstance(act, dict) or list(act) != list(exp):
            return [f"{where}: keys {list(act) if isinstance(act, dict) else type(act)} != "
                    f"torch's {list(exp)}"]
        return [m for k in exp for m in _plain_mismatches(en, exp[k], act[k], f"{where}.{k}",
                                                           active)]
    return []


#: torch dtypes NumPy has no type for: torchless lists such tensors but load() refuses them.
NO_NUMPY = {"float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_load_matches_torch(name: str, generated: dict[str, Any], oracle: Any,
                            en: ModuleType) -> None:
    case = generated[name].case
    obj, exp = oracle(name)
    from tests._kinds_oracle import RECORD_KINDS

    unsupported = [n for n, leaf in exp.leaves
                   if leaf.kind == "unsupported" and leaf.why not in RECORD_KINDS]
    try:
        # the oracle's modules are their state dicts (tests/reader/test_module_records.py:
        # the records load gives by default)
        got = torchless.load(generated[name].path, modules="state_dict")
    except torchless.UnsupportedError as e:
        # documented: load needs every tensor, as a NumPy array
        if unsupported or any(leaf.dtype in NO_NUMPY for _, leaf in exp.leaves):
            return
        fail(f"torchless.load raised {type(e).__name__}: {e}")
    except torchless.CheckpointError as e:
        if _refusal_allowed(case.refused_ok, e):
            return
        fail(f"torchless.load raised {type(e).__name__}: {e}")
    if unsupported:
        fail(f"torchless.load read a file holding tensors it does not read: {unsupported}")
    mismatches = _plain_mismatches(en, obj, got, "root", set())
    if mismatches:
        fail(f"{case.source}\n" + "\n".join(mismatches))


# ---- 3. the no-silent-omission property ------------------------------------------------------


def assert_nothing_omitted(en: ModuleType, path: Path, obj: Any,
                           refused_ok: tuple[str, ...] = ()) -> None:
    exp = en.expected_names(obj)
    ckpt = _open(path, refused_ok)
    if ckpt is None:
        assert not exp.leaves, "a refused file must not hide tensors torch reads"
        return
    with ckpt:
        have = en.canonical(torchless_entries(ckpt, coarse=True), exp.sets)
    want = en.canonical(exp.entries(coarse=True), exp.sets)
    missing = want - have
    if missing:
        fail(f"silently omitted: {sorted(n for n, _ in missing.elements())}")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_no_silent_omission(name: str, generated: dict[str, Any], oracle: Any,
                            en: ModuleType) -> None:
    obj, _ = oracle(name)
    g = generated[name]
    assert_nothing_omitted(en, g.path, obj, g.case.refused_ok)


def _real_files() -> list[Any]:
    """Every fixture and corpus file (ours and ../shared's), each distinct content once."""
    out: list[Any] = []
    seen: set[str] = set()
    for root in (DATA, SHARED):
        fixtures = root / "fixtures" / "REFERENCE.json"
        corpus = root / "corpus" / "MANIFEST.json"
        found = []
        if fixtures.is_file():
            ref = json.loads(fixtures.read_text())
            found += [(fixtures.parent / n, v.get("error")) for n, v in sorted(ref.items())]
        if corpus.is_file():
            found += [(corpus.parent / e["file"], None)
                      for e in json.loads(corpus.read_text())]
        for path, error in found:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            label = f"{'shared' if root == SHARED else 'data'}/{path.relative_to(root)}"
            out.append(pytest.param(path, error, id=label))
    return out


#: Files that are safetensors, not torch checkpoints: torchless reads them as the safetensors
#: package does (the tensors by name), whatever torch.load makes of them.
REAL_SAFETENSORS = {"mnist.safetensors"}


@pytest.mark.parametrize(("path", "reference_error"), _real_files())
def test_no_silent_omission_real_file(path: Path, reference_error: str | None,
                                      torch: ModuleType, en: ModuleType) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu")
        except Exception:
            try:  # modules saved whole, TorchScript (torch.load hands it to torch.jit.load)
                obj = torch.load(path, weights_only=False, map_location="cpu")
            except Exception as e:
                if reference_error is None:
                    raise
                pytest.skip(f"torch.load cannot read it: {type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200]}")
    if path.name in REAL_SAFETENSORS:
        from safetensors.numpy import load_file

        want = load_file(path)
        with torchless.open(path) as ckpt:
            assert ckpt.format == "safetensors" and set(ckpt.tensors) == set(want)
            for name, arr in want.items():
                assert ckpt.numpy(name).tobytes() == arr.tobytes(), name
        return
    assert_nothing_omitted(en, path, obj)


# ---- the harness itself --------------------------------------------------------------------


def test_case_list_is_complete(sp: ModuleType) -> None:
    """The names parametrized here are the generator's (drift would leave cases untested)."""
    assert sorted(CASE_NAMES) == sorted(sp.CASES)


def test_every_case_file_is_small_and_readable_by_torch(generated: dict[str, Any],
                                                        oracle: Any) -> None:
    sizes = {name: g.path.stat().st_size for name, g in generated.items()}
    assert max(sizes.values()) < 64 * 1024, max(sizes.items(), key=lambda kv: kv[1])
    for name in generated:
        oracle(name)  # torch.load must read every generated file


def test_canonical_compares_set_members_as_a_multiset(en: ModuleType) -> None:
    """The set comparison itself: member names may differ, contents may not."""
    sets = [(1, "s"), (2, r"s\.[^.]+")]
    want = [("s.\x000", "a"), ("s.\x001.0", "b"), ("s.\x001.\x005", "c"), ("t", "d")]
    same = [("s.7", "a"), ("s.2.0", "b"), ("s.2.1", "c"), ("t", "d")]
    moved = [("s.7", "a"), ("s.2.0", "b"), ("s.3", "c"), ("t", "d")]
    other = [("s.7", "b"), ("s.2.0", "a"), ("s.2.1", "c"), ("t", "d")]
    assert en.canonical(same, sets) == en.canonical(want, sets)
    assert en.canonical(moved, sets) != en.canonical(want, sets)
    assert en.canonical(other, sets) != en.canonical(want, sets)
