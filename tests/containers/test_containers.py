"""One contract every container reader meets, checked on a small file of each layout.

The files hold w = arange(6).reshape(2, 3) (float32) and b = [1, 2] (int64), written by
torch itself (ZIP, TorchScript, legacy) or by our test writer that torch reads (TAR); the
plain pickle holds the same values as NumPy arrays. Every cut-short or extended copy of a
valid file must be refused with a torchless error, never read differently or crash.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchless
from tests._legacy_writer import write_tar

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([1, 2], dtype=np.int64)


def _truncations_refused(directory: Path, member: str, step: int) -> None:
    """Every ``step``-th truncation of ``member`` makes ``load(directory)`` raise a specific
    error of ours, never the bare base class or an InternalError."""
    data = (directory / member).read_bytes()
    for n in range(0, len(data), step):
        (directory / member).write_bytes(data[:n])
        with pytest.raises(torchless.CheckpointError) as info:
            torchless.load(directory)
        assert type(info.value) is not torchless.CheckpointError, n
        assert not isinstance(info.value, torchless.InternalError), n


class ContainerContract:
    """Subclasses write one file of their layout with ``make``."""

    format = ""
    #: the registry's name for the layout (containers/registry.py)
    layout = ""
    has_tensors = True
    #: torch.load reads the file with bytes after it (a legacy stream is read to its last
    #: storage; torch.save twice on one file object writes two streams)
    trailing_bytes_ignored = False

    def make(self, torch: Any, path: Path) -> None:
        raise NotImplementedError

    @pytest.fixture
    def file(self, torch: Any, tmp_path: Path) -> Path:
        path = tmp_path / f"ckpt.{self.format}"
        self.make(torch, path)
        return path

    def test_reads_format_and_values(self, file: Path) -> None:
        with torchless.open(file) as ckpt:
            assert ckpt.format == self.format
            assert ckpt.info["layout"] == self.layout
            assert ckpt.info["era"]
            if self.has_tensors:
                assert list(ckpt.tensors) == ["w", "b"]
                np.testing.assert_array_equal(ckpt.numpy("w"), W)
                np.testing.assert_array_equal(ckpt.numpy("b"), B)
                assert not ckpt.numpy("w").flags.writeable
        loaded = torchless.load(file)
        np.testing.assert_array_equal(loaded["w"], W)
        np.testing.assert_array_equal(loaded["b"], B)

    def valid_length(self, data: bytes) -> int:
        """Bytes that carry the checkpoint; cutting any of them must be refused."""
        return len(data)

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        data = file.read_bytes()[:self.valid_length(file.read_bytes())]
        cut = tmp_path / "cut"
        for n in range(len(data)):  # every byte offset
            cut.write_bytes(data[:n])
            with pytest.raises(torchless.CheckpointError) as info:
                torchless.load(cut)
            assert type(info.value) is not torchless.CheckpointError, (n, info.value)
            assert not isinstance(info.value, torchless.InternalError), (n, info.value)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        grown = tmp_path / "grown"
        grown.write_bytes(file.read_bytes() + b"\x00junk")
        if not self.trailing_bytes_ignored:
            with pytest.raises((torchless.FormatError, torchless.PickleError)):
                torchless.load(grown)
            return
        theirs = torch.load(grown, weights_only=False)
        ours = torchless.load(grown)
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert ours[k].tobytes() == theirs[k].numpy().tobytes()
        with torchless.open(grown) as ckpt:
            assert ckpt.info["trailing_bytes"] == 5

    def test_strict_mode_reads_it(self, file: Path) -> None:
        with torchless.open(file, strict=True) as ckpt:
            assert ckpt.format == self.format


def _state(torch: Any) -> dict[str, Any]:
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "b": torch.tensor([1, 2], dtype=torch.int64)}


class TestZip(ContainerContract):
    format = "zip"
    layout = "zip"

    def make(self, torch: Any, path: Path) -> None:
        torch.save(_state(torch), path)


class TestLegacy(ContainerContract):
    format = "legacy"
    layout = "legacy"
    trailing_bytes_ignored = True

    def make(self, torch: Any, path: Path) -> None:
        torch.save(_state(torch), path, _use_new_zipfile_serialization=False)


class TestTar(ContainerContract):
    format = "tar"
    layout = "tar"

    def valid_length(self, data: bytes) -> int:
        # TAR writers pad with zero blocks to a 10 KiB record: cutting padding after the
        # end-of-archive block loses nothing
        return len(data.rstrip(b"\x00")) + 1

    def make(self, torch: Any, path: Path) -> None:
        write_tar(torch, _state(torch), str(path), views=False)


class TestTorchScript(ContainerContract):
    format = "torchscript"
    layout = "zip"

    def make(self, torch: Any, path: Path) -> None:
        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("w", _state(torch)["w"])
                self.register_buffer("b", _state(torch)["b"])

            def forward(self, x: Any) -> Any:
                return x

        import warnings

        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
            torch.jit.save(torch.jit.script(M()), buf)
        path.write_bytes(buf.getvalue())

    def test_strict_mode_reads_it(self, file: Path) -> None:
        """TorchScript objects are __torch__ classes: outside the rules, so strict refuses."""
        with pytest.raises(torchless.UnsafeGlobalError):
            torchless.open(file, strict=True)


class TestPt2(ContainerContract):
    """torch.export.save: the weights are raw records named by a JSON config."""

    format = "pt2"
    layout = "zip"

    def make(self, torch: Any, path: Path) -> None:
        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("w", _state(torch)["w"])
                self.register_buffer("b", _state(torch)["b"])

            def forward(self, x: Any) -> Any:
                return x + self.w.sum() + self.b.sum()

        ep = torch.export.export(M(), (torch.zeros(1),))
        torch.export.save(ep, path)


class TestPackage(ContainerContract):
    """torch.package: the storages are .data/<key>.storage records."""

    format = "package"
    layout = "zip"

    def make(self, torch: Any, path: Path) -> None:
        import warnings

        from torch.package import PackageExporter

        with warnings.catch_warnings(), PackageExporter(str(path)) as pe:
            warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
            pe.extern(["torch.**", "collections", "builtins"])
            pe.save_pickle("res", "obj.pkl", _state(torch))


class TestPlainPickle(ContainerContract):
    format = "pickle"
    layout = "pickle"
    has_tensors = False

    def make(self, torch: Any, path: Path) -> None:
        import pickle

        path.write_bytes(pickle.dumps({"w": W, "b": B}, protocol=2))


class TestDcp(ContainerContract):
    """A DCP directory (dcp.save, one process): ``file`` is the directory; cutting its
    metadata or its shard anywhere is refused; bytes after the shard's last item are not
    read by torch either."""

    format = "dcp"
    layout = "dcp"

    def make(self, torch: Any, path: Path) -> None:
        import warnings

        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to save in a single
            dcp.save(_state(torch), checkpoint_id=str(path), no_dist=True)  # process"

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        for member in (".metadata", "__0_0.distcp"):
            data = (file / member).read_bytes()
            # every offset of the metadata; the shard's items are checked against its size
            # before any is parsed, so any cut fails the same check: every 7th offset and
            # the last 64 (CI time)
            cuts = range(len(data)) if member == ".metadata" else sorted(
                {*range(0, len(data), 7), *range(max(0, len(data) - 64), len(data))})
            for n in cuts:
                (file / member).write_bytes(data[:n])
                with pytest.raises(torchless.CheckpointError) as info:
                    torchless.load(file)
                assert type(info.value) is not torchless.CheckpointError, (member, n)
                assert not isinstance(info.value, torchless.InternalError), (member, n)
            (file / member).write_bytes(data)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        shard = file / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes() + b"\x00junk")
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(file, tmp_path / "ref.pt")
        theirs = torch.load(tmp_path / "ref.pt")
        ours = torchless.load(file)
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert ours[k].tobytes() == theirs[k].numpy().tobytes()
        meta = file / ".metadata"
        meta.write_bytes(meta.read_bytes() + b"\x00junk")
        with pytest.raises(torchless.PickleError, match="after the pickle's STOP"):
            torchless.load(file)


class TestDcpHf(TestDcp, ContainerContract):
    """DCP's Hugging Face writer saving distributed (here one process): one safetensors
    file a rank, no .metadata."""

    layout = "dcp-hf"
    member = "shard-00001-model-00001-of-00001.safetensors"

    def make(self, torch: Any, path: Path) -> None:
        import warnings

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(_state(torch), no_dist=True, storage_writer=HuggingFaceStorageWriter(
                str(path), save_distributed=True))

    def test_reads_format_and_values(self, file: Path) -> None:
        """Names in the order torch's HuggingFaceStorageReader lists them (sorted, as
        safetensors' ``safe_open(...).keys()`` gives them)."""
        with torchless.open(file) as ckpt:
            assert (ckpt.format, ckpt.info["layout"]) == ("dcp", "dcp-hf")
            assert list(ckpt.tensors) == ["b", "w"]
            np.testing.assert_array_equal(ckpt.numpy("w"), W)
            np.testing.assert_array_equal(ckpt.numpy("b"), B)

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        _truncations_refused(file, self.member, step=1)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        shard = file / self.member
        shard.write_bytes(shard.read_bytes() + b"\x00junk")
        with pytest.raises(torchless.FormatError, match="data section"):
            torchless.load(file)


def test_every_registered_layout_passes_the_contract() -> None:
    from torchless.containers import registry

    tested = {cls.layout for cls in ContainerContract.__subclasses__()}
    assert set(registry.layouts()) <= tested, set(registry.layouts()) - tested


class TestRanks(ContainerContract):
    """A directory of verl's per-rank files for one rank (plain tensors; the DTensor
    pieces of two ranks are in test_ranks.py)."""

    format = "ranks"
    layout = "ranks"
    member = "model_world_size_1_rank_0.pt"

    def make(self, torch: Any, path: Path) -> None:
        path.mkdir()
        torch.save(_state(torch), path / self.member)

    def test_reads_format_and_values(self, file: Path) -> None:
        with torchless.open(file) as ckpt:
            assert (ckpt.format, ckpt.info["layout"]) == ("ranks", "ranks")
            assert ckpt.info["era"] and ckpt.info["world_size"] == 1
            assert list(ckpt.tensors) == ["w", "b"]
            np.testing.assert_array_equal(ckpt.numpy("w"), W)
            np.testing.assert_array_equal(ckpt.numpy("b"), B)
        loaded = torchless.load(file)
        np.testing.assert_array_equal(loaded["model"]["w"], W)
        np.testing.assert_array_equal(loaded["model"]["b"], B)

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        _truncations_refused(file, self.member, step=7)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        part = file / self.member
        part.write_bytes(part.read_bytes() + b"\x00junk")
        with pytest.raises(torchless.FormatError) as info:
            torchless.load(file)
        assert info.value.member == self.member


class TestMegatronDist(ContainerContract):
    """A Megatron-Core run directory (the tracker file naming a ``torch_dist`` save: DCP,
    ``common.pt``, ``metadata.json``; the TP=2 case is in test_megatron.py): the tensors and
    common.pt's state merged, as Megatron's loader merges them."""

    format = "dcp"
    layout = "megatron-dist"
    member = "iter_0000001/common.pt"

    def make(self, torch: Any, path: Path) -> None:
        import json
        import warnings

        import torch.distributed.checkpoint as dcp

        save = path / "iter_0000001"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(_state(torch), checkpoint_id=str(save), no_dist=True)
        torch.save({"iteration": 1, "checkpoint_version": 3.0}, save / "common.pt")
        (save / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
        (path / "latest_checkpointed_iteration.txt").write_text("1")

    def test_reads_format_and_values(self, file: Path) -> None:
        with torchless.open(file) as ckpt:
            assert (ckpt.format, ckpt.info["layout"]) == ("dcp", "megatron-dist")
            assert ckpt.info["era"].startswith("Megatron-Core dist checkpoint")
            assert list(ckpt.tensors) == ["w", "b"]
            np.testing.assert_array_equal(ckpt.numpy("w"), W)
        loaded = torchless.load(file)
        assert (loaded["iteration"], loaded["checkpoint_version"]) == (1, 3.0)
        np.testing.assert_array_equal(loaded["b"], B)

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        _truncations_refused(file, self.member, step=3)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        common = file / self.member
        common.write_bytes(common.read_bytes() + b"\x00junk")
        with pytest.raises((torchless.FormatError, torchless.PickleError)) as info:
            torchless.load(file)
        assert info.value.member == "common.pt"


class TestMegatronLegacy(ContainerContract):
    """Megatron-LM's legacy layout with one tensor rank (the TP=2 case is in
    test_megatron.py): the iteration the tracker file names, each rank's file as saved."""

    format = "megatron-legacy"
    layout = "megatron-legacy"
    member = "iter_0000003/mp_rank_00/model_optim_rng.pt"

    def make(self, torch: Any, path: Path) -> None:
        (path / "iter_0000003" / "mp_rank_00").mkdir(parents=True)
        (path / "latest_checkpointed_iteration.txt").write_text("3\n")
        torch.save({"iteration": 3, "model": _state(torch)}, path / self.member)

    def test_reads_format_and_values(self, file: Path) -> None:
        with torchless.open(file) as ckpt:
            assert (ckpt.format, ckpt.info["layout"]) == ("megatron-legacy",
                                                          "megatron-legacy")
            assert ckpt.info["era"] and ckpt.info["iteration"] == 3
            assert list(ckpt.tensors) == ["mp_rank_00.model.w", "mp_rank_00.model.b"]
            np.testing.assert_array_equal(ckpt.numpy("mp_rank_00.model.w"), W)
        loaded = torchless.load(file)
        np.testing.assert_array_equal(loaded["mp_rank_00"]["model"]["b"], B)

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        _truncations_refused(file, self.member, step=7)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        part = file / self.member
        part.write_bytes(part.read_bytes() + b"\x00junk")
        with pytest.raises(torchless.FormatError) as info:
            torchless.load(file)
        assert info.value.member == "mp_rank_00/model_optim_rng.pt"


class TestZero(ContainerContract):
    """A DeepSpeed ZeRO-2 directory of one rank, written with torch.save in DeepSpeed's
    layout (the DeepSpeed-written cases are in test_zero.py): ``w`` from the flat fp32
    partition (padded to ``2 * world_size``), ``b`` a buffer of the model states."""

    format = "zero"
    layout = "zero"
    member = "global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt"

    def make(self, torch: Any, path: Path) -> None:
        tag = path / "global_step1"
        tag.mkdir(parents=True)
        (path / "latest").write_text("global_step1")
        state = _state(torch)
        torch.save({"module": {"b": state["b"]}, "buffer_names": ["b"],
                    "param_shapes": [{"w": torch.Size([2, 3])}], "shared_params": {},
                    "frozen_param_shapes": None, "global_steps": 1},
                   tag / "mp_rank_00_model_states.pt")
        flat = torch.cat([state["w"].reshape(-1), torch.zeros(0)])
        torch.save({"optimizer_state_dict": {
            "zero_stage": 2, "partition_count": [1], "single_partition_of_fp32_groups": [flat],
            "base_optimizer_state": {"state": {0: {"exp_avg": torch.ones(6)}},
                                     "param_groups": [{"lr": 0.1, "params": [0]}]}}},
                   path / self.member)

    def test_reads_format_and_values(self, file: Path) -> None:
        with torchless.open(file) as ckpt:
            assert (ckpt.format, ckpt.info["layout"]) == ("zero", "zero")
            assert ckpt.info["era"] and ckpt.info["zero_stage"] == 2
            assert list(ckpt.tensors) == ["b", "w"]
            np.testing.assert_array_equal(ckpt.numpy("w"), W)
            np.testing.assert_array_equal(ckpt.numpy("b"), B)
            assert not ckpt.numpy("w").flags.writeable
        loaded = torchless.load(file)
        np.testing.assert_array_equal(loaded["module"]["w"], W)
        np.testing.assert_array_equal(loaded["optimizer"]["state"]["w"]["exp_avg"],
                                      np.ones((2, 3), np.float32))

    def test_every_truncation_is_refused(self, file: Path, tmp_path: Path) -> None:
        _truncations_refused(file, self.member, step=7)

    def test_trailing_bytes(self, torch: Any, file: Path, tmp_path: Path) -> None:
        """A partition with bytes after its archive is refused, naming the file."""
        part = file / self.member
        part.write_bytes(part.read_bytes() + b"\x00junk")
        with pytest.raises(torchless.FormatError) as info:
            torchless.load(file)
        assert info.value.member == "zero_pp_rank_0_mp_rank_00_optim_states.pt"
