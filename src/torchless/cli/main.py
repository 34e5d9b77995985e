"""The ``torchless`` command line."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchless._version import __version__
from torchless.cli.messages import print_bug, print_error
from torchless.core.limits import Limits
from torchless.core.text import line_writer
from torchless.errors import CheckpointError, InternalError

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from torchless.conversion.common import ConversionReport
    from torchless.scanner.report import ScanReport

__all__ = ["main"]

_EXAMPLES = """\
examples:
  torchless inspect model.pt
  torchless inspect model.pt --json | jq '.tensors[].name'
  torchless inspect checkpoint.ckpt --strict
  torchless convert model.pt                 # writes model.safetensors
  torchless verify model.pt model.safetensors
"""

_CONVERT_EXAMPLES = """\
examples:
  torchless convert model.pt                      # writes model.safetensors beside it
  torchless convert model.ckpt -o out.safetensors --key state_dict
  torchless convert pytorch_model.bin --dedupe --verify --json
  torchless convert ./my-model/                   # pytorch_model*.bin -> model*.safetensors
  torchless convert ./my-model/ --max-shard-size 5GB -o ./out/
  torchless convert a.pt b.pt c.pt -j 3 --json    # each to its default output
  torchless convert ./runs/ -j 4 --report run.jsonl  # a directory; re-runs skip done files
  torchless convert ckpt.pt --weights-only          # tensors only, no object tree
  torchless convert https://example.org/model.pt    # streamed by range requests
"""

_VERIFY_EXAMPLES = """\
examples:
  torchless verify model.pt model.safetensors
  torchless verify model.ckpt out.safetensors --key state_dict --json
  torchless verify ./my-model/ ./out/             # every shard, and the output index
  torchless verify -q model.pt model.safetensors  # nothing printed: the exit code says
"""


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"key": args.key, "force": args.force, "dedupe": args.dedupe,
            "skip_unsupported": args.skip_unsupported, "verify": args.verify,
            "max_shard_size": args.max_shard_size, "tree": not args.weights_only,
            "limits": _limits(args), "strict": args.strict,
            "allow_globals": tuple(args.allow_global), "verify_crc": args.verify_crc,
            "link_files": not args.copy_files}


def _limit(text: str) -> tuple[str, int]:
    """``--limit NAME=N``: one field of :class:`Limits`."""
    name, sep, value = text.partition("=")
    name = name.strip().replace("-", "_")
    if not name.startswith("max_"):
        name = "max_" + name
    fields = Limits.__dataclass_fields__
    if not sep or name not in fields:
        raise argparse.ArgumentTypeError(
            f"expected NAME=N with NAME one of {', '.join(sorted(fields))}, not {text!r}")
    try:
        n = int(value.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not an integer") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{name}: must not be negative")
    return name, n


def _add_allow_global(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-global", action="append", default=[], metavar="MODULE.NAME",
                        help="for a file you trust: keep this refused global as an inert "
                             "record, never called (repeatable)")


def _add_reading(parser: argparse.ArgumentParser, *, strict: str | None = None) -> None:
    """The options every command that reads a checkpoint shares (one vocabulary with the
    Python API: strict, allow_globals, verify_crc, limits)."""
    parser.add_argument("--strict", action="store_true",
                        help=strict or "refuse every global outside the rebuild rules")
    _add_allow_global(parser)
    parser.add_argument("--verify-crc", action="store_true",
                        help="check the CRC-32 of every tensor's archive member as it is read")
    _add_limit(parser)


def _add_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", action="append", default=[], type=_limit, metavar="NAME=N",
        help="raise (or lower) a resource limit for a file you trust, e.g. --limit "
             "max_tensors=2000000 (repeatable; NAME: a field of torchless.Limits)")


def _limits(args: argparse.Namespace) -> Limits | None:
    return Limits(**dict(args.limit)) if args.limit else None


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
    from torchless.cli.show import Bar, report_json, report_text

    if _is_batch(args.src):
        return _run_batch(args)
    bar = Bar() if sys.stderr.isatty() else None
    try:
        report = _quiet_convert(args.src[0], args.output, progress=bar, **_options(args))
    finally:
        if bar is not None:
            bar.close()
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


def _is_checkpoint_dir(path: str) -> bool:
    from torchless.conversion.hflayout import is_checkpoint_dir

    return is_checkpoint_dir(path)


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
        raise CheckpointError(
            f"no checkpoint files in {', '.join(paths)} (looked for "
            f"{', '.join('*' + x for x in CHECKPOINT_SUFFIXES)}, hidden files left out)",
            hint="check the path, or name the files themselves: a file named on the command "
                 "line is read whatever its name")
    return files


def _run_batch(args: argparse.Namespace) -> int:
    """Many sources (directories walked), each to its default output; a failure does not
    stop the others; outputs already there and verified are skipped."""
    from torchless.api.batch import BatchResult, batch
    from torchless.cli.show import batch_doc, batch_line

    files = _checkpoint_files(args.src)
    options = _options(args)
    options["resume"] = not args.force

    def show(result: BatchResult) -> None:
        batch_line(batch_doc(result), args.json)

    with _workers(args.jobs) as pool:
        results = batch(files, "convert", pool, report=args.report, on_result=show,
                        **options)
    if args.json:
        json.dump([batch_doc(r) for r in results], sys.stdout, indent=1)
        sys.stdout.write("\n")
    failed = [r for r in results if not r.ok]
    if not args.json:
        skipped = sum(r.status == "skipped" for r in results)
        sys.stdout.write(f"{len(results) - len(failed) - skipped} converted, {skipped} "
                         f"already done, {len(failed)} failed\n")
    return 1 if failed else 0


def _run_inspect_many(args: argparse.Namespace) -> int:
    """A summary per file (directories walked), in worker processes with -j."""
    from torchless.api.batch import BatchResult, batch
    from torchless.cli.show import human

    def show(r: BatchResult) -> None:
        if args.json:
            sys.stdout.write(r.to_json() + "\n")
        elif r.ok:
            d = r.detail
            line_writer(sys.stdout)(f"{r.path}: {d['format']}, {d['tensors']} tensors, "
                                    f"{human(d['bytes'])}"
                                    + (f", {len(d['opaque_globals'])} opaque classes"
                                       if d["opaque_globals"] else "") + "\n")
        else:
            print_error(r.error, r.hint)

    files = _checkpoint_files(args.file)
    options = {"strict": args.strict, "allow_globals": tuple(args.allow_global),
               "limits": _limits(args), "verify_crc": args.verify_crc}
    with _workers(args.jobs) as pool:
        results = batch(files, "inspect", pool, on_result=show, **options)
    return 0 if all(r.ok for r in results) else 1


def _run_inspect(args: argparse.Namespace) -> int:
    from torchless.cli.inspecting import run_inspect

    return run_inspect(args, _limits(args))


def _run_verify(args: argparse.Namespace) -> int:
    from torchless.cli.show import verify_json, verify_text
    from torchless.conversion.api import verify

    report = verify(args.src, args.dst, key=args.key, limits=_limits(args),
                    skip_unsupported=args.skip_unsupported, strict=args.strict,
                    allow_globals=args.allow_global, verify_crc=args.verify_crc)
    if args.json:
        json.dump(verify_json(report), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif not args.quiet:
        verify_text(report, sys.stdout)
    return 0 if report.ok else 1


def _run_scan(args: argparse.Namespace) -> int:
    """Exit 0 clean, 1 dangerous, anomalous or unvetted, 2 unreadable (never raises for a
    file)."""
    from torchless.scanner.files import format_table, scan_paths

    with _workers(args.jobs) as pool:
        report = scan_paths(args.paths, strict=args.strict, limits=_limits(args),
                            allow_globals=args.allow_global, executor=pool,
                            verify_crc=args.verify_crc)
    _no_checkpoints_in(args.paths, report)
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        sys.stdout.write(format_table(report, verbose=args.verbose))
    return report.exit_code


def _no_checkpoints_in(paths: Sequence[str], report: ScanReport) -> None:
    """A directory given to scan must hold a checkpoint, as for convert and inspect: one
    with no file, or only files that are no checkpoint, is a mistaken path."""
    for path in paths:
        if not os.path.isdir(path):
            continue
        under = [f for f in report.files if f.path.startswith(os.path.join(path, ""))]
        if not any(f.status != "skipped" for f in under):
            raise CheckpointError(
                f"no checkpoint files in {path}" + (
                    f" ({len(under)} files, none of them a checkpoint)" if under else ""),
                hint="check the path, or name the files themselves: a file named on the "
                     "command line is scanned whatever it holds")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchless",
        description="Read PyTorch checkpoints without PyTorch and without running pickle code.",
        epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"torchless {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ins = sub.add_parser(
        "inspect", help="show what a checkpoint holds",
        description="Show a checkpoint's format, the known structures of a training "
                    "checkpoint (Lightning, optimizers, schedulers, RNG states, an HF "
                    "Trainer's trainer_state.json beside it), tensors (name, dtype, shape, "
                    "size), totals by dtype, other values and the globals kept as inert "
                    "records. Long lists end with a line saying how many more --all shows.",
        epilog="examples:\n  torchless inspect model.pt\n  torchless inspect model.pt --json\n"
               "  torchless inspect model.pt --tree --filter '*.weight'\n"
               "  torchless inspect model.pt --html -o report.html\n"
               "  torchless inspect https://example.org/model.pt   # a few range requests\n"
               "  torchless inspect ./checkpoints/ -j 4            # one line per file\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ins.add_argument("file", nargs="+",
                     help="checkpoint file (.pt, .pth, .bin, .ckpt, .tar …) or URL; several "
                          "files or directories give one summary line (or JSON line) each")
    ins.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                     help="with several files: inspect them in N worker processes")
    ins.add_argument("--json", action="store_true", help="print a JSON document")
    ins.add_argument("--all", action="store_true",
                     help="list every tensor and value (default: the first 100 of each, and "
                          "a line saying how many more)")
    ins.add_argument("--tree", action="store_true",
                     help="print the saved object as an indented tree with tensor shapes")
    ins.add_argument("--filter", metavar="GLOB",
                     help="only the tensors whose flat name matches GLOB (e.g. "
                          "'model.layers.*.weight'); with --tree, the branches that lead to "
                          "them")
    ins.add_argument("--html", action="store_true",
                     help="write a self-contained HTML report (sortable tensor table, "
                          "treemap of bytes by module, dtype totals, scan verdict) to -o FILE")
    ins.add_argument("-o", "--output", metavar="FILE", help="with --html: the page to write")
    _add_reading(ins)
    conv = sub.add_parser(
        "convert", help="write a checkpoint's tensors as a safetensors file",
        description="Convert a torch checkpoint to safetensors: exact bytes, every tensor "
                    "contiguous and little-endian, written atomically (temporary file, fsync, "
                    "rename). Shared tensors are written once per name unless --dedupe.",
        epilog=_CONVERT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    conv.add_argument("src", nargs="+",
                      help="checkpoint file, Hugging Face model directory or *.bin.index.json "
                           "(several: each to its default output)")
    conv.add_argument("-o", "--output", metavar="DST",
                      help="output file, or output directory for a model directory (default: "
                           "SRC with the suffix .safetensors / SRC's directory); one SRC only")
    conv.add_argument("--max-shard-size", metavar="SIZE",
                      help="split the output into shards of at most SIZE tensor bytes "
                           "(5GB = 5*10^9, 500MB, 1GiB = 2^30, or bytes) with an index")
    conv.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                      help="convert several SRC in N worker processes (default 1)")
    conv.add_argument("--report", metavar="FILE",
                      help="with several SRC: append one JSON line per file to FILE")
    conv.add_argument("--key", metavar="K",
                      help="convert only the subtree under this dotted key (e.g. state_dict)")
    conv.add_argument("--force", action="store_true", help="replace an existing DST")
    conv.add_argument("--dedupe", action="store_true",
                      help="write identical aliases once; record the others in __metadata__")
    conv.add_argument("--skip-unsupported", action="store_true",
                      help="leave out tensors safetensors cannot hold (complex128 …)")
    conv.add_argument("--verify", action="store_true",
                      help="re-read both files afterwards and compare every tensor")
    conv.add_argument("--copy-files", action="store_true",
                      help="model directory to -o DIR: copy its other files (config.json, "
                           "tokenizer …) instead of hard-linking them")
    conv.add_argument("--weights-only", action="store_true",
                      help="write the tensors only, not the rest of the object (epochs, "
                           "optimizer state, configs …) as an inert tree")
    _add_reading(conv)
    conv.add_argument("--json", action="store_true", help="print a JSON summary")
    ver = sub.add_parser(
        "verify", help="compare a checkpoint with a safetensors file",
        description="Compare every tensor of a torch checkpoint with a safetensors file by "
                    "dtype, shape and bytes. Exit 0 only on an exact match. SRC may be a "
                    "model directory or a *.bin.index.json, DST a directory or a "
                    "*.safetensors.index.json with its shards.",
        epilog=_VERIFY_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ver.add_argument("src", help="torch checkpoint, model directory or *.bin.index.json")
    ver.add_argument("dst", help="safetensors file, directory or *.safetensors.index.json")
    ver.add_argument("--key", metavar="K", help="compare only the subtree under this key")
    ver.add_argument("--skip-unsupported", action="store_true",
                     help="tensors safetensors cannot hold count as skipped, not missing (as "
                          "convert --skip-unsupported leaves them out)")
    _add_reading(ver)
    out = ver.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON report")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="print nothing: the exit code says it (0 exact match, 1 not)")
    sc = sub.add_parser(
        "scan", help="list what torch.load would do with files, without running anything",
        description="Scan checkpoints (files or directories, recursively; layout found from "
                    "the content): every action torch.load(weights_only=False) would take "
                    "(imports, calls, builds), judged by a vetted allowlist, and container "
                    "anomalies that make scanners and torch see different files. Every pickle "
                    "is walked, not only data.pkl. Exit 0 clean, 1 dangerous, anomalous or "
                    "unvetted, 2 unreadable.",
        epilog="examples:\n  torchless scan model.pt\n  torchless scan ./models/ --json\n"
               "  torchless scan model.ckpt --strict   # unvetted actions count as dangerous\n"
               "  torchless scan ./hub-cache/ -j 4     # in 4 worker processes\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sc.add_argument("paths", nargs="+", metavar="PATH", help="file or directory")
    sc.add_argument("--json", action="store_true", help="print a JSON report")
    _add_reading(sc, strict="count every action that is not vetted as dangerous")
    sc.add_argument("-v", "--verbose", action="store_true",
                    help="list every action (not only those not vetted) and skipped files")
    sc.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                    help="scan files in N worker processes (default 1)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # names in a file may hold anything, lone surrogates included: printed escaped, never
    # a crash of the printing
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        if _is_batch(args.src) and args.output is not None:
            parser.error("-o/--output takes a single SRC; several SRC (or a directory of "
                         "checkpoints) go to their default outputs")
        if not _is_batch(args.src) and args.report is not None:
            parser.error("--report writes one line per file for several SRC or a directory "
                         "of checkpoints; with one SRC, --json prints its summary")
    if args.command == "inspect":
        if args.html and not args.output:
            parser.error("--html writes a page: name it with -o FILE")
        if args.output and not args.html:
            parser.error("-o/--output goes with --html")
        if (args.html or args.tree) and (len(args.file) > 1 or os.path.isdir(args.file[0])):
            parser.error("--html and --tree take one checkpoint file")
    if vars(args).get("jobs", 1) < 1:
        parser.error("-j/--jobs must be at least 1")
    try:
        if args.command == "inspect" and (len(args.file) > 1 or (
                os.path.isdir(args.file[0]) and not _is_checkpoint_dir(args.file[0]))):
            return _run_inspect_many(args)
        if args.command == "inspect":
            return _run_inspect(args)
        if args.command == "convert":
            return _run_convert(args)
        if args.command == "verify":
            return _run_verify(args)
        elif args.command == "scan":
            return _run_scan(args)
        return 0
    except InternalError as e:
        print_bug(e)
        return 1
    except CheckpointError as e:
        print_error(str(e), e.hint)
        return 1
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:  # a file of ours (the --report file)
        where = f"{e.filename}: " if e.filename else ""
        print_error(f"{where}{e.strerror or e}",
                     "check that the path exists, is not a directory and that you may write "
                     "there")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("torchless: interrupted\n")
        return 130
    except Exception as e:  # a bug in the command itself
        bug = InternalError.wrap(e, f"running {args.command}")
        bug.__cause__ = e
        print_bug(bug)
        return 1


