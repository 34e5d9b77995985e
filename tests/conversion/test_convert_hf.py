"""Hugging Face layouts: model directories, sharded checkpoints, --max-shard-size, batches.

The oracles: ``torch.load`` of every source shard, ``safetensors.torch.load_file`` of every
output, and indexes / shard splits computed by hand from the tensor sizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless.cli.main import main
from torchless.conversion.hflayout import output_name, parse_size

pytestmark = pytest.mark.torch

CONFIG = b'{"model_type": "toy", "hidden_size": 8}\n'


def _state(torch: ModuleType, n: int, seed: int = 0, numel: int = 16) -> dict[str, Any]:
    """n tensors in a deliberate, non-alphabetical order, of mixed dtypes."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for i in range(n):
        name = f"layer.{(i * 7) % n}.w{i}"
        t = torch.randn(numel, generator=g)
        out[name] = t.to(torch.bfloat16) if i % 3 == 1 else t
    return out


def _hf_dir(torch: ModuleType, root: Path, shards: list[dict[str, Any]],
            prefix: str = "pytorch_model") -> Path:
    """A directory as transformers' save_pretrained(safe_serialization=False) writes it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_bytes(CONFIG)
    (root / "tokenizer.json").write_bytes(b'{"v": 1}')
    if len(shards) == 1:
        torch.save(shards[0], root / f"{prefix}.bin")
        return root
    weight_map: dict[str, str] = {}
    total = 0
    for k, sd in enumerate(shards):
        name = f"{prefix}-{k + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(sd, root / name)
        for key, t in sd.items():
            weight_map[key] = name
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / f"{prefix}.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True)
                                                   + "\n")
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def _assert_equal(torch: ModuleType, got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for name, t in want.items():
        g = got[name]
        assert g.dtype == t.dtype and tuple(g.shape) == tuple(t.shape), name
        assert torch.equal(g.view(torch.uint8) if g.numel() else g,
                           t.contiguous().view(torch.uint8) if t.numel() else t), name


def _load_all(torch: ModuleType, root: Path, files: list[str]) -> dict[str, Any]:
    import safetensors.torch

    out: dict[str, Any] = {}
    for f in files:
        part = safetensors.torch.load_file(root / f)
        assert not set(part) & set(out)
        out.update(part)
    return out


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


# ---- model directories ---------------------------------------------------------------------


def test_single_file_dir(torch: ModuleType, tmp_path: Path) -> None:
    sd = _state(torch, 5)
    root = _hf_dir(torch, tmp_path / "m", [sd])
    before = _snapshot(root)
    report = torchless.convert(root)
    assert report.dst == str(root / "model.safetensors")
    assert report.files == (str(root / "model.safetensors"),)
    after = _snapshot(root)
    assert set(after) == set(before) | {"model.safetensors"}
    assert all(after[n] == before[n] for n in before)  # config.json … untouched
    loaded = torch.load(root / "pytorch_model.bin", weights_only=True)
    _assert_equal(torch, _load_all(torch, root, ["model.safetensors"]), loaded)
    from safetensors import safe_open
    with safe_open(str(root / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "source": "pytorch_model.bin"}
    # byte-identical to converting the file itself
    single = torchless.convert(root / "pytorch_model.bin", tmp_path / "x.safetensors",
                               tree=False)
    assert Path(single.dst).read_bytes() == (root / "model.safetensors").read_bytes()
    # an existing output is refused, and left alone
    with pytest.raises(torchless.ConversionError, match="exist"):
        torchless.convert(root)
    assert _snapshot(root) == after
    torchless.convert(root, force=True)
    assert _snapshot(root) == after


def test_sharded_dir(torch: ModuleType, tmp_path: Path) -> None:
    shards = [_state(torch, 4, seed=1), _state(torch, 3, seed=2), _state(torch, 2, seed=3)]
    shards[1] = {f"b.{k}": v for k, v in shards[1].items()}
    shards[2] = {f"c.{k}": v for k, v in shards[2].items()}
    root = _hf_dir(torch, tmp_path / "m", shards)
    before = _snapshot(root)
    report = torchless.convert(root, verify=True)
    names = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert report.files == (*[str(root / n) for n in names],
                            str(root / "model.safetensors.index.json"))
    assert report.dst == str(root / "model.safetensors.index.json")
    assert report.verified is not None and report.verified.ok
    assert report.tensors == 9
    after = _snapshot(root)
    assert set(after) == set(before) | set(names) | {"model.safetensors.index.json"}
    assert all(after[n] == before[n] for n in before)
    want: dict[str, Any] = {}
    weight_map: dict[str, str] = {}
    for k, name in enumerate(names):
        src = torch.load(root / f"pytorch_model-0000{k + 1}-of-00003.bin", weights_only=True)
        _assert_equal(torch, _load_all(torch, root, [name]), src)
        want.update(src)
        weight_map.update(dict.fromkeys(src, name))
    expected_index = {"metadata": {"total_parameters": sum(t.numel() for t in want.values()),
                                   "total_size": sum(_nbytes(t) for t in want.values())},
                      "weight_map": weight_map}
    text = after["model.safetensors.index.json"].decode()
    assert json.loads(text) == expected_index
    assert text == json.dumps(expected_index, indent=2, sort_keys=True) + "\n"
    # each output shard is what converting its source shard alone gives
    alone = torchless.convert(root / "pytorch_model-00002-of-00003.bin",
                              tmp_path / "alone.safetensors", tree=False)
    assert Path(alone.dst).read_bytes() == after[names[1]]
    # to another directory, via the index file itself
    out = tmp_path / "out"
    torchless.convert(root / "pytorch_model.bin.index.json", out)
    assert sorted(os.listdir(out)) == sorted([*names, "model.safetensors.index.json"])
    assert (out / "model.safetensors.index.json").read_text() == text
    with pytest.raises(torchless.ConversionError, match="output directory is a file"):
        torchless.convert(root, root / "config.json")
    assert (root / "config.json").read_bytes() == CONFIG


def test_sharded_dir_other_names(torch: ModuleType, tmp_path: Path) -> None:
    """Shards with any names: diffusers' prefix, and arbitrary *.bin in the weight_map."""
    shards = [{"a": torch.arange(6, dtype=torch.int32)}, {"b": torch.ones(2, 3)}]
    root = _hf_dir(torch, tmp_path / "d", shards, prefix="diffusion_pytorch_model")
    torchless.convert(root)
    assert json.loads((root / "diffusion_pytorch_model.safetensors.index.json")
                      .read_text())["weight_map"] == {
        "a": "diffusion_pytorch_model-00001-of-00002.safetensors",
        "b": "diffusion_pytorch_model-00002-of-00002.safetensors"}
    other = tmp_path / "o"
    other.mkdir()
    torch.save(shards[0], other / "first.bin")
    torch.save(shards[1], other / "second.bin")
    (other / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 48}, "weight_map": {"a": "first.bin", "b": "second.bin"}}))
    torchless.convert(other)
    index = json.loads((other / "model.safetensors.index.json").read_text())
    # 6 int32 + 6 float32: 12 parameters, 48 bytes
    assert index == {"metadata": {"total_parameters": 12, "total_size": 48},
                     "weight_map": {"a": "first.safetensors", "b": "second.safetensors"}}
    _assert_equal(torch, _load_all(torch, other, ["first.safetensors", "second.safetensors"]),
                  {**shards[0], **shards[1]})
    assert output_name("pytorch_model-00001-of-00002.bin") == "model-00001-of-00002.safetensors"
    assert output_name("pytorch_model.bin") == "model.safetensors"


def test_index_mismatch_and_missing_shard(torch: ModuleType, tmp_path: Path) -> None:
    shards = [{"a": torch.zeros(2), "a2": torch.zeros(1)}, {"b": torch.ones(2)}]
    root = _hf_dir(torch, tmp_path / "m", shards)
    index_path = root / "pytorch_model.bin.index.json"
    good = json.loads(index_path.read_text())
    before = _snapshot(root)

    def fails(weight_map: dict[str, str], match: str) -> None:
        index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        with pytest.raises(torchless.ConversionError, match=match) as info:
            torchless.convert(root)
        assert info.value.path == str(index_path)
        assert set(os.listdir(root)) == set(before)  # nothing written

    wm = good["weight_map"]
    fails({**wm, "ghost": wm["a"]}, r"1 listed but in no shard: ghost")
    fails({"a": wm["a"], "b": wm["b"]}, r"1 in a shard but not listed: a2")
    fails({**wm, "a": wm["b"]}, r"misplaced: a \(in pytorch_model-00001")
    fails({"a": wm["a"], "a2": wm["a"]}, r"names 1 shard\(s\) of 2")
    fails({**wm, "c": "pytorch_model-00003-of-00003.bin"},
          r"shard 'pytorch_model-00003-of-00003.bin', which does not exist")
    index_path.write_text(json.dumps(good))
    (root / "pytorch_model-00003-of-00003.bin").write_bytes(b"")
    with pytest.raises(torchless.ConversionError, match="does not name: pytorch_model-00003"):
        torchless.convert(root)
    os.unlink(root / "pytorch_model-00003-of-00003.bin")
    os.unlink(root / "pytorch_model-00002-of-00002.bin")
    with pytest.raises(torchless.ConversionError, match="does not exist"):
        torchless.convert(root)
    index_path.write_text(json.dumps({"weight_map": {"a": "../escape.bin"}}))
    with pytest.raises(torchless.UnsafePathError):
        torchless.convert(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "other.pt").write_bytes(b"")
    with pytest.raises(torchless.ConversionError, match=r"no Hugging Face weights.*other\.pt"):
        torchless.convert(empty)


def test_sharded_refuses_existing_outputs(torch: ModuleType, tmp_path: Path) -> None:
    root = _hf_dir(torch, tmp_path / "m", [{"a": torch.zeros(2)}, {"b": torch.ones(2)}])
    (root / "model-00002-of-00002.safetensors").write_bytes(b"old")
    before = _snapshot(root)
    with pytest.raises(torchless.ConversionError, match="1 output file"):
        torchless.convert(root)
    assert _snapshot(root) == before
    torchless.convert(root, force=True)
    import safetensors.torch
    assert safetensors.torch.load_file(root / "model-00002-of-00002.safetensors")["b"].tolist(
    ) == [1.0, 1.0]


def test_failure_removes_written_shards(torch: ModuleType, tmp_path: Path) -> None:
    """A shard that cannot be written: the earlier shards are removed and no index is left."""
    root = _hf_dir(torch, tmp_path / "m", [{"a": torch.zeros(2)},
                                           {"b": torch.ones(2, dtype=torch.complex128)}])
    before = set(os.listdir(root))
    with pytest.raises(torchless.ConversionError, match="complex128"):
        torchless.convert(root)
    assert set(os.listdir(root)) == before
    report = torchless.convert(root, skip_unsupported=True)
    assert report.skipped == ("b",)
    assert json.loads((root / "model.safetensors.index.json").read_text())["weight_map"] == {
        "a": "model-00001-of-00002.safetensors"}


# ---- --max-shard-size -----------------------------------------------------------------------


def test_parse_size() -> None:
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1GiB") == 2**30
    assert parse_size("10kb") == 10_000
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("123") == 123 and parse_size(7) == 7
    for bad in ("", "5XB", "-1", "0", "GB"):
        with pytest.raises(torchless.ConversionError):
            parse_size(bad)


def _expected_split(sizes: list[int], limit: int) -> list[list[int]]:
    """The split by hand: file order, close before going over, big tensors alone."""
    groups: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, n in enumerate(sizes):
        if cur and size + n > limit:
            groups.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        groups.append(cur)
    return groups


def test_max_shard_size_single_file(torch: ModuleType, tmp_path: Path) -> None:
    sd = {"emb": torch.randn(40), "a": torch.randn(10), "b": torch.randn(10),
          "c": torch.randn(10).to(torch.bfloat16), "d": torch.randn(5), "e": torch.randn(30),
          "f": torch.randn(2)}
    torch.save(sd, tmp_path / "net.pt")
    # limit 100 bytes: emb (160 B) alone; a+b (80); c (20) + d (20) + ... e is 120 -> alone
    report = torchless.convert(tmp_path / "net.pt", max_shard_size="100B", verify=True)
    assert report.verified is not None and report.verified.ok
    groups = [["emb"], ["a", "b", "c"], ["d"], ["e"], ["f"]]
    # by hand: a 40 + b 40 = 80, + c 20 = 100 (fits), + d 20 > 100: close
    names = [f"net-0000{k}-of-00005.safetensors" for k in range(1, 6)]
    assert report.files == (*[str(tmp_path / n) for n in names],
                            str(tmp_path / "net.safetensors.index.json"))
    index = json.loads((tmp_path / "net.safetensors.index.json").read_text())
    assert index == {"metadata": {"total_parameters": sum(t.numel() for t in sd.values()),
                                  "total_size": sum(_nbytes(t) for t in sd.values())},
                     "weight_map": {n: names[k] for k, g in enumerate(groups) for n in g}}
    import safetensors.torch
    for k, g in enumerate(groups):
        assert set(safetensors.torch.load_file(tmp_path / names[k])) == set(g)
    _assert_equal(torch, _load_all(torch, tmp_path, names),
                  torch.load(tmp_path / "net.pt", weights_only=True))
    # a limit everything fits in: one unsharded file, no index (as transformers)
    r2 = torchless.convert(tmp_path / "net.pt", tmp_path / "one.safetensors",
                           max_shard_size="1GB")
    assert r2.files == (str(tmp_path / "one.safetensors"),)
    assert not (tmp_path / "one.safetensors.index.json").exists()


def test_max_shard_size_reshards_dir(torch: ModuleType, tmp_path: Path) -> None:
    shards = [_state(torch, 6, seed=4, numel=25), _state(torch, 5, seed=5, numel=25)]
    shards[1] = {f"x.{k}": v for k, v in shards[1].items()}
    root = _hf_dir(torch, tmp_path / "m", shards)
    limit = 180
    report = torchless.convert(root, tmp_path / "out", max_shard_size=limit, verify=True)
    assert report.verified is not None and report.verified.ok
    order = [*shards[0], *shards[1]]  # file order: shard by shard, state_dict order
    every = {**shards[0], **shards[1]}
    groups = _expected_split([_nbytes(every[n]) for n in order], limit)
    count = len(groups)
    assert count > 2
    names = [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {order[i]: names[k] for k, g in enumerate(groups)
                                   for i in g}
    assert index["metadata"] == {"total_parameters": sum(t.numel() for t in every.values()),
                                 "total_size": sum(_nbytes(t) for t in every.values())}
    _assert_equal(torch, _load_all(torch, tmp_path / "out", names), every)
    # with the directory's other files, linked: a loadable model directory
    assert sorted(os.listdir(tmp_path / "out")) == sorted([
        *names, "model.safetensors.index.json", "config.json", "tokenizer.json"])


# ---- CLI and batches ----------------------------------------------------------------------


def test_cli_dir_and_shard_size(torch: ModuleType, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    root = _hf_dir(torch, tmp_path / "m", [{"w": torch.randn(30), "v": torch.randn(30)}])
    assert main(["convert", str(root), "--max-shard-size", "150", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["tensors"] == 2
    assert doc["dst"] == str(root / "model.safetensors.index.json")
    assert [os.path.basename(f) for f in doc["files"]] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"]
    assert main(["convert", str(root), "--max-shard-size", "150"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchless: error:") and "exist" in err
    assert main(["convert", str(root), "--max-shard-size", "lots"]) == 1
    assert "cannot read the size" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cli_batch(torch: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   jobs: str) -> None:
    a, b, bad = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "bad.pt"
    torch.save({"x": torch.arange(4)}, a)
    torch.save({"y": torch.ones(2, 2)}, b)
    bad.write_bytes(b"not a checkpoint")
    assert main(["convert", str(a), str(bad), str(b), "--json", "-j", jobs]) == 1
    out = capsys.readouterr()
    docs = json.loads(out.out)
    assert [d["src"] for d in docs] == [str(a), str(bad), str(b)]
    assert [d["ok"] for d in docs] == [True, False, True]
    assert docs[1]["error"] and "torchless: error:" in out.err
    import safetensors.torch
    assert safetensors.torch.load_file(tmp_path / "a.safetensors")["x"].tolist() == [0, 1, 2, 3]
    assert safetensors.torch.load_file(tmp_path / "b.safetensors")["y"].tolist() == [[1.0] * 2] * 2
    assert not (tmp_path / "bad.safetensors").exists()
    # again: both outputs exist, so both are refused (the one existing-output rule) ...
    assert main(["convert", str(a), str(b), "-j", jobs]) == 1
    out = capsys.readouterr()
    assert out.err.count("the output file exists") == 2 and "2 failed" in out.out
    # ... unless --skip-existing: both verify, so both are kept (a resumed run)
    assert main(["convert", str(a), str(b), "-j", jobs, "--skip-existing"]) == 0
    out = capsys.readouterr()
    assert out.out.count("already converted (verified)") == 2
    assert "0 converted, 2 already done, 0 failed" in out.out
    # an output that no longer matches its source is refused, not replaced
    torch.save({"y": torch.zeros(2, 2)}, b)
    assert main(["convert", str(a), str(b), "-j", jobs, "--skip-existing"]) == 1
    out = capsys.readouterr()
    assert "does not match" in out.err and "1 failed" in out.out
    assert safetensors.torch.load_file(tmp_path / "b.safetensors")["y"].tolist() == [[1.0] * 2] * 2
    # --force with --skip-existing: the one that verifies is kept, the other replaced
    mtime = os.stat(tmp_path / "a.safetensors").st_mtime_ns
    assert main(["convert", str(a), str(b), "--force", "--skip-existing", "-j", jobs]) == 0
    assert "1 converted, 1 already done, 0 failed" in capsys.readouterr().out
    assert os.stat(tmp_path / "a.safetensors").st_mtime_ns == mtime
    assert safetensors.torch.load_file(tmp_path / "b.safetensors")["y"].tolist() == [[0.0] * 2] * 2
    assert main(["convert", str(a), str(b), "--force", "-j", jobs]) == 0
    assert "a.safetensors: 1 tensors" in capsys.readouterr().out
    assert os.stat(tmp_path / "a.safetensors").st_mtime_ns != mtime


def test_cli_batch_rejects_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", "a.pt", "b.pt", "-o", str(tmp_path / "x")])
    assert info.value.code == 4 and "single SRC" in capsys.readouterr().err


def test_interrupted_run_leaves_nothing(torch: ModuleType, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the second shard, or a failing index write: no shard, no index, no
    temporary file is left; the index is only ever written after every shard."""
    from torchless.conversion import hf as _hf
    from torchless.write import atomic as _atomic

    root = _hf_dir(torch, tmp_path / "m", [{"a": torch.zeros(64)}, {"b": torch.ones(64)}])
    before = set(os.listdir(root))

    def interrupt(done: int, total: int) -> None:
        if done > total - 100:  # inside the second shard's tensor bytes
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        torchless.convert(root, progress=interrupt)
    assert set(os.listdir(root)) == before

    order: list[str] = []
    index_output = _hf._index_output

    def failing_index(stack: Any, path: str, data: bytes, force: bool) -> _atomic.Output:
        order.extend(sorted(os.listdir(root)))
        index_output(stack, path, data, force)  # written, then the disk fills up
        raise torchless.ConversionError("disk full", path=path)

    monkeypatch.setattr(_hf, "_index_output", failing_index)
    with pytest.raises(torchless.ConversionError, match="disk full"):
        torchless.convert(root)
    assert set(order) == before  # no shard is published before the index is written
    assert set(os.listdir(root)) == before

    published: list[str] = []
    publish = _atomic.Output._publish

    def record(self: _atomic.Output, force: bool) -> None:
        published.append(self.name)
        publish(self, force)

    monkeypatch.setattr(_atomic.Output, "_publish", record)
    monkeypatch.setattr(_hf, "_index_output", index_output)
    torchless.convert(root)
    assert published == ["model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors", "model.safetensors.index.json"]


# ---- verify on directories, indexes and shard sets -------------------------------------------


def _flip_byte(path: Path, name: str) -> None:
    """Change one byte of tensor ``name``'s data in a safetensors file (the header is parsed
    by hand: 8-byte little-endian length, then JSON with data_offsets)."""
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin = json.loads(raw[8:8 + n])[name]["data_offsets"][0]
    raw[8 + n + begin] ^= 0x40
    path.write_bytes(bytes(raw))


def test_verify_sharded_dirs(torch: ModuleType, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    shards = [_state(torch, 5, seed=1), _state(torch, 4, seed=2)]
    shards[1] = {k.replace("layer", "block"): v for k, v in shards[1].items()}
    src = _hf_dir(torch, tmp_path / "m", shards)
    out = tmp_path / "out"
    torchless.convert(src, out)
    names = sorted([*shards[0], *shards[1]])
    for s, d in [(src, out), (src / "pytorch_model.bin.index.json",
                              out / "model.safetensors.index.json")]:
        report = torchless.verify(s, d)
        assert report.ok and sorted(report.matched) == names, report
    assert main(["verify", str(src), str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    # re-sharded output: three shards of at most two 64-byte tensors, same tensors
    resharded = tmp_path / "re"
    torchless.convert(src, resharded, max_shard_size=150)
    assert len(list(resharded.glob("model-*-of-*.safetensors"))) >= 3
    assert torchless.verify(src, resharded).ok

    # one flipped byte in one shard: that tensor, and only it, mismatches
    victim = next(iter(shards[1])).replace("layer", "block")
    _flip_byte(out / "model-00002-of-00002.safetensors", victim)
    report = torchless.verify(src, out)
    assert not report.ok and dict(report.mismatched) == {victim: "bytes differ"}
    assert main(["verify", str(src), str(out)]) == 1
    assert victim in capsys.readouterr().out


def test_verify_index_disagreements(torch: ModuleType, tmp_path: Path) -> None:
    shards = [{"a": torch.ones(3), "b": torch.zeros(2)}, {"c": torch.arange(4.0)}]
    src = _hf_dir(torch, tmp_path / "m", shards)
    out = tmp_path / "out"
    torchless.convert(src, out)
    index = out / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    assert doc["weight_map"] == {"a": "model-00001-of-00002.safetensors",
                                 "b": "model-00001-of-00002.safetensors",
                                 "c": "model-00002-of-00002.safetensors"}
    # the index puts "b" in the wrong shard
    doc["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    report = torchless.verify(src, out)
    assert set(report.mismatched) == {"b"} and "index says" in report.mismatched["b"]
    # the index names a tensor the source does not have
    doc["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    doc["weight_map"]["ghost"] = "model-00002-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    report = torchless.verify(src, out)
    assert not report.ok and report.extra == ("index: ghost",)
    # a shard gone: its tensor is missing, and the index names a file that is not there
    del doc["weight_map"]["ghost"]
    index.write_text(json.dumps(doc))
    assert torchless.verify(src, out).ok
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(torchless.ConversionError, match="does not exist"):
        torchless.verify(src, out)
    # a directory with no single output to compare with
    (tmp_path / "empty").mkdir()
    with pytest.raises(torchless.ConversionError, match="found none"):
        torchless.verify(src, tmp_path / "empty")


def test_verify_single_file_against_dir(torch: ModuleType, tmp_path: Path) -> None:
    sd = {"w": torch.randn(4, 4), "v": torch.randn(3).to(torch.bfloat16)}
    src = _hf_dir(torch, tmp_path / "m", [sd])
    torchless.convert(src)  # writes m/model.safetensors beside pytorch_model.bin
    assert torchless.verify(src, src).ok
    assert torchless.verify(src / "pytorch_model.bin", src).ok
    assert sorted(torchless.verify(src, src / "model.safetensors").matched) == ["v", "w"]
