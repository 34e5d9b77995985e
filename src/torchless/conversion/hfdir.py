"""The rest of a model directory: what ``convert DIR [-o OUTDIR]`` does besides the weights.

A transformers model directory or a Trainer ``checkpoint-N/`` holds more than the weights:
``config.json``, ``generation_config.json``, tokenizer files, ``trainer_state.json`` (needed
to load or resume) and further pickles (``optimizer.pt``, ``scheduler.pt``,
``rng_state*.pth``, ``training_args.bin``, accelerate's ``*.bin`` / ``*.pkl``). So that
OUTDIR is a loadable model directory and nothing is skipped without a word:

* every other top-level checkpoint file (a name ending in ``.pt``, ``.pth``, ``.bin``,
  ``.ckpt``, ``.tar``, ``.pkl`` or ``.pickle``) is converted to ``<stem>.safetensors`` in
  OUTDIR, with its object tree, as ``convert FILE`` does;
* every other top-level file is hard-linked into OUTDIR (copied where a link cannot be
  made, e.g. across filesystems), or copied with ``link_files=False`` / ``--no-link-files``
  (a hard link is the same file: editing one edits the other). A subdirectory of plain
  files (sentence-transformers' ``1_Pooling/``, a tokenizer folder) is brought the same
  way; hidden entries and subdirectories holding weights or checkpoints (``checkpoint-500/``,
  a pipeline's ``unet/``: convert those on their own) are left out, and listed. Converting
  in place (no OUTDIR) brings nothing.

Every output name is checked before anything is written: an existing file is refused
without ``force`` (one already the same file as its source is left as it is).
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass

from torchless.conversion.common import ConversionReport, default_dst
from torchless.conversion.existing import claim, same_file
from torchless.errors import EXISTS_HINT, ConversionError
from torchless.write import atomic as _atomic

__all__ = ["CHECKPOINT_SUFFIXES", "DirectoryReport", "Plan", "bring", "plan"]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl", ".pickle")
_BLOCK = 1 << 20


@dataclass(frozen=True)
class DirectoryReport(ConversionReport):
    """What converting a model directory wrote, besides the weights (the base fields)."""

    #: the directory's other checkpoint files, each converted to ``<stem>.safetensors``
    converted: tuple[ConversionReport, ...] = ()
    #: (source, output, ``"linked"`` or ``"copied"``) for each other file brought over
    brought: tuple[tuple[str, str, str], ...] = ()
    #: hidden entries and subdirectories holding checkpoints, not brought over
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    checkpoints: list[tuple[str, str]]   # (source, output) to convert
    files: list[tuple[str, str]]         # (source, output) to link or copy
    left_out: list[str]


def plan(src_dir: str, out_dir: str, weights: list[str], outputs: list[str]) -> Plan:
    """What becomes of each entry of ``src_dir`` besides the ``weights`` sources (and their
    index), whose ``outputs`` (names in ``out_dir``) no other file may take."""
    same = os.path.abspath(src_dir) == os.path.abspath(out_dir)
    used = {os.path.basename(o): "the converted weights" for o in outputs}
    skip = {os.path.abspath(w) for w in weights}
    checkpoints: list[tuple[str, str]] = []
    files: list[tuple[str, str]] = []
    left_out: list[str] = []
    for name in sorted(os.listdir(src_dir)):
        path = os.path.join(src_dir, name)
        if os.path.abspath(path) in skip or (name in used and same):
            continue
        if os.path.isdir(path) and not name.startswith(".") and not same:
            inner = _plain_files(path)
            if inner is None:
                left_out.append(path)
            else:
                files += [(f, os.path.join(out_dir, os.path.relpath(f, src_dir)))
                          for f in inner]
            continue
        if name.startswith(".") or not os.path.isfile(path):
            left_out.append(path)
            continue
        if name.endswith(CHECKPOINT_SUFFIXES):
            dst = os.path.join(out_dir, os.path.basename(default_dst(name)))
            checkpoints.append((path, dst))
        elif same:
            continue
        elif name in used:  # an earlier conversion's output: ours replaces it
            continue
        else:
            dst = os.path.join(out_dir, name)
            files.append((path, dst))
        out = os.path.basename(dst)
        if out in used:
            raise ConversionError(f"{name} and {used[out]} would both be written as {out}",
                                  path=path, hint="convert the files one by one, each with "
                                                  "its own -o")
        used[out] = name
    return Plan(checkpoints, files, [] if same else left_out)


def _plain_files(directory: str) -> list[str] | None:
    """The files under a subdirectory (``1_Pooling/``, a tokenizer folder), or None when it
    holds weights or checkpoints (``checkpoint-500/``, ``unet/``: convert those on their
    own) or hidden entries."""
    found: list[str] = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in [*dirs, *names]:
            if name.startswith(".") or name.endswith((*CHECKPOINT_SUFFIXES, ".safetensors",
                                                      ".index.json")):
                return None
        found += [os.path.join(root, n) for n in sorted(names)]
    return found


def check_free(p: Plan, force: bool) -> None:
    """Refuse, before anything is written, outputs that exist (unless ``force``) or that
    are a source (:func:`~torchless.conversion.existing.claim`); a file to bring that is
    already the same file as its output (converting in place) is no output."""
    claim([dst for _, dst in p.checkpoints], [src for src, _ in p.checkpoints], force=force)
    claim([dst for src, dst in p.files if not same_file(src, dst)], [], force=force)


def bring(files: list[tuple[str, str]], *, link: bool,
          force: bool) -> list[tuple[str, str, str]]:
    """Hard-link (or copy) each file to its output; each appears whole or not at all."""
    done: list[tuple[str, str, str]] = []
    for src, dst in files:
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        except OSError as e:
            raise ConversionError(f"cannot create a directory: {e.strerror or e}",
                                  path=os.path.dirname(dst)) from None
        if same_file(src, dst):
            done.append((src, dst, "linked"))
            continue
        if link and _link(src, dst, force):
            done.append((src, dst, "linked"))
            continue
        _copy(src, dst, force)
        done.append((src, dst, "copied"))
    return done


def _link(src: str, dst: str, force: bool) -> bool:
    """A hard link at ``dst`` (False where links cannot be made: then the file is copied)."""
    tmp = f"{dst}.{os.getpid()}.link.tmp" if force else dst
    try:  # to the file itself: link() would link a symlink (a hub cache's, relative)
        os.link(os.path.realpath(src), tmp)
    except FileExistsError:
        raise ConversionError("the output file exists (use force=True / --force to "
                              "replace it)", path=dst, hint=EXISTS_HINT) from None
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EACCES):
            return False
        raise ConversionError(f"cannot link {src}: {e.strerror or e}", path=dst) from None
    if force:
        try:
            os.replace(tmp, dst)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ConversionError(f"cannot replace: {e.strerror or e}", path=dst) from None
    return True


def _copy(src: str, dst: str, force: bool) -> None:
    try:
        with open(src, "rb") as f, _atomic.Output(dst, force=force) as out:
            while block := f.read(_BLOCK):
                out.write(block)
            out.finish()
            _atomic.commit([out], force=force)
    except OSError as e:
        raise ConversionError(f"cannot copy {src}: {e.strerror or e}", path=dst) from None
