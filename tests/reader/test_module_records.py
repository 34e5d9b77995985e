"""A module saved whole (``torch.save(model)``) loads as the record of its ``__dict__``
(issue 29): its class, every plain attribute (``names``, ``yaml``, ``args``, ``config``,
``pretrained_cfg``, an Enum …), its parameters, buffers (non-persistent ones too) and
submodules, with tensors as arrays; ``modules="state_dict"`` gives its ``state_dict()``.
Every expected value comes from ``torch.load(weights_only=False)`` of the same file,
attribute by attribute (tests/_modulesaves.py: the shapes ultralytics, timm and HF models
keep; those libraries are not installed here)."""

from __future__ import annotations

import argparse
import collections
import enum
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless

pytestmark = pytest.mark.torch


@pytest.fixture(params=[2, 5])
def saved(request: pytest.FixtureRequest, torch: ModuleType, tmp_path: Path) -> tuple[Path, Any]:
    from tests import _modulesaves

    path = tmp_path / "model.pt"
    torch.save(_modulesaves.detector(), path, pickle_protocol=request.param)
    return path, torch.load(path, weights_only=False)


def _same(torch: ModuleType, want: Any, got: Any, where: str) -> None:
    """``got`` (torchless) is what torch loaded as ``want``, recursively; a module is
    compared as its record: class path, then every ``__dict__`` entry."""
    if isinstance(want, torch.nn.Module):
        assert isinstance(got, torchless.Opaque), where
        assert got.class_path == f"{type(want).__module__}.{type(want).__qualname__}", where
        assert isinstance(got.state, dict), where
        assert list(got.state) == list(vars(want)), where  # nothing vanishes
        for k, v in vars(want).items():
            _same(torch, v, got.state[k], f"{where}.{k}")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, np.ndarray), where
        np.testing.assert_array_equal(got, want.detach().numpy(), err_msg=where)
        assert got.dtype == want.detach().numpy().dtype, where
    elif isinstance(want, enum.Enum):
        assert isinstance(got, torchless.Opaque), where  # a class of the program: inert
        assert got.class_path == f"{type(want).__module__}.{type(want).__qualname__}"
        assert got.args == (want.value,), where
    elif isinstance(want, argparse.Namespace):
        assert isinstance(got, argparse.Namespace) and vars(got) == vars(want), where
    elif isinstance(want, dict):
        assert type(got) is type(want) or isinstance(got, dict), where
        assert list(got) == list(want), where
        for k, v in want.items():
            _same(torch, v, got[k], f"{where}.{k}")
    elif isinstance(want, (set, frozenset)):
        assert got == want, where
    elif type(want).__module__ == "tests._modulesaves":  # Config: a plain object
        assert isinstance(got, torchless.Opaque), where
        assert got.class_path == f"{type(want).__module__}.{type(want).__qualname__}"
        assert got.state == vars(want), where
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def test_load_gives_the_module_record(torch: ModuleType, saved: tuple[Path, Any]) -> None:
    path, model = saved
    record = torchless.load(path)
    _same(torch, model, record, "model")
    attrs = record.state
    assert attrs["names"] == {0: "cat", 1: "dog"} and attrs["yaml"]["nc"] == 2
    assert attrs["config"].state["architectures"] == ["TinyForDetection"]
    assert attrs["pretrained_cfg"]["input_size"] == (3, 32, 32)


def test_tied_parameters_are_one_array(saved: tuple[Path, Any]) -> None:
    path, model = saved
    assert model.out.weight is model.embed.weight
    mods = torchless.load(path).state["_modules"]
    assert mods["out"].state["_parameters"]["weight"] is \
        mods["embed"].state["_parameters"]["weight"]


def test_state_dict_switch_is_todays_shape(torch: ModuleType, saved: tuple[Path, Any]) -> None:
    path, model = saved
    want = model.state_dict()
    got = torchless.load(path, modules="state_dict")
    assert isinstance(got, collections.OrderedDict)
    assert list(got) == list(want)
    for name, t in want.items():
        np.testing.assert_array_equal(got[name], t.numpy(), err_msg=name)
    assert got["out.weight"] is got["embed.weight"]
    with torchless.open(path) as ckpt:  # open keeps state dicts unless asked
        assert list(ckpt.tensors) == list(want)


def test_record_names_its_tensors_as_state_dict_does(saved: tuple[Path, Any]) -> None:
    """``open(modules="record")``: each ``state_dict()`` name names the same tensor, and
    the tensors no state dict holds (a non-persistent buffer, a tensor attribute) are
    named in the same way, not lost."""
    path, model = saved
    want = model.state_dict()
    with torchless.open(path, modules="record") as ckpt:
        assert isinstance(ckpt.tree, torchless.Opaque)
        names = list(ckpt.tensors)
        assert [n for n in names if n in want] == list(want)
        assert sorted(set(names) - set(want)) == ["model.2.scratch", "model.2.stride"]
        for name, t in want.items():
            np.testing.assert_array_equal(ckpt.numpy(name), t.numpy(), err_msg=name)
        np.testing.assert_array_equal(ckpt.numpy("model.2.stride"), model.model[2].stride)
        np.testing.assert_array_equal(ckpt.numpy("model.2.scratch"), model.model[2].scratch)


def test_record_survives_the_inert_format(torch: ModuleType, saved: tuple[Path, Any],
                                          tmp_path: Path) -> None:
    """``torchless.save`` of the record, loaded back: equal to torch's module attribute by
    attribute; the tensors stored under their ``state_dict()`` names."""
    path, model = saved
    out = tmp_path / "model.inert.safetensors"
    torchless.save(torchless.load(path), out)
    back = torchless.load(out)
    _same(torch, model, back, "model")
    from safetensors.numpy import load_file

    stored = set(load_file(out))
    assert set(model.state_dict()) - {"out.weight"} <= stored  # the tied weight stored once


def test_modules_must_be_known(saved: tuple[Path, Any]) -> None:
    path, _ = saved
    with pytest.raises(ValueError, match="modules must be"):
        torchless.load(path, modules="dict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="modules must be"):
        torchless.open(path, modules="tree")  # type: ignore[arg-type]


def test_a_module_inside_a_checkpoint(torch: ModuleType, tmp_path: Path) -> None:
    """An ultralytics-like checkpoint: the model under ``model``, beside plain entries; the
    summary reads names and nc from the record."""
    from tests import _modulesaves
    from torchless.cli.summaries import structures

    path = tmp_path / "best.pt"
    ckpt = {"epoch": -1, "best_fitness": 0.25, "model": _modulesaves.detector(), "ema": None,
            "train_args": {"task": "detect", "imgsz": 640}, "version": "8.3.0"}
    torch.save(ckpt, path)
    want = torch.load(path, weights_only=False)
    got = torchless.load(path)
    _same(torch, want["model"], got["model"], "model")
    with torchless.open(path, modules="record") as opened:
        lines = structures(opened.tree, "")
    assert lines[:3] == [
        ("ultralytics", "Ultralytics checkpoint (ultralytics 8.3.0): task='detect', nc=2, "
                        "epoch=-1, best_fitness=0.25, imgsz=640"),
        ("ultralytics", "model: <tests._modulesaves.TinyDetector>, yaml 'tiny.yaml'"),
        ("ultralytics", "names: 0='cat', 1='dog'")]


def test_convert_keeps_the_attributes(torch: ModuleType, saved: tuple[Path, Any],
                                      tmp_path: Path) -> None:
    """``convert`` stores the record in the inert tree (``load`` of the output gives torch's
    attributes back) and verifies it; ``tree=False`` (``--no-tree``) writes the
    ``state_dict()`` tensors alone, as before."""
    path, model = saved
    out = tmp_path / "model.safetensors"
    with pytest.warns(torchless.OpaqueObjectWarning):  # the module classes: inert records
        report = torchless.convert(path, out, verify=True)
    assert report.verified is not None and report.verified.ok
    _same(torch, model, torchless.load(out), "model")
    weights = tmp_path / "weights.safetensors"
    report = torchless.convert(path, weights, verify=True, tree=False)
    assert report.verified is not None and report.verified.ok
    from safetensors.numpy import load_file

    assert set(load_file(weights)) | {"out.weight"} == set(model.state_dict())


def test_inspect_reads_the_module_attributes(torch: ModuleType, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``inspect`` keeps state dicts in its tensor table, and its summary reads the module's
    own attributes (ultralytics' names, nc, yaml; an HF-like config; timm's
    pretrained_cfg) from the record each state dict was read from."""
    from tests import _modulesaves
    from torchless.cli.main import main

    path = tmp_path / "best.pt"
    torch.save({"epoch": -1, "best_fitness": 0.25, "model": _modulesaves.detector(),
                "ema": None, "train_args": {"task": "detect", "imgsz": 640},
                "version": "8.3.0"}, path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("Ultralytics checkpoint (ultralytics 8.3.0): task='detect', nc=2, epoch=-1, "
            "best_fitness=0.25, imgsz=640") in out
    assert "model: <tests._modulesaves.TinyDetector>, yaml 'tiny.yaml'" in out
    assert "names: 0='cat', 1='dog'" in out
    assert "model.model.2.stride" not in out  # the table: the state dict's tensors
    whole = tmp_path / "whole.pt"
    torch.save(_modulesaves.detector(), whole)
    assert main(["inspect", str(whole)]) == 0
    out = capsys.readouterr().out
    assert ("timm model <tests._modulesaves.TinyDetector>: pretrained_cfg "
            "architecture='tiny', num_classes=2, input_size=(3, 32, 32)") in out
    assert ("HF model <tests._modulesaves.TinyDetector>: config <tests._modulesaves.Config> "
            "architectures=['TinyForDetection'], model_type='tiny', hidden_size=4") in out
