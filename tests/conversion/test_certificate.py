"""The conversion certificate (``convert --certificate``) and ``verify --certificate OUT
[SRC]``: the digests recorded are hashlib's BLAKE2b of torch's own tensor bytes (and of
``tensor.to(dtype)`` for a cast), the source's sha256 is hashlib's of the file; one flipped
byte of one tensor fails, naming it; a faithful re-conversion passes; a changed source fails
with SRC; a model directory has one certificate per shard."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests._dcpfixture import dcp_cases
from torchless.cli.main import main
from torchless.cli.parser import EXIT_USAGE
from torchless.errors import FormatError

__all__ = ["dcp_cases"]

pytestmark = pytest.mark.torch

KEY = "torchless.certificate"


def _b2(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _bytes(torch: Any, t: Any) -> bytes:
    """torch's logical bytes of a tensor: contiguous, C order, little-endian (x86)."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def _header(path: Path) -> tuple[dict[str, Any], int]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), 8 + n


def _certificate(path: Path) -> dict[str, Any]:
    header, _ = _header(path)
    doc: dict[str, Any] = json.loads(header["__metadata__"][KEY])
    return doc


def _flip(path: Path, name: str, at: int = 0) -> None:
    """Flip the bits of one byte of tensor ``name``'s data in the safetensors file."""
    header, start = _header(path)
    begin = header[name]["data_offsets"][0]
    with path.open("r+b") as f:
        f.seek(start + begin + at)
        b = f.read(1)
        f.seek(start + begin + at)
        f.write(bytes([b[0] ^ 0xFF]))


def _state(torch: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(40, 30, generator=g)
    return {"w": base, "wt": base.t(), "b": torch.randn(7, generator=g, dtype=torch.float64),
            "h": torch.randn(5, generator=g).half(), "i": torch.arange(6),
            "big": torch.randn(300_000, generator=g), "m": torch.tensor([True, False])}


def test_digests_are_blake2b_of_torchs_bytes(torch: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    sd = _state(torch)
    torch.save({"state_dict": sd, "epoch": 4}, src)
    torchless.convert(src, out, key="state_dict", certificate=True)
    doc = _certificate(out)
    assert doc["schema"] == 1 and doc["digest"] == "blake2b-128"
    assert doc["torchless"] == torchless.__version__
    assert doc["sources"] == [{"path": str(src), "size": src.stat().st_size,
                               "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}]
    assert doc["transforms"]["key"] == "state_dict" and doc["transforms"]["dtype"] is None
    assert set(doc["tensors"]) == set(sd)
    for name, t in sd.items():
        rec = doc["tensors"][name]
        assert rec["src"] == rec["out"] == _b2(_bytes(torch, t)), name
        assert rec["from"] == f"state_dict.{name}"
    # the output is still what safetensors reads, equal to torch's tensors
    from safetensors.torch import load_file

    got = load_file(out)
    assert all(torch.equal(got[n], t) for n, t in sd.items())
    report = torchless.verify_certificate(out)
    assert report.ok and sorted(report.matched) == sorted(sd)
    assert torchless.verify_certificate(out, src).ok


def test_one_flipped_byte_fails_naming_the_tensor(torch: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    sd = _state(torch)
    torch.save(sd, src)
    assert main(["convert", str(src), "-o", str(out), "--certificate", "-q"]) == 0
    assert main(["verify", "--certificate", str(out)]) == 0
    _flip(out, "big", at=123_457)
    report = torchless.verify_certificate(out)
    assert not report.ok
    assert list(report.mismatched) == ["big"]
    assert sorted(report.matched) == sorted(n for n in sd if n != "big")
    capsys.readouterr()
    assert main(["verify", "--certificate", str(out), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and list(doc["mismatched"]) == ["big"]
    # with the source, too (the output's bytes are checked either way)
    assert list(torchless.verify_certificate(out, src).mismatched) == ["big"]


def test_a_faithful_reconversion_passes(torch: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    torch.save({"model": _state(torch), "step": 9}, src)
    report = torchless.convert(src, out, certificate=True, verify=True)  # the object tree too
    assert report.verified is not None and report.verified.ok
    assert torchless.verify(src, out).ok
    first = out.read_bytes()
    torchless.convert(src, out, certificate=True, force=True)
    assert out.read_bytes() == first  # deterministic, digests included
    assert main(["verify", "--certificate", str(out), str(src), "-q"]) == 0


def test_a_changed_source_fails_with_src(torch: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    sd = _state(torch)
    torch.save(sd, src)
    torchless.convert(src, out, certificate=True)
    sd["w"] = sd["w"].clone()
    sd["w"][3, 4] += 1.0
    sd["wt"] = sd["w"].t()
    torch.save(sd, src)
    assert torchless.verify_certificate(out).ok  # the output alone is intact
    report = torchless.verify_certificate(out, src)
    assert not report.ok
    assert set(report.mismatched) == {"w", "wt", "(source m.pt)"}
    assert "sha256" in report.mismatched["(source m.pt)"]
    assert main(["verify", "--certificate", str(out), str(src), "-q"]) == 1


@pytest.mark.parametrize(("flag", "name"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_the_certificate_of_a_cast(torch: Any, tmp_path: Path, flag: str, name: str) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    sd = _state(torch)
    torch.save(sd, src)
    torchless.convert(src, out, dtype=flag, dtype_filter=["w*", "big", "i"],
                      certificate=True)
    doc = _certificate(out)
    assert doc["transforms"]["dtype"] == {"bf16": "BF16", "fp16": "F16"}[flag]
    assert doc["transforms"]["dtype_filter"] == ["w*", "big", "i"]
    target = getattr(torch, name)
    for n, t in sd.items():
        rec = doc["tensors"][n]
        cast = n in ("w", "wt", "big")  # i is an integer tensor: kept
        want = t.to(target) if cast else t
        assert rec["src"] == _b2(_bytes(torch, t)), n
        assert rec["out"] == _b2(_bytes(torch, want)), n
        assert (rec["src"] != rec["out"]) == cast, n
    assert torchless.verify_certificate(out, src).ok
    _flip(out, "wt")
    assert list(torchless.verify_certificate(out, src).mismatched) == ["wt"]


def test_selection_and_renames_are_recorded_and_replayed(torch: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    sd = _state(torch)
    torch.save({"state_dict": {f"model.{k}": v for k, v in sd.items()}}, src)
    torchless.convert(src, out, key="state_dict", include="model.w*", strip_prefix="model.",
                      rename="s/^/enc./", certificate=True)
    doc = _certificate(out)
    t = doc["transforms"]
    assert (t["include"], t["strip_prefix"], t["rename"]) == (["model.w*"], "model.",
                                                              ["s/^/enc./"])
    assert {n: r["from"] for n, r in doc["tensors"].items()} == {
        "enc.w": "state_dict.model.w", "enc.wt": "state_dict.model.wt"}
    assert torchless.verify_certificate(out, src).ok
    # a source whose names no longer give the recorded ones
    torch.save({"state_dict": {f"net.{k}": v for k, v in sd.items()}}, src)
    with pytest.raises(torchless.ConversionError):
        torchless.verify_certificate(out, src)  # include matches nothing: refused by name


def test_arrays_of_the_object_tree(torch: Any, tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    rng = np.arange(12, dtype=np.uint32).reshape(3, 4)
    torch.save({"w": torch.ones(3), "rng": rng}, src)
    torchless.convert(src, out, certificate=True)
    doc = _certificate(out)
    trees = {n: r for n, r in doc["tensors"].items() if r.get("tree")}
    assert len(trees) == 1
    (rec,) = trees.values()
    assert rec["src"] == rec["out"] == _b2(rng.tobytes())
    assert torchless.verify_certificate(out, src).ok


def test_a_model_directory_has_one_certificate_per_shard(torch: Any, tmp_path: Path) -> None:
    from tests.conversion.test_convert_hf import _hf_dir
    from tests.conversion.test_convert_hf import _state as _hf_state

    shards = [_hf_state(torch, 4, seed=1), _hf_state(torch, 3, seed=2)]
    shards[1] = {k.replace("layer", "head"): v for k, v in shards[1].items()}
    root = _hf_dir(torch, tmp_path / "model", shards)
    out = tmp_path / "out"
    torchless.convert(root, out, certificate=True)
    for k, sd in enumerate(shards):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        doc = _certificate(out / name)
        source = root / f"pytorch_model-{k + 1:05d}-of-00002.bin"
        assert doc["sources"] == [{"path": str(source), "size": source.stat().st_size,
                                   "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}]
        assert {n: r["src"] for n, r in doc["tensors"].items()} == {
            n: _b2(_bytes(torch, t)) for n, t in sd.items()}
    assert torchless.verify_certificate(out).ok
    assert torchless.verify_certificate(out, root).ok
    assert main(["verify", "--certificate", str(out / "model.safetensors.index.json"),
                 str(root / "pytorch_model.bin.index.json"), "-q"]) == 0
    victim = sorted(shards[1])[0]
    _flip(out / "model-00002-of-00002.safetensors", victim)
    report = torchless.verify_certificate(out)
    assert list(report.mismatched) == [f"model-00002-of-00002.safetensors: {victim}"]


def test_resharded_outputs_record_each_tensors_source(torch: Any, tmp_path: Path) -> None:
    from tests.conversion.test_convert_hf import _hf_dir
    from tests.conversion.test_convert_hf import _state as _hf_state

    shards = [_hf_state(torch, 4, seed=1, numel=64),
              {f"x.{k}": v for k, v in _hf_state(torch, 4, seed=2, numel=64).items()}]
    root = _hf_dir(torch, tmp_path / "model", shards)
    out = tmp_path / "out"
    torchless.convert(root, out, certificate=True, max_shard_size=3 * 256)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) == 3
    mixed = _certificate(out / files[1])  # tensors of both source shards
    assert [os.path.basename(s["path"]) for s in mixed["sources"]] == [
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert {r["file"] for r in mixed["tensors"].values()} == {0, 1}
    assert torchless.verify_certificate(out, root).ok


def test_a_dcp_source(dcp_cases: Path, tmp_path: Path, torch: Any) -> None:
    out = tmp_path / "out.safetensors"
    torchless.convert(dcp_cases / "single", out, certificate=True)
    doc = _certificate(out)
    (source,) = doc["sources"]
    files = {f["name"]: f for f in source["files"]}
    assert ".metadata" in files
    for name, f in files.items():
        data = (dcp_cases / "single" / name).read_bytes()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    ref = torch.load(dcp_cases / "single.pt", weights_only=False)
    from tests._dcpfixture import flat

    want = {k: v for k, v in flat(ref).items() if isinstance(v, torch.Tensor)}
    for name, t in want.items():
        assert doc["tensors"][name]["src"] == _b2(_bytes(torch, t)), name
    assert torchless.verify_certificate(out, dcp_cases / "single").ok


def test_a_url_records_the_servers_validators(tmp_path: Path, torch: Any) -> None:
    from benchmarks.range_server import serve

    served = tmp_path / "served"
    served.mkdir()
    torch.save({"w": torch.arange(10.0)}, served / "m.pt")
    for server in serve(served):
        out = tmp_path / "w.safetensors"
        url = server.url + "m.pt"
        torchless.convert(url, out, certificate=True)
        (source,) = _certificate(out)["sources"]
        st = (served / "m.pt").stat()
        assert source["url"] == url and source["size"] == st.st_size
        assert source["etag"] == f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        assert "sha256" not in source and source["last_modified"]
        assert torchless.verify_certificate(out, url).ok
        torch.save({"w": torch.arange(10.0) + 1}, served / "m.pt")  # a new version
        os.utime(served / "m.pt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        report = torchless.verify_certificate(out, url)
        assert set(report.mismatched) == {"w", "(source m.pt)"}
        assert "etag" in report.mismatched["(source m.pt)"]


def test_no_certificate_and_usage(torch: Any, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    torch.save({"w": torch.ones(2)}, src)
    torchless.convert(src, out)
    header, _ = _header(out)
    assert KEY not in header["__metadata__"]  # off by default
    with pytest.raises(FormatError, match="no torchless certificate"):
        torchless.verify_certificate(out)
    assert main(["verify", "--certificate", str(out)]) == 1
    assert "--certificate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["verify", "--certificate", str(out), str(src), "--key", "w"])
    assert e.value.code == EXIT_USAGE
    with pytest.raises(SystemExit) as e:
        main(["verify", str(src)])
    assert e.value.code == EXIT_USAGE


@pytest.mark.parametrize("text", [
    "[", "{}", "[" * 5000 + "]" * 5000, '{"schema": 1, "digest": "sha1"}',
    '{"schema": 1, "digest": "blake2b-128", "sources": [], "transforms": {}, "tensors": {}}',
    "TENSOR:" + json.dumps({"src": "x", "out": 1}),
    "TENSOR:" + json.dumps({"src": "0" * 32, "out": "0" * 32, "file": "a"}),
    "TENSOR:" + json.dumps({"src": "0" * 32, "out": "0" * 32, "file": -1}),
    "SOURCES:" + json.dumps([{"path": "m.pt", "files": 3}]),
    "SOURCES:" + json.dumps([{"size": 3}]),
    "TRANSFORMS:" + json.dumps({"include": 5}),
    "TRANSFORMS:" + json.dumps({"dtype_filter": [None]}),
    "TRANSFORMS:" + json.dumps({"dtype": "F64"}),
])
def test_a_malformed_certificate_is_refused_by_our_errors(torch: Any, tmp_path: Path,
                                                         text: str) -> None:
    from safetensors.numpy import save_file

    src, out = tmp_path / "m.pt", tmp_path / "m.safetensors"
    torch.save({"w": torch.ones(2)}, src)
    torchless.convert(src, out, certificate=True)
    doc = _certificate(out)
    for prefix, field in (("TENSOR:", None), ("SOURCES:", "sources"),
                          ("TRANSFORMS:", "transforms")):
        if text.startswith(prefix):
            value = json.loads(text[len(prefix):])
            if field is None:
                doc["tensors"]["w"] = value
            elif field == "transforms":
                doc["transforms"].update(value)
            else:
                doc["sources"] = value
            text = json.dumps(doc)
    save_file({"w": torch.ones(2).numpy()}, str(out), metadata={KEY: text})
    with pytest.raises(torchless.CheckpointError) as e:
        torchless.verify_certificate(out, src)
    assert not isinstance(e.value, torchless.InternalError), e.value
    assert main(["verify", "--certificate", str(out), str(src), "-q"]) == 1


def test_skip_existing_keeps_only_certified_outputs(torch: Any, tmp_path: Path) -> None:
    for name in ("a.pt", "b.pt"):
        torch.save({"w": torch.arange(5.0)}, tmp_path / name)
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    torchless.convert(a)  # no certificate
    assert main(["convert", a, b, "--certificate", "--skip-existing", "-q"]) == 1
    # a: verifies but holds no certificate, refused; b: converted
    assert torchless.verify_certificate(tmp_path / "b.safetensors").ok
    assert main(["convert", a, b, "--certificate", "--force", "-q"]) == 0
    assert main(["convert", a, b, "--certificate", "--skip-existing", "-q"]) == 0  # certified
    assert torchless.verify_certificate(tmp_path / "a.safetensors", a).ok
