"""torchless.safe_open behaves as safetensors.safe_open (the oracle) on the same tensors: over
safetensors files, inert files, torch checkpoints and index files, for each framework."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from torchless.api.safeopen import SafeOpenError

from ..conftest import require

#: Index forms safetensors' PySafeSlice takes (negative ones it refuses).
INDEXES: list[Any] = [0, 2, (1,), (slice(None), 2), (Ellipsis, 1), (slice(0, 2, 2),),
                      (slice(1, 3), slice(None), slice(0, 4, 3)), slice(None), Ellipsis,
                      (0, slice(1, 2), 3), (slice(5, 9),)]


def _arrays() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(7)
    return {"b.weight": rng.standard_normal((4, 3, 5)).astype(np.float32),
            "a.bias": np.arange(6, dtype=np.int64) - 3,
            "c.mask": rng.integers(0, 2, (3, 2)).astype(bool),
            "d.half": rng.standard_normal((2, 8)).astype(np.float16)}


@pytest.fixture(scope="module")
def st() -> ModuleType:
    return require("safetensors")


def _same(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs)
    assert ours.dtype == theirs.dtype and tuple(ours.shape) == tuple(theirs.shape)
    if isinstance(theirs, np.ndarray):
        assert ours.tobytes() == theirs.tobytes()
    else:  # torch (the values are finite: equal values are equal bits)
        import torch

        assert torch.equal(ours, theirs)


def _parity(st: ModuleType, ours_path: Path, theirs_path: Path, framework: str = "np",
            metadata: bool = True) -> None:
    with torchless.safe_open(ours_path, framework) as ours, \
            st.safe_open(str(theirs_path), framework) as theirs:
        assert ours.keys() == theirs.keys()
        if metadata:
            assert ours.metadata() == theirs.metadata()
        for name in theirs.keys():
            _same(ours.get_tensor(name), theirs.get_tensor(name))
            mine, ref = ours.get_slice(name), theirs.get_slice(name)
            assert mine.get_shape() == ref.get_shape() and mine.get_dtype() == ref.get_dtype()
            for index in INDEXES:
                try:
                    want = ref[index]
                except Exception:  # out of range for this tensor's rank
                    continue
                _same(mine[index], want)


def test_plain_safetensors_file(st: ModuleType, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file(_arrays(), str(path), metadata={"format": "np", "note": "x"})
    _parity(st, path, path)
    bare = tmp_path / "bare.safetensors"
    save_file(_arrays(), str(bare))
    _parity(st, bare, bare)  # metadata() is None for both
    with torchless.safe_open(bare, "np") as f:
        assert f.metadata() is None
        with st.safe_open(str(bare), "np") as g:
            assert f.offset_keys() == g.offset_keys()


def test_inert_file(st: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "inert.safetensors"
    torchless.save({"model": _arrays(), "epoch": 3, "cfg": {"lr": 0.1}}, path)
    _parity(st, path, path)  # the entries and __metadata__ safetensors sees, tree included


def test_missing_name_is_a_key_error(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file(_arrays(), str(path))
    with torchless.safe_open(path, "np") as f:
        for call in (f.get_tensor, f.get_slice):
            with pytest.raises(SafeOpenError, match="does not contain tensor nope") as info:
                call("nope")
            assert isinstance(info.value, KeyError)
            assert isinstance(info.value, torchless.CheckpointError)
        with pytest.raises(TypeError):
            f.get_slice("b.weight")[[0, 1]]
    with pytest.raises(ValueError, match="framework"):
        torchless.safe_open(path, "tf")


@pytest.mark.torch
@pytest.mark.parametrize("framework", ["np", "pt"])
def test_torch_checkpoint_reads_like_its_safetensors_twin(
        st: ModuleType, torch: ModuleType, tmp_path: Path, framework: str) -> None:
    from safetensors.torch import save_file

    tensors = {k: torch.from_numpy(v) for k, v in _arrays().items()}
    tensors["e.bf16"] = torch.randn(3, 4).to(torch.bfloat16)
    torch.save(tensors, tmp_path / "m.bin")
    save_file(tensors, str(tmp_path / "m.safetensors"))
    _parity(st, tmp_path / "m.bin", tmp_path / "m.safetensors", framework, metadata=False)
    with torchless.safe_open(tmp_path / "m.bin", framework) as f:
        assert f.metadata() == {"format": "pt"}
        if framework == "pt":
            assert type(f.get_tensor("e.bf16")) is torch.Tensor


@pytest.mark.torch
def test_index_files(st: ModuleType, torch: ModuleType, tmp_path: Path) -> None:
    """A sharded checkpoint through its index, safetensors shards and .bin shards: the
    union of the shards as safetensors reads them one by one."""
    from safetensors.torch import save_file

    arrays = _arrays()
    names = list(arrays)
    parts = [names[:2], names[2:]]
    wmap_st, wmap_bin = {}, {}
    for i, part in enumerate(parts, 1):
        shard = {n: torch.from_numpy(arrays[n]) for n in part}
        save_file(shard, str(tmp_path / f"model-0000{i}-of-00002.safetensors"))
        torch.save(shard, tmp_path / f"pytorch_model-0000{i}-of-00002.bin")
        wmap_st.update({n: f"model-0000{i}-of-00002.safetensors" for n in part})
        wmap_bin.update({n: f"pytorch_model-0000{i}-of-00002.bin" for n in part})
    meta = {"total_size": sum(a.nbytes for a in arrays.values())}
    for name, wmap in (("model.safetensors.index.json", wmap_st),
                       ("pytorch_model.bin.index.json", wmap_bin)):
        (tmp_path / name).write_text(json.dumps({"metadata": meta, "weight_map": wmap}))
        with torchless.safe_open(tmp_path / name, "np") as f:
            assert f.keys() == sorted(names)
            assert f.metadata() == {"total_size": str(meta["total_size"])}
            for n in names:
                with st.safe_open(str(tmp_path / wmap_st[n]), "np") as g:
                    _same(f.get_tensor(n), g.get_tensor(n))
                    _same(f.get_slice(n)[1:], g.get_slice(n)[1:])


_FRAMEWORK_PARITY = """
import sys
import numpy as np
import torchless
from safetensors import safe_open
framework, path = sys.argv[1], sys.argv[2]
fw = "flax" if framework == "jax" else "mlx"
with torchless.safe_open(path, framework) as f, safe_open(path, fw) as g:
    assert f.keys() == g.keys()
    for name in g.keys():
        a, b = f.get_tensor(name), g.get_tensor(name)
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(np.asarray(a), np.asarray(b)), name
        s, t = f.get_slice(name)[1:], g.get_slice(name)[1:]
        assert type(s) is type(t) and s.dtype == t.dtype, name
        assert np.array_equal(np.asarray(s), np.asarray(t)), name
    print("same", len(g.keys()))
"""


@pytest.mark.parametrize("framework", ["jax", "mlx"])
def test_jax_and_mlx(tmp_path: Path, framework: str) -> None:
    """In a child process: JAX, once imported, warns at every fork of the test process
    (process pools in other tests), and pytest makes warnings errors."""
    import importlib.util
    import os
    import subprocess
    import sys

    module = "jax" if framework == "jax" else "mlx"
    if importlib.util.find_spec(module) is None:
        if os.environ.get("TORCHLESS_REQUIRE_TORCH"):
            pytest.fail(f"{module} is missing (the test extra installs it)")
        pytest.skip(f"{module} is not installed")
    from safetensors.numpy import save_file

    arrays = {k: v for k, v in _arrays().items() if v.dtype != np.int64}  # JAX narrows int64
    path = tmp_path / "m.safetensors"
    save_file(arrays, str(path))
    out = subprocess.run([sys.executable, "-c", _FRAMEWORK_PARITY, framework, str(path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["same", str(len(arrays))]


def _resident(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore(2) over a fresh map of the file)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
        view = np.frombuffer(m, np.uint8)
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) == 0
        del view
        return sum(v & 1 for v in vec) * mmap.PAGESIZE


def test_a_slice_reads_only_the_pages_it_covers(tmp_path: Path) -> None:
    """The page cache is emptied of the file, a slice of one row is read, and only a small
    part of the 64 MiB tensor is in memory (the kernel's read-ahead around it); reading the
    whole tensor brings in all of it, so the measurement can tell the two apart."""
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("mincore(2) through the C library: measured on Linux")
    from safetensors.numpy import save_file

    path = tmp_path / "big.safetensors"
    big = np.arange(8192 * 2048, dtype=np.float32).reshape(8192, 2048)
    save_file({"big": big}, str(path))
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident(path) > big.nbytes // 16:
        pytest.skip("this file system keeps the file in memory (tmpfs): nothing to measure")
    with torchless.safe_open(path, "np") as f:
        row = f.get_slice("big")[5000:5001]
        assert np.array_equal(row, big[5000:5001])
        after_slice = _resident(path)
        assert np.array_equal(f.get_tensor("big"), big)
        after_all = _resident(path)
    assert after_slice < big.nbytes // 4, after_slice
    assert after_all > big.nbytes * 0.9, after_all


class _NpyDirectory:
    """A toy directory layout (one raw float32 file per tensor, shapes in a JSON file): what
    a registered directory container (DCP …) hands the reader."""

    format = "npydir"

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def load(self, resolver: Any) -> Any:
        from torchless.core.dtypes import by_torch_name
        from torchless.model.tensor import Storage, Tensor

        f32 = by_torch_name("float32")
        shapes = json.loads((self.path / "shapes.json").read_text())
        out = {}
        for name, shape in shapes.items():
            raw = (self.path / f"{name}.raw").read_bytes()
            storage = Storage(name, f32, len(raw), lambda r=raw: r)
            stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
            out[name] = Tensor(storage, f32, tuple(shape), stride, 0)
        return out

    def persistent_load(self, pid: Any, offset: int) -> Any:
        raise AssertionError("no pickle here")

    def describe(self, resolver: Any) -> dict[str, Any]:
        return {}

    def module_hook(self) -> Any:
        return lambda obj: None

    def close(self) -> None:
        pass


def test_a_registered_directory_layout_just_works(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.containers import registry

    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(2, np.float32)}
    for name, arr in arrays.items():
        (tmp_path / f"{name}.raw").write_bytes(arr.tobytes())
    (tmp_path / "shapes.json").write_text(json.dumps({k: list(v.shape)
                                                      for k, v in arrays.items()}))
    from torchless.containers.regions import EACH_FILE

    layout = registry.DirectoryLayout(  # raw arrays, no pickle: the scanner reads each file
        "npydir", lambda p: Path(p, "shapes.json").is_file(),
        lambda p, limits, crc: _NpyDirectory(p), EACH_FILE)
    monkeypatch.setattr(registry, "_DIRECTORIES", [layout])
    with torchless.safe_open(tmp_path, "np") as f:
        assert f.keys() == ["b", "w"] and f.metadata() == {"format": "pt"}
        _same(f.get_tensor("w"), arrays["w"])
        _same(f.get_slice("w")[1:, ::2], arrays["w"][1:, ::2])
