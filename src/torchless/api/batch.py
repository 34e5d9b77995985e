"""Many files at once: ``torchless.batch(paths, op, executor)``.

Directories are walked (recursively, in sorted order) for checkpoint files by name
(``.pt .pth .bin .ckpt .tar .pkl .pickle``); files named explicitly are taken whatever their
name. Each file is one task, run by any :class:`concurrent.futures.Executor` (a process
pool, or a Dask cluster's ``client.get_executor(pure=False)``): the task is a module-level
function with picklable arguments and returns a plain :class:`BatchResult`, so it runs
unchanged in another process or on another machine. One failure never stops the others:
every error a task meets becomes that file's result (``refused`` for files torchless will not
read, ``failed`` for anything else: a bug in torchless (:class:`InternalError`), an OS error, a
worker that died).

``convert`` resumes: a file whose output exists and verifies (every tensor and the stored
object compared) is ``skipped``; an existing output that does not verify is refused unless
``force=True``, which converts every file again. Results are written as JSON lines
to ``report`` as they arrive, so an interrupted run leaves a record of what was done.
"""

from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torchless.errors import CheckpointError, ConversionError, InternalError

__all__ = ["BatchResult", "batch", "expand"]

Op = Literal["convert", "scan", "inspect"]
#: What became of one file (see :class:`BatchResult`).
Status = Literal["done", "skipped", "refused", "failed"]
_BUG_HINT = ("torchless should have reported this as one of its own errors: please report "
             "it, with the file if you can share it")
_OS_HINT = "check that the file is readable and that the output directory is writable"
#: Names a directory walk picks up.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl", ".pickle")


@dataclass(frozen=True)
class BatchResult:
    """What one task did to one file.

    ``status``: ``done``, ``skipped`` (convert: a verified output already there), ``refused``
    (torchless will not read it: not a checkpoint, hostile, unsupported …) or ``failed``
    (anything else: a bug in torchless, an OS error, a worker that died; never a verdict
    on the file). A result that is not ok has the ``error`` and a ``hint``: what to do.
    ``detail`` holds the operation's own summary (the conversion report, the scan verdict,
    the inspect summary)."""

    path: str
    op: str
    status: Status
    seconds: float
    output: str | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    #: What the user can do about ``error`` (see :attr:`CheckpointError.hint`).
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("done", "skipped")

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, ensure_ascii=False, default=str)


def expand(paths: Iterable[str | os.PathLike[str]], *, units: bool = True) -> list[str]:
    """Files named, and checkpoint files under directories named (recursive, sorted); a
    directory that is one checkpoint (a DCP directory) is one item, named or found, unless
    ``units`` is false (scanning looks at files)."""
    from torchless.containers import registry

    def unit(directory: str) -> bool:
        return units and registry.sniff_directory(directory) is not None

    out: list[str] = []
    for p in paths:
        path = os.fspath(p)
        if os.path.isdir(path) and unit(path):
            out.append(path)
        elif os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found = [d for d in dirs if unit(os.path.join(root, d))]
                out.extend(os.path.join(root, d) for d in found)
                dirs[:] = [d for d in dirs if d not in found]
                out.extend(os.path.join(root, f) for f in sorted(files)
                           if f.endswith(CHECKPOINT_SUFFIXES) and not f.startswith("."))
        else:
            out.append(path)
    return out


def run_one(path: str, op: Op, options: dict[str, Any]) -> BatchResult:
    """One task (module level, so executors can send it to other processes)."""
    started = time.monotonic()
    try:
        status, output, detail = _OPS[op](path, dict(options))
        return BatchResult(path, op, status, time.monotonic() - started, output, None, detail)
    except CheckpointError as e:
        failed: Status = "failed" if isinstance(e, InternalError) else "refused"
        return BatchResult(path, op, failed, time.monotonic() - started, None, str(e),
                           hint=e.hint)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # one file's failure must not stop the batch
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
        return BatchResult(path, op, "failed", time.monotonic() - started, None,
                           f"{type(e).__name__}: {e}{where}",
                           hint=_OS_HINT if isinstance(e, OSError) else _BUG_HINT)


#: convert's options that choose and name the tensors: verify takes them too
_SELECTION = ("include", "exclude", "rename", "strip_prefix", "ema")


def _convert(path: str, options: dict[str, Any]) -> tuple[Status, str | None, dict[str, Any]]:
    from torchless.conversion.api import convert, verify
    from torchless.conversion.common import OpaqueObjectWarning, default_dst

    dst = options.pop("dst", None) or default_dst(path)
    resume = options.pop("resume", True)
    if resume and not options.get("force") and os.path.exists(dst):
        try:
            report = verify(path, dst, key=options.get("key"),
                            skip_unsupported=bool(options.get("skip_unsupported")),
                            limits=options.get("limits"), strict=bool(options.get("strict")),
                            allow_globals=options.get("allow_globals", ()),
                            verify_crc=bool(options.get("verify_crc")),
                            dtype=options.get("dtype"),
                            dtype_filter=options.get("dtype_filter", ()),
                            **{k: options[k] for k in _SELECTION if k in options})
        except InternalError:
            raise
        except CheckpointError:
            report = None
        if report is not None and report.ok and options.get("certificate"):
            _check_certified(dst)
        if report is not None and report.ok:
            return "skipped", dst, {"reason": "the output exists and verifies",
                                    "tensors": len(report.matched)}
        raise ConversionError("the output file exists and does not match the source (use "
                              "force=True / --force to replace it)", path=dst,
                              hint="an earlier run was interrupted, or the output was made "
                                   "from another source: check it, then convert again with "
                                   "--force / force=True")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueObjectWarning)
        done = convert(path, dst, **options)
    return "done", done.dst, {"tensors": done.tensors, "bytes": done.bytes,
                              "files": list(done.files), "skipped": list(done.skipped),
                              "opaque": list(done.opaque)}


def _check_certified(dst: str) -> None:
    """An output asked for with a certificate holds a valid one, or is refused."""
    from torchless.conversion.api import verify_certificate

    try:
        certified = verify_certificate(dst).ok
    except InternalError:
        raise
    except CheckpointError:
        certified = False
    if not certified:
        raise ConversionError("the output file exists and verifies, but holds no valid "
                              "certificate", path=dst,
                              hint="convert it again with --force / force=True to write one")


def _scan(path: str, options: dict[str, Any]) -> tuple[Status, str | None, dict[str, Any]]:
    from torchless.scanner.files import scan

    report = scan(path, **options)
    failed = [f for f in report.files if f.status == "error"]
    if failed:  # the scanner met a bug of its own: no verdict on the file
        raise InternalError(failed[0].error or "internal error while scanning", path=path)
    doc = json.loads(report.to_json(indent=None))
    return "done", None, doc


def _inspect(path: str, options: dict[str, Any]) -> tuple[Status, str | None, dict[str, Any]]:
    from torchless.reader.checkpoint import open as open_checkpoint

    with open_checkpoint(path, **options) as ckpt:
        return "done", None, {
            "format": ckpt.format, "tensors": len(ckpt.tensors),
            "bytes": sum(t.nbytes for t in ckpt.tensors.values()),
            "unsupported": dict(ckpt.unsupported),
            "opaque_globals": sorted({f"{g.module}.{g.name}" for g in ckpt.opaque})}


_OPS: dict[str, Callable[[str, dict[str, Any]], tuple[Status, str | None, dict[str, Any]]]] = {
    "convert": _convert, "scan": _scan, "inspect": _inspect}


def batch(
    paths: Iterable[str | os.PathLike[str]],
    op: Op,
    executor: Executor | None = None,
    *,
    report: str | os.PathLike[str] | None = None,
    on_result: Callable[[BatchResult], None] | None = None,
    **options: Any,
) -> list[BatchResult]:
    """Run ``op`` (``"convert"``, ``"scan"`` or ``"inspect"``) on every file of ``paths``.

    Args:
        paths: files and directories (walked for checkpoint files).
        op: what to do to each file.
        executor: where tasks run (default: one after another in this process). Any
            ``concurrent.futures.Executor``: ``ProcessPoolExecutor(4)``, or on Dask
            ``distributed.Client(...).get_executor(pure=False)``.
        report: a JSON-lines file; one line per result, appended as results arrive.
        on_result: called with each result as it arrives (progress display).
        **options: passed to the operation (convert: ``key``, ``dedupe``,
            ``skip_unsupported``, ``tree``, ``verify``, ``resume`` (default True) …; every
            op: ``strict``, ``allow_globals``, ``limits``; convert and inspect:
            ``verify_crc``).

    Returns the results in the order of the files.
    """
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}")
    files = expand(paths, units=op != "scan")
    results: list[BatchResult | None] = [None] * len(files)
    # a path that is not UTF-8 holds surrogate escapes: written as \udcXX, which JSON reads
    # back as the same str
    out = open(report, "a", encoding="utf-8", errors="backslashreplace") \
        if report is not None else None
    try:
        for i, result in _run(files, op, options, executor):
            results[i] = result
            if out is not None:
                out.write(result.to_json() + "\n")
                out.flush()
            if on_result is not None:
                on_result(result)
    finally:
        if out is not None:
            out.close()
    return [r for r in results if r is not None]


def _run(files: Sequence[str], op: Op, options: dict[str, Any],
         executor: Executor | None) -> Iterator[tuple[int, BatchResult]]:
    if executor is None:
        for i, path in enumerate(files):
            yield i, run_one(path, op, options)
        return
    futures: dict[Future[BatchResult], int] = {
        executor.submit(run_one, path, op, options): i for i, path in enumerate(files)}
    from concurrent.futures import as_completed

    for future in as_completed(futures):
        i = futures[future]
        try:
            result = future.result()
        except BaseException as e:  # a worker died: that file failed
            result = BatchResult(files[i], op, "failed", 0.0, None,
                                 f"the worker running it failed ({type(e).__name__}: {e})",
                                 hint="the worker process died (out of memory?): run this "
                                      "file alone, with fewer workers (-j)")
        yield i, result
