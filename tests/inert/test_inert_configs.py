"""Issue 26 row 3: OmegaConf configs and dataclasses round-trip through the inert format as
themselves when the loading program registered them (:mod:`torchless.integrations.configs`),
and as inert records otherwise, nothing imported.

The expected values come from OmegaConf itself (``OmegaConf.to_container(resolve=False)``,
``is_interpolation``, ``is_missing``, the flag queries of the original config) and from the
dataclasses' own ``==``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import torchless
from torchless import FormatError, Global, Opaque, TypeRegistry
from torchless.integrations.configs import register_dataclass, register_omegaconf

from ..conftest import require


@pytest.fixture
def oc() -> ModuleType:
    return require("omegaconf")


def _registry() -> TypeRegistry:
    reg = TypeRegistry()
    assert register_omegaconf(reg)
    return reg


def _round_trip(obj: Any, path: Path, reg: TypeRegistry | None = None) -> Any:
    reg = reg if reg is not None else _registry()
    torchless.save(obj, path, types=reg)
    return torchless.load(path, types=reg)


def _hydra_like(oc: ModuleType) -> Any:
    cfg = oc.OmegaConf.create({
        "model": {"width": 8, "depth": 2, "act": "gelu", "hidden": "${model.width}"},
        "data": {"root": "/data", "train": "${data.root}/train", "splits": [0.8, 0.2]},
        "seed": 3, "name": "???", "literal": r"\${not.an.interpolation}", "nothing": None,
        7: "an int key", "blob": b"\x00\x01", "run": {"tags": ["a", "${seed}"]}})
    oc.OmegaConf.set_struct(cfg, True)
    oc.OmegaConf.set_readonly(cfg.model, True)
    return cfg


def test_dictconfig_round_trips_as_itself(oc: ModuleType, tmp_path: Path) -> None:
    OmegaConf = oc.OmegaConf
    cfg = _hydra_like(oc)
    back = _round_trip({"cfg": cfg, "cls": type(cfg)}, tmp_path / "c.safetensors")["cfg"]
    assert type(back) is oc.DictConfig
    assert OmegaConf.to_container(back, resolve=False) == OmegaConf.to_container(
        cfg, resolve=False)
    # interpolations stay interpolations (unresolved in the file), and resolve as before
    for key in ("hidden",):
        assert OmegaConf.is_interpolation(back.model, key)
    assert OmegaConf.is_interpolation(back.data, "train")
    assert OmegaConf.is_missing(back, "name") and OmegaConf.is_missing(cfg, "name")
    assert back.data.train == cfg.data.train == "/data/train"
    assert back.model.hidden == cfg.model.hidden == 8
    assert back.literal == cfg.literal
    assert back.run.tags[1] == cfg.run.tags[1] == 3
    assert type(back.run.tags) is type(cfg.run.tags)
    # the flags of each node, as OmegaConf reports them on the original
    for node_b, node_c in ((back, cfg), (back.model, cfg.model), (back.data, cfg.data)):
        assert OmegaConf.is_struct(node_b) == OmegaConf.is_struct(node_c)
        assert OmegaConf.is_readonly(node_b) == OmegaConf.is_readonly(node_c)
    assert OmegaConf.is_readonly(back.model) and OmegaConf.is_struct(back)
    with pytest.raises(oc.errors.ConfigAttributeError):  # struct: no new keys
        back.new_key = 1
    with pytest.raises(oc.ReadonlyConfigError):
        back.model.width = 9


def test_the_class_reads_back_as_the_class(oc: ModuleType, tmp_path: Path) -> None:
    """Lightning stores ``hparams_type`` (the config's class) and calls it when loading."""
    got = _round_trip({"t": oc.DictConfig, "l": oc.ListConfig}, tmp_path / "t.safetensors")
    assert got["t"] is oc.DictConfig and got["l"] is oc.ListConfig


def test_listconfig_and_flags_of_a_leaf(oc: ModuleType, tmp_path: Path) -> None:
    OmegaConf = oc.OmegaConf
    lst = OmegaConf.create([1, "${0}", {"k": "v"}, [2, 3]])
    OmegaConf.set_readonly(lst[2], True)
    lst._get_node(0)._set_flag("readonly", True)
    back = _round_trip(lst, tmp_path / "l.safetensors")
    assert type(back) is oc.ListConfig
    assert OmegaConf.to_container(back, resolve=False) == [1, "${0}", {"k": "v"}, [2, 3]]
    assert back[1] == 1 and OmegaConf.is_readonly(back[2])
    assert back._get_node(0)._get_flag("readonly") is True
    assert back._get_node(1)._get_flag("readonly") is None


def test_tupleconfig(oc: ModuleType, tmp_path: Path) -> None:
    tuple_config = vars(oc).get("TupleConfig")
    if tuple_config is None:
        pytest.skip("this OmegaConf has no TupleConfig")
    t = tuple_config((1, "${0}"))
    t._get_node(1)._set_flag("readonly", True)
    back = _round_trip(t, tmp_path / "t.safetensors")
    assert type(back) is tuple_config
    assert oc.OmegaConf.to_container(back, resolve=False) == (1, "${0}") and back[1] == 1
    assert back._get_node(1)._get_flag("readonly") is True
    assert back._get_node(0)._get_flag("readonly") is None


class _Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y


def test_allow_objects_and_readonly_root(oc: ModuleType, tmp_path: Path) -> None:
    """The root's flags apply as the config is made: ``allow_objects`` lets it hold an
    object (a registered dataclass here), ``readonly`` holds from the start."""
    OmegaConf = oc.OmegaConf
    cfg = OmegaConf.create({"point": _Point(1, 2)}, flags={"allow_objects": True})
    assert type(cfg.point) is _Point  # OmegaConf keeps the object itself
    OmegaConf.set_readonly(cfg, True)
    reg = _registry()
    reg.register(_Point, lambda p: [p.x, p.y], lambda s: _Point(*s))
    back = _round_trip(cfg, tmp_path / "o.safetensors", reg)
    assert type(back.point) is _Point and (back.point.x, back.point.y) == (1, 2)
    assert back._get_flag("allow_objects") is True and OmegaConf.is_readonly(back)


def test_root_none_missing_and_interpolation(oc: ModuleType, tmp_path: Path) -> None:
    for content in (None, "???", "${x}"):
        cfg = oc.DictConfig(content)
        back = _round_trip(cfg, tmp_path / "r.safetensors")
        assert type(back) is oc.DictConfig
        assert back._is_none() == cfg._is_none()
        assert back._is_missing() == cfg._is_missing()
        assert back._is_interpolation() == cfg._is_interpolation()


def test_unregistered_configs_are_inert_records(oc: ModuleType, tmp_path: Path) -> None:
    cfg = _hydra_like(oc)
    path = tmp_path / "c.safetensors"
    torchless.save({"cfg": cfg, "cls": type(cfg)}, path, types=_registry())
    got = torchless.load(path, types=TypeRegistry())
    assert isinstance(got["cfg"], Opaque)
    assert got["cfg"].class_path == "omegaconf.dictconfig.DictConfig"
    assert got["cls"] == Global("omegaconf.dictconfig", "DictConfig")


def test_reading_without_registration_imports_nothing(oc: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    torchless.save({"cfg": _hydra_like(oc), "cls": oc.DictConfig}, path, types=_registry())
    code = ("import sys, torchless; got = torchless.load(sys.argv[1]); "
            "print(type(got['cfg']).__name__, got['cfg'].class_path, got['cls'], "
            "'omegaconf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["Opaque", "omegaconf.dictconfig.DictConfig",
                                  "Global(omegaconf.dictconfig.DictConfig)", "False"]


def test_a_record_naming_a_registered_class_stays_inert(oc: ModuleType,
                                                        tmp_path: Path) -> None:
    record = Opaque(Global("omegaconf.dictconfig", "DictConfig"), ({"a": 1},))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _round_trip(record, tmp_path / "o.safetensors")
    assert isinstance(got, Opaque) and got.callable == Global("omegaconf.dictconfig",
                                                              "DictConfig")
    assert got.args == ({"a": 1},)


def _forged(oc: ModuleType, state: Any, tmp_path: Path) -> Path:
    """A file whose DictConfig state is ``state`` (written under DictConfig's name)."""
    forger = TypeRegistry()
    forger.register(_Stand, lambda o: state, lambda s: s, name="omegaconf.dictconfig:DictConfig")
    path = tmp_path / "forged.safetensors"
    torchless.save({"x": _Stand()}, path, types=forger)
    return path


class _Stand:
    """Written under DictConfig's name by a forging registry."""


def test_a_forged_well_formed_state_reads(oc: ModuleType, tmp_path: Path) -> None:
    """The forging writer reaches the decoder (so the refusals below are the decoder's)."""
    path = _forged(oc, {"content": {"a": 1, "b": "${a}"}, "flags": [[[], {"struct": True}]]},
                   tmp_path)
    got = torchless.load(path, types=_registry())["x"]
    assert type(got) is oc.DictConfig and got.b == 1 and oc.OmegaConf.is_struct(got)


@pytest.mark.parametrize("state", [
    "text", {"content": {}}, {"content": {}, "flags": {}, "extra": 1},
    {"content": [1, 2], "flags": []},                      # a list is no DictConfig
    {"content": {"a": 1}, "flags": [[["b"], {"readonly": True}]]},   # no such node
    {"content": {"a": 1}, "flags": [[["a", "x"], {"readonly": True}]]},
    {"content": {"a": 1}, "flags": [[[], {"readonly": "yes"}]]},
    {"content": {"a": 1}, "flags": [["a", {}]]},
    {"content": {"a": 1}, "flags": [[[], {"readonly": 1}]]},        # 1 == True, not a bool
    {"content": {"a": Opaque(Global("os", "system"), ("ls",))}, "flags": []},
])
def test_malformed_states_are_format_errors(oc: ModuleType, tmp_path: Path,
                                            state: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _forged(oc, state, tmp_path)
    with pytest.raises(FormatError):
        torchless.load(path, types=_registry())


# ---- dataclasses ----------------------------------------------------------------------


@dataclasses.dataclass
class Optim:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    count: int = 0


@dataclasses.dataclass
class TrainConfig:
    optim: Optim
    frozen: Frozen
    steps: int = 10
    tags: list[str] = dataclasses.field(default_factory=list)
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.derived = self.steps * 2


def _dc_registry() -> TypeRegistry:
    reg = TypeRegistry()
    for cls in (Optim, Frozen, TrainConfig):
        register_dataclass(cls, registry=reg)
    return reg


def test_dataclasses_round_trip(tmp_path: Path) -> None:
    cfg = TrainConfig(Optim(lr=0.5), Frozen("f", 2), steps=4, tags=["x"])
    cfg.extra = "set later"  # type: ignore[attr-defined]   # pickle keeps it too
    back = _round_trip({"cfg": cfg, "cls": TrainConfig}, tmp_path / "d.safetensors",
                       _dc_registry())
    assert type(back["cfg"]) is TrainConfig and back["cfg"] == cfg
    assert type(back["cfg"].optim) is Optim and type(back["cfg"].frozen) is Frozen
    assert back["cfg"].derived == 8 and back["cfg"].extra == "set later"
    assert back["cls"] is TrainConfig
    with pytest.raises(dataclasses.FrozenInstanceError):
        back["cfg"].frozen.count = 3  # type: ignore[misc]


def test_dataclass_missing_a_field_is_a_format_error(tmp_path: Path) -> None:
    forger = TypeRegistry()
    forger.register(Frozen, lambda o: {"name": "x"}, lambda s: s)
    path = tmp_path / "f.safetensors"
    torchless.save(Frozen("x"), path, types=forger)
    with pytest.raises(FormatError, match="count"):
        torchless.load(path, types=_dc_registry())
    got = torchless.load(path)  # the default registry does not know it: an inert record
    assert isinstance(got, Opaque) and got.class_path.endswith("Frozen")


def test_register_dataclass_refuses_what_it_cannot_rebuild() -> None:
    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int = 0

    with pytest.raises(TypeError, match="slots"):
        register_dataclass(Slotted, registry=TypeRegistry())
    with pytest.raises(TypeError, match="dataclass"):
        register_dataclass(dict, registry=TypeRegistry())
    with pytest.raises(TypeError, match="dataclass"):
        register_dataclass(Optim(), registry=TypeRegistry())  # type: ignore[arg-type]


def test_by_global_follows_register_and_unregister() -> None:
    reg = TypeRegistry()
    assert reg.by_global(Optim.__module__, "Optim") is None
    register_dataclass(Optim, registry=reg, name="optim")
    assert reg.by_global(Optim.__module__, "Optim") is Optim
    register_dataclass(Frozen, registry=reg, name="optim")  # the name taken over
    assert reg.by_global(Optim.__module__, "Optim") is None
    assert reg.by_name("optim") is not None and reg.by_name("optim").cls is Frozen  # type: ignore[union-attr]
    reg.unregister(Frozen)
    assert reg.by_global(Frozen.__module__, "Frozen") is None and reg.by_name("optim") is None
