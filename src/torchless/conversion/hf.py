"""Hugging Face layouts: model directories, sharded checkpoints and ``max_shard_size``.

Conventions followed (those of transformers ``save_pretrained``, huggingface_hub
``split_torch_state_dict_into_shards`` and the safetensors ``convert.py`` script):

* a directory holding ``pytorch_model.bin`` becomes ``model.safetensors`` beside it;
  ``diffusion_pytorch_model.bin`` (diffusers) becomes ``diffusion_pytorch_model.safetensors``;
* a sharded checkpoint is found by its index, ``pytorch_model.bin.index.json`` (or another
  single ``*.bin.index.json``, or the index file given as SRC). Every shard the index's
  ``weight_map`` names becomes one output shard, renamed as the safetensors script does:
  ``.bin`` -> ``.safetensors`` and a leading ``pytorch_model`` -> ``model``, so
  ``pytorch_model-00001-of-00002.bin`` -> ``model-00001-of-00002.safetensors`` and the index
  ``pytorch_model.bin.index.json`` -> ``model.safetensors.index.json``. The tensor names the
  index lists must be exactly those its shards hold, each in the shard it names;
* ``max_shard_size`` (``"5GB"`` = 5 * 10**9 bytes, ``"1GiB"`` = 2**30, or a byte count)
  re-shards the output: tensors are taken in file order (shard by shard, then the order the
  checkpoint lists them) and a shard is closed when the next tensor would take its tensor
  bytes over the limit; a tensor larger than the limit gets a shard of its own (in file
  order: huggingface_hub puts such a shard before the one being filled). Shards are named
  ``<stem>-0000K-of-0000N.safetensors`` with ``<stem>.safetensors.index.json``; when
  everything fits in one shard, the output is the single unsharded file and no index, as in
  transformers;
* the index is ``{"metadata": {"total_parameters": P, "total_size": N}, "weight_map":
  {name: shard}}`` written as ``json.dumps(index, indent=2, sort_keys=True) + "\\n"``
  (transformers 4.57 and 5.x write these keys), with ``total_size`` the sum of the tensor
  bytes written and ``total_parameters`` the sum of their element counts (transformers
  counts the model's parameters, tied ones once: the same number unless the checkpoint
  holds persistent buffers, which torchless cannot tell from parameters). Every shard's
  ``__metadata__`` has ``format: pt`` and ``source`` (the source file name(s)); ``dedupe``
  aliases (on by default for a model directory or an index, as transformers and the
  safetensors converter write tied weights) are recorded in the shard holding the kept
  tensor and are not listed in ``weight_map``; which name of a tied weight is kept is
  transformers' choice (:mod:`.hftied`).

Every shard and the index are written (and, with ``verify``, checked) before any of them is
published, then published together (:func:`torchless.write.atomic.commit`): the shards first and
the index last, so an index never names a missing shard; with ``force``, an existing index
is moved aside before the first shard is replaced. Any failure, at any point, leaves the
directory as it was: nothing of this run, and every file it would have replaced. The
source directory's other files (``config.json`` …) are never touched; :mod:`.hfdir` brings
them, and converts its other checkpoint files, for a directory SRC.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from torchless.conversion import hftied as _hftied
from torchless.conversion.certificate import Certificate, transforms_of
from torchless.conversion.common import (
    ConversionReport,
    VerifyReport,
    cast_expected,
    cast_tensors,
    compare,
    entry_of,
    plan_names,
    safetensors_data,
    select,
    source_name,
    source_names,
    verify_unpublished,
    views_of,
    write_output,
)
from torchless.conversion.existing import claim
from torchless.conversion.hflayout import (
    SHARDS_HINT,
    Layout,
    check_index,
    is_checkpoint_dir,
    outputs,
    parse_size,
    resolve,
    split,
    stem,
)
from torchless.conversion.select import Selection
from torchless.errors import CheckpointError, ConversionError
from torchless.model.tensor import Tensor
from torchless.reader import checkpoint as _checkpoint
from torchless.reader.checkpoint import ReadOptions
from torchless.write import atomic as _atomic
from torchless.write.safetensors import Planned, plan

if TYPE_CHECKING:
    from torchless.core.dtypes import DType
    from torchless.write.cast import Cast
    from torchless.write.digest import Digests

__all__ = ["convert_layout", "verify_layout"]

@dataclass
class _Shard:
    name: str
    sources: list[int]
    tensors: dict[str, tuple[int, Tensor]]   # name -> (source index, tensor)


def convert_layout(
    spath: str,
    dst: str | None,
    *,
    key: str | None,
    force: bool,
    dedupe: bool,
    skip_unsupported: bool,
    verify: bool,
    progress: Callable[[int, int], None] | None,
    max_shard_size: int | str | None,
    read: ReadOptions,
    selection: Selection | None = None,
    cast: Cast | None = None,
    certificate: bool = False,
) -> ConversionReport:
    """Convert a model directory, an index, or one file into (sharded) safetensors;
    ``selection`` applies to all its files as one (a rename clash across shards is one); with
    ``cast``, its floating weights cast (each shard records those it holds); with
    ``certificate``, each shard holds the certificate of its tensors (:mod:`.certificate`).
    """
    started = time.monotonic()
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    layout = resolve(spath, dst)
    with contextlib.ExitStack() as stack:
        cert = None
        if certificate:
            cert = Certificate(transforms_of(key, selection, cast, dedupe=dedupe,
                                             skip_unsupported=skip_unsupported, tree=False))
            stack.callback(cert.close)
        ckpts = [stack.enter_context(read.open(p)) for p in layout.sources]
        if layout.expected is not None:
            check_index(layout, ckpts)
        tied = _hftied.tie_word_embeddings(os.path.dirname(layout.sources[0]) or ".")
        names = plan_names(ckpts, key, selection, spath) if selection else None
        parts = [_hftied.prepare(c, key, dedupe, skip_unsupported, tied, names)
                 for c in ckpts]
        cast_from: dict[str, DType] = {}  # name -> source dtype, of the tensors cast
        if cast is not None:
            for c, (written, *_) in zip(ckpts, parts, strict=True):
                cast_from.update(cast.plan(written))
                written.update(cast_tensors(c, written, cast,
                                            cert.observe if cert else None)[0])
        owner: dict[str, int] = {}
        for i, (written, _, _, aliases) in enumerate(parts):
            for name in [*written, *aliases]:
                if name in owner:
                    raise ConversionError(
                        f"the tensor {name!r} is in both {layout.sources[owner[name]]} and "
                        f"{layout.sources[i]}", path=spath, hint=SHARDS_HINT)
                owner[name] = i
        shards: list[_Shard] = []
        out_index = layout.out_index
        if limit is None:
            for i, (written, _, _, _) in enumerate(parts):
                shards.append(_Shard(layout.outputs[i], [i],
                                     {n: (i, t) for n, t in written.items()}))
        else:
            flat = [(n, i, t) for i, p in enumerate(parts) for n, t in p[0].items()]
            groups = split(flat, limit)
            count = len(groups)
            base = stem(layout.base)
            out_index = None if count == 1 else base + ".safetensors.index.json"
            for k, group in enumerate(groups):
                name = layout.base if count == 1 else (
                    f"{base}-{k + 1:05d}-of-{count:05d}.safetensors")
                used = sorted({i for _, i, _ in group}) if group else list(
                    range(len(parts)))
                shards.append(_Shard(name, used, {n: (i, t) for n, i, t in group}))
        records = None if cast is None else [cast.record(
            {n: cast_from[n] for n in s.tensors if n in cast_from}) for s in shards]
        origins = None
        if cert is not None:
            flats = [source_names(c, key, names) for c in ckpts]
            for path, c in zip(layout.sources, ckpts, strict=True):
                cert.add_source(path, c._source)
            origins = [{n: (layout.sources[i], flats[i].get(n))
                        for n, (i, _) in s.tensors.items()} for s in shards]
        return _write_all(spath, layout, ckpts, parts, shards, out_index, force=force,
                          verify=verify, progress=progress, started=started, records=records,
                          cert=cert, origins=origins)


def _write_all(spath: str, layout: Layout, ckpts: list[_checkpoint.Checkpoint],
               parts: list[tuple[dict[str, Tensor], dict[str, str], dict[str, str],
                                 dict[str, str]]],
               shards: list[_Shard], out_index: str | None, *, force: bool, verify: bool,
               progress: Callable[[int, int], None] | None,
               started: float, records: list[str] | None = None,
               cert: Certificate | None = None,
               origins: list[dict[str, tuple[str, str | None]]] | None = None
               ) -> ConversionReport:
    out_dir = layout.out_dir
    paths = [os.path.join(out_dir, s.name) for s in shards]
    index_path = os.path.join(out_dir, out_index) if out_index is not None else None
    targets = paths + ([index_path] if index_path is not None else [])
    claim(targets, [*layout.sources, *([layout.index_path] if layout.index_path else [])],
          force=force)
    aliases: dict[str, str] = {}
    for _, _, _, a in parts:
        aliases.update(a)
    planned_all: list[tuple[bytes, list[Planned]]] = []
    finals: list[Callable[[], bytes] | None] = []
    for k, shard in enumerate(shards):
        names = [source_name(layout.sources[i]) for i in shard.sources]
        metadata = {"format": "pt", "source": ", ".join(names)}
        if records is not None:
            from torchless.write.cast import METADATA_KEY

            metadata[METADATA_KEY] = records[k]
        for i in shard.sources:
            for removed, kept in parts[i][3].items():
                if kept in shard.tensors:
                    metadata[removed] = kept
        tensors = {n: t for n, (_, t) in shard.tensors.items()}
        finals.append(None)
        if cert is not None and origins is not None:
            finals[-1] = cert.stamp(tensors, metadata, origins[k])
        try:
            planned_all.append(plan(tensors, metadata))
        except CheckpointError as e:
            raise e.add_context(path=spath) from None
    total = sum(len(h) + sum(p.tensor.nbytes for p in pl) for h, pl in planned_all)
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError("the output directory is a file (for a model directory, -o "
                              "names a directory)", path=out_dir)
    created = _atomic.make_dirs(out_dir)
    try:
        nbytes, verified, outputs = _write_shards(spath, shards, paths, index_path, parts,
                                                  ckpts, planned_all, total, force=force,
                                                  verify=verify, progress=progress,
                                                  finals=finals,
                                                  digests=cert.digests if cert else None)
    except BaseException:
        _atomic.remove_dirs(created)  # a directory this run made, if nothing is in it
        raise
    done_files = [o.dst for o in outputs]
    skipped = sorted(n for p in parts for n in p[2])
    return ConversionReport(spath, index_path or paths[0],
                            sum(len(pl) for _, pl in planned_all), nbytes, tuple(skipped),
                            MappingProxyType(aliases), time.monotonic() - started, verified,
                            tuple(done_files))


def _write_shards(spath: str, shards: list[_Shard], paths: list[str], index_path: str | None,
                  parts: list[tuple[dict[str, Tensor], dict[str, str], dict[str, str],
                                    dict[str, str]]],
                  ckpts: list[_checkpoint.Checkpoint],
                  planned_all: list[tuple[bytes, list[Planned]]], total: int, *,
                  force: bool, verify: bool, progress: Callable[[int, int], None] | None,
                  finals: list[Callable[[], bytes] | None] | None = None,
                  digests: Digests | None = None
                  ) -> tuple[int, VerifyReport | None, list[_atomic.Output]]:
    """Write, check and publish every shard and the index; (bytes, verification, outputs)."""
    nbytes = 0
    verified = None
    with contextlib.ExitStack() as stack:
        outputs = []
        counts = (0, sum(len(pl) for _, pl in planned_all))  # tensors written, in all
        for k, (shard, path, (header, planned)) in enumerate(zip(shards, paths, planned_all,
                                                                 strict=True)):
            out = stack.enter_context(_atomic.Output(path, force=force))
            outputs.append(out)
            nbytes += _write_shard(shard, out, header, planned, ckpts, progress, nbytes, total,
                                   counts, digests, finals[k] if finals else None)
            counts = (counts[0] + len(planned), counts[1])
        if verify:  # the files are checked before any is published
            verified = verify_unpublished(spath, outputs, lambda readable: _verify_shards(
                spath, index_path or paths[0], shards, readable, paths, parts))
            if not verified.ok:
                raise ConversionError("verification failed; nothing was written",
                                      path=index_path or paths[0])
        if index_path is not None:
            weight_map = {n: s.name for s in shards for n in s.tensors}
            written = [p.tensor for _, pl in planned_all for p in pl]
            doc = {"metadata": {"total_parameters": sum(t.numel for t in written),
                                "total_size": sum(t.nbytes for t in written)},
                   "weight_map": weight_map}
            outputs.append(_index_output(stack, index_path, (json.dumps(
                doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), force))
        _atomic.commit(outputs, force=force)
    return nbytes, verified, outputs


def _write_shard(shard: _Shard, out: _atomic.Output, header: bytes, planned: list[Planned],
                 ckpts: list[_checkpoint.Checkpoint],
                 progress: Callable[[int, int], None] | None, before: int,
                 total: int, counts: tuple[int, int], digests: Digests | None = None,
                 final_header: Callable[[], bytes] | None = None) -> int:
    # the kernel copies from one source file: the one giving this shard the most bytes
    weight = dict.fromkeys(shard.sources, 0)
    for i, t in shard.tensors.values():
        weight[i] += t.nbytes
    main = max(shard.sources, key=lambda i: weight[i])
    return write_output(ckpts[main], out, header, planned, progress=progress,
                        before=before, total=total, tensors_before=counts[0],
                        tensors_total=counts[1], digests=digests, final_header=final_header)


def _index_output(stack: contextlib.ExitStack, path: str, data: bytes,
                  force: bool) -> _atomic.Output:
    """The index, written (not yet published) into an output ``stack`` discards on error."""
    out = stack.enter_context(_atomic.Output(path, force=force))
    out.write(data)
    out.finish()
    return out


def _verify_shards(spath: str, dpath: str, shards: list[_Shard], readable: list[str],
                   paths: list[str],
                   parts: list[tuple[dict[str, Tensor], dict[str, str], dict[str, str],
                                     dict[str, str]]]) -> VerifyReport:
    """Each shard (read through ``readable``, named by ``paths``) against its tensors."""
    matched: list[str] = []
    mismatched: dict[str, str] = {}
    missing: list[str] = []
    extra: list[str] = []
    aliases: dict[str, str] = {}
    for shard, source, path in zip(shards, readable, paths, strict=True):
        expected: dict[str, Tensor] = {n: t for n, (_, t) in shard.tensors.items()}
        for i in shard.sources:
            written, _, _, removed = parts[i]
            for name, kept in removed.items():
                if kept in shard.tensors:
                    expected[name] = written[kept]
        with safetensors_data(source) as (header, data):
            m, mm, miss, ext, _, al = compare(expected, [], header, data, True)
        matched += m
        mismatched.update(mm)
        missing += miss
        extra += [f"{os.path.basename(path)}: {n}" for n in ext]
        aliases.update(al)
    skipped = sorted(n for p in parts for n in p[2])
    return VerifyReport(spath, dpath, tuple(matched), MappingProxyType(mismatched),
                        tuple(missing), tuple(extra), tuple(skipped),
                        MappingProxyType(aliases))


# ---- verifying a directory, an index or a set of shards --------------------------------------


def verify_layout(spath: str, dpath: str, *, key: str | None, skip_unsupported: bool,
                  read: ReadOptions, selection: Selection | None = None,
                  cast: Cast | None = None) -> VerifyReport:
    """Compare a checkpoint, a model directory or an index of shards with one safetensors
    file, a directory holding one, or a safetensors index and its shards.

    Every tensor of the source must be in exactly one output file (directly, or as a
    ``dedupe`` alias in that file's ``__metadata__``), where the output index says it is."""

    sources = resolve(spath, None).sources if ((
        os.path.isdir(spath) and not is_checkpoint_dir(spath)) or spath.endswith(
            ".index.json")) else [spath]
    files, wmap = outputs(dpath)
    matched: list[str] = []
    mismatched: dict[str, str] = {}
    missing: list[str] = []
    extra: list[str] = []
    skipped: list[str] = []
    aliases: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        tensors: dict[str, Tensor] = {}
        unsupported: list[str] = []
        ckpts = [stack.enter_context(read.open(path)) for path in sources]
        names = plan_names(ckpts, key, selection, spath) if selection else None
        for path, ckpt in zip(sources, ckpts, strict=True):
            got, bad = select(ckpt, key, names)
            for name in [*got, *bad]:
                if name in tensors or name in unsupported:
                    raise ConversionError(f"the tensor {name!r} is in more than one source "
                                          "file", path=path, hint=SHARDS_HINT)
            tensors.update(got)
            unsupported += list(bad)
        placed: dict[str, str] = {}
        # a name the index places in a shard is that shard's entry, never a same-view
        # alias of a tensor another shard holds
        views = {n: g for n, g in views_of(tensors).items() if wmap is None or n not in wmap}
        for path in files:
            with safetensors_data(path, read.limits) as (header, data):
                mine = {n: t for n, t in tensors.items() if n not in placed and entry_of(
                    n, header, views) is not None}
                record: dict[str, str] = {}
                expected = cast_expected(mine, cast, header, record)
                m, mm, _, ext, _, al = compare(expected, [], header, data, skip_unsupported)
                mm.update({f"{os.path.basename(path)}: {k}": v for k, v in record.items()})
            base = os.path.basename(path)
            for name in mine:
                placed[name] = base
            matched += m
            mismatched.update(mm)
            aliases.update(al)
            extra += [n if len(files) == 1 else f"{base}: {n}" for n in ext
                      if n not in mine]
        for name in [*unsupported, *(n for n in tensors if n not in placed)]:
            t = tensors.get(name)
            if (t is None or t.dtype.safetensors is None) and skip_unsupported:
                skipped.append(name)
            else:
                missing.append(name)
        if wmap is not None:
            for name, base in placed.items():
                target = aliases.get(name, name)
                if wmap.get(target, base) != base and name not in mismatched:
                    mismatched[name] = f"in {base}, the index says {wmap[target]}"
                    matched.remove(name)
            listed = [n for n in wmap if n not in tensors and n not in aliases.values()]
            extra += [f"index: {n}" for n in listed if not any(
                e.endswith(f": {n}") or e == n for e in extra)]
    return VerifyReport(spath, dpath, tuple(matched), MappingProxyType(mismatched),
                        tuple(missing), tuple(extra), tuple(skipped),
                        MappingProxyType(aliases))
