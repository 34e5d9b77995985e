"""Checkpoints shaped like PyTorch Lightning's, the Hugging Face Trainer's and fairseq's.

The frameworks' own classes are faked under their real module names (modules made with
``types.ModuleType`` and put in ``sys.modules`` for the test), so ``torch.save`` pickles the
real class paths. Each checkpoint is converted with ``torchless.convert``; the inert file must
load back (``torchless.load``) to what ``torchless.load`` reads from the original ``.pt``,
its tensors must be the ones ``torch.load`` gives (read with the ``safetensors`` package),
the unknown classes must be ``Opaque`` records naming their real class with the in-memory
objects' field values, and the conversion must warn about them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import enum
import json
import random
import re
import struct
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from torchless import Global, Opaque

pytestmark = pytest.mark.torch

LIGHTNING_DATA = "lightning.fabric.utilities.data"
PL_PARSING = "pytorch_lightning.utilities.parsing"
HF_ARGS = "transformers.training_args"
HF_UTILS = "transformers.trainer_utils"
FAIRSEQ_METERS = "fairseq.meters"


# --- deep equality ------------------------------------------------------------------------

_MUTABLE = (list, dict, np.ndarray, Opaque, argparse.Namespace, collections.deque)


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _is_notset(x: Any) -> bool:
    return type(x).__name__ == "_NotSet"


class Same:
    """Deep, type-strict equality of two loaded trees, keeping track of shared objects:
    an object the reference holds twice must be one object in the other tree too."""

    def __init__(self) -> None:
        self.pairs: dict[int, Any] = {}
        self.back: dict[int, Any] = {}
        self.keep: list[Any] = []  # ids stay valid while we compare

    def __call__(self, got: Any, want: Any, path: str = "root") -> None:
        assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
        if isinstance(want, _MUTABLE):
            if id(want) in self.pairs:
                assert self.pairs[id(want)] is got, f"{path}: sharing lost"
                return
            assert id(got) not in self.back, f"{path}: shared, but not in the reference"
            self.pairs[id(want)] = got
            self.back[id(got)] = want
            self.keep += [got, want]
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, f"{path}: {got.dtype} != {want.dtype}"
            assert got.shape == want.shape, f"{path}: {got.shape} != {want.shape}"
            assert got.tobytes() == want.tobytes(), f"{path}: values differ"
        elif isinstance(want, float):
            assert _float_bits(got) == _float_bits(want), f"{path}: {got!r} != {want!r}"
        elif isinstance(want, complex):
            self(got.real, want.real, path + ".real")
            self(got.imag, want.imag, path + ".imag")
        elif isinstance(want, dict):
            assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
            for (kg, vg), (kw, vw) in zip(got.items(), want.items(), strict=True):
                self(kg, kw, f"{path}.key({kw!r})")
                self(vg, vw, f"{path}[{kw!r}]")
            # OrderedDict attributes (torch's _metadata) and a subclass's __dict__
            if type(want) is not dict:
                self(_attrs(got), _attrs(want), f"{path}.__dict__")
        elif isinstance(want, (list, tuple, collections.deque)):
            assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                self(g, w, f"{path}[{i}]")
        elif isinstance(want, (argparse.Namespace, types.SimpleNamespace)):
            self(vars(got), vars(want), f"{path}.vars")
        elif isinstance(want, Opaque):
            self(got.callable, want.callable, f"{path}.callable")
            self(got.args, want.args, f"{path}.args")
            self(got.kwargs, want.kwargs, f"{path}.kwargs")
            assert got.newobj is want.newobj, f"{path}.newobj"
            if _is_notset(want.state):
                assert _is_notset(got.state), f"{path}.state: {got.state!r} is set"
            else:
                self(got.state, want.state, f"{path}.state")
            self(got.items, want.items, f"{path}.items")
            self(got.dict_items, want.dict_items, f"{path}.dict_items")
        elif isinstance(want, Global):
            assert (got.module, got.name) == (want.module, want.name), path
        elif isinstance(want, (set, frozenset)):
            assert got == want, path
        else:
            assert got == want, f"{path}: {got!r} != {want!r}"


def _attrs(d: dict[Any, Any]) -> dict[str, Any]:
    return dict(vars(d)) if hasattr(d, "__dict__") else {}


def assert_same(got: Any, want: Any) -> None:
    Same()(got, want)


def test_assert_same_can_fail() -> None:
    """The helper tells apart what the conversions must keep."""
    od1: collections.OrderedDict[str, Any] = collections.OrderedDict(a=np.zeros(2))
    od2: collections.OrderedDict[str, Any] = collections.OrderedDict(a=np.zeros(2))
    od1._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    od2._metadata = {"": {"version": 2}}  # type: ignore[attr-defined]
    arr = np.zeros(2)
    o1, o2 = Opaque(Global("m", "C"), newobj=True), Opaque(Global("m", "D"), newobj=True)
    cases: list[tuple[Any, Any]] = [
        (od1, od2),
        ({"a": 1}, collections.OrderedDict(a=1)),
        ([1, 2], (1, 2)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (0.0, -0.0),
        (1, 1.0),
        (np.zeros(2, np.float32), np.zeros(2, np.float64)),
        (np.zeros(2), np.ones(2)),
        (argparse.Namespace(a=1), argparse.Namespace(a=2)),
        (o1, o2),
        ([arr, arr], [np.zeros(2), np.zeros(2)]),
        ([np.zeros(2), np.zeros(2)], [arr, arr]),
    ]
    for a, b in cases:
        with pytest.raises(AssertionError):
            assert_same(a, b)
    assert_same([arr, arr, od1], [arr, arr, od1])


# --- the fake frameworks ------------------------------------------------------------------


@dataclasses.dataclass
class Fakes:
    """The faked framework classes (their ``__module__`` is the framework's)."""

    attrdict: dict[str, Any]
    training_args: Any
    interval: Any
    scheduler_type: Any
    meter: Any


def _attribute_dict(module: str) -> Any:
    def __getattr__(self: dict[str, Any], key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e

    def __setattr__(self: dict[str, Any], key: str, value: Any) -> None:
        self[key] = value

    return type("AttributeDict", (dict,), {"__module__": module, "__qualname__": "AttributeDict",
                                           "__getattr__": __getattr__,
                                           "__setattr__": __setattr__})


def _enum(name: str, members: dict[str, str]) -> Any:
    # transformers' ExplicitEnum is ``(str, Enum)``
    cls = enum.Enum(name, members, type=str, module=HF_UTILS,  # type: ignore[misc]
                    qualname=name)
    return cls


@contextlib.contextmanager
def fake_frameworks() -> Iterator[Fakes]:
    """Fake framework modules in sys.modules, removed afterwards."""
    names = ["lightning", "lightning.fabric", "lightning.fabric.utilities", LIGHTNING_DATA,
             "pytorch_lightning", "pytorch_lightning.utilities", PL_PARSING,
             "transformers", HF_ARGS, HF_UTILS, "fairseq", FAIRSEQ_METERS]
    saved = {n: sys.modules.get(n) for n in names}
    mods = {n: ModuleType(n) for n in names}

    interval = _enum("IntervalStrategy", {"NO": "no", "STEPS": "steps", "EPOCH": "epoch"})
    sched_type = _enum("SchedulerType", {"LINEAR": "linear", "COSINE": "cosine"})

    @dataclasses.dataclass
    class TrainingArguments:
        output_dir: str = "out"
        learning_rate: float = 5e-5
        num_train_epochs: float = 3.0
        eval_strategy: Any = interval.STEPS
        lr_scheduler_type: Any = sched_type.COSINE
        report_to: list[str] = dataclasses.field(default_factory=lambda: ["tensorboard"])
        seed: int = 42
        fp16: bool = False
        label_names: Any = None

    TrainingArguments.__module__ = HF_ARGS
    TrainingArguments.__qualname__ = "TrainingArguments"

    class AverageMeter:
        """fairseq's meter: pickled through its __dict__."""

        def __init__(self) -> None:
            self.val = 0.0
            self.avg = 0.0
            self.sum = 0.0
            self.count = 0

        def update(self, val: float, n: int = 1) -> None:
            self.val = val
            self.sum += val * n
            self.count += n
            self.avg = self.sum / self.count

    AverageMeter.__module__ = FAIRSEQ_METERS
    AverageMeter.__qualname__ = "AverageMeter"

    f = Fakes(attrdict={LIGHTNING_DATA: _attribute_dict(LIGHTNING_DATA),
                        PL_PARSING: _attribute_dict(PL_PARSING)},
              training_args=TrainingArguments, interval=interval, scheduler_type=sched_type,
              meter=AverageMeter)
    mods[LIGHTNING_DATA].AttributeDict = f.attrdict[LIGHTNING_DATA]  # type: ignore[attr-defined]
    mods[PL_PARSING].AttributeDict = f.attrdict[PL_PARSING]  # type: ignore[attr-defined]
    mods[HF_ARGS].TrainingArguments = TrainingArguments  # type: ignore[attr-defined]
    mods[HF_UTILS].IntervalStrategy = interval  # type: ignore[attr-defined]
    mods[HF_UTILS].SchedulerType = sched_type  # type: ignore[attr-defined]
    mods[FAIRSEQ_METERS].AverageMeter = AverageMeter  # type: ignore[attr-defined]
    for n, m in mods.items():
        parent, _, child = n.rpartition(".")
        if parent:
            setattr(mods[parent], child, m)
    sys.modules.update(mods)
    try:
        yield f
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    with fake_frameworks() as f:
        yield f


# --- shared pieces ------------------------------------------------------------------------


def _net(torch: ModuleType, seed: int) -> Any:
    """A LightningModule-like wrapper: its state_dict keys are ``net.0.weight`` …"""
    g = torch.get_rng_state()
    torch.manual_seed(seed)
    net = torch.nn.ModuleDict({"net": torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(5, 2))})
    torch.set_rng_state(g)
    return net


def _train(torch: ModuleType, model: Any, steps: int = 2) -> tuple[Any, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(4, 3, generator=g)
        loss = model["net"](x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return opt, sched


def _collect(obj: Any, out: list[Any], seen: set[int], torch: ModuleType) -> None:
    """Every tensor and array of a torch.load result, each object once."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append(obj)
        return
    if isinstance(obj, (str, bytes, int, float, type(None), enum.Enum)):
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in obj.items():
            _collect(k, out, seen, torch)
            _collect(v, out, seen, torch)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _collect(v, out, seen, torch)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        _collect(vars(obj), out, seen, torch)


def _fingerprint(torch: ModuleType, a: Any) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype, shape, bytes) of a torch.load tensor (torch dtype name) or array (descr)."""
    if isinstance(a, torch.Tensor):
        t = a.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        return (str(t.dtype).removeprefix("torch."), tuple(t.shape), raw)
    return (a.dtype.str, tuple(a.shape), np.ascontiguousarray(a).tobytes())


def _tree_nodes(tree: Any, out: list[tuple[str, dict[str, Any]]]) -> None:
    """Every ``$tensor`` / ``$ndarray`` payload of the JSON tree, in document order."""
    if isinstance(tree, dict):
        for tag in ("$tensor", "$ndarray"):
            if tag in tree:
                out.append((tag, tree[tag]))
                return
        for v in tree.values():
            _tree_nodes(v, out)
    elif isinstance(tree, list):
        for v in tree:
            _tree_nodes(v, out)


def _check_tensors_in_file(torch: ModuleType, out: Path, original: Any) -> None:
    """The file is plain safetensors with the inert metadata, and its tensors are exactly
    the tensors and arrays torch.load finds in the original (each object once)."""
    import safetensors
    import safetensors.numpy

    with safetensors.safe_open(str(out), framework="np") as f:
        meta = f.metadata()
    assert meta is not None and meta.get("torchless.inert") == "1"
    tree = json.loads(meta["torchless.tree"])
    entries = safetensors.numpy.load_file(str(out))
    nodes: list[tuple[str, dict[str, Any]]] = []
    _tree_nodes(tree, nodes)
    got = []
    for tag, node in nodes:
        entry = entries[node["name"]]
        shape = tuple(node["shape"])
        # docs/inert-format.md 2.5/2.6: a raw tensor, or an array whose descr safetensors
        # has no name for, is a U8 entry of its bytes
        raw = node.get("raw", False) if tag == "$tensor" else node["descr"] not in (
            "|b1", "|u1", "|i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4",
            "<f8", "<c8", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
        if raw:
            assert entry.dtype == np.uint8 and entry.ndim == 1, node
        else:
            assert entry.shape == shape, node
        dtype = node["dtype"] if tag == "$tensor" else node["descr"]
        got.append((dtype, shape, entry.tobytes()))
    # an entry no tree node names can only be a copy of one that is named (an alias kept
    # under its flat name for plain safetensors readers)
    named = {n["name"] for _, n in nodes}
    assert named <= set(entries)
    copies = {(str(entries[n].dtype), entries[n].shape, entries[n].tobytes()) for n in named}
    for extra in set(entries) - named:
        e = entries[extra]
        assert (str(e.dtype), e.shape, e.tobytes()) in copies, f"{extra} is in no tree node"
    want: list[Any] = []
    _collect(original, want, set(), torch)
    expect = [_fingerprint(torch, a) for a in want]
    assert sorted((d, s) for d, s, _ in got) == sorted((d, s) for d, s, _ in expect)
    assert sorted(got) == sorted(expect)


def _convert_warns(src: Path, dst: Path, class_paths: list[str]) -> None:
    """convert warns, naming every class it kept as an inert record."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchless.convert(src, dst)
    text = "\n".join(str(w.message) for w in caught)
    for p in class_paths:
        assert p in text, f"{p} not named in the warnings: {text!r}"


def _convert_quiet(src: Path, dst: Path) -> None:
    """convert of an object with no unknown classes warns about nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchless.convert(src, dst)


def _round_trip(torch: ModuleType, src: Path, tmp: Path, unknown: list[str]) -> Any:
    """convert SRC; the inert file loads to what torchless reads from SRC; returns it."""
    out = tmp / (src.stem + ".safetensors")
    if unknown:
        _convert_warns(src, out, unknown)
        # and through pytest's own recorder
        with pytest.warns(Warning, match=re.escape(unknown[0])):
            torchless.convert(src, tmp / (src.stem + ".again.safetensors"))
    else:
        _convert_quiet(src, out)
    got = torchless.load(out)
    assert_same(got, torchless.load(src))
    _check_tensors_in_file(torch, out, torch.load(src, weights_only=False))
    return got


def _opaque(x: Any, module: str, name: str) -> Opaque:
    assert isinstance(x, Opaque), type(x)
    assert x.callable == Global(module, name)
    return x


# --- PyTorch Lightning --------------------------------------------------------------------


def _lightning(torch: ModuleType, fakes: Fakes, attr_module: str) -> tuple[dict[str, Any], Any]:
    model = _net(torch, seed=0)
    opt, sched = _train(torch, model)
    score = torch.tensor(0.4375)
    hp = fakes.attrdict[attr_module](lr=1e-2, hidden=5, betas=(0.9, 0.999), name="tiny",
                                     layers=[3, 5, 2], dropout=0.1, extra=None)
    key = ("ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, "
           "'every_n_epochs': 1, 'train_time_interval': None}")
    ckpt = {
        "epoch": 1,
        "global_step": 2,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": model.state_dict(),
        "loops": {"fit_loop": {
            "state_dict": {},
            "epoch_loop.state_dict": {"_batches_that_stepped": 2},
            "epoch_loop.batch_progress": {
                "total": {"ready": 2, "completed": 2, "started": 2, "processed": 2},
                "current": {"ready": 1, "completed": 1, "started": 1, "processed": 1},
                "is_last_batch": True},
            "epoch_loop.scheduler_progress": {"total": {"ready": 2, "completed": 2},
                                              "current": {"ready": 1, "completed": 1}},
            "epoch_loop.val_loop.state_dict": {},
            "epoch_progress": {"total": {"ready": 2, "completed": 1, "started": 2,
                                         "processed": 2}},
        }},
        "callbacks": {key: {
            "monitor": "val_loss", "best_model_score": score,
            "best_model_path": "/ckpt/epoch=1-step=2.ckpt", "current_score": score,
            "dirpath": "/ckpt", "best_k_models": {"/ckpt/epoch=1-step=2.ckpt": score},
            "kth_best_model_path": "/ckpt/epoch=1-step=2.ckpt", "kth_value": score,
            "last_model_path": "",
        }, "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}": {
            "wait_count": 0, "stopped_epoch": 0, "best_score": score.clone(), "patience": 3,
        }},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": hp,
    }
    return ckpt, model


@pytest.mark.parametrize("attr_module", [LIGHTNING_DATA, PL_PARSING])
def test_lightning(torch: ModuleType, fakes: Fakes, tmp_path: Path, attr_module: str) -> None:
    ckpt, model = _lightning(torch, fakes, attr_module)
    src = tmp_path / "epoch=1-step=2.ckpt"
    torch.save(ckpt, src)
    got = _round_trip(torch, src, tmp_path, [f"{attr_module}.AttributeDict"])

    # hyper_parameters: an inert record of the AttributeDict with the dict's items
    hp = _opaque(got["hyper_parameters"], attr_module, "AttributeDict")
    assert hp.newobj is True
    assert [k for k, _ in hp.dict_items] == list(ckpt["hyper_parameters"])
    assert dict(hp.dict_items) == dict(ckpt["hyper_parameters"])
    assert type(dict(hp.dict_items)["betas"]) is tuple
    # plain parts as the in-memory checkpoint has them
    for k in ("epoch", "global_step", "pytorch-lightning_version", "hparams_name", "loops"):
        assert got[k] == ckpt[k] and type(got[k]) is type(ckpt[k]), k
    assert list(got["callbacks"]) == list(ckpt["callbacks"])
    cb = next(iter(got["callbacks"].values()))
    # one tensor object held four times is one array
    assert cb["best_model_score"] is cb["current_score"] is cb["kth_value"]
    assert cb["best_k_models"]["/ckpt/epoch=1-step=2.ckpt"] is cb["best_model_score"]
    assert float(cb["best_model_score"]) == 0.4375
    assert list(got["state_dict"]) == list(ckpt["state_dict"])

    # with torch tensors, the state dicts load into fresh objects and equal the originals
    tl = torchless.load(tmp_path / (src.stem + ".safetensors"), framework="pt")
    fresh = _net(torch, seed=1)
    assert any(not torch.equal(a, b) for a, b in
               zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))
    fresh.load_state_dict(tl["state_dict"])
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    opt.load_state_dict(tl["optimizer_states"][0])
    sched.load_state_dict(tl["lr_schedulers"][0])
    want_opt = ckpt["optimizer_states"][0]
    assert opt.state_dict()["param_groups"] == want_opt["param_groups"]
    for pid, st in want_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(opt.state_dict()["state"][pid][k], v), (pid, k)
    assert sched.state_dict() == ckpt["lr_schedulers"][0]
    assert isinstance(tl["callbacks"][next(iter(ckpt["callbacks"]))]["best_model_score"],
                      torch.Tensor)
    # and the optimizer trains on from there (its state tensors are writable)
    x = torch.ones(2, 3)
    fresh["net"](x).sum().backward()
    opt.step()


# --- Hugging Face Trainer -----------------------------------------------------------------


@contextlib.contextmanager
def rngs_kept(torch: ModuleType) -> Iterator[None]:
    """Leave the three global RNGs (torch, NumPy, Python) as they were found."""
    t, n, p = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(t)
        np.random.set_state(n)
        random.setstate(p)


def _draws(torch: ModuleType) -> tuple[Any, ...]:
    """One draw from each stream (a Gaussian too, so cached Gaussians count)."""
    return (random.random(), random.gauss(0, 1), np.random.standard_normal(4), torch.rand(4))


def test_hf_trainer_dir(torch: ModuleType, fakes: Fakes, tmp_path: Path) -> None:
    out_dir = tmp_path / "checkpoint-500"
    out_dir.mkdir()
    model = _net(torch, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 500)
    model["net"](torch.ones(2, 3)).sum().backward()
    opt.step()
    sched.step()
    torch.save(opt.state_dict(), out_dir / "optimizer.pt")
    torch.save(sched.state_dict(), out_dir / "scheduler.pt")

    with rngs_kept(torch):
        random.seed(5)
        np.random.seed(5)
        torch.manual_seed(5)
        random.gauss(0, 1)
        rng = {"python": random.getstate(), "numpy": np.random.get_state(),
               "cpu": torch.random.get_rng_state()}
        torch.save(rng, out_dir / "rng_state.pth")
        draws = _draws(torch)

    args = fakes.training_args(output_dir=str(out_dir.parent), learning_rate=5e-5,
                               eval_strategy=fakes.interval.EPOCH,
                               report_to=["none", "wandb"], label_names=["labels"])
    torch.save(args, out_dir / "training_args.bin")

    # optimizer and scheduler: plain data, converted quietly
    got_opt = _round_trip(torch, out_dir / "optimizer.pt", tmp_path, [])
    assert sorted(got_opt["state"]) == sorted(opt.state_dict()["state"])
    got_sched = _round_trip(torch, out_dir / "scheduler.pt", tmp_path, [])
    assert got_sched == sched.state_dict()
    assert got_sched["lr_lambdas"] == [None]

    # training_args.bin: the whole file is one dataclass instance -> an inert record
    got_args = _round_trip(torch, out_dir / "training_args.bin", tmp_path,
                           [f"{HF_ARGS}.TrainingArguments", f"{HF_UTILS}.IntervalStrategy",
                            f"{HF_UTILS}.SchedulerType"])
    rec = _opaque(got_args, HF_ARGS, "TrainingArguments")
    assert rec.newobj is True
    state = rec.state
    assert isinstance(state, dict)
    fields = {f.name for f in dataclasses.fields(args)}
    assert set(state) == fields
    for name in fields - {"eval_strategy", "lr_scheduler_type"}:
        value = getattr(args, name)
        assert state[name] == value and type(state[name]) is type(value), name
    for name in ("eval_strategy", "lr_scheduler_type"):
        member = getattr(args, name)
        e = state[name]
        assert isinstance(e, Opaque), name
        assert e.callable == Global(HF_UTILS, type(member).__name__)
        assert e.args == (member.value,)

    # RNG states: restoring them from the inert file continues every stream
    got_rng = _round_trip(torch, out_dir / "rng_state.pth", tmp_path, [])
    tl = torchless.load(tmp_path / "rng_state.safetensors", framework="pt")
    assert list(tl) == ["python", "numpy", "cpu"]
    with rngs_kept(torch):
        random.setstate(tl["python"])
        np.random.set_state(tl["numpy"])
        torch.random.set_rng_state(tl["cpu"])
        again = _draws(torch)
    assert again[:2] == draws[:2]
    assert again[2].tobytes() == draws[2].tobytes()
    assert torch.equal(again[3], draws[3])
    assert got_rng["python"] == rng["python"]


# --- fairseq ------------------------------------------------------------------------------


def test_fairseq(torch: ModuleType, fakes: Fakes, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(7, 4, generator=g).half()
    model = collections.OrderedDict([
        ("encoder.version", torch.Tensor([3])),
        ("encoder.embed_tokens.weight", emb),
        ("encoder.layers.0.fc1.weight", torch.randn(8, 4, generator=g).half()),
        ("encoder.layers.0.fc1.bias", torch.zeros(8, dtype=torch.float16)),
        ("decoder.embed_tokens.weight", emb),  # shared embeddings: one tensor object
        ("decoder.output_projection.weight", emb[:]),  # tied: a view of the same storage
        ("decoder.version", torch.Tensor([3])),
    ])
    p = torch.nn.Parameter(torch.randn(4, generator=g))
    adam = torch.optim.Adam([p], lr=5e-4, betas=(0.9, 0.98), eps=1e-8)
    p.sum().backward()
    adam.step()
    meter = fakes.meter()
    meter.update(2.5, 4)
    meter.update(2.25, 4)
    args = argparse.Namespace(arch="transformer_iwslt_de_en", task="translation",
                              lr=[0.0005], max_tokens=4096, optimizer="adam",
                              adam_betas="(0.9, 0.98)", clip_norm=0.0, dropout=0.3,
                              fp16=True, seed=1, save_dir="checkpoints", no_epoch_checkpoints=False,
                              data="data-bin/iwslt14", source_lang=None)
    ckpt = {
        "args": args,
        "model": model,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": 2.25}, "num_updates": 8}],
        "last_optimizer_state": adam.state_dict(),
        "extra_state": {"epoch": 2, "batch_offset": 0, "val_loss": 2.25,
                        "train_iterator": {"epoch": 2, "iterations_in_epoch": 0,
                                           "shuffle": True},
                        "previous_training_time": 12.5,
                        "train_meters": collections.OrderedDict(train_loss=meter)},
    }
    src = tmp_path / "checkpoint_last.pt"
    torch.save(ckpt, src)
    got = _round_trip(torch, src, tmp_path, [f"{FAIRSEQ_METERS}.AverageMeter"])

    a = got["args"]
    assert type(a) is argparse.Namespace and vars(a) == vars(args)
    assert list(vars(a)) == list(vars(args))
    assert type(a.lr) is list and type(a.max_tokens) is int and a.source_lang is None
    m = got["model"]
    assert type(m) is collections.OrderedDict and list(m) == list(model)
    assert m["encoder.embed_tokens.weight"] is m["decoder.embed_tokens.weight"]
    assert m["decoder.output_projection.weight"].dtype == np.float16
    assert m["decoder.output_projection.weight"].tobytes() == emb.numpy().tobytes()
    assert got["optimizer_history"] == ckpt["optimizer_history"]
    assert got["extra_state"]["train_iterator"] == ckpt["extra_state"]["train_iterator"]
    rec = _opaque(got["extra_state"]["train_meters"]["train_loss"], FAIRSEQ_METERS,
                  "AverageMeter")
    assert rec.state == vars(meter)
    assert type(rec.state["count"]) is int and type(rec.state["avg"]) is float
    st = got["last_optimizer_state"]["state"][0]
    want = adam.state_dict()["state"][0]
    assert list(st) == list(want)
    for k, v in want.items():
        assert st[k].tobytes() == v.detach().numpy().tobytes(), k

    # with torch tensors: the fp16 weights, the shared one still shared
    tl = torchless.load(tmp_path / "checkpoint_last.safetensors", framework="pt")
    tm = tl["model"]
    assert tm["encoder.embed_tokens.weight"] is tm["decoder.embed_tokens.weight"]
    for k, v in model.items():
        assert isinstance(tm[k], torch.Tensor) and tm[k].dtype == v.dtype, k
        assert torch.equal(tm[k], v), k
    fresh = torch.nn.Parameter(torch.zeros(4))
    adam2 = torch.optim.Adam([fresh], lr=1.0)
    adam2.load_state_dict(tl["last_optimizer_state"])
    assert adam2.param_groups[0]["betas"] == (0.9, 0.98)
    assert torch.equal(adam2.state_dict()["state"][0]["exp_avg"], want["exp_avg"])


def test_convert_keeps_numpy_values(torch: ModuleType, tmp_path: Path) -> None:
    """NumPy arrays, scalars and dtypes pickled inside a checkpoint (RNG states, metrics)
    survive convert with the values, dtypes and layout torch.load gives them."""
    obj = {
        "w": torch.arange(4, dtype=torch.float32),
        "rng": ("MT19937", np.arange(624, dtype=np.uint32) * 7, 624, 0, 0.0),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "big_endian": np.arange(3, dtype=">f4"),
        "text": np.array(["ab", "c"]),
        "scalar": np.float64(1.5),
        "count": np.int64(-3),
        "dtype": np.dtype("float32"),
        "empty": np.zeros((0, 2), dtype=np.float64),
    }
    src = tmp_path / "numpy.pt"
    torch.save(obj, src)
    got = _round_trip(torch, src, tmp_path, [])
    ref = torch.load(src, weights_only=False)
    for k in ("fortran", "big_endian", "text", "empty"):
        assert isinstance(got[k], np.ndarray), k
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        assert np.array_equal(got[k], ref[k]), k
        assert got[k].flags.f_contiguous == ref[k].flags.f_contiguous, k
    assert type(got["rng"]) is tuple and got["rng"][0] == "MT19937"
    assert got["rng"][1].dtype == np.uint32 and np.array_equal(got["rng"][1], obj["rng"][1])
    assert type(got["scalar"]) is np.float64 and got["scalar"] == 1.5
    assert type(got["count"]) is np.int64 and got["count"] == -3
    assert got["dtype"] == np.dtype("float32")
    tl = torchless.load(tmp_path / "numpy.safetensors", framework="pt")
    assert isinstance(tl["w"], torch.Tensor) and torch.equal(tl["w"], obj["w"])
    assert isinstance(tl["rng"][1], np.ndarray)  # arrays stay arrays


def test_fakes_are_removed() -> None:
    """The fake modules exist (with the real class paths) only inside the context."""
    names = (LIGHTNING_DATA, "lightning", HF_ARGS, "transformers", FAIRSEQ_METERS)
    before = {n: sys.modules.get(n) for n in names}
    with fake_frameworks() as f:
        assert sys.modules[HF_ARGS].TrainingArguments is f.training_args
        assert f.training_args.__module__ == HF_ARGS
        assert f.attrdict[PL_PARSING].__module__ == PL_PARSING
        assert sys.modules[HF_UTILS].IntervalStrategy.STEPS.value == "steps"
    assert {n: sys.modules.get(n) for n in names} == before
