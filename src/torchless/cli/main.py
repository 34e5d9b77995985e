"""The ``torchless`` command line."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torchless.cli.messages import print_bug, print_error
from torchless.cli.parser import COMMANDS, EXIT_FAILED, EXIT_NOTHING, EXIT_OK, build_parser
from torchless.core.limits import Limits
from torchless.errors import CheckpointError, InternalError

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from torchless.conversion.common import ConversionReport
    from torchless.scanner.report import ScanReport

__all__ = ["NothingToRead", "main"]


class NothingToRead(CheckpointError):
    """A directory named holds no checkpoint: exit 3 (nothing to do), not 1 (a file
    refused) or scan's 1 (dangerous)."""


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"key": args.key, "force": args.force, "skip_existing": args.skip_existing,
            "dedupe": args.dedupe,
            "skip_unsupported": args.skip_unsupported, "verify": args.verify,
            "max_shard_size": args.max_shard_size, "tree": args.tree,
            "limits": _limits(args), "strict": args.strict,
            "allow_globals": tuple(args.allow_global), "verify_crc": args.verify_crc,
            "link_files": args.link_files, "dtype": args.dtype,
            "dtype_filter": tuple(args.dtype_filter), "certificate": args.certificate,
            "tag": args.tag,
            **_selection(args)}


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    return {"include": args.include, "exclude": args.exclude, "rename": args.rename,
            "strip_prefix": args.strip_prefix, "ema": args.ema}


def _limits(args: argparse.Namespace) -> Limits | None:
    from torchless.core.limits import allowing_download

    return allowing_download(Limits(**dict(args.limit)) if args.limit else None,
                             args.download)


@contextlib.contextmanager
def _download_line(quiet: bool) -> Iterator[None]:
    """A progress line on stderr while a file is downloaded whole (a server that ignores
    Range), wiped when it is done; on a terminal only, as every progress line."""
    from torchless.cli.progress import Progress, progress_wanted

    if not progress_wanted(quiet):
        yield
        return
    from torchless.cli.show import human
    from torchless.io.remote import download_progress

    bar = Progress(human)
    bar.count = "downloading (the server ignores Range)"

    def show(done: int, total: int) -> None:
        bar(done, total or done)
        if total and done >= total:
            bar.close()  # wiped before the command draws its own line

    token = download_progress.set(show)
    try:
        yield
    finally:
        download_progress.reset(token)
        bar.close()


def _quiet_convert(src: str, dst: str | None, **options: Any) -> ConversionReport:
    """convert(), with the opaque-object warning left to the report (printed by us)."""
    import warnings

    from torchless.conversion.api import convert
    from torchless.conversion.common import OpaqueObjectWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpaqueObjectWarning)
        return convert(src, dst, **options)


def _run_convert(args: argparse.Namespace) -> int:
    from torchless.cli.dirreport import directory_json, directory_text
    from torchless.cli.progress import Progress, progress_wanted
    from torchless.cli.show import human, report_json, report_text

    if args.tag is None and _is_batch(args.src):
        return _run_batch(args)
    bar = Progress(human) if progress_wanted(args.quiet or args.json) else None
    try:
        report = _quiet_convert(args.src[0], args.output, progress=bar, **_options(args))
    finally:
        if bar is not None:
            bar.close()
    if args.quiet:
        return EXIT_OK
    if args.json:
        json.dump(directory_json(report, report_json(report)), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        report_text(report, sys.stdout)
        directory_text(report, sys.stdout)
    return 0


def _workers(jobs: int) -> contextlib.AbstractContextManager[Executor | None]:
    """``-j N``: a pool of N worker processes, or None (this process) for N = 1. Workers
    come from a fork server, not a fork of this process: forking a process that holds
    threads (a library imported it, e.g. JAX) can deadlock the child."""
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=jobs,
                                   mp_context=multiprocessing.get_context("forkserver"))
    return contextlib.nullcontext()


def _output_as_source(sources: Sequence[str], output: str | None) -> bool:
    """``convert A B`` where B does not exist: the output given as ``cp`` takes it. Read as
    two sources it would convert A next to itself and then fail on B, so it is refused
    before anything is written."""
    from torchless.io.remote import is_remote

    return (output is None and len(sources) == 2 and not is_remote(sources[1])
            and not os.path.lexists(sources[1]))


def _is_batch(sources: Sequence[str]) -> bool:
    """Several sources, or a directory that is not a Hugging Face model directory."""
    from torchless.conversion.hflayout import is_checkpoint_dir, is_model_dir

    return len(sources) > 1 or any(os.path.isdir(s) and not is_model_dir(s)
                                   and not is_checkpoint_dir(s) for s in sources)


def _checkpoint_files(paths: Sequence[str]) -> list[str]:
    """The files named and those found under the directories named, walked once. Directories
    given to convert or inspect must hold a checkpoint: an empty walk is a mistaken path far
    more often than a finished job."""
    from torchless.api.batch import CHECKPOINT_SUFFIXES, expand

    files = expand(paths)
    if not files:
        raise NothingToRead(
            f"no checkpoint files in {', '.join(paths)} (looked for "
            f"{', '.join('*' + x for x in CHECKPOINT_SUFFIXES)}, hidden files left out)",
            hint="check the path, or name the files themselves: a file named on the command "
                 "line is read whatever its name")
    return files


def _run_batch(args: argparse.Namespace) -> int:
    """Many sources (directories walked), each to its default output; a failure does not
    stop the others; with --skip-existing, outputs already there and verified are kept."""
    from torchless.api.batch import BatchResult, batch
    from torchless.cli.progress import Progress, progress_wanted
    from torchless.cli.show import batch_doc, batch_line, human

    files = _checkpoint_files(args.src)
    options = _options(args)
    bar = Progress(human, unit="files") if progress_wanted(args.quiet or args.json) else None
    done: list[BatchResult] = []

    def show(result: BatchResult) -> None:
        done.append(result)
        if bar is not None:
            bar.clear()
        batch_line(batch_doc(result), args.json or args.quiet)
        if bar is not None:
            tensors = sum(r.detail.get("tensors", 0) for r in done if r.ok)
            bar.count = f"{tensors} tensors"
            bar(len(done), len(files))

    try:
        with _workers(args.jobs) as pool:
            results = batch(files, "convert", pool, report=args.report, on_result=show,
                            **options)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        json.dump([batch_doc(r) for r in results], sys.stdout, indent=1)
        sys.stdout.write("\n")
    failed = [r for r in results if not r.ok]
    if not args.json and not args.quiet:
        skipped = sum(r.status == "skipped" for r in results)
        sys.stdout.write(f"{len(results) - len(failed) - skipped} converted, {skipped} "
                         f"already done, {len(failed)} failed\n")
    return 1 if failed else 0


def _run_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from torchless.cli.inspecting import run_inspect, targets

    if args.tag is not None:
        from torchless.reader.checkpoint import tagged

        args.file = [tagged(args.file[0], args.tag, "inspecting")]
    found, one = targets(args.file, _checkpoint_files)
    if (args.html or args.tree) and not one:
        parser.error("--html and --tree take one checkpoint: a file, a DCP directory or a "
                     "model directory")
    with _workers(args.jobs if len(found) > 1 else 1) as pool:
        return run_inspect(args, _limits(args), found, one, pool)


def _run_verify(args: argparse.Namespace) -> int:
    from torchless.cli.show import verify_json, verify_text
    from torchless.conversion.api import verify, verify_certificate

    if args.certificate:
        report = verify_certificate(args.src, args.dst, limits=_limits(args),
                                    strict=args.strict, allow_globals=args.allow_global,
                                    verify_crc=args.verify_crc)
    else:
        report = verify(args.src, args.dst, key=args.key, limits=_limits(args),
                        skip_unsupported=args.skip_unsupported, strict=args.strict,
                        allow_globals=args.allow_global, verify_crc=args.verify_crc,
                        dtype=args.dtype, dtype_filter=args.dtype_filter, tag=args.tag,
                        **_selection(args))
    if args.json:
        json.dump(verify_json(report), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif not args.quiet:
        verify_text(report, sys.stdout)
    return 0 if report.ok else 1


def _check_verify(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.certificate:
        if args.dst is None:
            parser.error("verify takes SRC and DST (or --certificate OUT [SRC])")
        return
    given = [n for n, v in (("--key", args.key), ("--dtype", args.dtype),
                            ("--skip-unsupported", args.skip_unsupported),
                            *(("--" + k.replace("_", "-"), v)
                              for k, v in _selection(args).items())) if v]
    if given:
        parser.error("verify --certificate takes the transforms from the certificate: "
                     f"drop {', '.join(given)}")


def _run_scan(args: argparse.Namespace) -> int:
    """Exit 0 clean, 1 dangerous, anomalous or unvetted, 2 unreadable (never raises for a
    file), 3 a directory with nothing to scan."""
    from torchless.core.collector import importing

    with importing():
        from torchless.cli.progress import Progress, progress_wanted
        from torchless.scanner.files import format_table, scan_paths
    bar = Progress(str, unit="files") if progress_wanted(args.quiet or args.json) else None
    try:
        with _workers(args.jobs) as pool:
            report = scan_paths(args.paths, strict=args.strict, limits=_limits(args),
                                allow_globals=args.allow_global, executor=pool,
                                verify_crc=args.verify_crc, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    _no_checkpoints_in(args.paths, report)
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    elif not args.quiet:
        sys.stdout.write(format_table(report, verbose=args.verbose))
    return report.exit_code


def _no_checkpoints_in(paths: Sequence[str], report: ScanReport) -> None:
    """A directory given to scan must hold a checkpoint, as for convert and inspect: one
    with no file, or only files that are no checkpoint, is a mistaken path."""
    for path in paths:
        if not os.path.isdir(path):
            continue
        under = [f for f in report.files
                 if f.path == path or f.path.startswith(os.path.join(path, ""))]
        if not any(f.status != "skipped" for f in under):
            raise NothingToRead(
                f"no checkpoint files in {path}" + (
                    f" ({len(under)} files, none of them a checkpoint)" if under else ""),
                hint="check the path, or name the files themselves: a file named on the "
                     "command line is scanned whatever it holds")


def _check_convert(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What convert refuses before reading anything: options that do not go together, and
    a source that would be its own output (never converted over, nor verified against,
    itself)."""
    batch = args.tag is None and _is_batch(args.src)
    if batch and args.output is not None:
        parser.error("-o/--output takes a single SRC; several SRC (or a directory of "
                     "checkpoints) go to their default outputs")
    if not batch and args.report is not None:
        parser.error("--report writes one line per file for several SRC or a directory "
                     "of checkpoints; with one SRC, --json prints its summary")
    if _output_as_source(args.src, args.output):
        parser.error(f"{args.src[1]} does not exist, so it is no SRC: name the output "
                     f"with -o (torchless convert {args.src[0]} -o {args.src[1]}); "
                     "several SRC are each converted to their default output")
    from torchless.conversion.common import default_dst
    from torchless.conversion.existing import same_file
    from torchless.io.remote import is_remote

    for i, src in enumerate(args.src):
        if is_remote(src) or os.path.isdir(src):
            continue
        dst = args.output if args.output is not None and not os.path.isdir(
            args.output) else default_dst(src)
        if not same_file(src, dst):
            continue
        if i > 0 and len(args.src) == 2 and args.output is None:
            parser.error(f"{src} is a safetensors file, what convert writes: as SRC it would "
                         "be its own output. To write "
                         f"{args.src[0]} there, name it with -o (torchless convert "
                         f"{args.src[0]} -o {src}, with --force to replace it)")
        parser.error(f"{src} would be its own output: name another with -o")


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "inspect":
        return _run_inspect(args, parser)
    if args.command == "convert":
        return _run_convert(args)
    if args.command == "verify":
        return _run_verify(args)
    if args.command == "scan":
        return _run_scan(args)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; the exit codes are listed in :mod:`torchless.cli.parser`."""
    from torchless.cli.progress import quiet_from_env

    # names in a file may hold anything, lone surrogates included: printed escaped, never
    # a crash of the printing
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    given = sys.argv[1:] if argv is None else list(argv)
    # the command's own arguments only (the other commands' are not needed to parse it)
    parser = build_parser(given[0] if given and given[0] in COMMANDS else None)
    args = parser.parse_args(given)
    if quiet_from_env() and not vars(args).get("json") and not vars(args).get("jsonl"):
        args.quiet = True
    if args.command == "convert":
        _check_convert(parser, args)
    if args.command == "verify":
        _check_verify(parser, args)
    if vars(args).get("tag") is not None and len(args.src if args.command == "convert"
                                                else vars(args).get("file") or [None]) != 1:
        parser.error("--tag picks a save of one DeepSpeed run directory: name one")
    if args.command == "inspect":
        if args.html and not args.output:
            parser.error("--html writes a page: name it with -o FILE")
        if args.output and not args.html:
            parser.error("-o/--output goes with --html")
    if vars(args).get("jobs", 1) < 1:
        parser.error("-j/--jobs must be at least 1")
    if vars(args).get("dtype_filter") and not args.dtype:
        parser.error("--dtype-filter chooses the names --dtype casts: give --dtype too")
    try:
        with _download_line(bool(args.quiet or vars(args).get("json")
                                 or vars(args).get("jsonl"))):
            return _run(args, parser)
    except InternalError as e:
        print_bug(e)
        return EXIT_FAILED
    except NothingToRead as e:
        print_error(str(e), e.hint)
        return EXIT_NOTHING
    except CheckpointError as e:
        print_error(str(e), e.hint)
        return EXIT_FAILED
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:  # a file of ours (the --report file)
        where = f"{e.filename}: " if e.filename else ""
        print_error(f"{where}{e.strerror or e}",
                     "check that the path exists, is not a directory and that you may write "
                     "there")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("torchless: interrupted\n")
        return 130
    except Exception as e:  # a bug in the command itself
        bug = InternalError.wrap(e, f"running {args.command}")
        bug.__cause__ = e
        print_bug(bug)
        return EXIT_FAILED

