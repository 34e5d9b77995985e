"""``ema``: a checkpoint that keeps an exponential moving average of its model's weights,
written as that model with the EMA weights in place of the trained ones.

The model's names stay; the tensors under them are the EMA copy's twins; the copy (and its
bookkeeping) is left out; every other tensor of the checkpoint is kept. Three conventions
are known, each as its library writes it:

* **Stable Diffusion / ldm** (CompVis ``ldm/modules/ema.py``, ``LitEma``): the copy is a
  module ``model_ema`` beside ``model`` (a ``DiffusionWrapper``) whose buffers are named by
  the model's parameter names with the dots removed (``name.replace('.', '')``: buffer
  names cannot hold dots), plus ``decay`` and ``num_updates``. So
  ``model.diffusion_model.input_blocks.0.0.weight`` is read from
  ``model_ema.diffusion_modelinput_blocks00weight``; the names sit at the top level of the
  object or under ``state_dict.`` (a Lightning checkpoint). diffusers'
  ``convert_ldm_unet_checkpoint(..., extract_ema=True)`` reads them by the same rule
  (``"model_ema." + "".join(key.split(".")[1:])``). Removing dots can make two names one
  (``a.b1`` and ``ab.1``): such a model name is refused as ambiguous.
* **timm** (``timm/utils/checkpoint_saver.py``, ``CheckpointSaver._save``):
  ``state_dict`` holds the model's ``state_dict()`` and ``state_dict_ema`` the EMA
  module's (``get_state_dict`` unwraps ``ModelEma*`` to the copy), by the same names:
  ``state_dict.X`` is read from ``state_dict_ema.X``.
* **ultralytics** (``ultralytics/engine/trainer.py``, ``BaseTrainer.save_model``): ``ema``
  is the whole EMA module pickled (``deepcopy(self.ema.ema).half()``), its tensors named as
  its ``state_dict``, beside ``model``: ``model.X`` is read from ``ema.X``. Since
  ultralytics 8.1 a training checkpoint saves ``"model": None`` ("resume and final
  checkpoints derive from EMA"); the EMA module is then written as ``model``, as
  ``strip_optimizer`` does (``if x.get("ema"): x["model"] = x["ema"]``). A final
  ``best.pt`` has ``ema`` None: its ``model`` already is the EMA, and ``ema`` is refused.

Refused, by name: no convention found, or more than one; a model weight with no EMA twin,
or a twin of another shape (or one of them an unsupported tensor); EMA entries no model
weight reads (the mapping would not be the one the library uses); an EMA copy holding only
its bookkeeping (``decay``/``num_updates``: the weights were pruned from the file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torchless.conversion.select import Shape
from torchless.errors import ConversionError

__all__ = ["ema_names"]

_SHOWN = 10
_HINT = ("`torchless inspect FILE` shows the names; convert without --ema / ema=True to "
         "write the tensors as they are")


@dataclass(frozen=True)
class _Convention:
    name: str
    model: str       # the model's names start with this
    copy: str        # the EMA copy's names start with this
    twin: Callable[[str], str]   # a model name relative to ``model`` -> relative to ``copy``
    bookkeeping: tuple[str, ...] = ()   # names under ``copy`` that are no weight
    copy_is_model: bool = False   # no model tensors: the copy is written as the model

    def found(self, names: Mapping[str, Shape]) -> bool:
        return any(n.startswith(self.copy) for n in names)


def _dotless(name: str) -> str:
    return name.replace(".", "")


def _same(name: str) -> str:
    return name


_CONVENTIONS = (
    *(_Convention("ldm (Stable Diffusion)", root + "model.", root + "model_ema.", _dotless,
                  ("decay", "num_updates")) for root in ("", "state_dict.")),
    _Convention("timm", "state_dict.", "state_dict_ema.", _same),
    _Convention("ultralytics", "model.", "ema.", _same, copy_is_model=True),
)


def ema_names(shapes: Mapping[str, Shape], path: str | None) -> dict[str, str]:
    """Output name -> source name: the checkpoint with the EMA weights under the model's
    names (module docstring). ``shapes``: every flat name of the checkpoint."""
    found = [c for c in _CONVENTIONS if c.found(shapes)]
    if not found:
        raise ConversionError(
            "no EMA copy found: looked for model_ema.* (ldm / Stable Diffusion, also under "
            "state_dict.), state_dict_ema.* (timm) and ema.* (ultralytics)", path=path,
            hint="a file without an EMA copy holds the trained weights only (an ultralytics "
                 "best.pt, or a pruned SD checkpoint: its weights may already be the EMA "
                 "ones); convert it without --ema")
    if len(found) > 1:
        raise ConversionError("more than one EMA convention matches: "
                              + ", ".join(f"{c.copy}* ({c.name})" for c in found), path=path,
                              hint=_HINT)
    return _apply(found[0], shapes, path)


def _apply(c: _Convention, shapes: Mapping[str, Shape], path: str | None) -> dict[str, str]:
    skip = {c.copy + b for b in c.bookkeeping}
    copies = {n[len(c.copy):]: n for n in shapes if n.startswith(c.copy) and n not in skip}
    if not copies:
        raise ConversionError(f"the EMA copy {c.copy[:-1]} ({c.name}) holds no weights, only "
                              f"{', '.join(sorted(n for n in shapes if n in skip))}: they were "
                              "pruned from this file", path=path,
                              hint="its model weights are all there is (in an -emaonly "
                                   "file they already are the EMA ones): convert it "
                                   "without --ema")
    model = [n for n in shapes if n.startswith(c.model)]
    if not model and c.copy_is_model:  # ultralytics >= 8.1: "model": None beside the EMA
        return {**{n: n for n in shapes if not n.startswith(c.copy)},
                **{c.model + rest: source for rest, source in copies.items()}}
    twins: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for n in model:
        twins[n] = c.twin(n[len(c.model):])
        readers.setdefault(twins[n], []).append(n)
    problems = [f"{' and '.join(map(repr, ns))} would both read {c.copy}{t}"
                for t, ns in readers.items() if len(ns) > 1]
    problems += [f"{n!r} has no EMA twin {c.copy}{twins[n]}" for n in model
                 if twins[n] not in copies]
    problems += [f"{n!r} is {_shape(shapes[n])}, its EMA twin {copies[twins[n]]!r} "
                 f"{_shape(shapes[copies[twins[n]]])}" for n in model
                 if twins[n] in copies and shapes[n] != shapes[copies[twins[n]]]]
    orphans = [copies[t] for t in copies if t not in readers]
    if orphans:
        problems.append(f"no model weight for {len(orphans)} EMA entr"
                        f"{'y' if len(orphans) == 1 else 'ies'}: "
                        + ", ".join(map(repr, orphans[:_SHOWN])) + (
                            " …" if len(orphans) > _SHOWN else ""))
    if problems:
        more = f" and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ConversionError(f"the EMA weights ({c.name}: {c.copy}*) do not match the model "
                              f"({c.model}*): {'; '.join(problems[:_SHOWN])}{more}",
                              path=path, hint=_HINT)
    return {n: copies[twins[n]] if n in twins else n for n in shapes
            if not n.startswith(c.copy)}


def _shape(shape: Shape) -> str:
    return "an unsupported tensor" if shape is None else f"shape {list(shape)}"
