"""``convert()`` and ``verify()``: one checkpoint file to safetensors (an inert file with its
whole object, or a flat weights file), or a model directory through :mod:`.hf`."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING

from torchless.containers.base import PartialTree
from torchless.conversion import hflayout as _hflayout
from torchless.conversion.certificate import Certificate, transforms_of
from torchless.conversion.common import (
    ConversionReport,
    VerifyReport,
    cast_expected,
    compare,
    compare_tree,
    default_dst,
    plan_names,
    prepare,
    safetensors_data,
    select,
    source_names,
    store_tree,
    summary,
    verify_unpublished,
    write_output,
)
from torchless.conversion.existing import claim, skip_verified
from torchless.conversion.hflayout import is_checkpoint_dir
from torchless.conversion.select import NamePattern, RenameRule, Selection
from torchless.core.collector import collector_paused
from torchless.core.limits import Limits, allowing_download
from torchless.errors import (
    CheckpointError,
    ConversionError,
    InternalError,
    error_boundary,
    reports_bugs,
)
from torchless.inert import schema as _inert
from torchless.io.remote import is_remote
from torchless.reader.checkpoint import ReadOptions, tagged
from torchless.write import atomic as _atomic
from torchless.write.safetensors import (
    plan,
)

if TYPE_CHECKING:
    from torchless.conversion import hfdir as _hfdir
    from torchless.write.cast import Cast

__all__ = ["convert", "verify", "verify_certificate"]


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    key: str | None = None,
    force: bool = False,
    skip_existing: bool = False,
    dedupe: bool | None = None,
    skip_unsupported: bool = False,
    verify: bool = False,
    limits: Limits | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_shard_size: int | str | None = None,
    tree: bool = True,
    strict: bool = False,
    allow_globals: Iterable[str] = (),
    verify_crc: bool = False,
    link_files: bool = True,
    include: NamePattern | Iterable[NamePattern] | None = None,
    exclude: NamePattern | Iterable[NamePattern] | None = None,
    rename: RenameRule | Iterable[RenameRule] | None = None,
    strip_prefix: str | None = None,
    ema: bool = False,
    dtype: str | None = None,
    dtype_filter: Iterable[str] = (),
    certificate: bool = False,
    allow_full_download: bool = False,
    tag: str | None = None,
) -> ConversionReport:
    """Convert a torch checkpoint to a safetensors file, exactly and atomically.

    The output also holds the rest of the saved object (epochs, optimizer and scheduler
    state, RNG states, configs …) as an inert tree in ``__metadata__``
    (``docs/inert-format.md``), so :func:`torchless.load` of it returns the whole original
    structure; objects torchless does not rebuild are kept as :class:`Opaque` records and
    listed in an :class:`OpaqueObjectWarning`. Hugging Face layouts and sharded outputs hold
    the weights only.

    SRC may also be a Hugging Face model directory (``pytorch_model.bin`` or shards with a
    ``*.bin.index.json``) or such an index file; DST is then an output directory (default:
    SRC's directory) and the outputs follow transformers' naming (see
    :mod:`torchless.conversion.hf`); tied weights are written once, under the name
    transformers keeps (``dedupe=False`` writes every name). The directory's other
    checkpoint files (a Trainer's ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``,
    ``training_args.bin`` …) are converted too, and its
    other files (``config.json``, tokenizer …) hard-linked into DST, so DST loads with
    ``from_pretrained``; the report is then a
    :class:`~torchless.conversion.hfdir.DirectoryReport` saying what each became.

    Args:
        src: the checkpoint (any layout torchless reads).
        dst: the output; default SRC with its suffix replaced by ``.safetensors``.
        key: convert only the subtree under this dotted key (e.g. ``"state_dict"``).
        force: replace an existing DST (never SRC itself: refused, as the same file
            by another name is; :mod:`torchless.conversion.existing`).
        skip_existing: an existing DST that verifies against SRC is kept and nothing is
            written (the report's ``existing`` is true); one that does not verify is
            refused, or replaced with ``force``. One output file only (not a model
            directory, an index or ``max_shard_size``).
        dedupe: write identical aliases once, recording the others in ``__metadata__``
            (default: for a model directory or an index file, as transformers and the
            safetensors converter write them; not for one file).
        skip_unsupported: leave out tensors safetensors cannot hold instead of refusing.
        verify: re-read both files afterwards and compare every tensor.
        limits: resource bounds for reading SRC.
        progress: ``progress(bytes_done, bytes_total)`` while writing.
        max_shard_size: split the output into shards of at most this many tensor bytes
            (an int, or ``"5GB"``, ``"500MB"``, ``"1GiB"``: GB = 10**9, GiB = 2**30), named
            ``<stem>-0000K-of-0000N.safetensors`` with ``<stem>.safetensors.index.json``.
        tree: store the object tree beside the tensors (``False``: tensors only).
        strict: as for :func:`torchless.open`.
        verify_crc: as for :func:`torchless.open`.
        allow_globals: ``module.name`` globals the policy would refuse, kept as inert
            records for a file you trust (as in :func:`torchless.open`); never called.
        link_files: for a model directory converted into another directory: hard-link its
            other files there (``False``: copy them).
        include: write only the tensors whose flat name (relative to ``key``) matches one of
            these globs (``fnmatch``: ``*`` matches dots too) or predicates.
        exclude: leave out the tensors whose name matches one of these.
        rename: rename rules applied in order, each ``"s/REGEX/REPL/"`` (sed syntax, ``g``
            for every match) or a function of a name; two tensors given one name are
            refused, both named, before anything is written.
        strip_prefix: remove this prefix from the names that have it (refused if none has).
        ema: write the EMA copy's weights under the model's names (ldm / Stable Diffusion
            ``model_ema``, timm ``state_dict_ema``, ultralytics ``ema``; see
            :mod:`torchless.conversion.ema`); refused, by name, where a weight has no EMA
            twin of its shape. Applied first, before ``key`` and the filters.
        dtype: cast floating tensors to ``"bf16"``, ``"fp16"`` or ``"fp32"`` as they are
            written, bit for bit as torch's ``tensor.to(dtype)`` (:mod:`torchless.write.cast`);
            integer and bool tensors are left as they are. ``__metadata__`` records the cast
            (``torchless.cast``).
        dtype_filter: globs on the flat (output) names: cast only the tensors they match.
        certificate: record in each output's ``__metadata__`` a certificate of the
            conversion: the source (path or URL, size, sha256 or the server's ETag), this
            torchless's version, the transforms, and per tensor the BLAKE2b digests of its
            source bytes and of the bytes written (:mod:`torchless.conversion.certificate`,
            ``docs/certificate.md``), checked by :func:`verify_certificate`. Off by default:
            hashing reads every byte (a tensor the kernel copies never enters the process
            otherwise) and costs several times a plain conversion's CPU.
        allow_full_download: as for :func:`torchless.open` (a URL SRC on a server that
            ignores ``Range``: downloaded whole first, whatever its size).
        tag: of a DeepSpeed run directory, the save to convert (as for
            :func:`torchless.open`; default: the one its ``latest`` file names).

    With any of ``include``, ``exclude``, ``rename``, ``strip_prefix`` or ``ema``, the output
    holds the chosen tensors only (no object tree: it would name tensors the file does not
    hold); the steps are described in :mod:`torchless.conversion.select`.

    Raises:
        ConversionError: the output cannot be written as asked, or ``verify`` failed (no
            file of this run is left; an existing DST is as it was).
        InternalError: a bug in torchless (not a verdict on SRC).
        CheckpointError: SRC cannot be read.
    """
    if is_remote(src):
        if not isinstance(src, str):
            raise ConversionError("convert reads remote files by URL; for an open file "
                                  "object use torchless.open and save its tensors")
        if dst is None:
            dst = default_dst(os.path.basename(urllib.parse.urlparse(src).path) or "model")
    spath = tagged(os.fspath(src), tag, "converting")
    limits = allowing_download(limits, allow_full_download)
    read = ReadOptions(limits, strict, tuple(allow_globals), verify_crc)
    with error_boundary("converting", spath, max_depth=limits.max_depth if limits else -1), \
            collector_paused():
        selection = Selection.of(include, exclude, rename, strip_prefix, ema)
        cast = _cast(dtype, dtype_filter)
        if skip_existing:
            kept = _skip_existing(spath, dst, key, force, skip_unsupported, max_shard_size,
                                  read, selection, cast, certificate)
            if kept is not None:
                return kept
        return _convert_any(spath, dst, key, force, dedupe, skip_unsupported, verify,
                            progress, max_shard_size, tree, read, link_files, selection,
                            cast=cast, certificate=certificate)


def _skip_existing(spath: str, dst: str | os.PathLike[str] | None, key: str | None,
                   force: bool, skip_unsupported: bool, max_shard_size: int | str | None,
                   read: ReadOptions, selection: Selection | None, cast: Cast | None,
                   certificate: bool) -> ConversionReport | None:
    """``skip_existing``: the report of a DST kept because it verifies (and, asked for
    with ``certificate``, holds a valid certificate), or None."""
    if _is_layout(spath) or max_shard_size is not None:
        raise ConversionError(
            "skip_existing=True / --skip-existing keeps one output file that verifies; a "
            "model directory, an index or a sharded output is converted whole", path=spath,
            hint="convert it again with --force (force=True), or into another directory")
    dpath = _single_dst(spath, dst)
    started = time.monotonic()
    checked = skip_verified(spath, dpath, lambda: _verify(
        spath, dpath, key, skip_unsupported, read, selection, cast), force=force)
    if checked is None:
        return None
    if certificate and not _certified(dpath):
        if force:
            return None
        raise ConversionError("the output file exists and verifies, but holds no valid "
                              "certificate", path=dpath,
                              hint="convert it again with --force / force=True to write one")
    return ConversionReport(spath, dpath, len(checked.matched), 0, (), MappingProxyType({}),
                            time.monotonic() - started, checked, (), (), existing=True)


def _certified(dpath: str) -> bool:
    try:
        return verify_certificate(dpath).ok
    except InternalError:
        raise
    except CheckpointError:
        return False


def _is_layout(spath: str) -> bool:
    """A model directory or an index: converted through :mod:`.hf`."""
    return spath.endswith(".index.json") or (
        not is_remote(spath) and os.path.isdir(spath) and not is_checkpoint_dir(spath))


def _single_dst(spath: str, dst: str | os.PathLike[str] | None) -> str:
    return os.fspath(dst) if dst is not None else default_dst(spath.rstrip("/" + os.sep)
                                                              or spath)


def _cast(dtype: str | None, dtype_filter: Iterable[str]) -> Cast | None:
    """The ``dtype=`` request (NumPy imported only for one)."""
    filters = (dtype_filter,) if isinstance(dtype_filter, str) else tuple(dtype_filter)
    if dtype is None and not filters:
        return None
    from torchless.write.cast import Cast

    return Cast.of(dtype, filters)


def _convert_dir(spath: str, dst: str | None, *, key: str | None, force: bool,
                 dedupe: bool | None, skip_unsupported: bool, verify: bool,
                 progress: Callable[[int, int], None] | None, max_shard_size: int | str | None,
                 tree: bool, read: ReadOptions, link_files: bool,
                 selection: Selection | None, cast: Cast | None = None,
                 certificate: bool = False) -> _hfdir.DirectoryReport:
    """The weights through :mod:`.hf` (cast with ``cast``), then the rest of the directory
    (:mod:`.hfdir`; its other checkpoints, optimizer states …, are not cast)."""
    from torchless.conversion import hf as _hf
    from torchless.conversion import hfdir as _hfdir

    layout = _hflayout.resolve(spath, dst)
    weights = [*layout.sources, *([layout.index_path] if layout.index_path else [])]
    stem = _hflayout.stem(layout.base)
    names = [*layout.outputs, layout.base, stem + ".safetensors.index.json",
             *([layout.out_index] if layout.out_index else [])]
    rest = _hfdir.plan(spath, layout.out_dir, weights, names)
    _hfdir.check_free(rest, force)
    report = _hf.convert_layout(spath, dst, key=key, force=force, dedupe=dedupe is not False,
                                skip_unsupported=skip_unsupported, verify=verify,
                                progress=progress, max_shard_size=max_shard_size, read=read,
                                selection=selection, cast=cast, certificate=certificate)
    converted = tuple(_convert(src, out, None, force, bool(dedupe), skip_unsupported, verify,
                               None, tree, read, None, certificate=certificate)
                      for src, out in rest.checkpoints)
    brought = _hfdir.bring(rest.files, link=link_files, force=force)
    return _hfdir.DirectoryReport(**vars(report), converted=converted, brought=tuple(brought),
                                  left_out=tuple(rest.left_out))


def _convert_any(spath: str, dst: str | os.PathLike[str] | None, key: str | None,
                 force: bool, dedupe: bool | None, skip_unsupported: bool, verify: bool,
                 progress: Callable[[int, int], None] | None,
                 max_shard_size: int | str | None, tree: bool,
                 read: ReadOptions, link_files: bool,
                 selection: Selection | None, *, cast: Cast | None = None,
                 certificate: bool = False) -> ConversionReport:
    if _is_layout(spath) and not spath.endswith(".index.json"):
        return _convert_dir(spath, None if dst is None else os.fspath(dst), key=key,
                            force=force, dedupe=dedupe, skip_unsupported=skip_unsupported,
                            verify=verify, progress=progress, max_shard_size=max_shard_size,
                            tree=tree, read=read, link_files=link_files, selection=selection,
                            cast=cast, certificate=certificate)
    if spath.endswith(".index.json") or max_shard_size is not None:
        from torchless.conversion import hf as _hf  # directories only: not at start-up

        return _hf.convert_layout(
            spath, None if dst is None else os.fspath(dst), key=key, force=force,
            dedupe=dedupe is not False if spath.endswith(".index.json") else bool(dedupe),
            skip_unsupported=skip_unsupported, verify=verify,
            progress=progress, max_shard_size=max_shard_size, read=read, selection=selection,
            cast=cast, certificate=certificate)
    dpath = _single_dst(spath, dst)
    return _convert(spath, dpath, key, force, bool(dedupe), skip_unsupported, verify, progress,
                    tree, read, selection, cast, certificate=certificate)


def _convert(spath: str, dpath: str, key: str | None, force: bool, dedupe: bool,
             skip_unsupported: bool, verify: bool,
             progress: Callable[[int, int], None] | None, tree: bool,
             read: ReadOptions, selection: Selection | None,
             cast: Cast | None = None, *, certificate: bool = False) -> ConversionReport:
    started = time.monotonic()
    limits = read.limits
    claim([dpath], [spath], force=force)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(_atomic.Output(dpath, force=force))
        cert = None
        if certificate:
            cert = Certificate(transforms_of(key, selection, cast, dedupe=dedupe,
                                             skip_unsupported=skip_unsupported, tree=tree))
            stack.callback(cert.close)
        # with the object tree, modules saved whole keep their attributes (records); a
        # selection writes tensors only, as state dicts name them
        with read.open(spath, "record" if tree and selection is None else "state_dict"
                       ) as ckpt:
            names = plan_names([ckpt], key, selection, spath) if selection else None
            written, metadata, bad, aliases = prepare(ckpt, key, dedupe, skip_unsupported,
                                                      names, cast,
                                                      cert.observe if cert else None)
            # a layout whose tensors are a part of its tree (ZeRO: the consolidated weights
            # beside the optimizer's moments) converts to those tensors, as its own tools do;
            # so does a selection (the tree would name tensors the output does not hold)
            whole = not isinstance(ckpt._source, PartialTree) and names is None
            opaque = store_tree(ckpt, key, written, bad, aliases, metadata, limits
                                 ) if tree and whole else ()
            final = None
            if cert is not None:
                cert.add_source(spath, ckpt._source)
                flat = source_names(ckpt, key, names)
                final = cert.stamp(written, metadata,
                                   {n: (spath, flat.get(n)) for n in written})
            try:
                header, planned = plan(written, metadata)
            except CheckpointError as e:
                raise e.add_context(path=spath) from None
            total = len(header) + sum(p.tensor.nbytes for p in planned)
            nbytes = write_output(ckpt, out, header, planned, progress=progress, before=0,
                                  total=total, digests=cert.digests if cert else None,
                                  final_header=final)
        checked = None
        if verify:  # before publishing: a failure leaves an existing DST as it was
            checked = verify_unpublished(spath, [out], lambda paths: _verify(
                spath, paths[0], key, skip_unsupported, read, selection, cast))
            if not checked.ok:
                raise ConversionError(f"verification failed: {summary(checked)}; nothing "
                                      "was written", path=dpath,
                                      hint="the source changed while it was converted, or "
                                           "this is a bug in torchless: run again, and "
                                           "report it if it persists")
        _atomic.commit([out], force=force)
    return ConversionReport(spath, dpath, len(planned), nbytes, tuple(sorted(bad)),
                            MappingProxyType(aliases), time.monotonic() - started, checked,
                            (dpath,), opaque)

@reports_bugs("verifying")
def verify(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    key: str | None = None,
    limits: Limits | None = None,
    skip_unsupported: bool = False,
    strict: bool = False,
    allow_globals: Iterable[str] = (),
    verify_crc: bool = False,
    include: NamePattern | Iterable[NamePattern] | None = None,
    exclude: NamePattern | Iterable[NamePattern] | None = None,
    rename: RenameRule | Iterable[RenameRule] | None = None,
    strip_prefix: str | None = None,
    ema: bool = False,
    dtype: str | Cast | None = None,
    dtype_filter: Iterable[str] = (),
    allow_full_download: bool = False,
    tag: str | None = None,
) -> VerifyReport:
    """Compare every tensor of the torch checkpoint SRC with the safetensors file DST.

    SRC may also be a Hugging Face model directory or a ``*.bin.index.json`` with its shards,
    and DST a directory holding one ``*.safetensors`` file or a ``*.safetensors.index.json``,
    or such an index: every tensor must then be in exactly one output shard, the one the
    output index names.

    DST is read with torchless's own header parser (the data section must be tiled exactly).
    Names DST records as aliases in ``__metadata__`` are compared with the tensor they name,
    and so is a name DST lacks that is the same view as a name it holds (a tied weight
    transformers' ``save_pretrained`` writes once); both are listed in ``aliases``.
    Tensors of SRC that safetensors cannot hold are listed as missing, or as skipped with
    ``skip_unsupported=True`` (as ``convert`` leaves them out). ``strict``,
    ``allow_globals`` and ``verify_crc`` are as for :func:`torchless.open`; ``include``,
    ``exclude``, ``rename``, ``strip_prefix`` and ``ema`` as for :func:`convert` (SRC's
    tensors are compared under the names convert gives them). With ``dtype`` (and
    ``dtype_filter``), SRC's tensors are expected cast as ``convert`` casts them, and DST's
    record of the cast must be the one convert writes. ``allow_full_download`` as for
    :func:`torchless.open`. ``tag``: of a DeepSpeed run directory SRC, the save to compare
    (as for :func:`torchless.open`)."""
    spath, dpath = tagged(os.fspath(src), tag, "verifying"), os.fspath(dst)
    read = ReadOptions(allowing_download(limits, allow_full_download), strict,
                       tuple(allow_globals), verify_crc)
    cast = _cast(dtype, dtype_filter) if dtype is None or isinstance(dtype, str) else dtype
    return _verify(spath, dpath, key, skip_unsupported, read,
                   Selection.of(include, exclude, rename, strip_prefix, ema), cast)


@reports_bugs("verifying")
def verify_certificate(
    dst: str | os.PathLike[str],
    src: str | os.PathLike[str] | None = None,
    *,
    limits: Limits | None = None,
    strict: bool = False,
    allow_globals: Iterable[str] = (),
    verify_crc: bool = False,
) -> VerifyReport:
    """Check the safetensors output DST against the certificate ``convert(certificate=True)``
    wrote into it (every tensor's bytes against its recorded digest); given SRC, also
    re-derive every digest from the source, with the recorded transforms (names, cast), and
    check the source files' sizes and sha256. A model directory or a
    ``*.safetensors.index.json`` is checked shard by shard. Details:
    :mod:`torchless.conversion.certverify`, ``docs/certificate.md``."""
    from torchless.conversion.certverify import verify_certificate as check

    return check(dst, src, limits=limits, strict=strict, allow_globals=allow_globals,
                 verify_crc=verify_crc)


def _verify(spath: str, dpath: str, key: str | None, skip_unsupported: bool,
            read: ReadOptions, selection: Selection | None,
            cast: Cast | None = None) -> VerifyReport:
    limits = read.limits
    if any((os.path.isdir(p) and not is_checkpoint_dir(p)) or p.endswith(".index.json")
           for p in (spath, dpath)):
        from torchless.conversion import hf as _hf

        return _hf.verify_layout(spath, dpath, key=key, skip_unsupported=skip_unsupported,
                                 read=read, selection=selection, cast=cast)
    with safetensors_data(dpath, limits) as (header, data), read.open(
            spath, "record" if _inert.TREE_KEY in header.metadata else "state_dict") as ckpt:
        tensors, unsupported = select(ckpt, key, plan_names([ckpt], key, selection, spath)
                                      if selection else None)
        cast_report: dict[str, str] = {}
        expected = cast_expected(tensors, cast, header, cast_report)
        result = compare(expected, list(unsupported), header, data, skip_unsupported)
        matched, mismatched, missing, extra, skipped, aliases = result
        mismatched.update(cast_report)
        if _inert.TREE_KEY in header.metadata:
            arrays = compare_tree(ckpt, key, tensors, header, data, aliases, limits,
                                   mismatched, expected)
            matched += [n for n in arrays if n not in mismatched]
            extra = [n for n in extra if n not in arrays]
    return VerifyReport(spath, dpath, tuple(matched), MappingProxyType(mismatched),
                        tuple(missing), tuple(extra), tuple(skipped), MappingProxyType(aliases))
