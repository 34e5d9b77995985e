"""DCP directories written by torch (one process, and FSDP2 / DTensor shardings over two
gloo processes, both storage formats) read as ``dcp_to_torch_save`` + ``torch.load`` read
them; what is not a whole checkpoint is refused by name."""

from __future__ import annotations

import math
import mmap
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests._dcpfixture import dcp_cases, flat
from torchless.containers.dcpchunks import coverage
from torchless.containers.dcpmeta import Chunk, TensorMeta
from torchless.core.dtypes import by_torch_name

__all__ = ["dcp_cases"]

TORCH_SAVE_CASES = ("single", "fsdp", "dtensor")


def _same(ref: Any, got: Any, torch: Any, ordered: bool = True) -> None:
    """Equal leaves (dtype, shape, bytes; values and their types); ``ordered``: the keys in
    the same order too (the state each rank held has its own order; DCP's is the
    metadata's)."""
    rf, gf = flat(ref), flat(got)
    assert (list(rf) if ordered else sorted(rf)) == (list(gf) if ordered else sorted(gf))
    for name, want in rf.items():
        have = gf[name]
        if isinstance(want, torch.Tensor):
            assert isinstance(have, torch.Tensor), name
            assert (have.dtype, have.shape) == (want.dtype, want.shape), name
            assert torch.equal(have, want), name
        else:
            assert have == want and type(have) is type(want), name


@pytest.mark.parametrize("case", TORCH_SAVE_CASES)
def test_load_equals_dcp_to_torch_save(case: str, dcp_cases: Path, torch: Any) -> None:
    ref = torch.load(dcp_cases / f"{case}.pt", weights_only=False)
    _same(ref, torchless.load(dcp_cases / case, framework="pt"), torch)
    # and the tensors the ranks held, whole
    _same(torch.load(dcp_cases / f"{case}.full.pt", weights_only=False),
          torchless.load(dcp_cases / case, framework="pt"), torch, ordered=False)


@pytest.mark.parametrize(("case", "layout", "storage"), [
    ("st", "dcp", "safetensors"),
    ("hf", "dcp-hf", "safetensors (HuggingFaceStorageWriter, one file a rank)")])
def test_safetensors_formats(case: str, layout: str, storage: str, dcp_cases: Path,
                             torch: Any) -> None:
    _same(torch.load(dcp_cases / "st.full.pt", weights_only=False),
          torchless.load(dcp_cases / case, framework="pt"), torch, ordered=False)
    with torchless.open(dcp_cases / case) as ckpt:
        assert ckpt.info["layout"] == layout
        assert ckpt.info["storage_format"] == storage
        assert len(ckpt.info["chunks"]["uneven_cols"]) == 2


@pytest.mark.parametrize("case", TORCH_SAVE_CASES)
def test_tensors_by_fqn(case: str, dcp_cases: Path, torch: Any) -> None:
    ref = torch.load(dcp_cases / f"{case}.pt", weights_only=False)
    want = {k: v for k, v in flat(ref).items() if isinstance(v, torch.Tensor)}
    with torchless.open(dcp_cases / case) as ckpt:
        assert ckpt.format == "dcp" and ckpt.info["layout"] == "dcp"
        assert set(ckpt.tensors) == set(want)
        for name, t in want.items():
            got = ckpt.tensors[name].to_torch()
            assert got.dtype == t.dtype and torch.equal(got, t), name


def test_one_chunk_is_a_view_of_the_shard(dcp_cases: Path) -> None:
    with torchless.open(dcp_cases / "dtensor") as ckpt:
        assert len(ckpt.info["chunks"]["replicated"]) == 1
        assert isinstance(memoryview(ckpt.tensors["replicated"].storage.buffer()).obj,
                          mmap.mmap)
        assert len(ckpt.info["chunks"]["cols"]) == 2
        assert not isinstance(memoryview(ckpt.tensors["cols"].storage.buffer()).obj,
                              mmap.mmap)


def test_inspect_shows_shards_ranks_and_chunks(dcp_cases: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.cli.main import main

    assert main(["inspect", str(dcp_cases / "dtensor")]) == 0
    out = capsys.readouterr().out
    assert "__0_0.distcp" in out and "__1_0.distcp" in out and "ranks 0, 1" in out
    assert "uneven_cols: 2 chunks: [0, 0]+[3, 4] @__0_0.distcp, [0, 4]+[3, 3] " \
           "@__1_0.distcp" in out


def _edit_metadata(src: Path, dst: Path, torch: Any, change: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    shutil.copytree(src, dst)
    meta = FileSystemReader(str(dst)).read_metadata()
    meta.storage_meta = None
    change(meta)
    (dst / ".metadata").write_bytes(pickle.dumps(meta))


def test_uncovered_tensor_is_refused_by_name(dcp_cases: Path, tmp_path: Path,
                                             torch: Any) -> None:
    def drop(meta: Any) -> None:
        meta.state_dict_metadata["rows"].chunks.pop()

    _edit_metadata(dcp_cases / "dtensor", tmp_path / "d", torch, drop)
    with torchless.open(tmp_path / "d") as ckpt:
        assert "rows" not in ckpt.tensors
        assert ckpt.unsupported["rows"] == ("partly saved DCP tensor: its chunks cover 12 "
                                            "of 24 elements")
        assert "cols" in ckpt.tensors
    with pytest.raises(torchless.UnsupportedError, match=r"cover 12 of 24") as info:
        torchless.load(tmp_path / "d")
    assert info.value.member == "rows"


def test_stream_transform_is_named(dcp_cases: Path, tmp_path: Path, torch: Any) -> None:
    def compress(meta: Any) -> None:
        for index, info in meta.storage_data.items():
            if index.fqn == "cols":
                info.transform_descriptors = ["stream.zstd/1"]

    _edit_metadata(dcp_cases / "dtensor", tmp_path / "d", torch, compress)
    with torchless.open(tmp_path / "d") as ckpt:
        assert "stream.zstd/1" in ckpt.unsupported["cols"]


def test_truncated_shard_names_the_item(dcp_cases: Path, tmp_path: Path) -> None:
    shutil.copytree(dcp_cases / "dtensor", tmp_path / "d")
    shard = tmp_path / "d" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(torchless.TruncatedInputError, match=r"past the end of __1_0.distcp"):
        torchless.open(tmp_path / "d")


def test_missing_shard(dcp_cases: Path, tmp_path: Path) -> None:
    shutil.copytree(dcp_cases / "dtensor", tmp_path / "d")
    (tmp_path / "d" / "__0_0.distcp").unlink()
    with pytest.raises(torchless.FormatError, match=r"'__0_0.distcp' the metadata names is "
                                                    "missing"):
        torchless.open(tmp_path / "d")


def test_hostile_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".metadata").write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    with pytest.raises(torchless.UnsafeGlobalError, match=r"os.system"):
        torchless.open(tmp_path / "d")


def test_metadata_of_another_shape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".metadata").write_bytes(pickle.dumps({"not": "Metadata"}))
    with pytest.raises(torchless.FormatError, match=r"expected Metadata, found a dict"):
        torchless.open(tmp_path / "d")


@pytest.mark.parametrize("name", ["__0_0.distcp", ".metadata"])
def test_a_member_opened_alone_is_named(name: str, dcp_cases: Path) -> None:
    with pytest.raises(torchless.NotACheckpointError,
                       match=r"torch.distributed.checkpoint.*open its directory") as info:
        torchless.open(dcp_cases / "dtensor" / name)
    assert str(dcp_cases / "dtensor") in info.value.hint


def test_a_copied_shard_is_named(dcp_cases: Path, tmp_path: Path) -> None:
    shutil.copy(dcp_cases / "dtensor" / "__1_0.distcp", tmp_path / "__1_0.distcp")
    with pytest.raises(torchless.NotACheckpointError, match=r"shard file of a torch"):
        torchless.load(tmp_path / "__1_0.distcp")


F32 = by_torch_name("float32")


@pytest.mark.parametrize(("size", "chunks", "missing", "overlap"), [
    ((4, 6), [((0, 0), (4, 3)), ((0, 3), (4, 3))], 0, False),
    ((4, 6), [((0, 0), (4, 3))], 12, False),
    ((4, 6), [((0, 0), (4, 4)), ((0, 3), (4, 3))], 0, True),
    ((5,), [((0,), (3,)), ((3,), (2,))], 0, False),
    ((3, 3), [((0, 0), (2, 2)), ((2, 2), (1, 1))], 4, False),
    ((), [((), ())], 0, False),
    ((), [], 1, False),
])
def test_coverage_by_hand(size: tuple[int, ...], chunks: list[Any], missing: int,
                          overlap: bool) -> None:
    assert F32 is not None
    meta = TensorMeta(F32, size, tuple(Chunk(o, s) for o, s in chunks))
    assert coverage(meta) == (missing, overlap)
    assert math.prod(size) >= missing


def test_bfloat16_columns_assemble(dcp_cases: Path, torch: Any) -> None:
    ref = torch.load(dcp_cases / "dtensor.pt", weights_only=False)["bf16_cols"]
    with torchless.open(dcp_cases / "dtensor") as ckpt:
        got = np.frombuffer(bytes(ckpt.tensors["bf16_cols"].storage.buffer()), np.uint16)
    assert got.tobytes() == ref.view(torch.int16).numpy().tobytes()


@pytest.mark.parametrize("block", [7, 64, 1 << 20])
def test_streamed_bytes_in_any_block_size(block: int, dcp_cases: Path, torch: Any) -> None:
    """What convert writes: each tensor's bytes streamed from its chunks (read from the shard
    files by ranges, or through the map for a strided chunk), in blocks of any size."""
    for case in ("dtensor", "single"):
        ref = {k: v for k, v in flat(torch.load(dcp_cases / f"{case}.pt")).items()
               if isinstance(v, torch.Tensor)}
        with torchless.open(dcp_cases / case) as ckpt:
            for name, want in ref.items():
                storage = ckpt.tensors[name].storage
                assert storage.streams
                got = b"".join(bytes(b) for b in storage.iter_bytes(0, storage.nbytes, block))
                assert got == want.reshape(-1).view(torch.uint8).numpy().tobytes(), name


def test_limits_apply_to_global_tensors(dcp_cases: Path) -> None:
    with pytest.raises(torchless.LimitError, match="max_tensor_bytes"):
        torchless.open(dcp_cases / "dtensor", limits=torchless.Limits(max_tensor_bytes=64))


def test_too_many_chunks_to_check_is_refused() -> None:
    """A million-cell grid of scattered chunks: refused rather than checked pair by pair."""
    assert F32 is not None
    chunks = tuple(Chunk((i, (i * 7919) % 5000), (1, 1)) for i in range(5000))
    with pytest.raises(torchless.UnsupportedError, match="too many to check"):
        coverage(TensorMeta(F32, (5000, 5000), chunks))


def _archive(pickle_bytes: bytes) -> bytes:
    """A torch.save-shaped ZIP whose data.pkl is ``pickle_bytes``."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


@pytest.mark.parametrize("fqn", ["epoch", "rows"])
def test_a_hostile_item_is_refused(fqn: str, dcp_cases: Path, tmp_path: Path,
                                   torch: Any) -> None:
    """An item whose archive would run code under torch.load: a value is read with the
    caller's rules (refused by the policy), a chunk with torch's tensor rules alone."""
    attack = _archive(b"cos\nsystem\n(S'touch /tmp/owned-by-dcp'\ntR.")
    target: dict[str, Any] = {}

    def point(meta: Any) -> None:
        for index, info in meta.storage_data.items():
            if index.fqn == fqn and not target:  # its first chunk, or the value
                target["file"] = info.relative_path
                info.offset = (dcp_cases / "dtensor" / info.relative_path).stat().st_size
                info.length = len(attack)

    _edit_metadata(dcp_cases / "dtensor", tmp_path / "d", torch, point)
    with (tmp_path / "d" / target["file"]).open("ab") as f:
        f.write(attack)
    with pytest.raises(torchless.UnsafeGlobalError, match=r"os\.system") as info:
        torchless.load(tmp_path / "d")
    assert info.value.member == f"{fqn}: archive/data.pkl"
    assert not Path("/tmp/owned-by-dcp").exists()
