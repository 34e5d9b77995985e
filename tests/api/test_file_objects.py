"""Issue 26 rows 2, 4, 5: file objects for every format load reads by path, mmap=True in the
drop-in, and a missing file as the FileNotFoundError torch.load and safetensors raise."""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
import torchless.torch as tt


def _files(torch: ModuleType, tmp: Path) -> dict[str, Path]:
    import safetensors.torch as st

    w = torch.arange(12.0).reshape(3, 4)
    torch.save({"w": w}, tmp / "z.pt")
    st.save_file({"w": w}, tmp / "s.safetensors")
    torchless.save({"w": w, "epoch": 3}, tmp / "i.ckpt")
    return {"zip": tmp / "z.pt", "safetensors": tmp / "s.safetensors", "inert": tmp / "i.ckpt"}


@pytest.mark.parametrize("kind", ["zip", "safetensors", "inert"])
@pytest.mark.parametrize("wrap", ["open", "bytesio"])
def test_file_objects_read_as_paths(torch: ModuleType, tmp_path: Path, kind: str,
                                    wrap: str) -> None:
    path = _files(torch, tmp_path)[kind]
    want = torch.arange(12.0).reshape(3, 4)

    def fobj() -> io.BufferedIOBase:
        return open(path, "rb") if wrap == "open" else io.BytesIO(path.read_bytes())

    with fobj() as f:
        assert np.array_equal(torchless.load(f)["w"], want.numpy())
    with fobj() as f:
        assert torch.equal(tt.load(f)["w"], want)
    with fobj() as f, torchless.open(f) as ckpt:
        assert np.array_equal(ckpt.tensors["w"].numpy(), want.numpy())


def test_a_stream_that_cannot_seek_says_what_is_needed(torch: ModuleType,
                                                       tmp_path: Path) -> None:
    path = _files(torch, tmp_path)["zip"]

    class Stream(io.RawIOBase):
        def __init__(self) -> None:
            self.data = io.BytesIO(path.read_bytes())

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            return self.data.readinto(b)

    with pytest.raises(torchless.UnsupportedError, match="cannot seek") as info:
        tt.load(Stream())
    assert "io.BytesIO" in info.value.hint


def test_missing_file_is_file_not_found_as_torch_and_safetensors(torch: ModuleType,
                                                                 tmp_path: Path) -> None:
    import safetensors

    missing = tmp_path / "nope.pt"
    for reference in (lambda: torch.load(missing),
                      lambda: safetensors.safe_open(str(missing), "np")):
        with pytest.raises(FileNotFoundError):
            reference()
    for ours in (lambda: tt.load(missing), lambda: torchless.load(missing),
                 lambda: torchless.open(missing), lambda: torchless.safe_open(missing, "np")):
        try:
            ours()
        except FileNotFoundError as e:
            assert isinstance(e, torchless.CheckpointError) and e.errno == 2
            assert e.filename == str(missing)
        else:
            pytest.fail("no error")


def test_mmap_views_the_file_as_torch_does(torch: ModuleType, tmp_path: Path) -> None:
    files = _files(torch, tmp_path)
    for kind in ("zip", "safetensors"):
        got = tt.load(files[kind], mmap=True)["w"]
        assert torch.equal(got, torch.arange(12.0).reshape(3, 4))
        got[0, 0] = 99.0  # a private map: writable, the file unchanged
        assert torch.equal(tt.load(files[kind])["w"], torch.arange(12.0).reshape(3, 4))
    ref = torch.load(files["zip"], mmap=True)["w"]
    ours = tt.load(files["zip"], mmap=True)["w"]
    # both map the whole file: the storage starts at the tensor's bytes inside it
    assert ours.untyped_storage().nbytes() == ref.untyped_storage().nbytes()
    with open(files["zip"], "rb") as f, pytest.raises(ValueError, match="file path"):
        tt.load(f, mmap=True)
    with open(files["zip"], "rb") as f, pytest.raises(ValueError, match="file path"):
        torch.load(f, mmap=True)


@pytest.mark.parametrize("mmap", [False, True])
def test_each_storage_is_read_once_or_mapped(torch: ModuleType, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             mmap: bool) -> None:
    """Without mmap each stored storage is read once, straight into torch's memory (two
    storages: two reads, whatever the tensors viewing them); with mmap none is read."""
    from torchless.io.source import Source

    base = torch.arange(10.0)
    torch.save({"a": base, "b": base[2:5], "c": torch.arange(3, dtype=torch.bfloat16)},
               tmp_path / "m.pt")
    reads: list[int] = []
    real = Source.read_into

    def counted(self: Source, offset: int, out: object, what: str = "data") -> None:
        reads.append(offset)
        real(self, offset, out, what)

    for path in (tmp_path / "m.pt", _files(torch, tmp_path)["safetensors"]):
        reads.clear()
        monkeypatch.setattr(Source, "read_into", counted)
        ours = tt.load(path, mmap=mmap)
        monkeypatch.undo()
        want = torch.load(path) if path.suffix == ".pt" else {
            "w": torch.arange(12.0).reshape(3, 4)}
        assert ours.keys() == want.keys()
        for k in want:
            assert torch.equal(ours[k], want[k]) and ours[k].dtype == want[k].dtype
        storages = {t.untyped_storage().data_ptr() for t in want.values()}
        assert len(reads) == (0 if mmap else len(storages))
        if "b" in ours:  # still one storage, as torch.load gives it
            ours["a"][3] = -1.0
            assert ours["b"][1] == -1.0
