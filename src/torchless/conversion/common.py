"""What converting one checkpoint and converting a model directory share: the reports,
choosing and naming the tensors, writing and comparing a safetensors file (the entry points,
``convert`` and ``verify``, are :mod:`.api`; directories are :mod:`.hf`).

Names are the flat names of :attr:`Checkpoint.tensors`. Shared storage is written once per
name by default. With ``dedupe=True``, names that are the *same* view (one storage, offset,
shape, stride and dtype) keep one copy under the first name in sorted order, and every other
name is recorded in ``__metadata__`` as ``removed name -> kept name``: the convention of
``safetensors.torch.save_model`` / ``_remove_duplicate_names`` (and the Hugging Face convert
script), which ``safetensors.torch.load_model`` reads back. A name that cannot be recorded that
way (``format``, ``source``) is written with its own bytes: no name is ever dropped silently.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torchless.conversion.certificate import METADATA_KEY as CERT_KEY
from torchless.conversion.ema import ema_names
from torchless.conversion.select import Selection, Shape
from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    ConversionError,
)
from torchless.inert import encode as _inert_write
from torchless.inert import schema as _inert
from torchless.inert.schema import OpaqueObjectWarning
from torchless.io.source import Source
from torchless.model import graph as _graph
from torchless.model.chunks import chunks
from torchless.model.tensor import Tensor
from torchless.model.walk import children
from torchless.reader import checkpoint as _checkpoint
from torchless.write import atomic as _atomic
from torchless.write.digest import Digests
from torchless.write.safetensors import (
    Planned,
    Progress,
    SafetensorsHeader,
    read_header,
    write_into,
)

if TYPE_CHECKING:
    from torchless.write.cast import Cast

__all__ = ["ConversionReport", "OpaqueObjectWarning", "TensorProgress", "VerifyReport",
           "cast_expected", "cast_tensors", "compare", "compare_tree", "default_dst",
           "entry_of", "plan_names", "prepare", "safetensors_data", "same_views", "select",
           "source_name", "source_names", "store_tree", "summary", "tree_of",
           "verify_unpublished", "views_of",
           "write_output"]


@dataclass(frozen=True)
class VerifyReport:
    """Every tensor of SRC compared with DST by dtype, shape and bytes.

    ``matched``: names equal in both. ``mismatched``: name -> what differs. ``missing``:
    names of SRC absent from DST. ``extra``: names only in DST. ``skipped``: SRC names with no
    safetensors dtype, not expected in DST. ``aliases``: SRC names found under another name
    (removed -> kept): one DST's ``__metadata__`` records, or another name of SRC that is
    the same view of one storage (a tied weight transformers saved once)."""

    src: str
    dst: str
    matched: tuple[str, ...]
    mismatched: Mapping[str, str]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing or self.extra)


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert` wrote."""

    src: str
    dst: str
    tensors: int
    bytes: int
    skipped: tuple[str, ...]
    aliases: Mapping[str, str]
    seconds: float
    verified: VerifyReport | None = None
    #: every file written, in the order written (shards first, an index last)
    files: tuple[str, ...] = ()
    #: class paths of objects kept as inert records in the stored object tree
    opaque: tuple[str, ...] = ()
    #: ``skip_existing``: DST was there and verifies against SRC (``verified``); it was
    #: kept as it was and nothing written (``files`` empty)
    existing: bool = False


def default_dst(src: str) -> str:
    """SRC with its suffix replaced by ``.safetensors`` (appended when it has none); for a
    URL, that name in the current directory."""
    root, ext = os.path.splitext(src)
    return (root if ext else src) + ".safetensors"


def source_name(path: str) -> str:
    """The file name recorded as ``source``: a name that is not UTF-8 (its bytes are
    surrogate escapes in ``path``, which JSON text cannot hold) with U+FFFD for them."""
    return os.fsencode(os.path.basename(path)).decode("utf-8", "replace")


def select(ckpt: _checkpoint.Checkpoint, key: str | None,
           names: Mapping[str, str] | None = None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (and unsupported tensors) under ``key``, named relative to it; or, given
    ``names`` (output name -> source name, from :func:`plan_names`, ``key`` applied there),
    the source's tensors among them under their output names."""
    if names is None and key is None:
        return dict(ckpt.tensors), dict(ckpt.unsupported)
    names = source_names(ckpt, key, names)
    return ({n: ckpt.tensors[s] for n, s in names.items() if s in ckpt.tensors},
            {n: ckpt.unsupported[s] for n, s in names.items() if s in ckpt.unsupported})


def source_names(ckpt: _checkpoint.Checkpoint, key: str | None,
                 names: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """Output name -> source flat name, as :func:`select` names the tensors."""
    if names is not None:
        return names
    every = {n: n for n in [*ckpt.tensors, *ckpt.unsupported]}
    return every if key is None else _under_key(ckpt, every, key)


def plan_names(ckpts: Sequence[_checkpoint.Checkpoint], key: str | None, selection: Selection,
         path: str) -> dict[str, str]:
    """Output name -> source name for the tensors of ``ckpts`` (the files of one model,
    their names distinct) with ``selection`` applied (:mod:`.select`: EMA, then ``key``,
    then the filters and renames), every refusal raised before an output is opened."""
    shapes: dict[str, Shape] = {}
    for c in ckpts:
        shapes.update({n: t.shape for n, t in c.tensors.items()})
        shapes.update(dict.fromkeys(c.unsupported))
    names = ema_names(shapes, path) if selection.ema else {n: n for n in shapes}
    if key is not None:
        names = _under_key(ckpts[0], names, key)
    return selection.apply(names, path)


def _under_key(ckpt: _checkpoint.Checkpoint, names: Mapping[str, str],
               key: str) -> dict[str, str]:
    """``names`` (name -> source) under ``key``, named relative to it."""
    prefix = key + "."
    out: dict[str, str] = {}
    for name, source in names.items():
        if name == key:
            out[key.rsplit(".", 1)[-1]] = source
        elif name.startswith(prefix):
            out[name[len(prefix):]] = source
    if not out:
        keys = [n for n, _ in children(ckpt.tree) if n] or sorted(
            {n.split(".", 1)[0] for n in ckpt.tensors})
        shown = ", ".join(repr(k) for k in keys[:50]) + (" …" if len(keys) > 50 else "")
        raise ConversionError(f"no tensors under key {key!r}; the top-level keys are: "
                              f"{shown or '(none)'}", path=ckpt.path,
                              hint="pass one of those keys (dotted for deeper ones: "
                                   "state_dict.encoder), or no key; `torchless inspect "
                                   "FILE` lists every tensor name")
    return out


def same_views(tensors: Mapping[str, Tensor]) -> list[list[str]]:
    """The groups (each sorted, of two names or more) of names that are the very same view
    of one storage: offset, shape, stride and dtype alike."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in tensors.items():
        ident = (id(t.storage), t.storage_offset, t.shape, t.stride, t.dtype.name)
        groups.setdefault(ident, []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def _aliases(tensors: dict[str, Tensor], reserved: set[str]) -> dict[str, str]:
    """removed name -> kept name, for names that are the very same view of one storage."""
    out: dict[str, str] = {}
    for kept, *rest in same_views(tensors):
        for name in rest:
            if name not in reserved:
                out[name] = kept
    return out


def entry_of(name: str, header: SafetensorsHeader,
             views: Mapping[str, list[str]]) -> str | None:
    """The entry of ``header`` holding SRC's tensor ``name``: its own, the one
    ``__metadata__`` records it as an alias of, or that of another name of SRC that is the
    same view (``views``: name -> its group of :func:`same_views`). The last is how
    transformers' ``save_pretrained`` and ``safetensors.torch.save_model`` write a tied
    weight: once, the other names dropped (``lm_head.weight`` of GPT-2) with no record."""
    if name in header.entries:
        return name
    recorded = header.metadata.get(name)
    if recorded in header.entries:
        return recorded
    return next((n for n in views.get(name, ()) if n != name and n in header.entries), None)


def views_of(tensors: Mapping[str, Tensor]) -> dict[str, list[str]]:
    """name -> its group of :func:`same_views`, for the names that have one."""
    return {n: group for group in same_views(tensors) for n in group}


def _file_offset(source: Source, path: str) -> tuple[int | None, Callable[[Tensor],
                                                                          int | None]]:
    """A descriptor of the very file ``source`` maps, and where a tensor's bytes lie in it."""
    if source.remote or not source.size:
        return None, lambda t: None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None, lambda t: None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != source.identity or st.st_size != source.size:
        os.close(fd)
        return None, lambda t: None

    def offset(t: Tensor) -> int | None:
        buf = t.storage.buffer()
        known = t.storage.file_offset(source)
        if known is not None:
            return known
        return source.offset_of(buf) if isinstance(buf, memoryview) else None

    return fd, offset


def prepare(ckpt: _checkpoint.Checkpoint, key: str | None, dedupe: bool,
            skip_unsupported: bool, names: Mapping[str, str] | None = None,
            cast: Cast | None = None,
            observe: Callable[[str], Callable[[memoryview], None]] | None = None
            ) -> tuple[dict[str, Tensor], dict[str, str], dict[str, str], dict[str, str]]:
    """What one checkpoint contributes: (tensors to write, ``__metadata__``, refused name ->
    why, removed alias -> kept name); ``names`` as for :func:`select`. With ``cast``, the
    floating tensors it chooses are written cast (streamed) and ``__metadata__`` records
    them (``observe`` as for :meth:`Cast.apply`)."""
    spath = ckpt.path
    tensors, unsupported = select(ckpt, key, names)
    bad = {n: f"torch.{t.dtype.name}" for n, t in tensors.items()
           if t.dtype.safetensors is None}
    bad.update({n: f"{kind} tensor" for n, kind in unsupported.items()})
    if bad and not skip_unsupported:
        listed = ", ".join(f"{n} ({why})" for n, why in list(bad.items())[:20])
        more = f" and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise ConversionError(
            f"safetensors cannot hold {len(bad)} tensor(s): {listed}{more} "
            "(skip them with skip_unsupported=True / --skip-unsupported)", path=spath,
            hint="add --skip-unsupported (skip_unsupported=True) to write the other tensors; "
                 "the report lists what was left out")
    tensors = {n: t for n, t in tensors.items() if n not in bad}
    metadata = {"format": "pt", "source": source_name(spath)}
    aliases = _aliases(tensors, {*metadata, _inert.FORMAT_KEY, _inert.TREE_KEY}
                       ) if dedupe else {}
    for removed, kept in aliases.items():
        metadata[removed] = kept
    written = {n: t for n, t in tensors.items() if n not in aliases}
    if cast is not None:
        from torchless.write.cast import METADATA_KEY

        written, metadata[METADATA_KEY] = cast_tensors(ckpt, written, cast, observe)
    return written, metadata, bad, aliases


def cast_tensors(ckpt: _checkpoint.Checkpoint, tensors: dict[str, Tensor], cast: Cast,
                 observe: Callable[[str], Callable[[memoryview], None]] | None = None
                 ) -> tuple[dict[str, Tensor], str]:
    """``cast.apply`` to tensors of ``ckpt``: the tensors, some cast, and the record."""
    source = ckpt._source  # a file's map hands back its pages behind each block cast
    return cast.apply(tensors, release=source.release_view if isinstance(source, Source)
                      else None, observe=observe)


def cast_expected(tensors: dict[str, Tensor], cast: Cast | None, header: SafetensorsHeader,
                  mismatched: dict[str, str]) -> dict[str, Tensor]:
    """What convert with ``cast`` writes for ``tensors`` (for :func:`compare`); a cast
    record in DST's ``__metadata__`` that differs from the one convert writes (of the
    entries DST holds) is recorded in ``mismatched``."""
    from torchless.write.cast import METADATA_KEY

    if cast is None:
        if METADATA_KEY in header.metadata:
            mismatched["(cast record)"] = "DST records a cast (__metadata__[" \
                f"{METADATA_KEY!r}]): compare with that cast (--dtype, dtype=)"
        return tensors

    castable = {n: t for n, t in tensors.items() if t.dtype.safetensors is not None}
    expected, _ = cast.apply(castable)
    held = cast.plan({n: t for n, t in castable.items() if n in header.entries})
    if header.metadata.get(METADATA_KEY) != cast.record(held):
        mismatched["(cast record)"] = f"__metadata__[{METADATA_KEY!r}] is not the record of " \
                                      "this cast"
    return {**tensors, **expected}


def verify_unpublished(spath: str, outputs: list[_atomic.Output],
                       check: Callable[[list[str]], VerifyReport]) -> VerifyReport:
    """``check`` run on the files written but not yet published (through paths that open
    them), its report and errors naming the outputs' own paths."""
    readable = {o.path: o.dst for o in outputs}
    try:
        report = check(list(readable))
    except CheckpointError as e:
        if e.path in readable:
            e.path = readable[e.path]
        raise
    return dataclasses.replace(report, dst=readable.get(report.dst, report.dst))


def _tree_encoder(ckpt: _checkpoint.Checkpoint, key: str | None,
                  tensors: Mapping[str, Tensor], bad: Mapping[str, str],
                  aliases: Mapping[str, str], reserved: set[str],
                  limits: Limits | None, written: Mapping[str, Tensor]
                  ) -> tuple[_inert_write.Encoder, str]:
    """The encoder and tree text of SRC's object (or the subtree under ``key``), its tensors
    named by their entries (aliases by the kept name) with the dtypes of ``written``, as
    convert writes them."""
    root = ckpt.tree
    if key is not None:
        root = _graph.find(ckpt.tree, key)
        if root is _graph.MISSING:  # pragma: no cover - select found tensors under it
            raise ConversionError(f"no value under key {key!r}", path=ckpt.path)
    names: dict[int, str] = {}
    skipped: dict[int, str] = {}
    dtypes: dict[int, DType] = {}
    for name, t in tensors.items():
        if name in bad:
            skipped.setdefault(id(t), bad[name])
        else:
            entry = names.setdefault(id(t), aliases.get(name, name))
            out = written.get(entry)
            if out is not None and out.dtype != t.dtype:
                dtypes[id(t)] = out.dtype
    encoder = _inert_write.Encoder(limits=limits, names=names, skipped=skipped,
                                   reserved={*tensors, *reserved}, records=False,
                                   dtypes=dtypes)
    try:
        return encoder, encoder.encode(root)
    except CheckpointError as e:
        raise e.add_context(path=ckpt.path) from None


def store_tree(ckpt: _checkpoint.Checkpoint, key: str | None, written: dict[str, Tensor],
                bad: dict[str, str], aliases: dict[str, str], metadata: dict[str, str],
                limits: Limits | None) -> tuple[str, ...]:
    """Put the whole object (or the subtree under ``key``) in ``metadata`` as an inert tree
    whose tensors are the entries written; warn about objects kept as opaque records."""
    tensors, _ = select(ckpt, key)
    encoder, metadata[_inert.TREE_KEY] = _tree_encoder(ckpt, key, tensors, bad, aliases,
                                                       set(metadata), limits, written)
    metadata[_inert.FORMAT_KEY] = _inert.VERSION
    # NumPy arrays pickled in the checkpoint (RNG states …) are entries of their own
    written.update(encoder.tensors)
    opaque = tuple(sorted(encoder.opaque))
    if opaque:
        shown = ", ".join(opaque[:10]) + (f" and {len(opaque) - 10} more" if len(opaque) > 10
                                          else "")
        warnings.warn(f"{ckpt.path}: {sum(encoder.opaque.values())} object(s) kept as inert "
                      f"records (torchless.Opaque) in the stored tree: {shown}",
                      OpaqueObjectWarning, stacklevel=4)
    return opaque


@runtime_checkable
class TensorProgress(Protocol):
    """A ``progress(done, total)`` callback (bytes) that is also told the tensors written:
    ``tensors(done, total)``, called just before it (the command line's progress line)."""

    def __call__(self, done: int, total: int) -> None: ...

    def tensors(self, done: int, total: int) -> None: ...


def write_output(ckpt: _checkpoint.Checkpoint, out: _atomic.Output, header: bytes,
                 planned: list[Planned], *,
                 progress: Callable[[int, int], None] | None, before: int, total: int,
                 tensors_before: int = 0, tensors_total: int | None = None,
                 digests: Digests | None = None,
                 final_header: Callable[[], bytes] | None = None) -> int:
    """Write one safetensors file from ``ckpt`` into ``out`` (published later), copying
    byte ranges of its file.

    ``progress(done, total)`` counts ``before`` bytes already written by earlier files; a
    :class:`TensorProgress` is also told the tensors written, after ``tensors_before`` of
    earlier files, of ``tensors_total`` (default: this file's). ``digests`` and
    ``final_header`` as for :func:`~torchless.write.safetensors.write_into`."""
    report: Progress | None = None
    if progress is not None:
        callback = progress
        counter = progress if isinstance(progress, TensorProgress) else None
        ends = [len(header) + p.end for p in planned]  # a tensor is written at its end
        of = len(planned) if tensors_total is None else tensors_total

        def report(done: int) -> None:
            if counter is not None:
                counter.tensors(tensors_before + bisect.bisect_right(ends, done), of)
            callback(before + done, total)

    src_fd, file_offset = _file_offset(ckpt._source, ckpt.path)
    try:
        return write_into(out, header, planned, src_fd=src_fd, file_offset=file_offset,
                          progress=report, release=ckpt._source.release, needed=total,
                          held=before, digests=digests, final_header=final_header)
    except CheckpointError as e:  # writing DST, or reading SRC (a damaged member …)
        raise e.add_context(path=out.dst if isinstance(e, ConversionError) else ckpt.path
                            ) from None
    finally:
        if src_fd is not None:
            os.close(src_fd)


@contextlib.contextmanager
def safetensors_data(path: str, limits: Limits | None = None
                     ) -> Iterator[tuple[SafetensorsHeader, memoryview]]:
    """A safetensors file's checked header and its data section (a view of the file map)."""
    with Source(path) as out:
        try:
            header = read_header(out.buffer, (limits or Limits()).max_depth)
        except CheckpointError as e:
            raise e.add_context(path=path) from None
        yield header, out.buffer[header.data_start:]


def summary(r: VerifyReport) -> str:
    parts = [f"{n}: {why}" for n, why in list(r.mismatched.items())[:5]]
    if r.missing:
        parts.append(f"missing {', '.join(r.missing[:5])}")
    if r.extra:
        parts.append(f"unexpected {', '.join(r.extra[:5])}")
    return "; ".join(parts)


def _same_bytes(t: Tensor, data: memoryview) -> bool:
    pos = 0
    for block in chunks(t):
        n = len(block)
        if data[pos:pos + n] != block:
            return False
        pos += n
    return pos == len(data)


def compare_tree(ckpt: _checkpoint.Checkpoint, key: str | None, tensors: Mapping[str, Tensor],
                  header: SafetensorsHeader, data: memoryview, aliases: Mapping[str, str],
                  limits: Limits | None, mismatched: dict[str, str],
                  written: Mapping[str, Tensor] | None = None) -> list[str]:
    """Check DST's object tree: SRC's object encoded as convert does must give the same
    text, and the entries it adds (NumPy arrays of the object) the same bytes. Records
    differences in ``mismatched``; returns the names of those entries."""
    encoder, text = tree_of(ckpt, key, tensors, header, aliases, limits, written,
                            frozenset({CERT_KEY}))
    if text != header.metadata[_inert.TREE_KEY]:
        mismatched["(object tree)"] = "the stored tree differs from the source's object"
    for name, t in encoder.tensors.items():
        entry = header.entries.get(name)
        if entry is None:
            mismatched[name] = "missing (an array of the object tree)"
        elif entry[0] != t.dtype.safetensors or entry[1] != t.shape:
            mismatched[name] = f"{entry[0]} {list(entry[1])} != {t.dtype.safetensors} " \
                               f"{list(t.shape)}"
        elif not _same_bytes(t, data[entry[2]:entry[3]]):
            mismatched[name] = "bytes differ"
    return list(encoder.tensors)


def tree_of(ckpt: _checkpoint.Checkpoint, key: str | None, tensors: Mapping[str, Tensor],
            header: SafetensorsHeader, aliases: Mapping[str, str], limits: Limits | None,
            written: Mapping[str, Tensor] | None = None,
            ignore: frozenset[str] = frozenset()) -> tuple[_inert_write.Encoder, str]:
    """SRC's object encoded as convert encoded it into DST (whose header says which names
    were reserved: its ``__metadata__`` keys but the tree's own and ``ignore``, keys
    added after the tree was encoded): the encoder (its arrays) and the tree text."""
    bad = {n: f"torch.{t.dtype.name}" for n, t in tensors.items()
           if t.dtype.safetensors is None and n not in header.entries}
    reserved = {n for n in header.metadata
                if n not in (_inert.TREE_KEY, _inert.FORMAT_KEY) and n not in ignore}
    return _tree_encoder(ckpt, key, tensors, bad, aliases, reserved, limits,
                         tensors if written is None else written)


Compared = tuple[list[str], dict[str, str], list[str], list[str], list[str], dict[str, str]]


def compare(tensors: Mapping[str, Tensor], unsupported: list[str],
            header: SafetensorsHeader, data: memoryview,
            skip_unsupported: bool) -> Compared:
    """(matched, mismatched, missing, extra, skipped, aliases) of ``tensors`` against one
    safetensors file's header and data section."""
    matched: list[str] = []
    mismatched: dict[str, str] = {}
    missing: list[str] = []
    skipped: list[str] = []
    aliases: dict[str, str] = {}
    seen: set[str] = set()
    views = views_of(tensors)
    for name in unsupported:
        (skipped if skip_unsupported else missing).append(name)
    for name, t in tensors.items():
        target = entry_of(name, header, views) or name
        if target != name:
            aliases[name] = target
        entry = header.entries.get(target)
        if t.dtype.safetensors is None:
            if entry is None:
                (skipped if skip_unsupported else missing).append(name)
                continue
        if entry is None:
            missing.append(name)
            continue
        seen.add(target)
        dtype, shape, begin, end = entry
        if dtype != t.dtype.safetensors:
            mismatched[name] = f"dtype {dtype} != {t.dtype.safetensors}"
        elif shape != t.shape:
            mismatched[name] = f"shape {list(shape)} != {list(t.shape)}"
        elif not _same_bytes(t, data[begin:end]):
            mismatched[name] = "bytes differ"
        else:
            matched.append(name)
    extra = [n for n in header.entries if n not in seen]
    return matched, mismatched, missing, extra, skipped, aliases


