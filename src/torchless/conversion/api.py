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
from torchless.conversion.common import (
    ConversionReport,
    VerifyReport,
    compare,
    compare_tree,
    default_dst,
    prepare,
    safetensors_data,
    select,
    store_tree,
    summary,
    verify_unpublished,
    write_output,
)
from torchless.conversion.hflayout import is_checkpoint_dir
from torchless.core.collector import collector_paused
from torchless.core.limits import Limits
from torchless.errors import (
    CheckpointError,
    ConversionError,
    error_boundary,
    reports_bugs,
)
from torchless.inert import schema as _inert
from torchless.io.remote import is_remote
from torchless.reader.checkpoint import ReadOptions
from torchless.write import atomic as _atomic
from torchless.write.safetensors import (
    plan,
)

if TYPE_CHECKING:
    from torchless.conversion import hfdir as _hfdir

__all__ = ["convert", "verify"]


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    key: str | None = None,
    force: bool = False,
    dedupe: bool = False,
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
    :mod:`torchless.conversion.hf`); ``dedupe`` keeps the names transformers keeps for tied
    weights. The directory's other checkpoint files (a Trainer's ``optimizer.pt``,
    ``scheduler.pt``, ``rng_state.pth``, ``training_args.bin`` …) are converted too, and its
    other files (``config.json``, tokenizer …) hard-linked into DST, so DST loads with
    ``from_pretrained``; the report is then a
    :class:`~torchless.conversion.hfdir.DirectoryReport` saying what each became.

    Args:
        src: the checkpoint (any layout torchless reads).
        dst: the output; default SRC with its suffix replaced by ``.safetensors``.
        key: convert only the subtree under this dotted key (e.g. ``"state_dict"``).
        force: replace an existing DST.
        dedupe: write identical aliases once, recording the others in ``__metadata__``.
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
    spath = os.fspath(src)
    read = ReadOptions(limits, strict, tuple(allow_globals), verify_crc)
    with error_boundary("converting", spath, max_depth=limits.max_depth if limits else -1), \
            collector_paused():
        return _convert_any(spath, dst, key, force, dedupe, skip_unsupported, verify,
                            progress, max_shard_size, tree, read, link_files)


def _convert_dir(spath: str, dst: str | None, *, key: str | None, force: bool, dedupe: bool,
                 skip_unsupported: bool, verify: bool,
                 progress: Callable[[int, int], None] | None, max_shard_size: int | str | None,
                 tree: bool, read: ReadOptions, link_files: bool) -> _hfdir.DirectoryReport:
    """The weights through :mod:`.hf`, then the rest of the directory (:mod:`.hfdir`)."""
    from torchless.conversion import hf as _hf
    from torchless.conversion import hfdir as _hfdir

    layout = _hflayout.resolve(spath, dst)
    weights = [*layout.sources, *([layout.index_path] if layout.index_path else [])]
    stem = _hflayout.stem(layout.base)
    names = [*layout.outputs, layout.base, stem + ".safetensors.index.json",
             *([layout.out_index] if layout.out_index else [])]
    rest = _hfdir.plan(spath, layout.out_dir, weights, names)
    _hfdir.check_free(rest, force)
    report = _hf.convert_layout(spath, dst, key=key, force=force, dedupe=dedupe,
                                skip_unsupported=skip_unsupported, verify=verify,
                                progress=progress, max_shard_size=max_shard_size, read=read)
    converted = tuple(_convert(src, out, None, force, dedupe, skip_unsupported, verify, None,
                               tree, read) for src, out in rest.checkpoints)
    brought = _hfdir.bring(rest.files, link=link_files, force=force)
    return _hfdir.DirectoryReport(**vars(report), converted=converted, brought=tuple(brought),
                                  left_out=tuple(rest.left_out))


def _convert_any(spath: str, dst: str | os.PathLike[str] | None, key: str | None,
                 force: bool, dedupe: bool, skip_unsupported: bool, verify: bool,
                 progress: Callable[[int, int], None] | None,
                 max_shard_size: int | str | None, tree: bool,
                 read: ReadOptions, link_files: bool) -> ConversionReport:
    local_dir = not is_remote(spath) and os.path.isdir(spath) and not is_checkpoint_dir(spath)
    if local_dir:
        return _convert_dir(spath, None if dst is None else os.fspath(dst), key=key,
                            force=force, dedupe=dedupe, skip_unsupported=skip_unsupported,
                            verify=verify, progress=progress, max_shard_size=max_shard_size,
                            tree=tree, read=read, link_files=link_files)
    if spath.endswith(".index.json") or max_shard_size is not None:
        from torchless.conversion import hf as _hf  # directories only: not at start-up

        return _hf.convert_layout(
            spath, None if dst is None else os.fspath(dst), key=key, force=force,
            dedupe=dedupe, skip_unsupported=skip_unsupported, verify=verify,
            progress=progress, max_shard_size=max_shard_size, read=read)
    dpath = os.fspath(dst) if dst is not None else default_dst(spath.rstrip("/" + os.sep) or spath)
    return _convert(spath, dpath, key, force, dedupe, skip_unsupported, verify, progress,
                    tree, read)


def _convert(spath: str, dpath: str, key: str | None, force: bool, dedupe: bool,
             skip_unsupported: bool, verify: bool,
             progress: Callable[[int, int], None] | None, tree: bool,
             read: ReadOptions) -> ConversionReport:
    started = time.monotonic()
    limits = read.limits
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(_atomic.Output(dpath, force=force))
        # with the object tree, modules saved whole keep their attributes (records)
        with read.open(spath, "record" if tree else "state_dict") as ckpt:
            try:
                if os.path.exists(dpath) and os.path.samefile(spath, dpath):
                    raise ConversionError("the output path is the source file", path=dpath,
                                          hint="give another output path with -o / dst")
            except OSError:
                pass
            written, metadata, bad, aliases = prepare(ckpt, key, dedupe, skip_unsupported)
            # a layout whose tensors are a part of its tree (ZeRO: the consolidated weights
            # beside the optimizer's moments) converts to those tensors, as its own tools do
            whole = not isinstance(ckpt._source, PartialTree)
            opaque = store_tree(ckpt, key, written, bad, aliases, metadata, limits
                                 ) if tree and whole else ()
            try:
                header, planned = plan(written, metadata)
            except CheckpointError as e:
                raise e.add_context(path=spath) from None
            total = len(header) + sum(p.tensor.nbytes for p in planned)
            nbytes = write_output(ckpt, out, header, planned, progress=progress, before=0,
                                  total=total)
        checked = None
        if verify:  # before publishing: a failure leaves an existing DST as it was
            checked = verify_unpublished(spath, [out], lambda paths: _verify(
                spath, paths[0], key=key, limits=limits, skip_unsupported=skip_unsupported,
                strict=read.strict, allow_globals=read.allow_globals,
                verify_crc=read.verify_crc))
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
) -> VerifyReport:
    """Compare every tensor of the torch checkpoint SRC with the safetensors file DST.

    SRC may also be a Hugging Face model directory or a ``*.bin.index.json`` with its shards,
    and DST a directory holding one ``*.safetensors`` file or a ``*.safetensors.index.json``,
    or such an index: every tensor must then be in exactly one output shard, the one the
    output index names.

    DST is read with torchless's own header parser (the data section must be tiled exactly).
    Names DST records as aliases in ``__metadata__`` are compared with the tensor they name.
    Tensors of SRC that safetensors cannot hold are listed as missing, or as skipped with
    ``skip_unsupported=True`` (as ``convert`` leaves them out). ``strict``,
    ``allow_globals`` and ``verify_crc`` are as for :func:`torchless.open`."""
    spath, dpath = os.fspath(src), os.fspath(dst)
    read = ReadOptions(limits, strict, tuple(allow_globals), verify_crc)
    if any((os.path.isdir(p) and not is_checkpoint_dir(p)) or p.endswith(".index.json")
           for p in (spath, dpath)):
        from torchless.conversion import hf as _hf

        return _hf.verify_layout(spath, dpath, key=key, skip_unsupported=skip_unsupported,
                                 read=read)
    with safetensors_data(dpath, limits) as (header, data), read.open(
            spath, "record" if _inert.TREE_KEY in header.metadata else "state_dict") as ckpt:
        tensors, unsupported = select(ckpt, key)
        result = compare(tensors, list(unsupported), header, data, skip_unsupported)
        matched, mismatched, missing, extra, skipped, aliases = result
        if _inert.TREE_KEY in header.metadata:
            arrays = compare_tree(ckpt, key, tensors, header, data, aliases, limits,
                                   mismatched)
            matched += [n for n in arrays if n not in mismatched]
            extra = [n for n in extra if n not in arrays]
    return VerifyReport(spath, dpath, tuple(matched), MappingProxyType(mismatched),
                        tuple(missing), tuple(extra), tuple(skipped), MappingProxyType(aliases))


_verify = verify  # convert's ``verify`` flag shadows the function inside convert
