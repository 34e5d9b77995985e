"""Checkpoint directories of training frameworks, both ways: each pickle converted to an
inert file beside it (``optimizer.pt`` -> ``optimizer.safetensors``), and back: a directory
the framework's own loader reads, its pickles rebuilt with ``torch.save`` from the inert
files (so the framework's ``torch.load`` reads data torchless wrote, never the original
pickle)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import warnings
from typing import Any

from torchless.conversion import api as _api
from torchless.conversion.common import OpaqueObjectWarning, safetensors_data
from torchless.conversion.hfdir import CHECKPOINT_SUFFIXES, DirectoryReport
from torchless.conversion.hflayout import is_model_dir, read_index, resolve
from torchless.errors import ConversionError
from torchless.inert import schema as _inert
from torchless.pickle.values import Opaque
from torchless.reader import checkpoint as _checkpoint
from torchless.write import atomic as _atomic

__all__ = ["convert_dir", "missing_sources", "restore_dir", "torch_module"]


def torch_module() -> Any:
    """The torch the framework imported (torchless itself never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise ConversionError("torch is not imported: this integration runs inside a program "
                              "using its framework (import torch first)")
    return torch


def convert_dir(directory: str, *, remove_originals: bool) -> dict[str, str]:
    """Each checkpoint file of ``directory`` (top level) -> its inert ``<stem>.safetensors``
    beside it, verified (the weights of a model directory, ``pytorch_model*.bin``, as
    transformers names them: ``model*.safetensors``); with ``remove_originals`` the pickles
    (and a ``*.bin.index.json``) are then deleted. Returns {source name: output name}. An
    earlier output is replaced."""
    done: dict[str, str] = {}
    names = sorted(n for n in os.listdir(directory)
                   if n.endswith(CHECKPOINT_SUFFIXES) and not n.startswith(".")
                   and os.path.isfile(os.path.join(directory, n)))
    removed = list(names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueObjectWarning)
        if is_model_dir(directory):
            layout = resolve(directory, None)
            report = _api.convert(directory, force=True, verify=True)
            assert isinstance(report, DirectoryReport)
            for r in report.converted:
                done[os.path.basename(r.src)] = os.path.basename(r.dst)
            for source in layout.sources:
                done[os.path.basename(source)] = os.path.basename(report.dst)
            if layout.index_path is not None:
                removed.append(os.path.basename(layout.index_path))
        for name in names:
            if name not in done:
                report = _api.convert(os.path.join(directory, name), force=True, verify=True)
                done[name] = os.path.basename(report.dst)
    if remove_originals:
        for name in removed:
            os.unlink(os.path.join(directory, name))
    return done


def _source(path: str) -> tuple[str | None, bool]:
    """The file ``path`` was converted from (its ``source``: a checkpoint file name, or
    None), and whether it holds an inert tree (else it holds weights only)."""
    with safetensors_data(path) as (header, _):
        meta = header.metadata
    source = meta.get("source")
    if not source or os.path.basename(source) != source or ", " in source or (
            not source.endswith(CHECKPOINT_SUFFIXES)):
        return None, False
    return source, _inert.TREE_KEY in meta


def missing_sources(directory: str) -> list[str]:
    """The files the inert files of ``directory`` were converted from that are not beside
    them (the pickles a framework's loader would look for, deleted after conversion)."""
    missing = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith(".safetensors") and not name.startswith(".") and os.path.isfile(path):
            source, _ = _source(path)
            if source is not None and not os.path.exists(os.path.join(directory, source)):
                missing.append(source)
    return missing


_SHARD = re.compile(r"-\d+-of-\d+(?=\.bin$)")


def has_opaque(obj: Any, depth: int = 0) -> bool:
    if isinstance(obj, Opaque):
        return True
    if depth > 100:
        return False
    if isinstance(obj, dict):
        return any(has_opaque(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(has_opaque(v, depth + 1) for v in obj)
    return False


def restore_dir(src: str, dst: str) -> dict[str, str]:
    """A copy of the converted directory ``src`` at ``dst`` that the framework loads: each
    inert file becomes its source file again (``torch.save`` of what torchless reads, torch
    tensors), every other file is hard-linked (or copied). A file whose object holds inert
    records of unknown classes (``training_args.bin``) is not rebuilt: no class is ever
    instantiated from file data. Returns {output name: how}. If it fails, what it wrote is
    removed: ``dst`` if it made it, else the files it put there."""
    torch = torch_module()
    created = _atomic.make_dirs(dst)
    before = set(os.listdir(dst))
    try:
        return _restore_into(torch, src, dst)
    except BaseException:
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)
        else:
            for name in set(os.listdir(dst)) - before:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dst, name))
        raise


def _restore_into(torch: Any, src: str, dst: str) -> dict[str, str]:
    done: dict[str, str] = {}
    shards: dict[str, str] = {}     # weights file -> the .bin it was converted from
    indexes: list[str] = []
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path) or name.startswith("."):
            continue
        source, inert = _source(path) if name.endswith(".safetensors") else (None, False)
        if source is not None and not inert:
            # weights converted from pytorch_model*.bin: a Trainer saving with
            # save_safetensors=False reads that name, so it is rebuilt beside the link
            torch.save(_checkpoint.load(path, framework="pt"), os.path.join(dst, source))
            done[source] = f"rebuilt from {name}"
            shards[name] = source
        elif source is not None:
            obj = _checkpoint.load(path, framework="pt")
            if has_opaque(obj):
                done[source] = "left out (holds inert records of unknown classes)"
                continue
            torch.save(obj, os.path.join(dst, source))
            done[source] = f"rebuilt from {name}"
            continue
        if name.endswith(".safetensors.index.json"):
            indexes.append(path)
        if name.endswith(CHECKPOINT_SUFFIXES):  # a pickle left beside: never passed on
            continue
        target = os.path.join(dst, name)
        if os.path.lexists(target):
            os.unlink(target)
        try:
            os.link(os.path.realpath(path), target)
            done[name] = "linked"
        except OSError:
            shutil.copyfile(path, target)
            done[name] = "copied"
    for path in indexes:  # the .bin index beside rebuilt .bin shards
        wmap = {k: shards.get(v) for k, v in read_index(path).items()}
        if wmap and all(wmap.values()):
            first = next(iter(wmap.values()))
            assert first is not None
            name = _SHARD.sub("", first) + ".index.json"
            with open(os.path.join(dst, name), "w") as f:
                json.dump({"metadata": {}, "weight_map": wmap}, f, indent=2, sort_keys=True)
            done[name] = f"rebuilt from {os.path.basename(path)}"
    return done
