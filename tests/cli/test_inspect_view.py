"""``inspect`` worth reading: known structures first (Lightning keys, optimizer and scheduler
state, callbacks, RNG states, an HF Trainer's trainer_state.json beside the file), inert
records with their fields, no silent truncation, --all, --tree and --filter. Checkpoints are
written by torch with the keys Lightning and the HF Trainer write."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from torchless.cli.main import main

pytestmark = pytest.mark.torch


@dataclasses.dataclass
class TrainingArguments:  # the HF class's shape: a dataclass pickled with its fields
    output_dir: str = "out"
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    seed: int = 42


def _lightning(torch: ModuleType, path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    torch.save({
        "epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.6.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {"k": 1},
                      "EarlyStopping{'monitor': 'val_loss'}": {"wait_count": 0}},
        "optimizer_states": [opt.state_dict()], "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": argparse.Namespace(lr=1e-3, hidden=16)}, path)


def _entry(text: str) -> dict[str, Any]:
    """The one file's entry of an ``inspect --json`` document."""
    doc = json.loads(text)
    assert doc["format"] == "torchless-inspect" and doc["version"] == 1
    (entry,) = doc["files"]
    assert entry["ok"] is True
    return dict(entry)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


def test_lightning_summary_comes_first(torch: ModuleType, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _lightning(torch, tmp_path / "last.ckpt")
    out = _run(["inspect", str(tmp_path / "last.ckpt")], capsys)
    summary = out[out.index("summary:"):out.index("  name ")]
    assert "Lightning checkpoint (lightning 2.6.0): epoch 3, global_step 1200" in summary
    assert "hyper_parameters (Namespace): lr=0.001, hidden=16" in summary
    assert "optimizer (optimizer_states.0): 2 params in 1 group; lr=0.001" in summary
    assert "state for 2 params (exp_avg, exp_avg_sq, step)" in summary
    assert "scheduler (lr_schedulers.0): step_size=10, gamma=0.5" in summary
    assert "callbacks: ModelCheckpoint, EarlyStopping" in summary
    doc = _entry(_run(["inspect", str(tmp_path / "last.ckpt"), "--json"], capsys))
    kinds = [s["kind"] for s in doc["summary"]]
    assert kinds == ["lightning", "config", "optimizer", "scheduler", "callbacks"]


def test_rng_states_and_trainer_files(torch: ModuleType, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    random.seed(1)
    np.random.seed(1)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                "cpu": torch.get_rng_state()}, tmp_path / "rng_state.pth")
    (tmp_path / "trainer_state.json").write_text(json.dumps({
        "global_step": 500, "epoch": 1.5, "best_metric": 0.25,
        "log_history": [{"loss": 0.9, "step": 10}, {"loss": 0.5, "step": 500}]}))
    out = _run(["inspect", str(tmp_path / "rng_state.pth")], capsys)
    assert "numpy: numpy MT19937 state (625 ints)" in out
    assert "python: python random state (625 ints)" in out
    assert "RNG states: python, numpy, cpu" in out
    assert ("HF Trainer state (trainer_state.json): global_step=500, epoch=1.5, "
            "best_metric=0.25; 2 log entries, last: loss=0.5, step=500") in out
    assert len(out.splitlines()) < 40  # not 625 lines of key material
    tree = _run(["inspect", str(tmp_path / "rng_state.pth"), "--tree"], capsys)
    assert tree.splitlines() == ["dict (3)", "  python: python random state (625 ints)",
                                 "  numpy: numpy MT19937 state (625 ints)",
                                 "  cpu: Tensor uint8 5056"]


def test_inert_records_show_their_fields(torch: ModuleType, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(TrainingArguments(), tmp_path / "training_args.bin")
    out = _run(["inspect", str(tmp_path / "training_args.bin")], capsys)
    assert "TrainingArguments> (4 fields)" in out
    for field, value in (("output_dir", "'out'"), ("learning_rate", "5e-05"),
                         ("num_train_epochs", "3.0"), ("seed", "42")):
        assert f"    {field}: {value}\n" in out
    doc = _entry(_run(["inspect", str(tmp_path / "training_args.bin"), "--json"], capsys))
    assert doc["values"]["seed"] == "42" and doc["values"]["output_dir"] == "'out'"


def test_nothing_is_cut_silently(torch: ModuleType, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({f"w{i:03d}": torch.zeros(1) for i in range(130)}
               | {f"v{i:03d}": i for i in range(120)}, tmp_path / "many.pt")
    out = _run(["inspect", str(tmp_path / "many.pt")], capsys)
    assert "  … 30 more tensors (use --all)\n" in out and "w129" not in out
    assert "  … 20 more values (use --all)\n" in out and "v119" not in out
    full = _run(["inspect", str(tmp_path / "many.pt"), "--all"], capsys)
    assert "more tensors" not in full and "w129" in full and "v119: 119" in full
    doc = _entry(_run(["inspect", str(tmp_path / "many.pt"), "--json"], capsys))
    assert len(doc["tensors"]) == 130 and len(doc["values"]) == 120


def test_tree_and_filter(torch: ModuleType, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    w = torch.zeros(3, 2)
    torch.save({"model": {"a.weight": w, "a.bias": torch.zeros(3), "b.weight": w.t()},
                "step": 7, "tags": ["x", "y"]}, tmp_path / "m.pt")
    tree = _run(["inspect", str(tmp_path / "m.pt"), "--tree"], capsys)
    assert tree.splitlines() == [
        "dict (3)",
        "  model: dict (3)",
        "    a.weight: Tensor float32 3x2",
        "    a.bias: Tensor float32 3",
        "    b.weight: Tensor float32 2x3",
        "  step: 7",
        "  tags: ['x', 'y']"]
    picked = _run(["inspect", str(tmp_path / "m.pt"), "--tree", "--filter", "*.weight"], capsys)
    assert picked.splitlines() == ["dict (3)", "  model: dict (3)",
                                   "    a.weight: Tensor float32 3x2",
                                   "    b.weight: Tensor float32 2x3"]
    doc = _entry(_run(["inspect", str(tmp_path / "m.pt"), "--json", "--filter",
                           "model.a.*"], capsys))
    assert [t["name"] for t in doc["tensors"]] == ["model.a.weight", "model.a.bias"]
    assert doc["tensors_in_file"] == 3
    text = _run(["inspect", str(tmp_path / "m.pt"), "--filter", "*.bias"], capsys)
    assert "tensors: 1 matching '*.bias' (of 3)" in text


def test_options_that_need_each_other(tmp_path: Path) -> None:
    tiny = str(Path(__file__).resolve().parents[2] / "examples" / "tiny.pt")
    for bad in (["--html"], ["-o", str(tmp_path / "x.html")]):
        with pytest.raises(SystemExit) as info:
            main(["inspect", tiny, *bad])
        assert info.value.code == 4
    assert not (tmp_path / "x.html").exists()




def test_odd_shapes_never_break_the_summary() -> None:
    """Structures that only look like known ones (from any file) are described or left out,
    never a crash; a huge value is clipped before it is printed."""
    from torchless.cli.summaries import compact, structures

    tree = {"optimizer": {"state": 5, "param_groups": [{"params": 3}, "x"]},
            "a": (np.arange(3), np.zeros(624), 1, 2, 3), "b": (np.arange(2), (1,) * 625, None),
            "hyper_parameters": {"blob": b"x" * 10**6, "name": "y" * 10**6},
            "callbacks": {"Only{": 1}, "epoch": np.arange(2)}
    found = dict(structures(tree, ""))
    assert found["optimizer"] == "optimizer (optimizer): 0 params in 2 groups"
    assert len(found["config"]) < 200 and "blob=b'xxxx" in found["config"]
    assert found["callbacks"] == "callbacks: Only"
    assert compact(tree["a"]) is None and compact(tree["b"]) is None
    assert compact(("MT19937", np.zeros(624, np.uint32), 0, 0, 0.0)) == \
        "numpy MT19937 state (625 ints)"


def test_tree_clips_long_names_from_the_file(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """One memoised 100 KB name as 2,000 globals, and a 100 KB dict key: each tree line
    shows at most 80 characters of them (the tree printed 200 MB here)."""
    import struct

    from tests._fuzz_inputs import zip_checkpoint

    name = b"a" * 100_000
    data = (b"\x80\x04}\x94(\x8c\x01g]\x8c\x05mymod\x940X" + struct.pack("<I", len(name)) + name
            + b"\x940(" + b"h\x01h\x02\x93" * 2000 + b"eX" + struct.pack("<I", len(name))
            + name + b"K\x07u.")
    src = tmp_path / "n.pt"
    src.write_bytes(zip_checkpoint(data))
    out = _run(["inspect", str(src), "--tree"], capsys)
    lines = out.splitlines()
    assert len(lines) == 2003 and max(len(line) for line in lines) < 100
    assert lines[1] == "  g: list (2000)"
    assert lines[2] == "    0: <global mymod." + "a" * 62 + "...>"
    assert lines[-1] == "  " + "a" * 77 + "...: 7"


def _memo_key_pickle(key: bytes, body: bytes) -> bytes:
    import struct

    return (b"\x80\x04}\x94(\x8c\x01xX" + struct.pack("<I", len(key)) + key + b"\x940" + body
            + b"u.")


def test_values_clip_long_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2,000 dicts each keyed by one memoised 1 MiB key (20 KB of opcodes): each value's
    name shows the key's start and length (the names took 2 GB, and inspect 20 GB of
    memory for 20,000)."""
    from tests._fuzz_inputs import zip_checkpoint

    src = tmp_path / "k.pt"
    src.write_bytes(zip_checkpoint(_memo_key_pickle(
        b"k" * (1 << 20), b"](" + b"}h\x01K\x07s" * 2000 + b"e")))
    doc = _entry(_run(["inspect", str(src), "--json"], capsys))
    clipped = "k" * 100 + "…(1048576 characters)"
    assert len(doc["values"]) == 2000
    assert doc["values"][f"x.0.{clipped}"] == "7"
    assert doc["values"][f"x.1999.{clipped}"] == "7"


def test_values_stop_where_their_names_pass_64_mib(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """100 nested dicts under one 200-character key (each name repeats it 100 times: 20 KB),
    then a dict of 4,000 values: their names would take 80 MB; the listing stops with a
    note."""
    import struct

    from tests._fuzz_inputs import zip_checkpoint

    key = b"k" * 200
    items = b"".join(b"M" + struct.pack("<H", i) + b"K\x07" for i in range(4000))
    chain = b"}h\x01" * 100 + b"}(" + items + b"u" + b"s" * 100
    src = tmp_path / "d.pt"
    src.write_bytes(zip_checkpoint(_memo_key_pickle(key, chain)))
    doc = _entry(_run(["inspect", str(src), "--json"], capsys))
    values = doc["values"]
    assert 3000 < len(values) < 4000
    assert values["…"].endswith("more values not listed: their names pass 67108864 characters")


def test_summary_names_places_as_tensor_names_do() -> None:
    """A summary's label names the place as ``.tensors`` names it (model/walk.entry_name):
    a bytes key by its text, a non-plain key by its position."""
    from torchless.cli.summaries import structures

    opt = {"state": {}, "param_groups": [{"params": [0, 1]}]}
    found = dict(structures({"run": {b"opt": opt}}, ""))
    assert found["optimizer"] == "optimizer (run.opt): 2 params in 1 group"
    found = dict(structures({"run": {(1, object()): opt}}, ""))
    assert found["optimizer"] == "optimizer (run.0.1): 2 params in 1 group"
