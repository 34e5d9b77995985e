"""A full disk: the error says the bytes the output needs and those free for it, and a run
that fails leaves nothing: no file, and no output directory it created.

The disk is made full by replacing the system calls that put bytes into the outputs
(``write``, ``copy_file_range``, ``sendfile``) with ones failing with ``ENOSPC`` for files
under the output directory, and ``statvfs`` with one reporting 10 free blocks of 4096
bytes there. Oracles: the byte size of the file ``safetensors.torch.save`` makes of the same
tensors and metadata (what the output would have been), hand arithmetic for the free
bytes."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import torchless
from torchless.cli.main import main

pytestmark = pytest.mark.torch

FREE = 10 * 4096


class _FullDisk:
    """Writes into files under ``root`` fail with ENOSPC once ``after`` output files have
    been written to; ``statvfs`` there says FREE bytes are free."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path, after: int = 0) -> None:
        self.root = str(root)
        self.after = after
        self.files: list[int] = []
        real_write, real_statvfs = os.write, os.statvfs

        def write(fd: int, data: Any) -> int:
            self._check(fd)
            return real_write(fd, data)

        def statvfs(path: Any) -> Any:
            if os.path.abspath(os.fspath(path)).startswith(self.root):
                return SimpleNamespace(f_bavail=10, f_frsize=4096)
            return real_statvfs(path)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "statvfs", statvfs)
        for name in ("copy_file_range", "sendfile"):
            if hasattr(os, name):
                real = vars(os)[name]
                monkeypatch.setattr(os, name, self._wrap(real))

    def _wrap(self, real: Any) -> Any:
        def call(a: int, b: int, *rest: Any) -> Any:
            self._check(b if real.__name__ == "copy_file_range" else a)
            return real(a, b, *rest)
        return call

    def _check(self, fd: int) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if not target.startswith(self.root):
            return
        if fd not in self.files:
            self.files.append(fd)
        if len(self.files) > self.after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _size(tensors: dict[str, Any], metadata: dict[str, str]) -> int:
    import safetensors.torch

    return len(safetensors.torch.save(tensors, metadata=metadata))


@pytest.mark.parametrize("numel", [16, 1 << 20], ids=["gathered", "kernel-copied"])
def test_one_file_says_needed_and_free(torch: ModuleType, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, numel: int) -> None:
    sd = {"w": torch.arange(numel, dtype=torch.float32), "b": torch.ones(3)}
    torch.save(sd, tmp_path / "m.pt")
    need = _size(sd, {"format": "pt", "source": "m.pt"})
    out = tmp_path / "out"
    out.mkdir()
    _FullDisk(monkeypatch, out)
    with pytest.raises(torchless.ConversionError) as info:
        torchless.convert(tmp_path / "m.pt", out / "m.safetensors", tree=False)
    assert f"needs {need:,} bytes, {FREE:,} free" in str(info.value)
    assert "No space left on device" in str(info.value)
    assert os.listdir(out) == []


def _shards(torch: ModuleType, root: Path) -> list[dict[str, Any]]:
    root.mkdir()
    shards = [{"a": torch.randn(64)}, {"b": torch.randn(32)}]
    from .._torchgen import save_bin_shards

    save_bin_shards(root, shards)
    return shards


def test_model_dir_into_a_new_directory(torch: ModuleType, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The second shard fails: both shards' bytes are needed, and the first one's count as
    free (they are released); the new output directory and its new parent are removed."""
    shards = _shards(torch, tmp_path / "m")
    sizes = [_size(sd, {"format": "pt", "source": f"pytorch_model-{k + 1:05d}-of-00002.bin"})
             for k, sd in enumerate(shards)]
    out = tmp_path / "new" / "out"
    _FullDisk(monkeypatch, tmp_path / "new", after=1)
    assert main(["convert", str(tmp_path / "m"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"needs {sum(sizes):,} bytes, {FREE + sizes[0]:,} free" in err, err
    assert not (tmp_path / "new").exists()


def test_failed_conversion_leaves_an_existing_directory(torch: ModuleType, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    _shards(torch, tmp_path / "m")
    out = tmp_path / "out"
    out.mkdir()
    _FullDisk(monkeypatch, out)
    with pytest.raises(torchless.ConversionError, match="No space left on device: the output"):
        torchless.convert(tmp_path / "m", out)
    assert out.is_dir() and os.listdir(out) == []


def test_other_errors_keep_their_words(torch: ModuleType, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    torch.save({"w": torch.ones(4)}, tmp_path / "m.pt")
    real = os.write

    def write(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(torchless.ConversionError, match=r"cannot write: Input/output error$"):
        torchless.convert(tmp_path / "m.pt", tmp_path / "m.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]
