"""Issue 26, row 13: an HTTP server that ignores ``Range`` (the standard library's
``http.server``, as ``python -m http.server`` runs it) serves a checkpoint that torchless
downloads whole, to an unnamed temporary file, and then reads: up to
``Limits.max_download_bytes`` (64 MiB) on its own, any size with ``allow_full_download=True``
/ ``--download``; a larger file is refused with a LimitError naming both ways. Oracles:
torch.load of the same file, the local conversion's bytes, the Content-Length the server
sends."""

from __future__ import annotations

import functools
import gc
import itertools
import os
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.io.remote import download_progress

from .._httpd import serving as _run

pytestmark = pytest.mark.torch


class _Quiet(SimpleHTTPRequestHandler):
    """The standard library's file server (no Range support), without its log lines."""

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[str]:
    yield from _run(ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        _Quiet, directory=str(tmp_path))))


def _checkpoint(torch: ModuleType, path: Path) -> dict:
    sd = {"w": torch.arange(2048, dtype=torch.float32).reshape(32, 64),
          "b": torch.ones(5, dtype=torch.bfloat16), "epoch": 3}
    torch.save(sd, path)
    return sd


def _fds() -> int:
    gc.collect()  # arrays of a load are views of the map, which holds a descriptor
    return len(os.listdir("/proc/self/fd"))


def test_plain_server_small_file_reads(torch: ModuleType, tmp_path: Path, plain: str) -> None:
    """A 10 KB file: every reader takes it, as from the local file."""
    sd = _checkpoint(torch, tmp_path / "m.pt")
    assert 8_000 < (tmp_path / "m.pt").stat().st_size < 64 << 20
    got = torchless.load(plain + "m.pt")
    assert np.array_equal(got["w"], sd["w"].numpy()) and got["epoch"] == 3
    assert np.array_equal(got["b"].astype(np.float32), sd["b"].float().numpy())
    with torchless.open(plain + "m.pt") as ckpt:
        assert sorted(ckpt.tensors) == ["b", "w"]
    local = torchless.convert(tmp_path / "m.pt", tmp_path / "local.safetensors")
    remote = torchless.convert(plain + "m.pt", tmp_path / "remote.safetensors")
    assert remote.tensors == local.tensors == 2
    assert (tmp_path / "remote.safetensors").read_bytes() == (
        tmp_path / "local.safetensors").read_bytes()
    assert torchless.scan(plain + "m.pt").exit_code == 0


def test_progress_and_cleanup(torch: ModuleType, tmp_path: Path, plain: str) -> None:
    _checkpoint(torch, tmp_path / "m.pt")
    size = (tmp_path / "m.pt").stat().st_size
    seen: list[tuple[int, int]] = []
    before = _fds()
    token = download_progress.set(lambda done, total: seen.append((done, total)))
    try:
        torchless.load(plain + "m.pt")
    finally:
        download_progress.reset(token)
    assert seen and seen[-1] == (size, size)
    assert all(a <= b for (a, _), (b, _) in itertools.pairwise(seen))
    assert _fds() == before  # the temporary file is closed with the source


def test_threshold_and_allow_full_download(torch: ModuleType, tmp_path: Path, plain: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    sd = _checkpoint(torch, tmp_path / "m.pt")
    size = (tmp_path / "m.pt").stat().st_size
    small = torchless.Limits(max_download_bytes=size - 1)
    with pytest.raises(torchless.LimitError, match="max_download_bytes") as info:
        torchless.open(plain + "m.pt", limits=small)
    assert "--download" in (info.value.hint or "") and f"{size:,} bytes" in str(info.value)
    assert info.value.limit == size - 1 and info.value.actual == size
    got = torchless.load(plain + "m.pt", limits=small, allow_full_download=True)
    assert np.array_equal(got["w"], sd["w"].numpy())
    assert torchless.Limits(max_download_bytes=size).max_download_bytes == size
    torchless.open(plain + "m.pt", limits=torchless.Limits(max_download_bytes=size)).close()
    with pytest.raises(torchless.LimitError):
        torchless.convert(plain + "m.pt", tmp_path / "x.safetensors", limits=small)
    assert not (tmp_path / "x.safetensors").exists()
    torchless.convert(plain + "m.pt", tmp_path / "x.safetensors", limits=small,
                      allow_full_download=True)
    limit = ["--limit", f"max_download_bytes={size - 1}"]
    assert main(["inspect", plain + "m.pt", *limit]) == 1
    assert "--download" in capsys.readouterr().err
    for flag in ("--download", "--allow-full-download"):
        assert main(["inspect", plain + "m.pt", *limit, flag, "-q"]) == 0
    assert main(["scan", plain + "m.pt", *limit, "--download", "-q"]) == 0


class _Lying(BaseHTTPRequestHandler):
    """Ignores Range; ``/short`` says a Content-Length longer than its body, ``/unsaid``
    sends no Content-Length (the body ends when the connection closes)."""

    body = b""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        if self.path == "/short":
            self.send_header("Content-Length", str(len(self.body) + 100))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(self.body)
        self.close_connection = True


def test_short_and_unsaid_bodies(torch: ModuleType, tmp_path: Path) -> None:
    _checkpoint(torch, tmp_path / "m.pt")
    body = (tmp_path / "m.pt").read_bytes()
    handler = type("Handler", (_Lying,), {"body": body})
    for url in _run(ThreadingHTTPServer(("127.0.0.1", 0), handler)):
        before = _fds()
        with pytest.raises(torchless.TruncatedInputError,
                           match=f"sent {len(body)} of the {len(body) + 100} bytes"):
            torchless.open(url + "short")
        assert _fds() == before
        got = torchless.load(url + "unsaid")  # length unknown: read until the end
        assert got["epoch"] == 3
        del got
        with pytest.raises(torchless.LimitError, match="more than 1,000 bytes"):
            torchless.open(url + "unsaid", limits=torchless.Limits(max_download_bytes=1000))
        assert _fds() == before


def test_cli_download_line_on_a_terminal(torch: ModuleType, tmp_path: Path, plain: str,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the command draws the download (bytes of the Content-Length) and wipes
    the line; in a pipe (the other tests) nothing is drawn."""
    import torchless.cli.progress as progress

    _checkpoint(torch, tmp_path / "m.pt")
    size = (tmp_path / "m.pt").stat().st_size
    monkeypatch.setattr(progress, "progress_wanted", lambda quiet, stream=None: not quiet)
    monkeypatch.setattr(progress, "_FIRST_DRAW", 0.0)
    assert main(["inspect", plain + "m.pt"]) == 0
    err = capsys.readouterr().err
    assert "downloading (the server ignores Range)" in err and "100.0%" in err
    assert err.rstrip(" ").endswith("\r")  # wiped
    from torchless.cli.show import human

    assert f"{human(size)} / {human(size)}" in err
    assert main(["inspect", plain + "m.pt", "-q"]) == 0
    assert capsys.readouterr().err == ""
