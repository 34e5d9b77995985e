"""Checking an output against its certificate (:mod:`.certificate`): ``verify --certificate
OUT [SRC]``.

Without SRC, every tensor of every output file (a model directory's shards through its
index) is hashed and compared with the ``out`` digest its file's certificate records; the
names must be those the certificate lists, and a shard's those its index places in it.

With SRC, also: each source file the certificate names is found in SRC (the file itself,
or by name among a model directory's or an index's files) and must have the recorded size
and sha256 (a URL: size and the server's ETag and Last-Modified as it gives them now); the
recorded transforms are applied to SRC again (the names it gives must be
the recorded ``from`` names; a pattern recorded as a function cannot be, and the recorded
names are then used as they are), every source tensor is hashed (``src``), a cast tensor is
cast again and hashed (``out``), and an array of the stored object tree is encoded again
from SRC's object. A source tensor the transforms name that no output holds is missing.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from torchless.conversion.certificate import (
    METADATA_KEY,
    parse,
    recorded_patterns,
    replayable,
    sha256_file,
)
from torchless.conversion.common import (
    VerifyReport,
    plan_names,
    safetensors_data,
    select,
    source_names,
    tree_of,
)
from torchless.conversion.hflayout import is_checkpoint_dir, outputs, resolve
from torchless.conversion.select import Selection
from torchless.core.limits import Limits
from torchless.errors import ConversionError
from torchless.inert import schema as _inert
from torchless.io.remote import RemoteSource, is_remote
from torchless.model.chunks import chunks
from torchless.model.tensor import Tensor
from torchless.reader import checkpoint as _checkpoint
from torchless.reader.checkpoint import ReadOptions
from torchless.write.digest import HASH_BLOCK_BYTES, digest_of

__all__ = ["verify_certificate"]

_CAST_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}


@dataclass
class _Outcome:
    ok: list[str] = field(default_factory=list)
    mismatched: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class _Shard:
    path: str
    label: str  # "name: " when there are several files, else ""
    doc: dict[str, Any]
    metadata: dict[str, str]
    entries: dict[str, tuple[str, tuple[int, ...], int, int]]


def _blocks(view: memoryview) -> Iterator[memoryview]:
    for pos in range(0, len(view), HASH_BLOCK_BYTES):
        yield view[pos:pos + HASH_BLOCK_BYTES]


def verify_certificate(dst: str | os.PathLike[str], src: str | os.PathLike[str] | None = None,
                       *, limits: Limits | None = None, strict: bool = False,
                       allow_globals: Iterable[str] = (),
                       verify_crc: bool = False) -> VerifyReport:
    """Check the safetensors output DST (a file, a directory or a
    ``*.safetensors.index.json`` with its shards) against the certificate each file holds;
    given SRC (what was converted), re-derive every digest from it (module docstring).

    The report is :func:`verify`'s: ``matched`` the tensors whose every digest agrees,
    ``mismatched`` name -> what differs (a source file's size or sha256 under
    ``(source NAME)``), ``missing`` the tensors a certificate lists that DST lacks (and,
    with SRC, source tensors no output holds), ``extra`` DST's tensors no certificate
    lists. ``strict``, ``allow_globals``, ``verify_crc`` and ``limits`` are for reading
    SRC, as for :func:`torchless.open`.

    Raises:
        FormatError: a file of DST holds no certificate, or a malformed one.
        CheckpointError: DST or SRC cannot be read."""
    dpath = os.fspath(dst)
    spath = None if src is None else os.fspath(src)
    read = ReadOptions(limits, strict, tuple(allow_globals), verify_crc)
    files, wmap = outputs(dpath)
    shards: list[_Shard] = []
    result = _Outcome()
    for path in files:
        base = os.path.basename(path)
        label = f"{base}: " if len(files) > 1 else ""
        with safetensors_data(path, limits) as (header, data):
            doc = parse(header.metadata, path, (limits or Limits()).max_depth)
            records = doc["tensors"]
            for name, (_, _, begin, end) in header.entries.items():
                rec = records.get(name)
                if rec is None:
                    result.extra.append(label + name)
                elif digest_of(_blocks(data[begin:end])) != rec["out"]:
                    result.mismatched[label + name] = "the bytes differ from the " \
                                                      "certificate's digest"
                elif wmap is not None and wmap.get(name) != base:
                    result.mismatched[label + name] = f"the index places it in " \
                                                      f"{wmap.get(name)}"
                else:
                    result.ok.append(label + name)
            result.missing += [label + n for n in records if n not in header.entries]
            shards.append(_Shard(path, label, doc, dict(header.metadata),
                                 dict(header.entries)))
    if wmap is not None:
        held = {n for s in shards for n in s.entries}
        result.missing += [f"index: {n}" for n in wmap if n not in held]
    if spath is not None:
        _check_source(spath, shards, read, result)
    matched = tuple(n for n in result.ok if n not in result.mismatched)
    return VerifyReport(spath if spath is not None else "(certificate)", dpath, matched,
                        MappingProxyType(result.mismatched), tuple(result.missing),
                        tuple(result.extra), tuple(result.skipped))


def _source_files(spath: str) -> list[str]:
    if is_remote(spath) or not ((os.path.isdir(spath) and not is_checkpoint_dir(spath))
                                or spath.endswith(".index.json")):
        return [spath]
    return list(resolve(spath, None).sources)


def _base(rec: dict[str, Any]) -> str:
    where = rec.get("path") or rec.get("url") or ""
    if is_remote(where):
        where = urllib.parse.urlparse(where).path
    return os.path.basename(str(where).rstrip("/" + os.sep))


def _match_sources(spath: str, shards: list[_Shard], result: _Outcome
                   ) -> dict[tuple[int, int], str]:
    """(shard, source index in its certificate) -> the file of SRC that is that source, its
    size and sha256 checked."""
    found = _source_files(spath)
    by_base = {os.path.basename(p.rstrip("/" + os.sep)): p for p in found}
    checked: dict[str, bool] = {}
    out: dict[tuple[int, int], str] = {}
    for k, shard in enumerate(shards):
        for i, rec in enumerate(shard.doc["sources"]):
            if not isinstance(rec, dict):
                continue
            base = _base(rec)
            path = found[0] if len(found) == 1 and len(shard.doc["sources"]) == 1 else (
                by_base.get(base))
            if path is None:
                result.mismatched[f"(source {base})"] = "not found in SRC"
                continue
            out[k, i] = path
            if path not in checked:
                checked[path] = True
                why = _file_differs(path, rec)
                if why:
                    result.mismatched[f"(source {base})"] = why
    return out


def _file_differs(path: str, rec: dict[str, Any]) -> str | None:
    """Why the file (or directory) at ``path`` is not the recorded source, or None."""
    if is_remote(path):
        return None  # its version is the server's word (etag): nothing to read again
    if "files" in rec:
        for f in rec["files"]:
            why = _file_differs(os.path.join(path, *str(f.get("name", "")).split("/")), f)
            if why:
                return f"{f.get('name')}: {why}"
        return None
    try:
        size = os.stat(path).st_size
    except OSError as e:
        return f"cannot be read: {e.strerror}"
    if size != rec.get("size"):
        return f"size {size} != {rec.get('size')} recorded"
    if rec.get("sha256") is not None and sha256_file(path) != rec["sha256"]:
        return "sha256 differs: not the file that was converted"
    return None


def _shard_source(shards: list[_Shard], k: int, i: int) -> dict[str, Any]:
    rec: dict[str, Any] = shards[k].doc["sources"][i]
    return rec


def _version_differs(source: Any, rec: dict[str, Any]) -> str | None:
    """Why a remote source, as its server gives it now, is not the recorded one."""
    if not isinstance(source, RemoteSource):  # pragma: no cover - a bug of ours
        return "not read as a remote file"
    if source.size != rec.get("size"):
        return f"size {source.size} != {rec.get('size')} recorded"
    now = source.validators
    for name in ("etag", "last_modified"):
        if rec.get(name) is not None and now.get(name) is not None and now[name] != rec[name]:
            return f"the server's {name} is {now[name]!r}, {rec[name]!r} recorded"
    return None


def _transforms(doc: dict[str, Any]) -> tuple[str | None, Selection | None, Any, bool]:
    t = doc["transforms"]
    selection = Selection.of(recorded_patterns(t.get("include", ())),
                             recorded_patterns(t.get("exclude", ())),
                             recorded_patterns(t.get("rename", ())),
                             t.get("strip_prefix"), bool(t.get("ema")))
    cast = None
    if t.get("dtype") is not None:
        from torchless.write.cast import Cast

        if t["dtype"] not in _CAST_NAMES:
            raise ConversionError(f"the certificate records a cast to {t['dtype']!r}, "
                                  "which torchless does not make")
        cast = Cast.of(_CAST_NAMES[t["dtype"]], tuple(t.get("dtype_filter", ())))
    return t.get("key"), selection, cast, replayable(t)


def _check_source(spath: str, shards: list[_Shard], read: ReadOptions,
                  result: _Outcome) -> None:
    paths = _match_sources(spath, shards, result)
    key, selection, cast, replay = _transforms(shards[0].doc)
    tree = any(_inert.TREE_KEY in s.metadata for s in shards)
    opened: dict[str, _checkpoint.Checkpoint] = {}
    with contextlib.ExitStack() as stack:
        for path in dict.fromkeys(paths.values()):
            opened[path] = stack.enter_context(read.open(path, "record" if tree
                                                         else "state_dict"))
        for (k, i), path in paths.items():
            if is_remote(path):
                why = _version_differs(opened[path]._source, _shard_source(shards, k, i))
                if why:
                    result.mismatched[f"(source {_base(_shard_source(shards, k, i))})"] = why
        ckpts = list(opened.values())
        # output name -> (source file, source flat name), as the transforms give them
        derived: dict[str, tuple[str, str]] = {}
        if replay and ckpts:
            if selection is not None:
                names = plan_names(ckpts, key, selection, spath)
                for out, name in names.items():
                    owner = next((p for p, c in opened.items()
                                  if name in c.tensors or name in c.unsupported), None)
                    if owner is not None:
                        derived[out] = (owner, name)
            else:
                for p, c in opened.items():
                    derived.update({o: (p, n) for o, n in source_names(c, key).items()})
        covered: set[str] = set()
        for k, shard in enumerate(shards):
            covered |= _check_shard(k, shard, paths, opened, derived, replay, key, cast,
                                    read.limits, result)
        skip = bool(shards[0].doc["transforms"].get("skip_unsupported"))
        for out, (p, name) in derived.items():
            if out in covered:
                continue
            t = opened[p].tensors.get(name)
            if t is None or t.dtype.safetensors is None:
                (result.skipped if skip else result.missing).append(out)
            else:
                result.missing.append(out)


def _check_shard(k: int, shard: _Shard, paths: dict[tuple[int, int], str],
                 opened: dict[str, _checkpoint.Checkpoint],
                 derived: dict[str, tuple[str, str]], replay: bool, key: str | None,
                 cast: Any, limits: Limits | None, result: _Outcome) -> set[str]:
    """One shard's tensors against SRC; the output names it accounts for."""
    label = shard.label
    records = shard.doc["tensors"]
    covered = set(records)
    # dedupe aliases: the removed name is the kept tensor's
    covered |= {n for n, v in shard.metadata.items() if v in shard.entries}
    trees = {n: r for n, r in records.items() if r.get("tree")}
    for name, rec in records.items():
        if rec.get("tree"):
            continue
        index = rec.get("file", 0)
        path = paths.get((k, index))
        if path is None:
            if index >= len(shard.doc["sources"]):
                result.mismatched[label + name] = f"its source {index} is not recorded"
            continue  # else its source file is reported, not found in SRC
        want = str(rec.get("from", name))
        if replay and derived.get(name) != (path, want):
            result.mismatched[label + name] = "the recorded transforms do not give this " \
                                              f"name from the source's {want!r}"
            continue
        t = opened[path].tensors.get(want)
        if t is None:
            result.mismatched[label + name] = f"the source holds no tensor {want!r}"
            continue
        if digest_of(chunks(t)) != rec["src"]:
            result.mismatched[label + name] = "the source's bytes differ from the " \
                                              "certificate's digest"
            continue
        expected = rec["src"]
        if cast is not None and cast.plan({name: t}):
            from torchless.write.cast import cast_tensor

            expected = digest_of(chunks(cast_tensor(t, cast.dtype)))
        if expected != rec["out"]:
            result.mismatched[label + name] = "the source, cast as recorded, differs " \
                                              "from the certificate's output digest"
    if trees:
        _check_tree(shard, trees, opened, key, cast, limits, result)
    return covered


def _check_tree(shard: _Shard, trees: dict[str, Any],
                opened: dict[str, _checkpoint.Checkpoint], key: str | None, cast: Any,
                limits: Limits | None, result: _Outcome) -> None:
    """The arrays of the stored object tree, encoded again from SRC's object."""
    from torchless.write.safetensors import SafetensorsHeader

    ckpt = next(iter(opened.values()))
    tensors, _ = select(ckpt, key)
    aliases = {n: shard.metadata[n] for n in tensors if shard.metadata.get(n) in shard.entries}
    written: dict[str, Tensor] = dict(tensors)
    if cast is not None:
        castable = {n: t for n, t in tensors.items() if t.dtype.safetensors is not None}
        written.update(cast.apply(castable)[0])
    header = SafetensorsHeader(shard.metadata, shard.entries, 0, b"")
    encoder, text = tree_of(ckpt, key, tensors, header, aliases, limits, written,
                            frozenset({METADATA_KEY}))
    if text != shard.metadata.get(_inert.TREE_KEY):
        result.mismatched[shard.label + "(object tree)"] = "the stored tree differs from " \
                                                           "the source's object"
    for name, rec in trees.items():
        t = encoder.tensors.get(name)
        if t is None:
            result.mismatched[shard.label + name] = "the source's object has no such array"
        elif digest_of(chunks(t)) != rec["src"]:
            result.mismatched[shard.label + name] = "the source's bytes differ from the " \
                                                    "certificate's digest"
