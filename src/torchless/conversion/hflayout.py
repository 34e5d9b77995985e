"""Hugging Face model directories as files on disk: which checkpoint files a directory or an
index holds and which outputs they become (the naming conventions are in :mod:`.hf`), shard
sizes, and reading an output directory or index back."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torchless.containers import registry
from torchless.conversion.common import (
    default_dst,
)
from torchless.core import jsondepth as _json
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    ConversionError,
    FormatError,
    UnsafePathError,
)
from torchless.model.tensor import Tensor
from torchless.reader import checkpoint as _checkpoint

__all__ = ["SHARDS_HINT", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "Layout", "check_index",
           "check_shard_set", "is_checkpoint_dir", "is_model_dir", "output_name", "outputs",
           "parse_size", "read_index", "resolve", "split", "stem"]

WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
#: single-file weights looked for in a directory, in this order
_SINGLE_NAMES = (WEIGHTS_NAME, "diffusion_pytorch_model.bin")
#: their outputs: the weights of a directory that also holds other converted files
_SINGLE_OUTPUTS = ("model.safetensors", "diffusion_pytorch_model.safetensors")
_MAX_INDEX_BYTES = 100_000_000

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_HINT = ("--max-shard-size / max_shard_size takes a positive size: 5GB (5*10^9 bytes), "
              "500MB, 1GiB (2^30) or a number of bytes")
_INDEX_HINT = "the index file is damaged: download it again with the model's shards"
SHARDS_HINT = ("the model's index and shard files do not belong together (an interrupted or "
                "mixed download?): download the model again")


def parse_size(value: int | str) -> int:
    """Bytes from ``5GB`` (10**9), ``500MB``, ``1GiB`` (2**30), ``123`` or an int."""
    if isinstance(value, bool):
        raise ConversionError(f"not a size: {value!r}", hint=_SIZE_HINT)
    if isinstance(value, int):
        n = value
    else:
        from decimal import Decimal, InvalidOperation  # shard sizes only: not at start-up

        m = _SIZE.match(str(value))
        if m is None:
            raise ConversionError(f"cannot read the size {value!r} (use e.g. 5GB, 500MB, "
                                  "1GiB or a number of bytes)", hint=_SIZE_HINT)
        try:
            n = int(Decimal(m.group(1)) * _UNITS[(m.group(2) or "B").upper()])
        except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
            raise ConversionError(f"cannot read the size {value!r}") from None
    if n <= 0:
        raise ConversionError(f"the shard size must be positive, not {value!r}",
                              hint=_SIZE_HINT)
    return n


def output_name(name: str) -> str:
    """The safetensors name for a ``.bin`` weights file, as the safetensors script renames."""
    stem = name[:-4] if name.endswith(".bin") else os.path.splitext(name)[0]
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model"):]
    return stem + ".safetensors"


@dataclass(frozen=True)
class Layout:
    sources: list[str]                  # paths, in order
    index_path: str | None              # the input index
    expected: dict[str, str] | None     # its weight_map: name -> shard file name
    out_dir: str
    base: str                           # the unsharded output name (model.safetensors)
    outputs: list[str]                  # one output name per source (without resharding)
    out_index: str | None               # output index name (without resharding)


def is_checkpoint_dir(path: str) -> bool:
    """A directory that is one checkpoint (a DCP directory), read like a file."""
    return os.path.isdir(path) and registry.sniff_directory(path) is not None


def is_model_dir(path: str) -> bool:
    """Whether a directory holds Hugging Face weights this module converts as a whole."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(n in _SINGLE_NAMES or n.endswith(".bin.index.json") for n in names)


def read_index(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_INDEX_BYTES + 1)
    except OSError as e:
        raise ConversionError(f"cannot read the index: {e.strerror or e}", path=path) from None
    if len(raw) > _MAX_INDEX_BYTES:
        raise FormatError(f"the index is larger than {_MAX_INDEX_BYTES} bytes", path=path,
                          hint=_INDEX_HINT)
    try:
        doc = _json.loads(raw.decode("utf-8"), max_depth=Limits.max_depth, what="the index")
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"the index is not UTF-8 JSON: {e}", path=path,
                          hint=_INDEX_HINT) from None
    except CheckpointError as e:
        raise e.add_context(path=path) from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
        raise FormatError("the index has no weight_map of tensor name -> shard file",
                          path=path, hint=_INDEX_HINT)
    for shard in set(wmap.values()):
        if (not shard or shard != os.path.basename(shard) or shard in (".", "..")
                or "\\" in shard or "\0" in shard):
            raise UnsafePathError(f"the index names the shard {shard!r}, which is not a plain "
                                  "file name in the index's directory", path=path)
    return dict(wmap)


def resolve(spath: str, dst: str | None) -> Layout:
    if os.path.isdir(spath) and not is_checkpoint_dir(spath):
        directory = spath
        index_name = None
        single = next((n for n in _SINGLE_NAMES if os.path.isfile(os.path.join(spath, n))),
                      None)
        if single is None:
            names = sorted(os.listdir(spath))
            indexes = [n for n in names if n.endswith(".bin.index.json")]
            if WEIGHTS_INDEX_NAME in indexes:
                index_name = WEIGHTS_INDEX_NAME
            elif len(indexes) == 1:
                index_name = indexes[0]
            elif indexes:
                raise ConversionError(f"the directory holds several indexes ({', '.join(indexes)}"
                                      "); give the one to convert as SRC", path=spath)
            else:
                found = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
                raise ConversionError(
                    "no Hugging Face weights here (pytorch_model.bin, or shards with a "
                    "*.bin.index.json); checkpoint files in the directory: "
                    f"{', '.join(found[:20]) or '(none)'} (convert one by its path)",
                    path=spath, hint="pass a checkpoint file, or a directory with "
                                     "pytorch_model.bin or *.bin shards and their index")
        out_dir = dst if dst is not None else directory
        if single is not None:
            base = output_name(single)
            return Layout([os.path.join(directory, single)], None, None, out_dir, base,
                           [base], None)
        assert index_name is not None
        index_path = os.path.join(directory, index_name)
    elif spath.endswith(".index.json"):
        index_path = spath
        directory = os.path.dirname(spath) or "."
        index_name = os.path.basename(spath)
        out_dir = dst if dst is not None else directory
    else:  # one checkpoint file, resharded
        if dst is not None and (dst.endswith(("/", os.sep)) or os.path.isdir(dst)):
            # -o names a directory: transformers' names inside it
            base = "model.safetensors"
            return Layout([spath], None, None, dst, base, [base], None)
        out = dst if dst is not None else default_dst(spath.rstrip("/" + os.sep) or spath)
        base = os.path.basename(out)
        return Layout([spath], None, None, os.path.dirname(out) or ".", base, [base], None)
    expected = read_index(index_path)
    shards = sorted(set(expected.values()))
    for shard in shards:
        if not os.path.isfile(os.path.join(directory, shard)):
            raise ConversionError(f"the index names the shard {shard!r}, which does not "
                                  "exist", path=index_path, hint=SHARDS_HINT)
    bin_name = index_name[:-len(".index.json")]
    check_shard_set(directory, bin_name, shards, index_path)
    base = output_name(bin_name)
    outputs = [output_name(s) for s in shards]
    if len(set(outputs)) != len(outputs):
        raise ConversionError("two shards would get the same output name", path=index_path)
    return Layout([os.path.join(directory, s) for s in shards], index_path, expected,
                   out_dir, base, outputs, base + ".index.json")


def check_shard_set(directory: str, bin_name: str, shards: list[str], index_path: str) -> None:
    """Shards named ``<stem>-0000K-of-0000N.bin``: the index must name all N of them, and the
    directory may hold no other shard of that pattern (a stale or forgotten one)."""
    stem = bin_name[:-4] if bin_name.endswith(".bin") else bin_name
    pattern = re.compile(re.escape(stem) + r"-(\d+)-of-(\d+)\.bin")
    counts = {int(m.group(2)) for s in shards if (m := pattern.fullmatch(s))}
    if len(counts) == 1 and len(shards) != next(iter(counts)):
        raise ConversionError(f"the index names {len(shards)} shard(s) of "
                              f"{next(iter(counts))}: {', '.join(shards[:10])}",
                              path=index_path, hint=SHARDS_HINT)
    listed = set(shards)
    stray = sorted(n for n in os.listdir(directory)
                   if pattern.fullmatch(n) and n not in listed)
    if stray:
        raise ConversionError(f"shard file(s) the index does not name: "
                              f"{', '.join(stray[:10])}", path=index_path,
                              hint="remove the stray shards (left from another download?) "
                                   "or fetch the index that names them")


def check_index(layout: Layout, ckpts: list[_checkpoint.Checkpoint]) -> None:
    assert layout.expected is not None
    actual: dict[str, str] = {}
    for path, ckpt in zip(layout.sources, ckpts, strict=True):
        shard = os.path.basename(path)
        for name in [*ckpt.tensors, *ckpt.unsupported]:
            actual[name] = shard
    missing = [n for n in layout.expected if n not in actual]
    unlisted = [n for n in actual if n not in layout.expected]
    misplaced = [f"{n} (in {actual[n]}, the index says {f})"
                 for n, f in layout.expected.items() if n in actual and actual[n] != f]
    problems = []
    for what, names in (("listed but in no shard", missing),
                        ("in a shard but not listed", unlisted), ("misplaced", misplaced)):
        if names:
            more = f" and {len(names) - 10} more" if len(names) > 10 else ""
            problems.append(f"{len(names)} {what}: {', '.join(names[:10])}{more}")
    if problems:
        raise ConversionError("the index's weight_map does not match its shards: "
                              + "; ".join(problems), path=layout.index_path,
                              hint=SHARDS_HINT)


def split(flat: list[tuple[str, int, Tensor]], limit: int) -> list[list[tuple[str, int, Tensor]]]:
    groups: list[list[tuple[str, int, Tensor]]] = []
    current: list[tuple[str, int, Tensor]] = []
    size = 0
    for item in flat:
        n = item[2].nbytes
        if current and (n > limit or size + n > limit):
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += n
        if n > limit:
            groups.append(current)
            current, size = [], 0
    if current or not groups:
        groups.append(current)
    return groups


def stem(base: str) -> str:
    return base[:-len(".safetensors")] if base.endswith(".safetensors") else (
        os.path.splitext(base)[0])


def outputs(dpath: str) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files DST stands for, and its index's weight_map (if it has one)."""
    if os.path.isdir(dpath):
        names = sorted(os.listdir(dpath))
        indexes = [n for n in names if n.endswith(".safetensors.index.json")]
        if len(indexes) > 1:
            raise ConversionError(f"the directory holds several indexes ({', '.join(indexes)}"
                                  "); give the one to verify as DST", path=dpath)
        if indexes:
            dpath = os.path.join(dpath, indexes[0])
        else:
            files = [n for n in names if n.endswith(".safetensors")]
            weights = [n for n in files if n in _SINGLE_OUTPUTS]
            if len(files) > 1 and len(weights) == 1:  # beside converted optimizer.pt …
                files = weights
            if len(files) != 1:
                raise ConversionError(
                    "expected one *.safetensors file or a *.safetensors.index.json here, "
                    f"found {', '.join(files[:10]) or 'none'}; give the file to verify as DST",
                    path=dpath)
            return [os.path.join(dpath, files[0])], None
    if dpath.endswith(".index.json"):
        wmap = read_index(dpath)
        directory = os.path.dirname(dpath) or "."
        files = [os.path.join(directory, s) for s in sorted(set(wmap.values()))]
        for f in files:
            if not os.path.isfile(f):
                raise ConversionError(f"the index names the shard {os.path.basename(f)!r}, "
                                      "which does not exist", path=dpath)
        return files, wmap
    return [dpath], None


