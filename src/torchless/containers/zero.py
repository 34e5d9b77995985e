"""A DeepSpeed ZeRO checkpoint directory (stages 1, 2 and 3), as ``engine.save_checkpoint``
writes it::

    DIR/latest                          the tag of the last save (``global_step2``)
    DIR/<tag>/mp_rank_00_model_states.pt            ZeRO-1/2: the module, client state
    DIR/<tag>/zero_pp_rank_R_mp_rank_00_model_states.pt   ZeRO-3: one a rank
    DIR/<tag>/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt  each rank's optimizer
                                        partition: its flat fp32 master weights and moments

Every file is a ``torch.save`` archive. The weights live in the optimizer partitions, one
flat fp32 vector a parameter group a rank; DeepSpeed's ``deepspeed/utils/zero_to_fp32.py``
is the spec of how they are cut:

* ZeRO-1/2 (``single_partition_of_fp32_groups``): a group's full vector is the ranks'
  partitions end to end; its parameters (``param_shapes``, in order) follow each other in
  it, each after the ``param_alignment_paddings`` of the one before when they are recorded;
  the vector is padded to a multiple of ``2 * world_size``.
* ZeRO-3 (``fp32_flat_groups``): every parameter is split in ``world_size`` pieces of
  ``ceil(numel / world_size)`` elements, the last padded; rank R's pieces follow each
  other across its groups in ``param_shapes`` order (all groups merged).

The consolidated state dict is zero_to_fp32's: the floating buffers as float32, the frozen
parameters (ZeRO-2: whole in the model states; ZeRO-3: each rank's piece), the trainable
parameters from the fp32 partitions, then the ``shared_params`` aliases. A parameter inside
one partition reads as a view of its file, one split across ranks or groups as its pieces put
together; converting streams the pieces from their files with ``pread`` either way.
The tree is the model states (client state, step, scheduler …) with ``module`` the
consolidated weights and ``optimizer`` the moments put together the same way, by parameter
name (``optimizer.state.<param>.exp_avg``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

from torchless.containers.dcpchunks import Piece, assembled
from torchless.containers.dcpmeta import Chunk, TensorMeta
from torchless.containers.rankfiles import RankFiles
from torchless.core import dtypes as _dtypes
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    FormatError,
    MissingFileError,
    NotACheckpointError,
    StorageError,
    UnsupportedError,
)
from torchless.io.remote import is_remote
from torchless.io.source import Source
from torchless.model.graph import ModuleHook, module_state_dict
from torchless.model.tensor import Storage, Tensor
from torchless.pickle.values import Opaque
from torchless.rules.resolver import TorchResolver

__all__ = ["ZeroDirectory", "check_tag", "is_zero_dir", "refuse_rank_file", "tag_directory",
           "tags"]

_MODEL = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt\Z")
_OPTIM = re.compile(r"(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt\Z")
_TAG = re.compile(r"[^/\\\x00]+\Z")
_HINT = ("the ZeRO checkpoint is incomplete or damaged (a rank's file missing?): copy the "
         "whole directory again")


def _float32() -> _dtypes.DType:
    found = _dtypes.by_torch_name("float32")
    assert found is not None
    return found


_FLOAT32 = _float32()


def _natural(text: str) -> list[Any]:
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", text)]


def _files(path: str, pattern: re.Pattern[str]) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted((n for n in names if pattern.match(n)), key=_natural)


def _tag_dir(path: str) -> str | None:
    """The directory holding the rank files: ``path`` itself, or the one ``latest`` names."""
    if _holds_ranks(path):
        return path
    latest = os.path.join(path, "latest")
    if not os.path.isfile(latest):
        return None
    try:
        with open(latest, "rb") as f:
            tag = f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not _TAG.match(tag) or tag in (".", ".."):
        return None
    inner = os.path.join(path, tag)
    return inner if _holds_ranks(inner) else None


def _holds_ranks(path: str) -> bool:
    return bool(_files(path, _OPTIM) and _files(path, _MODEL))


def tags(path: str) -> list[str]:
    """The tags of a DeepSpeed run directory: its subdirectories holding model-states and
    optimizer-partition files (``global_step1``, ``global_step2`` …), in natural order."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted((n for n in names if _TAG.match(n) and n not in (".", "..")
                   and _holds_ranks(os.path.join(path, n))), key=_natural)


def check_tag(tag: Any) -> None:
    """``tag=`` of the entry points: None or a str (a programming error otherwise)."""
    if tag is not None and not isinstance(tag, str):
        raise TypeError(f"tag is a str (a directory name such as 'global_step2'), not "
                        f"{type(tag).__name__}")


def tag_directory(path: Any, tag: str) -> str:
    """The directory of one save of a DeepSpeed run directory, by its tag (zero_to_fp32's
    ``-t``; without a tag, the ``latest`` file names it). An unknown tag is refused, the
    tags present listed; ``path`` must be the local run directory, not a tag directory."""
    if not isinstance(path, str) or is_remote(path):
        raise UnsupportedError("a tag picks a save of a local DeepSpeed run directory",
                               path=path if isinstance(path, str) else None)
    if not os.path.isdir(path):
        raise NotACheckpointError("a tag names a save in a DeepSpeed run directory; this "
                                  "is no directory", path=path)
    present = tags(path)
    if tag in present:
        return os.path.join(path, tag)
    if _holds_ranks(path):
        raise NotACheckpointError(
            f"this is the save {os.path.basename(os.path.normpath(path))!r} of a DeepSpeed "
            f"run, not the run directory whose tags {tag!r} would pick from", path=path,
            hint=f"open {path} without a tag, or pass its parent directory with the tag")
    if not present:
        raise NotACheckpointError(f"no DeepSpeed ZeRO saves (global_step*/ directories of "
                                  f"rank files) to pick the tag {tag!r} from", path=path)
    raise MissingFileError(
        f"no save tagged {tag!r}; the tags present: {', '.join(present)}", path=path,
        hint="pick one of the tags present (without a tag, the one the latest file names)")


def is_zero_dir(path: str) -> bool:
    """A DeepSpeed checkpoint directory (``latest`` naming a tag directory) or a tag
    directory (``global_step*``) holding model-states and optimizer-partition files."""
    return _tag_dir(path) is not None


def refuse_rank_file(path: str) -> None:
    """A rank file of a ZeRO checkpoint opened alone: refused with what it is and what to
    open instead (a ZeRO-3 model-states file holds zero-element placeholders, a partition
    a slice of flat vectors: neither is the model, and converting either would write
    empty or meaningless tensors). The scanner still scans each (it sniffs, never refuses)."""
    name, directory = os.path.basename(path), os.path.dirname(path) or "."
    model, optim = _MODEL.match(name), _OPTIM.match(name)
    zero3_model = model is not None and model.group(1) is not None
    # ZeRO-1/2's mp_rank_00_model_states.pt is a whole module state dict (in the training
    # dtype): it opens as the torch file it is
    if not (zero3_model or optim) or not is_zero_dir(directory):
        return
    what = ("a ZeRO optimizer partition (one rank's slice of the flat fp32 weights and "
            "moments)" if optim else
            "a ZeRO-3 model-states file (its weights are zero-element placeholders: they "
            "live in the optimizer partitions)")
    raise NotACheckpointError(
        f"this is {what} of a DeepSpeed checkpoint: open its directory, which torchless "
        "consolidates", path=path,
        hint=f"pass the directory: torchless.open({directory!r}) / torchless convert "
             f"{directory} -o model.safetensors")


class ZeroDirectory:
    """Reads one ZeRO checkpoint: its model states, every rank's partition, and the
    consolidated weights and moments."""

    format = "zero"
    remote = False
    size = 0

    def __init__(self, path: str, limits: Limits, *, verify_crc: bool = False) -> None:
        self.path = path
        self.limits = limits
        self.verify_crc = verify_crc
        tag_dir = _tag_dir(path)
        if tag_dir is None:  # pragma: no cover - the registry sniffed it
            raise NotACheckpointError("not a DeepSpeed ZeRO checkpoint directory", path=path)
        self.tag_dir = tag_dir
        self._ranks = RankFiles(self.limits, self.verify_crc)
        self.stage = 0
        self.world_size = 0
        self.model_files = _files(tag_dir, _MODEL)
        self.optim_files = _files(tag_dir, _OPTIM)

    # ---- reading the rank files -------------------------------------------------------

    def _read(self, name: str, resolver: TorchResolver) -> Any:
        return self._ranks.read(os.path.join(self.tag_dir, name), name, resolver)

    def persistent_load(self, pid: Any, offset: int) -> Storage:
        return self._ranks.persistent_load(pid, offset)

    def load(self, resolver: TorchResolver) -> Any:
        optims = [self._read(n, resolver) for n in self.optim_files]
        osds = [_get(o, "optimizer_state_dict", n) for o, n in zip(optims, self.optim_files,
                                                                   strict=True)]
        first = osds[0]
        self.stage = _stage(first.get("zero_stage"), self.optim_files[0])
        count = first.get("partition_count")
        counts = count if isinstance(count, list) else [count]
        if not counts or not all(type(c) is int and c > 0 for c in counts):
            raise FormatError(f"partition_count {count!r:.60} is not a positive int",
                              member=self.optim_files[0])
        self.world_size = max(counts)
        if self.world_size != len(optims):
            raise StorageError(f"the partitions say world size {self.world_size}; the "
                               f"directory holds {len(optims)} optimizer files", hint=_HINT)
        if self.stage == 3:
            if len(self.model_files) != self.world_size or any(
                    _MODEL.match(n).group(1) is None for n in self.model_files):  # type: ignore[union-attr]
                raise StorageError(f"ZeRO-3 needs one model-states file a rank "
                                   f"({self.world_size}); found {self.model_files}",
                                   hint=_HINT)
            models = [self._read(n, resolver) for n in self.model_files]
        else:
            name = "mp_rank_00_model_states.pt"
            if name not in self.model_files:
                raise StorageError(f"{name} is missing", hint=_HINT)
            models = [self._read(name, resolver)]
        states = models[0]
        if not isinstance(states, dict) or "buffer_names" not in states:
            raise FormatError("the model states hold no buffer_names: not a DeepSpeed "
                              "model-states file", member=self.model_files[0])
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        flats = [_tensor_list(_get(o, key, n), key, n)
                 for o, n in zip(osds, self.optim_files, strict=True)]
        if len({len(f) for f in flats}) != 1:
            raise FormatError("the ranks' partitions have different numbers of groups",
                              hint=_HINT)
        shapes = _param_shapes(_get(states, "param_shapes", self.model_files[0]))
        if self.stage == 3:
            places = _zero3_places(shapes, flats, self.world_size)
        else:
            paddings = first.get("param_alignment_paddings")
            places = _zero2_places(shapes, flats, self.world_size, paddings)
        weights = self._weights(states, models, places, flats)
        tree = dict(states)
        tree["module"] = weights
        tree["optimizer"] = self._moments(osds, places, flats)
        return tree

    # ---- consolidation ----------------------------------------------------------------

    def _weights(self, states: dict[Any, Any], models: list[Any],
                 places: dict[str, tuple[tuple[int, ...], list[_Place]]],
                 flats: list[list[Tensor]]) -> dict[str, Tensor]:
        module = states.get("module")
        module = module if isinstance(module, dict) else {}
        buffers = states.get("buffer_names") or []
        out: dict[str, Tensor] = {}
        for name in buffers:
            t = module.get(name)
            if isinstance(t, Tensor):
                out[name] = _as_float32(name, t)
        frozen = states.get("frozen_param_shapes") or {}
        for name, shape in frozen.items():
            shape = _shape(shape, name)
            if self.stage == 3:
                frags = [_get(_get(m, "frozen_param_fragments", "model states"), name,
                              "frozen_param_fragments") for m in models]
                pieces = _take([(f, 0, _numel(f)) for f in frags], math.prod(shape), name)
                files = [self._ranks.file(self.model_files[r]) for r in range(len(pieces))]
                out[name] = _as_float32(name, _gathered(name, shape, pieces, files))
            else:
                frag = _get(_get(states, "frozen_param_fragments", "model states"), name,
                            "frozen_param_fragments")
                if not isinstance(frag, Tensor):
                    raise FormatError(f"frozen parameter {name!r} is not a tensor")
                out[name] = _as_float32(name, frag)
        for name, (shape, where) in places.items():
            pieces = [(flats[r][g], start, n) for r, g, start, n in where]
            out[name] = _gathered(name, shape, pieces,
                                  [self._ranks.file(self.optim_files[r]) for r, *_ in where])
        shared = states.get("shared_params") or {}
        if self.stage < 3:  # parameters no group and no frozen record holds (ZeRO-1 keeps
            # frozen ones only in the module, which zero_to_fp32 then leaves out): as saved
            for name, t in module.items():
                if name not in out and name not in shared and isinstance(t, Tensor):
                    out[name] = _as_float32(name, t)
        for alias, target in shared.items():
            if target in out:
                out[alias] = out[target]
        return out

    def _moments(self, osds: list[dict[Any, Any]],
                 places: dict[str, tuple[tuple[int, ...], list[_Place]]],
                 flats: list[list[Tensor]]) -> dict[str, Any]:
        """The base optimizer's per-group flat state (``exp_avg``, ``exp_avg_sq`` …) cut
        like the fp32 weights, by parameter name; its param_groups as saved by rank 0."""
        key = "optimizer_state_dict" if self.stage == 3 else "base_optimizer_state"
        bases = [o.get(key) for o in osds]
        if not all(isinstance(b, dict) for b in bases):
            return {}
        groups = [b.get("state") or {} for b in bases]  # type: ignore[union-attr]
        state: dict[str, dict[str, Any]] = {}
        for name, (shape, where) in places.items():
            keys = groups[0].get(where[0][1], {}) if where else {}
            entry: dict[str, Any] = {}
            for k, v in keys.items():
                if not isinstance(v, Tensor) or v.shape != flats[0][where[0][1]].shape:
                    entry[k] = v  # the step count, the same for every parameter of a group
                    continue
                try:
                    pieces = [(_get(groups[r][g], k, "optimizer state"), start, n)
                              for r, g, start, n in where]
                except CheckpointError:
                    continue
                entry[k] = _gathered(f"{name}.{k}", shape, pieces,
                                     [self._ranks.file(self.optim_files[r])
                                      for r, *_ in where])
            state[name] = entry
        return {"state": state, "param_groups": bases[0].get("param_groups")}  # type: ignore[union-attr]

    # ---- what it is -------------------------------------------------------------------

    def weights(self, tree: Any) -> Any:
        """What ``Checkpoint.tensors`` holds: the consolidated weights, by module name
        (``convert`` writes these, as zero_to_fp32 does; ``load`` gives the whole tree)."""
        return tree.get("module", {}) if isinstance(tree, dict) else {}

    def describe(self, resolver: TorchResolver) -> dict[str, Any]:
        return {"zero_stage": self.stage, "world_size": self.world_size,
                "tag": os.path.basename(self.tag_dir),
                # every save of the run (what tag= / --tag pick from)
                "tags": tags(os.path.dirname(self.tag_dir) or "."),
                "model_files": self.model_files, "optim_files": self.optim_files}

    def module_hook(self) -> ModuleHook:
        return module_state_dict

    def release(self, offset: int, n: int) -> None:
        """Nothing: each piece hands back its own file's pages as it is streamed."""

    def close(self) -> None:
        self._ranks.close()


#: Where a parameter's elements lie: (rank, group, start, count) pieces in order.
_Place = tuple[int, int, int, int]


def _get(obj: Any, key: Any, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise FormatError(f"{where} has no {key!r}", hint=_HINT)
    return obj[key]


def _stage(value: Any, where: str) -> int:
    """``zero_stage``: a ``ZeroStageEnum`` (an int enum pickled as a call with the int)."""
    if isinstance(value, Opaque) and len(value.args) == 1:
        value = value.args[0]
    if type(value) is not int or value not in (1, 2, 3):
        raise FormatError(f"zero_stage {value!r:.60} is not 1, 2 or 3: not a ZeRO "
                          "optimizer partition", member=where)
    return value


def _numel(t: Tensor) -> int:
    return math.prod(t.shape)


def _tensor_list(value: Any, key: str, where: str) -> list[Tensor]:
    if not isinstance(value, list) or not all(
            isinstance(t, Tensor) and len(t.shape) == 1 and t.is_contiguous()
            for t in value):
        raise FormatError(f"{key} is not a list of flat tensors", member=where)
    return value


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(d) is int and d >= 0
                                                       for d in value):
        raise FormatError(f"the shape of {name!r} is {value!r:.60}, not a list of sizes")
    return tuple(value)


def _param_shapes(value: Any) -> list[dict[str, tuple[int, ...]]]:
    if not isinstance(value, list) or not all(isinstance(g, dict) for g in value):
        raise FormatError("param_shapes is not a list of groups of shapes")
    return [{str(k): _shape(v, str(k)) for k, v in g.items()} for g in value]


def _zero2_places(shapes: list[dict[str, tuple[int, ...]]], flats: list[list[Tensor]],
                  world: int, paddings: Any) -> dict[str, tuple[tuple[int, ...], list[_Place]]]:
    if len(shapes) != len(flats[0]):
        raise FormatError(f"{len(shapes)} groups of shapes, {len(flats[0])} of partitions")
    out: dict[str, tuple[tuple[int, ...], list[_Place]]] = {}
    align = 2 * world
    for g, group in enumerate(shapes):
        sizes = [_numel(f[g]) for f in flats]
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
        pads = paddings[g] if isinstance(paddings, list) else None
        if pads is not None and (not isinstance(pads, list) or len(pads) != len(group)):
            raise FormatError(f"group {g}: param_alignment_paddings do not match its "
                              f"{len(group)} parameters")
        offset = 0
        for i, (name, shape) in enumerate(group.items()):
            n = math.prod(shape)
            where = []
            for r, (lo, size) in enumerate(zip(starts, sizes, strict=True)):
                a, b = max(offset, lo), min(offset + n, lo + size)
                if a < b:
                    where.append((r, g, a - lo, b - a))
            if sum(p[3] for p in where) != n:
                raise FormatError(f"{name!r} runs past the end of group {g}'s partitions",
                                  hint=_HINT)
            out[name] = (shape, where)
            offset += n + (int(pads[i]) if pads is not None else 0)
        total = sum(sizes)
        if align * math.ceil(offset / align) != align * math.ceil(total / align):
            raise FormatError(f"group {g}: its parameters take {offset} elements of the "
                              f"{total} its partitions hold", hint=_HINT)
    return out


def _zero3_places(shapes: list[dict[str, tuple[int, ...]]], flats: list[list[Tensor]],
                  world: int) -> dict[str, tuple[tuple[int, ...], list[_Place]]]:
    sizes = [_numel(t) for t in flats[0]]
    if any([_numel(t) for t in f] != sizes for f in flats):
        raise FormatError("the ranks' ZeRO-3 partitions differ in size", hint=_HINT)
    bounds = [sum(sizes[:g]) for g in range(len(sizes) + 1)]
    out: dict[str, tuple[tuple[int, ...], list[_Place]]] = {}
    offset = 0
    for group in shapes:
        for name, shape in group.items():
            n = math.prod(shape)
            part = math.ceil(n / world)
            where: list[_Place] = []
            for r in range(world):
                for g in range(len(sizes)):
                    a, b = max(offset, bounds[g]), min(offset + part, bounds[g + 1])
                    if a < b:
                        where.append((r, g, a - bounds[g], b - a))
            if sum(p[3] for p in where) != part * world:
                raise FormatError(f"{name!r} runs past the end of the partitions",
                                  hint=_HINT)
            out[name] = (shape, _take_places(where, n))
            offset += part
    if offset != bounds[-1]:
        raise FormatError(f"the parameters take {offset} elements of each rank's partition; "
                          f"it holds {bounds[-1]}", hint=_HINT)
    return out


def _take_places(where: list[_Place], n: int) -> list[_Place]:
    out: list[_Place] = []
    for r, g, start, count in where:
        if n <= 0:
            break
        out.append((r, g, start, min(count, n)))
        n -= count
    return out


def _take(pieces: list[tuple[Tensor, int, int]], n: int, name: str
          ) -> list[tuple[Tensor, int, int]]:
    out = []
    for t, start, count in pieces:
        if n <= 0:
            break
        out.append((t, start, min(count, n)))
        n -= count
    if n > 0:
        raise FormatError(f"the pieces of {name!r} hold fewer elements than its shape",
                          hint=_HINT)
    return out


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def _gathered(name: str, shape: tuple[int, ...], pieces: list[tuple[Tensor, int, int]],
              files: list[tuple[Source | None, int | None]]) -> Tensor:
    """A parameter from its pieces of flat partitions (``files``: the file each lies in,
    and its descriptor): read, a view of the one partition that holds it whole, else the
    pieces put together; converted, the pieces streamed end to end from their files with
    ``pread`` (:mod:`.dcpchunks`), so no page of a map stays behind."""
    n = math.prod(shape)
    for t, start, count in pieces:
        if not (len(t.shape) == 1 and t.is_contiguous() and 0 <= start
                and start + count <= t.shape[0]):
            raise FormatError(f"a piece of {name!r} lies outside its flat partition",
                              hint=_HINT)
    dtype = pieces[0][0].dtype if pieces else _FLOAT32
    if any(t.dtype != dtype for t, _, _ in pieces):
        raise FormatError(f"the pieces of {name!r} differ in dtype", hint=_HINT)
    chunks, parts, pos = [], [], 0
    for (t, start, count), (src, fd) in zip(pieces, files, strict=True):
        chunk = Chunk((pos,), (count,))
        view = Tensor(t.storage, dtype, (count,), (1,), t.storage_offset + start)
        chunks.append(chunk)
        parts.append(Piece(chunk, view, src, fd))
        pos += count
    flat = assembled(name, TensorMeta(dtype, (n,), tuple(chunks)), parts)
    return Tensor(flat.storage, dtype, shape, _strides(shape), 0)


def _as_float32(name: str, t: Tensor) -> Tensor:
    """zero_to_fp32's ``.float()`` of a floating buffer or frozen parameter, lazily."""
    if t.dtype.name not in ("float16", "bfloat16", "float64"):
        return t
    import numpy as np

    n = math.prod(t.shape)

    def load() -> bytes:
        return np.ascontiguousarray(t.numpy(), dtype=np.float32).tobytes()

    def stream(block: int) -> Iterator[bytes]:
        yield load()

    storage = Storage(f"{name} (as float32)", _FLOAT32, n * 4, load, stream=stream)
    return Tensor(storage, _FLOAT32, t.shape, _strides(t.shape), 0)
