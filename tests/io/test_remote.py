"""Remote checkpoints: range reads over HTTP (a local server that counts what it sends) and
fsspec URLs. Oracles: the same file read locally (itself checked against torch elsewhere),
torch.load, and the server's own byte and request counts.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from benchmarks.range_server import RangeServer, serve

import torchless

pytestmark = pytest.mark.torch

MiB = 1 << 20


@pytest.fixture
def served(tmp_path: Path) -> Iterator[RangeServer]:
    yield from serve(tmp_path)


def _big_checkpoint(torch: ModuleType, path: Path, mib: int = 104, count: int = 52) -> dict:
    g = torch.Generator().manual_seed(0)
    per = mib * MiB // count // 4
    sd = {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(count)}
    sd["layers.0.bias"] = torch.arange(7, dtype=torch.bfloat16)
    torch.save({"model": sd, "epoch": 7, "lr": [0.1, 0.01]}, path)
    return sd


def test_inspect_reads_under_one_percent(torch: ModuleType, tmp_path: Path,
                                         served: RangeServer) -> None:
    sd = _big_checkpoint(torch, tmp_path / "big.pt")
    size = (tmp_path / "big.pt").stat().st_size
    assert size >= 100 * MiB
    with torchless.open(served.url + "big.pt") as ckpt:
        assert ckpt.format == "zip"
        assert list(ckpt.tensors) == [f"model.{k}" for k in sd]
        assert ckpt.tensors["model.layers.3.weight"].shape == tuple(sd["layers.3.weight"].shape)
        assert ckpt.tree["epoch"] == 7
        requests, sent = served.requests, served.sent
        # one tensor on demand: its bytes (and its local header), no more
        arr = ckpt.tensors["model.layers.3.weight"].numpy()
        assert arr.tobytes() == sd["layers.3.weight"].numpy().tobytes()
        one = sd["layers.3.weight"].numel() * 4
        assert served.sent - sent <= one + 2 * 64 * 1024
    assert sent < size / 100, f"{sent} bytes read to open a {size}-byte checkpoint"
    assert requests <= 8, requests


def test_remote_convert_equals_local(torch: ModuleType, tmp_path: Path,
                                     served: RangeServer) -> None:
    _big_checkpoint(torch, tmp_path / "m.pt", mib=12, count=6)
    local = torchless.convert(tmp_path / "m.pt", tmp_path / "local.safetensors")
    size = (tmp_path / "m.pt").stat().st_size
    before = served.sent
    torchless.convert(served.url + "m.pt", tmp_path / "once.safetensors")
    # every byte once, plus the end records, the central directory and data.pkl: no byte of
    # a tensor is fetched twice (the block read with each local header is reused)
    assert served.sent - before <= size + 4 * 64 * 1024, (served.sent - before, size)
    remote = torchless.convert(served.url + "m.pt", tmp_path / "remote.safetensors",
                               verify=True)
    assert remote.verified is not None and remote.verified.ok
    assert (tmp_path / "remote.safetensors").read_bytes() == \
        (tmp_path / "local.safetensors").read_bytes()
    assert local.tensors == remote.tensors == 7


def test_remote_legacy_and_numpy_values(torch: ModuleType, tmp_path: Path,
                                        served: RangeServer) -> None:
    saved = {"a": torch.arange(10, dtype=torch.int16), "b": torch.ones(3, 4).t(),
             "meta": {"step": 3}}
    torch.save(saved, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    torch.save(saved, tmp_path / "new.pt")
    for name in ("old.pt", "new.pt"):
        got = torchless.load(served.url + name)
        assert got["meta"] == {"step": 3}
        for k in ("a", "b"):
            assert np.array_equal(got[k], saved[k].numpy()), (name, k)


def test_server_without_range_is_downloaded_or_refused(torch: ModuleType,
                                                       tmp_path: Path) -> None:
    """Up to Limits.max_download_bytes the one answer's body is the download (one request);
    above it, refused (test_remote_download.py has the rest)."""
    torch.save({"w": torch.ones(1000)}, tmp_path / "m.pt")
    for server in serve(tmp_path, ranges=False):
        with torchless.open(server.url + "m.pt") as ckpt:
            assert ckpt.tensors["w"].numpy().tolist() == [1.0] * 1000
        assert server.requests == 1
        with pytest.raises(torchless.LimitError, match="ignores Range"):
            torchless.open(server.url + "m.pt", limits=torchless.Limits(max_download_bytes=100))
        assert server.requests == 2


def test_missing_remote_file(served: RangeServer) -> None:
    with pytest.raises(torchless.CheckpointError, match="404"):
        torchless.open(served.url + "nope.pt")


def test_fsspec_url_and_file_object(torch: ModuleType, tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    sd = {"w": torch.randn(5, 3), "v": torch.arange(4)}
    torch.save(sd, tmp_path / "m.pt")
    fs = fsspec.filesystem("memory")
    fs.pipe("/torchless-test/m.pt", (tmp_path / "m.pt").read_bytes())
    try:
        with torchless.open("memory://torchless-test/m.pt") as ckpt:
            assert np.array_equal(ckpt.tensors["w"].numpy(), sd["w"].numpy())
        with fs.open("/torchless-test/m.pt", "rb") as f, torchless.open(f) as ckpt:
            assert np.array_equal(ckpt.tensors["v"].numpy(), sd["v"].numpy())
    finally:
        fs.rm("/torchless-test", recursive=True)


@pytest.mark.filterwarnings("ignore")
def test_s3_through_moto(torch: ModuleType, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://{host}:{port}"})
        fs.mkdir("ckpts")
        sd = _big_checkpoint(torch, tmp_path / "m.pt", mib=24, count=12)
        fs.put(str(tmp_path / "m.pt"), "ckpts/m.pt")
        size = (tmp_path / "m.pt").stat().st_size
        with torchless.open("s3://ckpts/m.pt") as ckpt:
            assert list(ckpt.tensors) == [f"model.{k}" for k in sd]
            stats = ckpt._source.stats  # type: ignore[attr-defined]
            assert stats.bytes < size / 100 and stats.requests <= 8, stats
            w = ckpt.tensors["model.layers.2.weight"].numpy()
            assert w.tobytes() == sd["layers.2.weight"].numpy().tobytes()
        torchless.convert("s3://ckpts/m.pt", tmp_path / "s3.safetensors")
        torchless.convert(tmp_path / "m.pt", tmp_path / "local.safetensors")
        assert (tmp_path / "s3.safetensors").read_bytes() == \
            (tmp_path / "local.safetensors").read_bytes()
        with fs.open("ckpts/m.pt", "rb") as f:
            assert torchless.load(f)["epoch"] == 7
    finally:
        server.stop()


def test_scan_and_inspect_cli_remote(torch: ModuleType, tmp_path: Path, served: RangeServer,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.cli.main import main

    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pt")
    (tmp_path / "evil.pkl").write_bytes(
        b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    report = torchless.scan(served.url + "evil.pkl")
    assert [f.status for f in report.files] == ["dangerous"] and report.exit_code == 1
    assert torchless.scan(served.url + "ok.pt").exit_code == 0
    assert main(["inspect", served.url + "ok.pt", "--json"]) == 0
    assert '"w"' in capsys.readouterr().out


# ---- the ZIP checks do not depend on where the bytes come from -------------------------------

def _stored_zip(members: list[tuple[str, bytes]], *, gap_after: str | None = None,
                swallow: str | None = None) -> bytes:
    """A plain stored ZIP of ``members``, in order (the layout of APPNOTE 4.3.6, written out
    here): ``gap_after`` puts 16 bytes that no member owns after that member's data;
    ``swallow`` makes that member's declared size (local and central alike) run 30 bytes
    into the next member, so the two overlap."""
    out = bytearray()
    central = []
    for name, data in members:
        raw = name.encode()
        offset = len(out)
        size = len(data) + (30 if name == swallow else 0)
        crc = zlib.crc32(data)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, size,
                           size, len(raw), 0) + raw + data
        central.append(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0,
                                   0x21, crc, size, size, len(raw), 0, 0, 0, 0, 0, offset)
                       + raw)
        if name == gap_after:
            out += bytes(16)
    cd = b"".join(central)
    cd_off = len(out)
    out += cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members),
                            len(cd), cd_off, 0)
    return bytes(out)


def test_remote_zip_gets_the_gap_and_overlap_checks(torch: ModuleType, tmp_path: Path,
                                                   served: RangeServer) -> None:
    """Bytes that no member owns, and members that share bytes, are refused in a remote
    archive as in a local one (the ZIP reader skipped both checks for remote files). A
    remote archive's local headers are read only when their member is read, so a gap after
    a member is refused when that member is read: here by load(), which reads data.pkl, the
    records and every tensor; an overlap, which the central directory shows, at open."""
    torch.save({"a": torch.arange(6.0), "b": torch.ones(3)}, tmp_path / "m.pt")
    with zipfile.ZipFile(tmp_path / "m.pt") as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    (tmp_path / "plain.pt").write_bytes(_stored_zip(members))
    for where in (tmp_path / "plain.pt", served.url + "plain.pt"):
        assert sorted(torchless.load(where)) == ["a", "b"]
    read_by_load = [f"m/{record}" for record in ("data.pkl", "byteorder", "data/0", "data/1")]
    assert set(read_by_load) < {name for name, _ in members}
    for name in read_by_load:
        for trick, match in (("gap_after", "unaccounted bytes"), ("swallow", "overlap")):
            path = tmp_path / f"{trick}-{name.replace('/', '_')}.pt"
            path.write_bytes(_stored_zip(members, **{trick: name}))
            with pytest.raises(torchless.AmbiguousArchiveError, match=match):
                torchless.open(path)
            with pytest.raises(torchless.AmbiguousArchiveError, match=match):
                torchless.load(served.url + path.name)
            if trick == "swallow":
                with pytest.raises(torchless.AmbiguousArchiveError, match=match):
                    torchless.open(served.url + path.name)
