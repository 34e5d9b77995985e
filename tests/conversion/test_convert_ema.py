"""``ema`` (issue 28, item 3): the EMA weights under the model's names, for the three
conventions of :mod:`torchless.conversion.ema`.

ldm, timm and ultralytics are not test dependencies, so each fixture is written by torch
with the library's own save code restated here, step for step (the sources are named at
each); the expected names are written out by hand from the modules' structure, and the
expected values come from the library's own way of using its EMA (ldm's
``LitEma.copy_to``; timm's and ultralytics' EMA module's ``state_dict()``), never from
torchless."""

from __future__ import annotations

import argparse
import copy
import math
import re
import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from tests.cli.test_cli import run
from torchless.errors import ConversionError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny.pt"


def _written(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(path)))


def _assert_nothing_written(directory: Path, *keep: str) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(keep)


# ---- Stable Diffusion / ldm ---------------------------------------------------------------


def _ldm_classes(torch: ModuleType) -> tuple[type, type]:
    nn = torch.nn

    class LitEma(nn.Module):
        """ldm/modules/ema.py (CompVis/stable-diffusion), ``__init__``, ``forward`` and
        ``copy_to`` restated: a buffer per trainable parameter, named by the parameter's
        name with the dots removed, beside ``decay`` and ``num_updates``."""

        def __init__(self, model: Any, decay: float = 0.9999,
                     use_num_upates: bool = True) -> None:
            super().__init__()
            self.m_name2s_name: dict[str, str] = {}
            self.register_buffer("decay", torch.tensor(decay, dtype=torch.float32))
            self.register_buffer("num_updates", torch.tensor(0, dtype=torch.int)
                                 if use_num_upates else torch.tensor(-1, dtype=torch.int))
            for name, p in model.named_parameters():
                if p.requires_grad:
                    s_name = name.replace(".", "")
                    self.m_name2s_name.update({name: s_name})
                    self.register_buffer(s_name, p.clone().detach().data)

        def forward(self, model: Any) -> None:
            decay = self.decay
            if self.num_updates >= 0:
                self.num_updates += 1
                decay = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
            one_minus_decay = 1.0 - decay
            with torch.no_grad():
                m_param = dict(model.named_parameters())
                shadow = dict(self.named_buffers())
                for key in m_param:
                    if m_param[key].requires_grad:
                        s = self.m_name2s_name[key]
                        shadow[s] = shadow[s].type_as(m_param[key])
                        shadow[s].sub_(one_minus_decay * (shadow[s] - m_param[key]))

        def copy_to(self, model: Any) -> None:
            m_param = dict(model.named_parameters())
            shadow = dict(self.named_buffers())
            for key in m_param:
                if m_param[key].requires_grad:
                    m_param[key].data.copy_(shadow[self.m_name2s_name[key]].data)

    class UNet(nn.Module):  # openaimodel.UNetModel's attribute names, tiny
        def __init__(self) -> None:
            super().__init__()
            self.time_embed = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8))
            self.input_blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(4, 8, 3, padding=1)),
                                               nn.Sequential(nn.Conv2d(8, 8, 1))])
            self.out = nn.Sequential(nn.GroupNorm(2, 8), nn.SiLU(), nn.Conv2d(8, 4, 1))

    class DiffusionWrapper(nn.Module):  # ldm/models/diffusion/ddpm.py
        def __init__(self) -> None:
            super().__init__()
            self.diffusion_model = UNet()

    class LatentDiffusion(nn.Module):
        """ddpm.py's DDPM/LatentDiffusion attributes: ``model``, ``model_ema =
        LitEma(self.model)`` when ``use_ema``, the schedule buffers, the frozen first and
        conditioning stages."""

        def __init__(self) -> None:
            super().__init__()
            self.model = DiffusionWrapper()
            self.model_ema = LitEma(self.model)
            self.register_buffer("betas", torch.linspace(1e-4, 2e-2, 5))
            self.register_buffer("scale_factor", torch.tensor(0.18215))
            self.first_stage_model = nn.Conv2d(3, 4, 1).requires_grad_(False)
            self.cond_stage_model = nn.Embedding(10, 8).requires_grad_(False)

    return LatentDiffusion, LitEma


def _sd_checkpoint(torch: ModuleType, path: Path, edit: Any = None) -> Any:
    """Three training steps with EMA updates (ddpm.py ``on_train_batch_end``:
    ``self.model_ema(self.model)``), saved as Lightning's ModelCheckpoint saves."""
    latent_diffusion, _ = _ldm_classes(torch)
    torch.manual_seed(0)
    ld = latent_diffusion()
    for _ in range(3):
        with torch.no_grad():
            for p in ld.model.parameters():
                p.add_(torch.randn_like(p))
        ld.model_ema(ld.model)
    state = ld.state_dict()
    if edit is not None:
        edit(state)
    torch.save({"epoch": 0, "global_step": 3, "pytorch-lightning_version": "1.4.2",
                "state_dict": state, "callbacks": {}, "optimizer_states": [],
                "lr_schedulers": []}, path)
    return ld


#: the model's names, by hand from UNet / DiffusionWrapper / LatentDiffusion above
_SD_MODEL = ["model.diffusion_model.time_embed.0.weight",
             "model.diffusion_model.time_embed.0.bias",
             "model.diffusion_model.time_embed.2.weight",
             "model.diffusion_model.time_embed.2.bias",
             "model.diffusion_model.input_blocks.0.0.weight",
             "model.diffusion_model.input_blocks.0.0.bias",
             "model.diffusion_model.input_blocks.1.0.weight",
             "model.diffusion_model.input_blocks.1.0.bias",
             "model.diffusion_model.out.0.weight", "model.diffusion_model.out.0.bias",
             "model.diffusion_model.out.2.weight", "model.diffusion_model.out.2.bias"]
_SD_REST = ["betas", "scale_factor", "first_stage_model.weight", "first_stage_model.bias",
            "cond_stage_model.weight"]


def test_stable_diffusion_ema_is_written_under_the_model_names(torch: ModuleType,
                                                               tmp_path: Path) -> None:
    src, out = tmp_path / "sd.ckpt", tmp_path / "sd.safetensors"
    ld = _sd_checkpoint(torch, src)
    report = torchless.convert(src, out, ema=True, key="state_dict", verify=True)
    written = _written(out)
    assert sorted(written) == sorted(_SD_MODEL + _SD_REST)  # model_ema.* all left out
    reference = copy.deepcopy(ld.model)  # what ldm's ema_scope() runs the model with
    ld.model_ema.copy_to(reference)
    expected = {"model." + k: v for k, v in reference.state_dict().items()}
    trained = ld.state_dict()
    for name in _SD_MODEL:
        assert torch.equal(written[name], expected[name]), name
        assert not torch.equal(written[name], trained[name]), name  # not the trained ones
    for name in _SD_REST:
        assert torch.equal(written[name], trained[name]), name
    assert report.verified is not None and report.verified.ok
    assert torchless.verify(src, out, ema=True, key="state_dict").ok
    assert not torchless.verify(src, out, key="state_dict").ok

    # without key: the names of the whole checkpoint, the same swap under state_dict.
    out2 = tmp_path / "whole.safetensors"
    torchless.convert(src, out2, ema=True)
    assert sorted(_written(out2)) == sorted("state_dict." + n for n in _SD_MODEL + _SD_REST)


def test_the_command_line_ema(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "sd.ckpt"
    _sd_checkpoint(torch, src)
    done = run("convert", str(src), "--ema", "--key", "state_dict", "--include", "model.*",
               "--strip-prefix", "model.diffusion_model.", "--verify", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(_written(tmp_path / "sd.safetensors")) == sorted(
        n.removeprefix("model.diffusion_model.") for n in _SD_MODEL)


def test_sd_refusals_name_the_weight(torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "sd.ckpt", tmp_path / "sd.safetensors"

    def drop(state: dict[str, Any]) -> None:
        del state["model_ema.diffusion_modelout2bias"]

    _sd_checkpoint(torch, src, drop)
    with pytest.raises(ConversionError, match=re.escape(
            "'state_dict.model.diffusion_model.out.2.bias' has no EMA twin")):
        torchless.convert(src, out, ema=True)

    def reshape(state: dict[str, Any]) -> None:
        state["model_ema.diffusion_modelout2bias"] = torch.zeros(5)

    _sd_checkpoint(torch, src, reshape)
    with pytest.raises(ConversionError, match=r"'state_dict.model.diffusion_model.out.2.bias' "
                                              r"is shape \[4\], its EMA twin"):
        torchless.convert(src, out, ema=True)

    def extra(state: dict[str, Any]) -> None:
        state["model_ema.stray"] = torch.zeros(1)

    _sd_checkpoint(torch, src, extra)
    with pytest.raises(ConversionError, match=re.escape(
            "no model weight for 1 EMA entry: 'state_dict.model_ema.stray'")):
        torchless.convert(src, out, ema=True)

    def pruned(state: dict[str, Any]) -> None:  # as the "-emaonly" / pruned files are
        for name in [n for n in state if n.startswith("model_ema.")]:
            if name not in ("model_ema.decay", "model_ema.num_updates"):
                del state[name]

    _sd_checkpoint(torch, src, pruned)
    with pytest.raises(ConversionError, match=re.escape(
            "holds no weights, only state_dict.model_ema.decay, "
            "state_dict.model_ema.num_updates")):
        torchless.convert(src, out, ema=True)
    _assert_nothing_written(tmp_path, "sd.ckpt")


def test_two_model_names_with_one_dotless_twin_are_ambiguous(torch: ModuleType,
                                                            tmp_path: Path) -> None:
    src = tmp_path / "amb.ckpt"
    torch.save({"model.x.a1": torch.zeros(2), "model.xa.1": torch.ones(2),
                "model_ema.xa1": torch.zeros(2), "model_ema.decay": torch.tensor(0.9)}, src)
    with pytest.raises(ConversionError, match=re.escape(
            "'model.x.a1' and 'model.xa.1' would both read model_ema.xa1")):
        torchless.convert(src, tmp_path / "amb.safetensors", ema=True)
    _assert_nothing_written(tmp_path, "amb.ckpt")


# ---- timm ---------------------------------------------------------------------------------


def _timm_checkpoint(torch: ModuleType, path: Path, edit: Any = None) -> tuple[Any, Any]:
    """timm/utils/model_ema.py ``ModelEmaV2`` (a deepcopy in ``.module``, updated as
    ``decay * ema + (1 - decay) * model`` over the state_dict) and
    timm/utils/checkpoint_saver.py ``CheckpointSaver._save`` (``get_state_dict`` unwraps
    the EMA to ``.module``)."""
    nn = torch.nn
    torch.manual_seed(2)
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(3, 4, 3))
    model.add_module("bn", nn.BatchNorm2d(4))
    model.add_module("fc", nn.Linear(4, 2))
    ema_module = copy.deepcopy(model).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        model.train()
        loss = model.fc(model.bn(model.conv(torch.randn(2, 3, 5, 5))).mean((2, 3))).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for e, m in zip(ema_module.state_dict().values(), model.state_dict().values(),
                            strict=True):
                e.copy_(0.5 * e + (1.0 - 0.5) * m)
    args = argparse.Namespace(model="tinynet", lr=0.1)
    save_state = {"epoch": 2, "arch": type(model).__name__.lower(),
                  "optimizer": optimizer.state_dict(), "version": 2}
    save_state["arch"] = args.model
    save_state["args"] = args
    save_state["state_dict"] = model.state_dict()
    save_state["state_dict_ema"] = ema_module.state_dict()
    save_state["metric"] = 71.5
    if edit is not None:
        edit(save_state)
    torch.save(save_state, path)
    return model, ema_module


_TIMM_MODEL = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean",
               "bn.running_var", "bn.num_batches_tracked", "fc.weight", "fc.bias"]


def test_timm_state_dict_ema(torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "last.pth.tar", tmp_path / "ema.safetensors"
    model, ema_module = _timm_checkpoint(torch, src)
    torchless.convert(src, out, ema=True, key="state_dict", verify=True)
    written = _written(out)
    assert sorted(written) == sorted(_TIMM_MODEL)
    for name, value in ema_module.state_dict().items():
        assert torch.equal(written[name], value), name
    assert not torch.equal(written["fc.weight"], model.state_dict()["fc.weight"])
    # the whole checkpoint: the optimizer's tensors stay, the EMA copy is gone
    torchless.convert(src, tmp_path / "whole.safetensors", ema=True)
    assert sorted(_written(tmp_path / "whole.safetensors")) == sorted(
        [f"state_dict.{n}" for n in _TIMM_MODEL]
        + [f"optimizer.state.{i}.momentum_buffer" for i in range(6)])


def test_timm_refusals(torch: ModuleType, tmp_path: Path) -> None:
    src, out = tmp_path / "last.pth.tar", tmp_path / "ema.safetensors"
    _timm_checkpoint(torch, src, lambda s: s["state_dict_ema"].update(
        {"fc.weight": torch.zeros(3, 4)}))
    with pytest.raises(ConversionError, match=r"'state_dict.fc.weight' is shape \[2, 4\], its "
                                              r"EMA twin 'state_dict_ema.fc.weight' shape "
                                              r"\[3, 4\]"):
        torchless.convert(src, out, ema=True)
    _timm_checkpoint(torch, src, lambda s: s["state_dict_ema"].pop("bn.running_var"))
    with pytest.raises(ConversionError,
                       match=re.escape("'state_dict.bn.running_var' has no EMA twin")):
        torchless.convert(src, out, ema=True)
    _timm_checkpoint(torch, src, lambda s: s.update({"ema": {"w": torch.zeros(1)}}))
    with pytest.raises(ConversionError, match="more than one EMA convention"):
        torchless.convert(src, out, ema=True)
    _assert_nothing_written(tmp_path, "last.pth.tar")


# ---- ultralytics --------------------------------------------------------------------------


@pytest.fixture
def ultralytics(torch: ModuleType, monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Classes pickled under ultralytics' names (``ultralytics.nn.tasks.DetectionModel``,
    ``ultralytics.nn.modules.conv.Conv``), ``ModelEMA`` (ultralytics/utils/torch_utils.py:
    ``deepcopy(model).eval()``, ``decay * (1 - exp(-updates / tau))``, floating entries of
    the state_dict updated in place) and ``convert_optimizer_state_dict_to_fp16``."""
    nn = torch.nn
    modules = {}
    for name in ("ultralytics", "ultralytics.nn", "ultralytics.nn.tasks",
                 "ultralytics.nn.modules", "ultralytics.nn.modules.conv"):
        modules[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, modules[name])

    class Conv(nn.Module):
        def __init__(self, c1: int, c2: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(c2)
            self.act = nn.SiLU()

        def forward(self, x: Any) -> Any:
            return self.act(self.bn(self.conv(x)))

    class DetectionModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.yaml = {"nc": 2, "backbone": [[-1, 1, "Conv", [4, 3, 2]]]}
            self.model = nn.Sequential(Conv(3, 4), nn.Conv2d(4, 6, 1))
            self.stride = torch.tensor([8.0, 16.0, 32.0])
            self.names = {0: "cat", 1: "dog"}

    for cls, module in ((Conv, "ultralytics.nn.modules.conv"),
                        (DetectionModel, "ultralytics.nn.tasks")):
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
        setattr(modules[module], cls.__name__, cls)

    class ModelEMA:
        def __init__(self, model: Any, decay: float = 0.9999, tau: int = 2000) -> None:
            self.ema = copy.deepcopy(model).eval()
            self.updates = 0
            self.decay = lambda x: decay * (1 - math.exp(-x / tau))
            for p in self.ema.parameters():
                p.requires_grad_(False)

        def update(self, model: Any) -> None:
            self.updates += 1
            d = self.decay(self.updates)
            msd = model.state_dict()
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1 - d) * msd[k].detach()

    def to_fp16(state_dict: dict[str, Any]) -> dict[str, Any]:
        for state in state_dict["state"].values():
            for k, v in state.items():
                if k != "step" and isinstance(v, torch.Tensor) and v.dtype is torch.float32:
                    state[k] = v.half()
        return state_dict

    def train() -> tuple[Any, Any, Any]:
        torch.manual_seed(3)
        model = DetectionModel()
        ema = ModelEMA(model, decay=0.5, tau=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            loss = model.model(torch.randn(2, 3, 4, 4)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model)
        return model, ema, optimizer

    return types.SimpleNamespace(train=train, to_fp16=to_fp16)


_YOLO_MODEL = ["model.0.conv.weight", "model.0.bn.weight", "model.0.bn.bias",
               "model.0.bn.running_mean", "model.0.bn.running_var",
               "model.0.bn.num_batches_tracked", "model.1.weight", "model.1.bias"]


def test_ultralytics_save_model_with_model_none(torch: ModuleType, tmp_path: Path,
                                                ultralytics: types.SimpleNamespace) -> None:
    """ultralytics/engine/trainer.py ``BaseTrainer.save_model`` (8.1 and later)."""
    _, ema, optimizer = ultralytics.train()
    src, out = tmp_path / "last.pt", tmp_path / "last.safetensors"
    torch.save({"epoch": 1, "best_fitness": 0.25, "model": None,
                "ema": copy.deepcopy(ema.ema).half(), "updates": ema.updates,
                "optimizer": ultralytics.to_fp16(copy.deepcopy(optimizer.state_dict())),
                "train_args": {"model": "yolo.yaml", "epochs": 2},
                "train_metrics": {"fitness": 0.25}, "train_results": {},
                "date": "2026-01-01T00:00:00", "version": "8.3.0",
                "license": "AGPL-3.0 (https://ultralytics.com/license)",
                "docs": "https://docs.ultralytics.com"}, src)
    torchless.convert(src, out, ema=True, key="model", verify=True)
    written = _written(out)
    assert sorted(written) == sorted(_YOLO_MODEL)
    half = copy.deepcopy(ema.ema).half().state_dict()
    for name in _YOLO_MODEL:
        assert torch.equal(written[name], half[name]), name
    assert written["model.1.weight"].dtype == torch.float16


def test_ultralytics_with_model_and_ema(torch: ModuleType, tmp_path: Path,
                                        ultralytics: types.SimpleNamespace) -> None:
    """ultralytics 8.0 / YOLOv5 ``train.py``: ``model`` and ``ema`` both pickled, half."""
    model, ema, optimizer = ultralytics.train()
    src, out = tmp_path / "last.pt", tmp_path / "last.safetensors"
    torch.save({"epoch": 1, "best_fitness": 0.25, "model": copy.deepcopy(model).half(),
                "ema": copy.deepcopy(ema.ema).half(), "updates": ema.updates,
                "optimizer": optimizer.state_dict(), "opt": {"epochs": 2},
                "date": "2026-01-01T00:00:00"}, src)
    torchless.convert(src, out, ema=True, key="model")
    written = _written(out)
    assert sorted(written) == sorted(_YOLO_MODEL)
    half = copy.deepcopy(ema.ema).half().state_dict()
    trained = copy.deepcopy(model).half().state_dict()
    for name in _YOLO_MODEL:
        assert torch.equal(written[name], half[name]), name
    assert not torch.equal(written["model.1.weight"], trained["model.1.weight"])

    # strip_optimizer's final file: ema None, model already the EMA -> nothing to extract
    best = tmp_path / "best.pt"
    torch.save({"epoch": -1, "best_fitness": None, "model": copy.deepcopy(ema.ema).half(),
                "ema": None, "updates": None, "optimizer": None}, best)
    with pytest.raises(ConversionError, match="no EMA copy found"):
        torchless.convert(best, tmp_path / "best.safetensors", ema=True)
    assert not (tmp_path / "best.safetensors").exists()


def test_no_ema_copy_is_refused(tmp_path: Path) -> None:
    out = run("convert", str(EXAMPLE), "-o", str(tmp_path / "x.safetensors"), "--ema",
              cwd=tmp_path)
    assert out.returncode == 1 and "no EMA copy found" in out.stderr
    _assert_nothing_written(tmp_path)
