"""Nothing is lost on failure: atomic outputs (``torchless.write.atomic``).

* a ``--force`` conversion of a Hugging Face layout that fails at any point (while writing,
  while verifying, at any publishing step) leaves the old index and shards byte for byte;
* a ``--force --verify`` conversion that fails verification keeps the old file;
* without ``force`` nothing is ever replaced, whichever way the file is published
  (``O_TMPFILE`` + ``linkat``, a named temporary file + ``link``, or, with no hard links, a
  reservation then a rename), even when the file appears while the output is written;
* a conversion killed with SIGKILL leaves no file of any name (``O_TMPFILE``), or only the
  documented hidden temporary file (the fallback), and never a partial DST.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless import ConversionError
from torchless.write import atomic as _atomic

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny.pt"
LINUX_TMPFILE = _atomic.TMPFILE


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file (hidden ones included) and its bytes."""
    return {p.name: p.read_bytes() for p in root.iterdir()}


def _hf_dir(torch: ModuleType, root: Path, seed: int) -> Path:
    """pytorch_model-0000K-of-00002.bin shards with their index; the tensors depend on seed."""
    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    shards = [{f"a{seed}": torch.randn(64, generator=g)},
              {f"b{seed}": torch.randn(64, generator=g)}]
    from .._torchgen import save_bin_shards

    save_bin_shards(root, shards)
    return root


class _FailAt:
    """Replaces the filesystem calls that publish files; the ``n``-th call fails."""

    NAMES = ("link", "replace", "rename")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        self.n = n
        self.calls = 0
        self.failed = False
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.n and not self.failed:
                self.failed = True
                raise OSError(errno.EIO, "Input/output error (injected)")
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("mode", ["tmpfile", "named"])
def test_failed_force_hf_conversion_keeps_the_old_output(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    _mode(mode, monkeypatch)
    out = tmp_path / "out"
    torchless.convert(_hf_dir(torch, tmp_path / "old", seed=1), out)
    old = _snapshot(out)
    assert sorted(old) == ["model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    new_src = _hf_dir(torch, tmp_path / "new", seed=2)

    # a failure while the second shard is written
    def interrupt(done: int, total: int) -> None:
        if done > total - 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        torchless.convert(new_src, out, force=True, progress=interrupt)
    assert _snapshot(out) == old

    # verification fails
    from torchless.conversion import hf as _hf

    def mismatch(*args: Any, **kwargs: Any) -> Any:
        return [], {"a2": "bytes differ"}, [], [], [], {}

    with monkeypatch.context() as m:
        m.setattr(_hf, "compare", mismatch)
        with pytest.raises(ConversionError, match="verification failed"):
            torchless.convert(new_src, out, force=True, verify=True)
    assert _snapshot(out) == old

    # each filesystem call of the publishing fails in turn: the run fails and leaves the old
    # output, or gets round the failure (another way to publish) and leaves the new one whole
    n, failures = 1, 0
    while True:
        with monkeypatch.context() as m:
            fail = _FailAt(m, n)
            try:
                torchless.convert(new_src, out, force=True)
            except ConversionError as e:
                assert "Input/output error (injected)" in str(e)
                assert _snapshot(out) == old, f"call {n} failed"
                failures += 1
            else:
                new = _snapshot(out)
                assert set(new) == set(old) and new != old, f"call {n} failed"
                assert torchless.verify(new_src, out).ok
                for p in out.iterdir():
                    p.unlink()
                for name, data in old.items():
                    (out / name).write_bytes(data)
        if not fail.failed:
            break  # every call has failed once: the last run met no failure
        n += 1
    assert failures >= 3, failures


def test_force_hf_publishes_the_index_after_hiding_the_old_one(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At each step a reader sees the old set, no index, or the new set: never an index
    naming a shard that is missing or not yet the one it describes."""
    out = tmp_path / "out"
    torchless.convert(_hf_dir(torch, tmp_path / "old", seed=1), out)
    new_src = _hf_dir(torch, tmp_path / "new", seed=2)
    index = out / "model.safetensors.index.json"
    old_index = index.read_bytes()
    seen: list[tuple[bool, bool]] = []  # (the old index is visible, all shards are old)
    old_shards = {p.name: p.read_bytes() for p in out.glob("*.safetensors")}
    real_link = os.link

    def watch(*args: Any, **kwargs: Any) -> None:
        visible = index.exists() and index.read_bytes() == old_index
        shards_old = all((out / n).exists() and (out / n).read_bytes() == b
                         for n, b in old_shards.items())
        seen.append((visible, shards_old))
        real_link(*args, **kwargs)

    monkeypatch.setattr(os, "link", watch)
    torchless.convert(new_src, out, force=True)
    assert seen and all(shards_old for visible, shards_old in seen if visible), seen
    assert index.read_bytes() != old_index and torchless.verify(new_src, out).ok


def test_failed_verify_keeps_the_replaced_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.conversion import api as _convert

    dst = tmp_path / "tiny.safetensors"
    dst.write_bytes(b"the previous output")
    real = _convert.compare

    def mismatch(*args: Any, **kwargs: Any) -> Any:
        matched, _, missing, extra, skipped, aliases = real(*args, **kwargs)
        return matched[1:], {matched[0]: "bytes differ"}, missing, extra, skipped, aliases

    monkeypatch.setattr(_convert, "compare", mismatch)
    with pytest.raises(ConversionError, match="verification failed") as info:
        torchless.convert(TINY, dst, force=True, verify=True)
    assert info.value.path == str(dst)
    assert _snapshot(tmp_path) == {"tiny.safetensors": b"the previous output"}
    monkeypatch.setattr(_convert, "compare", real)
    report = torchless.convert(TINY, dst, force=True, verify=True)
    assert report.verified is not None and report.verified.ok
    assert report.verified.dst == str(dst) and report.dst == str(dst)
    assert list(_snapshot(tmp_path)) == ["tiny.safetensors"]
    assert torchless.verify(TINY, dst).ok


# ---- publishing without force never replaces ---------------------------------------------

_MODES = ["tmpfile", "named", "named-no-links", "tmpfile-no-links"]


def _mode(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode.startswith("tmpfile") and not LINUX_TMPFILE:
        pytest.skip("no O_TMPFILE on this platform")
    monkeypatch.setattr(_atomic, "TMPFILE", mode.startswith("tmpfile"))
    if mode.endswith("no-links"):
        def no_links(*args: Any, **kwargs: Any) -> None:
            raise PermissionError(errno.EPERM, "Operation not permitted (no hard links)")

        monkeypatch.setattr(os, "link", no_links)


@pytest.mark.parametrize("mode", _MODES)
def test_a_file_that_appears_while_writing_is_never_replaced(
        mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mode(mode, monkeypatch)
    dst = tmp_path / "tiny.safetensors"

    def appear(done: int, total: int) -> None:
        if not dst.exists():
            dst.write_bytes(b"someone else's file")

    with pytest.raises(ConversionError, match="exists") as info:
        torchless.convert(TINY, dst, progress=appear)
    assert info.value.hint is not None and "--force" in info.value.hint
    assert _snapshot(tmp_path) == {"tiny.safetensors": b"someone else's file"}
    # and the same way of publishing works when nothing is in the way
    dst.unlink()
    torchless.convert(TINY, dst)
    assert list(_snapshot(tmp_path)) == ["tiny.safetensors"]
    assert torchless.verify(TINY, dst).ok
    # force replaces, in every mode
    dst.write_bytes(b"old")
    torchless.convert(TINY, dst, force=True)
    assert list(_snapshot(tmp_path)) == ["tiny.safetensors"] and torchless.verify(TINY, dst).ok


def test_the_reservation_is_checked_before_the_rename(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No hard links: a file renamed over the reservation before the final rename is kept."""
    _mode("named-no-links", monkeypatch)
    dst = tmp_path / "out.bin"
    real_lstat = os.lstat

    def swap(path: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fspath(path) == str(dst) and dst.exists() and dst.stat().st_size == 0:
            other = tmp_path / "other"
            other.write_bytes(b"renamed over the reservation")
            os.replace(other, dst)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", swap)
    with pytest.raises(ConversionError, match="exists"), \
            _atomic.Output(str(dst), force=False) as out:
        out.write(b"mine")
        out.finish()
        _atomic.commit([out], force=False)
    assert _snapshot(tmp_path) == {"out.bin": b"renamed over the reservation"}


@pytest.mark.skipif(not LINUX_TMPFILE, reason="no O_TMPFILE on this platform")
def test_tmpfile_writes_leave_no_name_until_published(tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    with _atomic.Output(str(dst), force=False) as out:
        out.write(b"hello")
        out.finish()
        assert out.temp is None and list(tmp_path.iterdir()) == []
        with open(out.path, "rb") as f:
            assert f.read() == b"hello"
        _atomic.commit([out], force=False)
    assert _snapshot(tmp_path) == {"out.bin": b"hello"}
    with _atomic.Output(str(dst), force=True) as out:
        out.write(b"second")
        out.finish()
    assert _snapshot(tmp_path) == {"out.bin": b"hello"}  # never committed: nothing changes


def test_save_keeps_the_old_file_on_failure(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    np = pytest.importorskip("numpy")
    from torchless.write import safetensors as _safetensors

    path = tmp_path / "state.safetensors"
    torchless.save({"step": 1, "w": np.ones(4, dtype=np.float32)}, path)
    before = _snapshot(tmp_path)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_safetensors, "_write_tensor", disk_full)
    with pytest.raises(ConversionError, match="No space left"):
        torchless.save({"step": 2, "w": np.zeros(4, dtype=np.float32)}, path)
    assert _snapshot(tmp_path) == before
    assert torchless.load(path)["step"] == 1


# ---- SIGKILL ------------------------------------------------------------------------------


@pytest.mark.parametrize("tmpfile", [True, False], ids=["tmpfile", "named"])
@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_sigkill_mid_conversion(torch: ModuleType, tmp_path: Path, tmpfile: bool,
                                force: bool) -> None:
    if tmpfile and not LINUX_TMPFILE:
        pytest.skip("no O_TMPFILE on this platform")
    src = tmp_path / "big.pt"
    # strided, so it is copied in chunks; the callback holds the child mid-write
    torch.save({"w": torch.ones(3000, 3000, dtype=torch.float32).t()}, src)
    dst = tmp_path / "big.safetensors"
    if force:
        dst.write_bytes(b"the previous output")
    code = textwrap.dedent(f"""
        import sys, torchless
        from torchless.write import atomic as _atomic
        _atomic.TMPFILE = {tmpfile!r}
        def progress(done, total):
            if done > (1 << 20):
                print("started", flush=True)
                sys.stdin.readline()
        torchless.convert({str(src)!r}, force={force!r}, progress=progress)
    """)
    before = sorted(os.listdir(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stdin=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
            during = sorted(os.listdir(tmp_path))
            open_files = [os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                          for fd in os.listdir(f"/proc/{proc.pid}/fd")] if LINUX_TMPFILE else []
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    after = sorted(os.listdir(tmp_path))
    assert (dst.read_bytes() == b"the previous output") if force else not dst.exists()
    if tmpfile:
        assert during == before and after == before, (during, after)
        # the bytes were going to an unnamed file in DST's directory
        assert any(f.startswith(str(tmp_path) + "/#") and f.endswith("(deleted)")
                   for f in open_files), open_files
    else:  # the documented fallback: a hidden temporary file is all a SIGKILL leaves
        left = [n for n in after if n not in before]
        assert len(left) == 1 and left[0].startswith(".big.safetensors.") and \
            left[0].endswith(".tmp"), after
