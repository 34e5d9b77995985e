"""The one existing-output rule, for every file torchless writes at a path it was given:
``convert`` (one file, shards and their index, a model directory's other files, each file
of a batch), the API's :func:`~torchless.convert` and ``inspect --html -o``.

1. An output that is one of the sources (the same path, or the same file by a hard link or
   a symlink: the same inode) is refused, naming both, whatever else is asked: a file is
   never written over, nor verified against, itself.
2. An existing output is refused unless ``force=True`` / ``--force`` (then replaced
   atomically, :mod:`torchless.write.atomic`).
3. ``skip_existing=True`` / ``--skip-existing`` (a re-run of a batch): an existing output
   that verifies against its source (every tensor and the stored object compared) is left
   as it is and the source skipped; one that does not verify is refused as in 2 (replaced
   with ``force`` as well).

Nothing is written before these checks pass; :class:`~torchless.write.atomic.Output` checks
again, race-free, when it publishes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from torchless.errors import EXISTS_HINT, CheckpointError, ConversionError, InternalError
from torchless.write.atomic import refuse_directory

if TYPE_CHECKING:
    from torchless.conversion.common import VerifyReport

__all__ = ["SKIP_HINT", "claim", "same_file", "skip_verified", "source_of"]

SKIP_HINT = ("an earlier run was interrupted, or the output was made from another source: "
             "check it, then convert again with --force (force=True) to replace it")


def same_file(a: str, b: str) -> bool:
    """Whether the paths name one file: the same path, or the same inode."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def source_of(output: str, sources: Iterable[str]) -> str | None:
    """The source ``output`` is the same file as, if any."""
    return next((s for s in sources if same_file(s, output)), None)


def claim(outputs: Sequence[str], sources: Iterable[str], *, force: bool) -> list[str]:
    """Rules 1 and 2 for the outputs of one run: refuse an output that is a source, and
    existing outputs without ``force`` (all named at once). Returns the outputs that exist
    (those ``force`` replaces)."""
    sources = [s for s in sources]
    for output in outputs:
        src = source_of(output, sources)
        if src is not None:
            what = "the source file itself" if os.path.abspath(src) == os.path.abspath(
                output) else f"the source file {src} under another name"
            raise ConversionError(f"the output is {what}: a file is never written over, nor "
                                  "verified against, itself", path=output,
                                  hint="name another output with -o (dst=...)")
    for output in outputs:  # every output is a file
        refuse_directory(output)
    existing = [o for o in outputs if os.path.lexists(o)]
    if existing and not force:
        what = ("the output file exists" if len(outputs) == 1 else
                f"{len(existing)} output file{' exists' if len(existing) == 1 else 's exist'}"
                f": {', '.join(existing[:10])}")
        raise ConversionError(f"{what} (use force=True / --force to replace "
                              f"{'it' if len(existing) == 1 else 'them'})",
                              path=existing[0], hint=EXISTS_HINT)
    return existing


def skip_verified(source: str, output: str, verify: Callable[[], VerifyReport], *,
                  force: bool) -> VerifyReport | None:
    """Rule 3 for one source and its one output: the report of the existing ``output``
    verified against ``source`` when it verifies (the caller writes nothing); None when
    there is nothing to skip (no output yet, or one that does not verify and ``force``
    replaces it). An output that does not verify, or cannot be read, is refused without
    ``force``."""
    claim([output], [source], force=True)
    if not os.path.lexists(output):
        return None
    try:
        report = verify()
    except InternalError:
        raise
    except CheckpointError:
        report = None
    if report is not None and report.ok:
        return report
    if force:
        return None
    raise ConversionError("the output file exists and does not match the source (use "
                          "force=True / --force to replace it)", path=output, hint=SKIP_HINT)
