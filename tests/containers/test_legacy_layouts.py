"""Legacy stream, TAR and plain-pickle layouts, differential against torch.

torch writes the legacy files itself (protocols 1-5); our own writer (tests/_legacy_writer.py)
adds big-endian variants and the pre-0.1.10 TAR layout, which torch 2.13 still reads.
torch ignores the endianness flag of legacy and TAR files (it reads the bytes as
little-endian whatever sys_info says); torchless honours it, so big-endian files are checked
against torch's reading of their little-endian twin.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests._legacy_writer import write_legacy, write_tar

LEGACY_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "complex64", "complex128"]


def torch_flat(torch: Any, obj: Any, prefix: str = "") -> dict[str, Any]:
    """Flat names of torch tensors, by the rule the issue states (keys and indices by '.')."""
    out: dict[str, Any] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(torch_flat(torch, v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(torch_flat(torch, v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def torch_bytes(torch: Any, t: Any) -> bytes:
    c = t.detach().contiguous().reshape(-1)
    return c.view(torch.uint8).numpy().tobytes() if c.numel() else b""


_ORACLE = """
import base64, json, sys, torch
def flat(obj, prefix=""):
    out = {}
    if isinstance(obj, torch.Tensor):
        c = obj.detach().contiguous().reshape(-1)
        data = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
        out[prefix] = [str(obj.dtype), list(obj.shape), list(obj.stride()),
                       obj.storage_offset(), base64.b64encode(data).decode()]
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat(v, f"{prefix}.{i}" if prefix else str(i)))
    return out
obj = torch.load(sys.argv[1], weights_only=False)
if isinstance(obj, torch.nn.Module):
    obj = obj.state_dict()
print(json.dumps(flat(obj)))
"""


def torch_read_in_subprocess(path: Path) -> dict[str, list[Any]]:
    """What torch.load reads, flattened, from a separate process (torch's TAR loader
    extracts members to a temporary directory; keep that out of the test process)."""
    import json

    out = subprocess.run([sys.executable, "-c", _ORACLE, str(path)], capture_output=True,
                         text=True, check=True, cwd=path.parent, timeout=300)
    result: dict[str, list[Any]] = json.loads(out.stdout)
    return result


def assert_same_as_oracle(ckpt: torchless.Checkpoint, expected: dict[str, list[Any]]) -> None:
    import base64

    assert list(ckpt.tensors) == list(expected)
    for name, (dtype, shape, stride, offset, data) in expected.items():
        mine = ckpt.tensors[name]
        assert f"torch.{mine.dtype.name}" == dtype, name
        assert list(mine.shape) == shape and list(mine.stride) == stride, name
        assert mine.storage_offset == offset, name
        assert np.ascontiguousarray(mine.numpy()).tobytes() == base64.b64decode(data), name


def assert_same_tensors(torch: Any, ckpt: torchless.Checkpoint, expected: dict[str, Any]) -> None:
    assert list(ckpt.tensors) == list(expected)
    for name, t in expected.items():
        mine = ckpt.tensors[name]
        assert mine.dtype.name == str(t.dtype).removeprefix("torch."), name
        assert mine.shape == tuple(t.shape), name
        assert mine.stride == tuple(t.stride()), name
        assert mine.storage_offset == t.storage_offset(), name
        assert np.ascontiguousarray(mine.numpy()).tobytes() == torch_bytes(torch, t), name


def rich(torch: Any, dtypes: list[str]) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    for name in dtypes:
        dt = getattr(torch, name)
        base = (torch.randn(4, 6, generator=g) * 50)
        t = base.to(dt) if not dt.is_complex else torch.complex(base, -base).to(dt)
        out[name] = {
            "contiguous": t, "transposed": t.t(), "offset": t[1:, 2:], "step": t[:, ::2],
            "expanded": t[0:1].expand(3, 6), "scalar": t[2, 3], "empty": t[:0],
        }
    out["shared"] = [out[dtypes[0]]["contiguous"], out[dtypes[0]]["transposed"]]
    return out


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_legacy_stream_matches_torch(torch: Any, tmp_path: Path, protocol: int) -> None:
    obj = rich(torch, LEGACY_DTYPES)
    obj["param"] = torch.nn.Parameter(torch.ones(3))
    obj["meta"] = {"epoch": 3, "name": "x", "tuple": (1, 2.5, None)}
    path = tmp_path / "legacy.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    expected = torch.load(path, weights_only=False)
    with torchless.open(path) as ckpt:
        assert ckpt.format == "legacy"
        assert "legacy stream" in ckpt.info["era"]
        assert_same_tensors(torch, ckpt, torch_flat(torch, expected))
        assert ckpt.tensors["param"].is_parameter
    loaded = torchless.load(path)
    assert loaded["meta"] == {"epoch": 3, "name": "x", "tuple": (1, 2.5, None)}
    shared = loaded["shared"]
    assert np.shares_memory(shared[0], shared[1])


def test_legacy_full_model_save(torch: Any, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 4)
                self.bn = torch.nn.BatchNorm1d(4)
                self.head = torch.nn.Linear(4, 2, bias=False)
                self.seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2))
                self.register_buffer("scale", torch.tensor([2.0]))
                self.register_buffer("tmp", torch.zeros(2), persistent=False)
        torch.manual_seed(0)
        m = Net()
        m.tied = m.fc
        torch.save(m, {str(tmp_path / 'model.pt')!r}, _use_new_zipfile_serialization=False)
        sd = m.state_dict()
        torch.save(sd, {str(tmp_path / 'sd.pt')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    expected = torch.load(tmp_path / "sd.pt")
    with torchless.open(tmp_path / "model.pt") as ckpt:
        assert_same_tensors(torch, ckpt, dict(expected))
        sources = ckpt.info["module_sources"]
        assert "__main__.Net" in sources or any(k.endswith("Linear") for k in sources)


@pytest.mark.parametrize("protocol", [1, 2, 4])
def test_big_endian_legacy_reads_as_its_little_endian_twin(torch: Any, tmp_path: Path,
                                                           protocol: int) -> None:
    obj = rich(torch, LEGACY_DTYPES)
    twin = io.BytesIO()
    write_legacy(torch, obj, twin, protocol=protocol)
    (tmp_path / "little.pt").write_bytes(twin.getvalue())
    big = io.BytesIO()
    write_legacy(torch, obj, big, protocol=protocol, big_endian=True)
    (tmp_path / "big.pt").write_bytes(big.getvalue())
    expected = torch_flat(torch, torch.load(tmp_path / "little.pt", weights_only=False))
    with torchless.open(tmp_path / "big.pt") as ckpt:
        assert ckpt.info["byteorder"] == "big"
        assert_same_tensors(torch, ckpt, expected)


def test_big_endian_count_written_by_a_big_endian_host(torch: Any, tmp_path: Path) -> None:
    obj = {"w": torch.arange(6, dtype=torch.float32)}
    f = io.BytesIO()
    write_legacy(torch, obj, f, big_endian=True, count_big_endian=True)
    (tmp_path / "big.pt").write_bytes(f.getvalue())
    np.testing.assert_array_equal(torchless.load(tmp_path / "big.pt")["w"],
                                  np.arange(6, dtype=np.float32))


def test_legacy_storage_view_metadata(torch: Any, tmp_path: Path) -> None:
    """Old torch wrote storage views as (view_key, offset, size) in the persistent id."""
    import warnings

    root = torch.arange(10, dtype=torch.float32)
    part = root[3:8].clone()  # its own storage, declared below as a view of root's
    obj = {"root": root, "part": part, "part_t": part[1:]}
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        write_legacy(torch, obj, f, views={part.untyped_storage().data_ptr(): (root, 3)})
    path = tmp_path / "views.pt"
    path.write_bytes(f.getvalue())
    expected = torch_flat(torch, torch.load(path, weights_only=False))
    np.testing.assert_array_equal(expected["part"].numpy(), [3, 4, 5, 6, 7])
    with torchless.open(path) as ckpt:
        assert_same_tensors(torch, ckpt, expected)
        assert np.shares_memory(ckpt.numpy("root"), ckpt.numpy("part"))


def test_tar_layout_matches_torch(torch: Any, tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    tensors = {"w": base, "wt": base.t(), "row": base[1], "i": torch.arange(5),
               "h": torch.ones(2, 3, dtype=torch.float16), "b": torch.tensor([True, False])}
    path = tmp_path / "old.tar"
    write_tar(torch, tensors, str(path))
    expected = torch_read_in_subprocess(path)
    with torchless.open(path) as ckpt:
        assert ckpt.format == "tar"
        assert "0.1.10" in ckpt.info["era"]
        assert_same_as_oracle(ckpt, expected)


def test_tar_full_model_save(torch: Any, tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 2, bias=False))
    path = tmp_path / "model.tar"
    write_tar(torch, {}, str(path), module=model)
    expected = torch_read_in_subprocess(path)
    assert list(expected) == list(model.state_dict())
    with torchless.open(path) as ckpt:
        assert_same_as_oracle(ckpt, expected)
        assert any(k.endswith("Linear") for k in ckpt.info["module_sources"])


def test_big_endian_tar_reads_as_its_little_endian_twin(torch: Any, tmp_path: Path) -> None:
    tensors = {"w": torch.arange(6, dtype=torch.float32), "c": torch.ones(2, dtype=torch.cdouble)}
    write_tar(torch, tensors, str(tmp_path / "little.tar"))
    write_tar(torch, tensors, str(tmp_path / "big.tar"), big_endian=True)
    expected = torch_read_in_subprocess(tmp_path / "little.tar")
    with torchless.open(tmp_path / "big.tar") as ckpt:
        assert ckpt.info["byteorder"] == "big"
        assert_same_as_oracle(ckpt, expected)


def test_protocol_0_legacy_stream_without_tensors(torch: Any, tmp_path: Path) -> None:
    obj = {"epoch": 3, "lr": 0.5, "names": ["a", "b"], "nested": {"k": (1, None)}}
    f = io.BytesIO()
    write_legacy(torch, obj, f, protocol=0)
    path = tmp_path / "p0.pt"
    path.write_bytes(f.getvalue())
    assert path.read_bytes().startswith(b"L119547037146038801333356L\n")
    assert torch.load(path, weights_only=False) == obj
    assert torchless.load(path) == obj


def test_protocol_0_storages_are_refused_like_torch(torch: Any, tmp_path: Path) -> None:
    """Protocol 0 writes persistent ids as text (str of a tuple); torch cannot read them back
    and torchless refuses them with its own error."""
    path = tmp_path / "p0t.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False,
               pickle_protocol=0)
    with pytest.raises(AssertionError):
        torch.load(path, weights_only=False)
    with pytest.raises(torchless.StorageError):
        torchless.open(path)


def test_plain_pickle_config(tmp_path: Path) -> None:
    import argparse
    import pickle

    ns = argparse.Namespace(lr=0.1, layers=[1, 2], name="run")
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps({"args": ns, "step": 5}, protocol=4))
    with torchless.open(path) as ckpt:
        assert ckpt.format == "pickle"
        assert not ckpt.tensors
    assert torchless.load(path) == {"args": ns, "step": 5}


def test_plain_pickle_with_dataless_tensors_names_them(torch: Any, tmp_path: Path) -> None:
    import zipfile

    src = tmp_path / "full.pt"
    torch.save({"model": {"w": torch.ones(2)}}, src)
    with zipfile.ZipFile(src) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    path = tmp_path / "data.pkl"
    path.write_bytes(data)
    with torchless.open(path) as ckpt:
        assert dict(ckpt.unsupported).keys() == {"model.w"}
    with pytest.raises(torchless.UnsupportedError, match=r"model\.w"):
        torchless.load(path)


def test_trailing_bytes_after_a_plain_pickle_are_refused(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps([1, 2]) + pickle.dumps("second"))
    with pytest.raises(torchless.PickleError):
        torchless.open(path)


@pytest.mark.parametrize("content,says", [
    (b"GGUF\x03\x00\x00\x00" + b"\x00" * 64, "GGUF"),
    (b"<!DOCTYPE html><html><body>404</body></html>", "HTML"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "Git LFS"),
    (b"\x1f\x8b\x08\x00" + b"\x00" * 40, "gzip"),
    (b"7z\xbc\xaf\x27\x1c" + b"\x00" * 40, "7-Zip"),
    (b"\x08\x07\x12\x07pytorch:onnx" + b"\x00" * 30, "ONNX"),
    (b"\x93NUMPY\x01\x00" + b"\x00" * 40, "NumPy"),
])
def test_other_formats_are_named(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(torchless.NotACheckpointError, match=says):
        torchless.open(path)


def test_a_safetensors_file_under_a_torch_name_is_read(tmp_path: Path) -> None:
    """open() reads safetensors files too, whatever their name: the header says what they
    hold (the safetensors spec: 8-byte little-endian header length, JSON, then data)."""
    header = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "model.pt"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x00\x80\x3f")
    ckpt = torchless.open(path)
    assert ckpt.format == "safetensors"
    assert ckpt.tensors["a"].numpy().tolist() == [1.0]


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    with pytest.raises(torchless.TruncatedInputError):
        torchless.open(path)


def test_zip_era_from_records(torch: Any, tmp_path: Path) -> None:
    path = tmp_path / "z.pt"
    torch.save({"w": torch.ones(1)}, path)
    with torchless.open(path) as ckpt:
        assert "torch >= 2.1" in ckpt.info["era"]
