"""``convert(dtype=)`` / ``--dtype`` and ``verify --dtype``: the output read back by the
safetensors package equals torch's ``tensor.to(dtype)`` of what torch.load reads; integer
and bool tensors are kept; the header records the cast; verify accepts it only with the
same cast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import torchless
from tests.conftest import require
from torchless.cli.main import main
from torchless.conversion.api import convert, verify
from torchless.errors import ConversionError


def _checkpoint(torch: Any, path: Path) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=g)
    sd = {"w": base, "t": base.t(), "b": torch.randn(5, generator=g, dtype=torch.float64),
          "h": torch.randn(3, generator=g).half(), "bf": torch.randn(2).bfloat16(),
          "i": torch.arange(4), "m": torch.tensor([True, False]),
          "special": torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, 3.5e38,
                                   1 + 2**-8, 65520.0])}
    torch.save({"state_dict": sd, "epoch": 7}, path)
    return sd


def _bits(torch: Any, t: Any) -> bytes:
    t = t.contiguous()
    if t.is_floating_point():
        t = t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return bytes(t.numpy().tobytes())


@pytest.mark.parametrize(("flag", "name"), [("bf16", "bfloat16"), ("fp16", "float16"),
                                            ("fp32", "float32")])
def test_convert_dtype_equals_torch_to(tmp_path: Path, flag: str, name: str) -> None:
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src, dst = tmp_path / "a.pt", tmp_path / "a.safetensors"
    _checkpoint(torch, src)
    report = convert(src, dst, dtype=flag, verify=True)
    assert report.verified is not None and report.verified.ok
    loaded = torch.load(src, weights_only=True)["state_dict"]
    out = safetensors_torch.load_file(dst)
    target = getattr(torch, name)
    for key, t in loaded.items():
        expected = t.to(target) if t.is_floating_point() else t
        got = out[f"state_dict.{key}"]
        assert got.dtype == expected.dtype, key
        assert _bits(torch, got) == _bits(torch, expected), key
    from safetensors import safe_open

    with safe_open(str(dst), "np") as f:
        record = json.loads(f.metadata()["torchless.cast"])
    cast = {k: set(v) for k, v in record["cast"].items()}
    expected_cast: dict[str, set[str]] = {}
    for key, t in loaded.items():
        if t.is_floating_point() and t.dtype != target:
            st = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
                  torch.bfloat16: "BF16"}[t.dtype]
            expected_cast.setdefault(st, set()).add(f"state_dict.{key}")
    assert record["dtype"] == {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[name]
    assert cast == expected_cast and record["filter"] == []
    whole = torchless.load(dst)  # the object tree names the cast dtype
    assert whole["epoch"] == 7
    assert str(whole["state_dict"]["w"].dtype) == name
    assert verify(src, dst, dtype=flag).ok
    plain = verify(src, dst)  # without the cast: refused, saying why
    assert not plain.ok and "--dtype" in plain.mismatched["(cast record)"]


def test_dtype_filter_casts_only_matching_names(tmp_path: Path) -> None:
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src, dst = tmp_path / "a.pt", tmp_path / "a.safetensors"
    sd = _checkpoint(torch, src)
    convert(src, dst, dtype="fp16", dtype_filter=["*.w", "*.i"], tree=False)
    out = safetensors_torch.load_file(dst)
    assert out["state_dict.w"].dtype == torch.float16
    assert _bits(torch, out["state_dict.w"]) == _bits(torch, sd["w"].half())
    assert out["state_dict.t"].dtype == torch.float32  # not matched: the source's bytes
    assert out["state_dict.i"].dtype == torch.int64  # matched, but never cast
    assert verify(src, dst, dtype="fp16", dtype_filter=["*.w", "*.i"]).ok
    report = verify(src, dst, dtype="fp16")  # another cast: refused by name
    assert not report.ok and "state_dict.t" in report.mismatched
    assert "(cast record)" in report.mismatched


@pytest.mark.parametrize(("flag", "name"), [("bf16", "bfloat16"), ("fp16", "float16"),
                                            ("fp32", "float32")])
def test_float8_sources_cast_as_torch_casts_them(tmp_path: Path, flag: str, name: str) -> None:
    """Every one of the 256 codes of float8_e4m3fn and float8_e5m2 (NaNs, ±inf, ±0,
    subnormals), in many positions and through a strided view, against torch's ``.to()``."""
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(8)
    codes = torch.arange(256, dtype=torch.uint8).repeat(40)[torch.randperm(10240, generator=g)]
    sd = {}
    for kind in ("float8_e4m3fn", "float8_e5m2"):
        x = codes.view(getattr(torch, kind))
        sd[kind] = x
        sd[kind + ".t"] = x.reshape(80, 128).t()  # strided: made contiguous first
        sd[kind + ".all"] = torch.arange(256, dtype=torch.uint8).view(getattr(torch, kind))
    src, dst = tmp_path / "f8.pt", tmp_path / "f8.safetensors"
    torch.save(sd, src)
    convert(src, dst, dtype=flag, certificate=True)
    out = safetensors_torch.load_file(dst)
    target = getattr(torch, name)
    for key, t in sd.items():
        expected = t.to(target)
        assert out[key].dtype == target, key
        assert _bits(torch, out[key]) == _bits(torch, expected), key
    assert verify(src, dst, dtype=flag).ok
    assert torchless.verify_certificate(dst, src).ok


def test_refusals(tmp_path: Path) -> None:
    torch = require("torch")
    src = tmp_path / "a.pt"
    torch.save({"f8": torch.zeros(3).to(torch.float8_e8m0fnu), "w": torch.ones(2)}, src)
    with pytest.raises(ConversionError, match="float8"):
        convert(src, tmp_path / "a.safetensors", dtype="bf16")
    with pytest.raises(ConversionError, match="needs dtype"):
        convert(src, tmp_path / "a.safetensors", dtype_filter=["w"])
    with pytest.raises(ConversionError, match="one of bf16"):
        convert(src, tmp_path / "a.safetensors", dtype="int8")
    assert not list(tmp_path.glob("*.safetensors"))
    convert(src, tmp_path / "a.safetensors", dtype="bf16", dtype_filter=["w"])


def test_cli_convert_and_verify_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src, dst = tmp_path / "a.pt", tmp_path / "a.safetensors"
    sd = _checkpoint(torch, src)
    assert main(["convert", str(src), "-o", str(dst), "--dtype", "bf16", "--dtype-filter",
                 "state_dict.[wtb]", "--verify", "-q"]) == 0
    out = safetensors_torch.load_file(dst)
    for key in "wtb":
        assert _bits(torch, out[f"state_dict.{key}"]) == _bits(
            torch, sd[key].to(torch.bfloat16)), key
    assert out["state_dict.h"].dtype == torch.float16
    assert main(["verify", "-q", str(src), str(dst), "--dtype", "bf16", "--dtype-filter",
                 "state_dict.[wtb]"]) == 0
    assert main(["verify", "-q", str(src), str(dst)]) == 1
    assert main(["verify", "-q", str(src), str(dst), "--dtype", "bf16"]) == 1
    capsys.readouterr()
    for bad in (["convert", str(src), "--dtype", "int8"],
                ["verify", str(src), str(dst), "--dtype-filter", "*"]):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 4  # a usage error


@pytest.mark.parametrize("example", ["tiny.pt", "lightning.ckpt", "dcp", "zero"])
def test_every_layout_casts(tmp_path: Path, example: str) -> None:
    """Single files, DCP and ZeRO directories: the cast output equals torch's ``.to`` of the
    plain conversion's tensors (which other tests compare with torch.load)."""
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src = Path(__file__).resolve().parents[2] / "examples" / example
    plain, cast = tmp_path / "plain.safetensors", tmp_path / "cast.safetensors"
    convert(src, plain, tree=False)
    convert(src, cast, dtype="bf16", verify=True)
    expected = safetensors_torch.load_file(plain)
    got = safetensors_torch.load_file(cast)
    assert set(got) >= set(expected)
    assert any(t.is_floating_point() for t in expected.values())
    for name, t in expected.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].dtype == want.dtype, name
        assert _bits(torch, got[name]) == _bits(torch, want), name
    assert verify(src, cast, dtype="bf16").ok


def _deflated(src: Path, dst: Path) -> None:
    """The same archive with every member deflated (torch.load inflates them)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))


@pytest.mark.parametrize("layout", ["legacy", "deflated"])
def test_streamed_and_legacy_sources_cast(tmp_path: Path, layout: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A legacy file (storages in the stream) and a ZIP of deflated members (inflated as they
    stream), cast in blocks far smaller than the tensors, as torch.load + .to gives."""
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from torchless.write import cast as _cast

    monkeypatch.setattr(_cast, "BLOCK_BYTES", 256)
    src, dst = tmp_path / "a.pt", tmp_path / "a.safetensors"
    g = torch.Generator().manual_seed(3)
    sd = {"w": torch.randn(40, 30, generator=g), "t": torch.randn(30, 40, generator=g).t(),
          "d": torch.randn(333, generator=g, dtype=torch.float64), "i": torch.arange(7)}
    if layout == "legacy":
        torch.save(sd, src, _use_new_zipfile_serialization=False)
    else:
        torch.save(sd, tmp_path / "plain.pt")
        _deflated(tmp_path / "plain.pt", src)
    loaded = torch.load(src, weights_only=True)
    convert(src, dst, dtype="fp16", verify=True)
    out = safetensors_torch.load_file(dst)
    for name, t in loaded.items():
        want = t.half() if t.is_floating_point() else t
        assert _bits(torch, out[name]) == _bits(torch, want), name


def test_model_directory_and_shards_cast(tmp_path: Path) -> None:
    """A sharded ``pytorch_model*.bin`` directory resharded to bf16: every output tensor is
    torch's ``.to`` of what torch.load reads, each shard records the names it holds cast, the
    Trainer's optimizer file beside them is converted but not cast; verify --dtype accepts
    the directory."""
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    model, out = tmp_path / "model", tmp_path / "out"
    model.mkdir()
    g = torch.Generator().manual_seed(5)
    shards = {"pytorch_model-00001-of-00002.bin": {"a.weight": torch.randn(64, 64, generator=g),
                                                   "a.steps": torch.arange(3)},
              "pytorch_model-00002-of-00002.bin": {"b.weight": torch.randn(64, 32, generator=g),
                                                   "b.bias": torch.randn(32).double()}}
    for name, sd in shards.items():
        torch.save(sd, model / name)
    (model / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, sd in shards.items() for n in sd}}))
    torch.save({"state": {0: {"exp_avg": torch.zeros(3)}}}, model / "optimizer.pt")
    convert(model, out, dtype="bf16", max_shard_size=5000, verify=True)
    outputs = sorted(out.glob("model*.safetensors"))
    assert len(outputs) >= 2  # resharded by size
    got: dict[str, Any] = {}
    recorded: set[str] = set()
    for path in outputs:
        got.update(safetensors_torch.load_file(path))
        with safe_open(str(path), "np") as f:
            record = json.loads(f.metadata()["torchless.cast"])
            names = set(f.keys())
        cast_here = {n for v in record["cast"].values() for n in v}
        assert cast_here <= names
        recorded |= cast_here
    loaded = {n: t for name in shards for n, t in torch.load(model / name).items()}
    assert set(got) == set(loaded)
    for name, t in loaded.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert _bits(torch, got[name]) == _bits(torch, want), name
    assert recorded == {"a.weight", "b.weight", "b.bias"}
    optimizer = safetensors_torch.load_file(out / "optimizer.safetensors")
    assert all(t.dtype == torch.float32 for t in optimizer.values())
    assert verify(model, out, dtype="bf16").ok
    assert not verify(model, out).ok


def test_several_sources_cast_and_resume(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``convert A B --dtype bf16``: each cast; run again, each output verifies with the
    cast and is skipped with --skip-existing, not converted again."""
    torch = require("torch")
    sources = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for i, src in enumerate(sources):
        torch.save({"w": torch.randn(8, 8, generator=torch.Generator().manual_seed(i))}, src)
    args = ["convert", *map(str, sources), "--dtype", "bf16", "--json"]
    assert main(args) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["done", "done"]
    for src in sources:
        assert verify(src, src.with_suffix(".safetensors"), dtype="bf16").ok
    assert main([*args, "--skip-existing"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in again] == ["skipped", "skipped"]
    # another cast: not skipped
    assert main([*args[:-1], "--dtype", "fp16", "--json", "--skip-existing"]) != 0


def test_dtype_with_a_selection(tmp_path: Path) -> None:
    """Casting and selecting in one convert: the filter globs match the names the selection
    writes (after ``key``, the filters and the renames), verify with the same options agrees,
    and verify with another filter does not."""
    torch = require("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src, dst = tmp_path / "a.pt", tmp_path / "a.safetensors"
    _checkpoint(torch, src)
    options: dict[str, Any] = {"key": "state_dict", "exclude": ["special", "m"],
                               "rename": ["s/^/model./"], "dtype": "bf16",
                               "dtype_filter": ["model.w", "model.b"]}
    convert(src, dst, **options)
    loaded = torch.load(src, weights_only=True)["state_dict"]
    out = safetensors_torch.load_file(dst)
    # by hand: every name but the two excluded, under "model."; only w and b cast
    assert sorted(out) == ["model.b", "model.bf", "model.h", "model.i", "model.t", "model.w"]
    for name, t in out.items():
        source = loaded[name.removeprefix("model.")]
        expected = source.to(torch.bfloat16) if name in ("model.w", "model.b") else source
        assert t.dtype == expected.dtype, name
        assert _bits(torch, t) == _bits(torch, expected), name
    assert verify(src, dst, **options).ok
    assert not verify(src, dst, **{**options, "dtype_filter": ["model.w"]}).ok
