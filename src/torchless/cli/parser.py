"""The ``torchless`` command's options: one argparse parser, the reading options every
command shares (one vocabulary with the Python API), the examples each command shows and
the exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from torchless._version import __version__
from torchless.core.limits import Limits

__all__ = ["EXIT_DANGER", "EXIT_FAILED", "EXIT_NOTHING", "EXIT_OK", "EXIT_UNREADABLE",
           "EXIT_USAGE", "EXIT_CODES", "COMMANDS", "Parser", "build_parser"]

#: Every command: it did what was asked (scan: every file clean).
EXIT_OK = 0
#: A file was refused or a step failed (scan: a file is dangerous, anomalous or unvetted).
EXIT_FAILED = EXIT_DANGER = 1
#: scan: a file could not be read (and none is dangerous).
EXIT_UNREADABLE = 2
#: A directory named holds no checkpoint: nothing to read, convert or scan.
EXIT_NOTHING = 3
#: The command line itself is wrong (an unknown option, options that do not go together).
EXIT_USAGE = 4
#: The exit codes as the help and the docs list them.
EXIT_CODES = """\
exit codes:
  0  done (scan: every file clean)
  1  a file refused or a step failed (scan: a file dangerous, anomalous or unvetted)
  2  scan: a file unreadable (none dangerous)
  3  nothing to do: a directory with no checkpoint in it
  4  usage: the command line is wrong
"""


class Parser(argparse.ArgumentParser):
    """argparse's parser with its own exit code for usage errors (argparse's 2 is taken:
    scan's "unreadable"). Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

_EXAMPLES = """\
examples:
  torchless inspect model.pt
  torchless inspect model.pt --json | jq '.files[0].tensors[].name'
  torchless inspect checkpoint.ckpt --strict
  torchless convert model.pt                 # writes model.safetensors
  torchless verify model.pt model.safetensors
  torchless scan ./models/

""" + EXIT_CODES

_CONVERT_EXAMPLES = """\
examples:
  torchless convert model.pt                      # writes model.safetensors beside it
  torchless convert model.ckpt -o out.safetensors --key state_dict
  torchless convert pytorch_model.bin --dedupe --verify --json
  torchless convert ./my-model/                   # pytorch_model*.bin -> model*.safetensors
  torchless convert ./my-model/ --max-shard-size 5GB -o ./out/
  torchless convert a.pt b.pt c.pt -j 3 --json    # each to its default output
  torchless convert ./runs/ -j 4 --report run.jsonl --skip-existing  # re-runs: only what is left
  torchless convert ckpt.pt --no-tree               # tensors only, no object tree
  torchless convert https://example.org/model.pt    # streamed by range requests
  torchless convert model.ckpt -o net.safetensors --key state_dict --rename s/^/net./
  torchless convert model.pt -o signed.safetensors --certificate  # + every tensor's digest
"""

_VERIFY_EXAMPLES = """\
examples:
  torchless verify model.pt model.safetensors
  torchless verify model.ckpt out.safetensors --key state_dict --json
  torchless verify ./my-model/ ./out/             # every shard, and the output index
  torchless verify -q model.pt model.safetensors  # nothing printed: the exit code says
  torchless verify --certificate signed.safetensors           # the output alone
  torchless verify --certificate signed.safetensors model.pt  # and against its source
"""


class _Deprecated(argparse.Action):
    """An old spelling of an option: it still sets ``dest`` to ``const``, and says the new
    spelling on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, const: Any, new: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, const=const, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stderr.write(f"torchless: warning: {option_string} is deprecated: say "
                         f"{self.new} (the same meaning)\n")
        setattr(namespace, self.dest, self.const)


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


def _add_dtype(parser: argparse.ArgumentParser, what: str) -> None:
    """--dtype and --dtype-filter, the same for convert and verify."""
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help=what)
    parser.add_argument("--dtype-filter", action="append", default=[], metavar="GLOB",
                        help="with --dtype: cast only the tensors whose flat name matches "
                             "GLOB (repeatable)")


def _add_reading(parser: argparse.ArgumentParser, *, strict: str | None = None) -> None:
    """The options every command that reads a checkpoint shares (one vocabulary with the
    Python API: strict, allow_globals, verify_crc, allow_full_download, limits)."""
    parser.add_argument("--strict", action="store_true",
                        help=strict or "refuse every global outside the rebuild rules")
    _add_allow_global(parser)
    parser.add_argument("--verify-crc", action="store_true",
                        help="check the CRC-32 of every tensor's archive member as it is read")
    parser.add_argument("--download", "--allow-full-download", action="store_true",
                        dest="download",
                        help="a URL on an HTTP server that ignores Range requests: download "
                             "the whole file (to an unnamed temporary file) whatever its "
                             "size; without it, up to 64 MiB (--limit max_download_bytes=N) "
                             "is downloaded and a larger file refused")
    _add_limit(parser)


def _add_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", action="append", default=[], type=_limit, metavar="NAME=N",
        help="raise (or lower) a resource limit for a file you trust, e.g. --limit "
             "max_tensors=2000000 (repeatable; NAME: a field of torchless.Limits)")


def _rename_rule(text: str) -> str:
    """``--rename``: checked here, so a bad rule is a usage error (convert parses it again)."""
    from torchless.conversion.select import substitution
    from torchless.errors import ConversionError

    try:
        substitution(text)
    except ConversionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _add_selection(parser: argparse.ArgumentParser) -> None:
    """convert's and verify's choice of tensors and names (torchless.conversion.select)."""
    parser.add_argument("--include", action="append", metavar="GLOB",
                        help="only the tensors whose flat name (after --key) matches GLOB "
                             "('*' matches dots too; repeatable: any of them)")
    parser.add_argument("--exclude", action="append", metavar="GLOB",
                        help="leave out the tensors whose name matches GLOB (repeatable)")
    parser.add_argument("--strip-prefix", metavar="PREFIX",
                        help="remove PREFIX from the names that start with it")
    parser.add_argument("--rename", action="append", type=_rename_rule,
                        metavar="s/REGEX/REPL/",
                        help="rename by a regex, sed style ('g' after it: every match); "
                             "repeatable, applied in order after --strip-prefix; two "
                             "tensors given one name are refused")
    parser.add_argument("--ema", action="store_true",
                        help="the EMA weights under the model's names (Stable Diffusion "
                             "model_ema, timm state_dict_ema, ultralytics ema), before "
                             "--key; a weight with no EMA twin is refused")


def _add_tag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-t", "--tag", metavar="TAG",
                        help="of a DeepSpeed run directory: the save to read (global_stepN, "
                             "as zero_to_fp32's -t; default: the one its latest file names)")


def _add_quiet(group: argparse._MutuallyExclusiveGroup, text: str) -> None:
    group.add_argument("-q", "--quiet", action="store_true",
                       help=text + "; TORCHLESS_QUIET=1 in the environment does the same")


#: The commands, in the order ``torchless -h`` lists them.
COMMANDS = ("inspect", "convert", "verify", "scan")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (one of :data:`COMMANDS`), only that
    command's arguments are added (every command is listed, with its help): the parser of
    the command being run, without building the others' arguments."""
    every = command is None
    p = Parser(
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
                    "records. Long lists end with a line saying how many more --all shows. "
                    "A model directory (an index and its shards, .bin or safetensors, or "
                    "one weights file: what convert writes, what save_pretrained writes) "
                    "is one model, in every view; a DCP directory is one checkpoint.",
        epilog="examples:\n  torchless inspect model.pt\n  torchless inspect model.pt --json\n"
               "  torchless inspect model.pt --tree --filter '*.weight'\n"
               "  torchless inspect model.pt --html -o report.html\n"
               "  torchless inspect ./my-model/                    # one model, its shards\n"
               "  torchless inspect https://example.org/model.pt   # a few range requests\n"
               "  torchless inspect ./checkpoints/ -j 4            # one line per file\n"
               "  torchless inspect a.pt b.pt --jsonl              # one JSON line per file\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    if every or command == "inspect":
        ins.add_argument("file", nargs="+",
                         help="checkpoint file (.pt, .pth, .bin, .ckpt, .tar …) or URL; several "
                              "files or directories give one summary line (or JSON line) each")
        ins.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                         help="with several files: inspect them in N worker processes")
        out = ins.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true",
                         help="print one JSON document: {\"files\": [...]}, an entry per file "
                              "(one for one file)")
        out.add_argument("--jsonl", action="store_true",
                         help="print JSON lines: one entry per file, as each is read")
        _add_quiet(out, "print nothing on success (the exit code says whether every file reads)")
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
        ins.add_argument("--force", action="store_true",
                         help="with -o: replace an existing FILE (never the checkpoint itself)")
        _add_tag(ins)
        _add_reading(ins)
    conv = sub.add_parser(
        "convert", help="write a checkpoint's tensors as a safetensors file",
        description="Convert a torch checkpoint to safetensors: exact bytes, every tensor "
                    "contiguous and little-endian, written atomically (temporary file, fsync, "
                    "rename). Shared tensors are written once per name unless --dedupe (a "
                    "model directory: tied weights once, unless --no-dedupe). An "
                    "existing output is refused unless --force, or kept with "
                    "--skip-existing when it verifies against its SRC; a SRC is never its "
                    "own output. On a terminal a progress line shows bytes (files, for "
                    "several SRC), %, rate and time left: -q or TORCHLESS_PROGRESS=0 turns it off.",
        epilog=_CONVERT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    if every or command == "convert":
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
        conv.add_argument("--force", action="store_true",
                          help="replace an existing DST (never SRC itself)")
        conv.add_argument("--skip-existing", action="store_true",
                          help="keep an existing DST that verifies against its SRC and write "
                               "nothing for it (a re-run of several SRC); one that does not "
                               "verify is refused (replaced with --force)")
        conv.add_argument("--dedupe", action=argparse.BooleanOptionalAction, default=None,
                          help="write identical aliases once; record the others in __metadata__ "
                               "(default: on for a model directory or an index, as transformers "
                               "writes them; --no-dedupe writes every name)")
        conv.add_argument("--skip-unsupported", action="store_true",
                          help="leave out tensors safetensors cannot hold (complex128 …)")
        conv.add_argument("--verify", action="store_true",
                          help="re-read both files afterwards and compare every tensor")
        conv.add_argument("--certificate", action=argparse.BooleanOptionalAction, default=False,
                          help="record a certificate in each output's __metadata__: the source "
                               "(path or URL, size, sha256 or ETag), the transforms and every "
                               "tensor's BLAKE2b digests, checked by verify --certificate "
                               "(default: off; hashing reads every byte, docs/certificate.md)")
        conv.add_argument("--link-files", action=argparse.BooleanOptionalAction, default=True,
                          help="model directory to -o DIR: hard-link its other files "
                               "(config.json, tokenizer …) there (default); --no-link-files "
                               "copies them (link_files=False)")
        conv.add_argument("--copy-files", action=_Deprecated, dest="link_files", const=False,
                          new="--no-link-files", help="deprecated spelling of --no-link-files")
        conv.add_argument("--tree", action=argparse.BooleanOptionalAction, default=True,
                          help="write the rest of the object (epochs, optimizer state, configs "
                               "…) as an inert tree beside the tensors (default); --no-tree "
                               "writes the tensors only (tree=False; implied by the selection "
                               "options below)")
        conv.add_argument("--weights-only", action=_Deprecated, dest="tree", const=False,
                          new="--no-tree", help="deprecated spelling of --no-tree (not torch's "
                                                "weights_only, which is about what unpickling "
                                                "may call)")
        _add_selection(conv)
        _add_dtype(conv, "cast floating tensors to this dtype as they are written, bit for bit "
                         "as torch's tensor.to(dtype); integer and bool tensors are kept")
        _add_tag(conv)
        _add_reading(conv)
        out = conv.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="print a JSON summary")
        _add_quiet(out, "print no progress and no summary (errors still go to stderr)")
    ver = sub.add_parser(
        "verify", help="compare a checkpoint with a safetensors file",
        description="Compare every tensor of a torch checkpoint with a safetensors file by "
                    "dtype, shape and bytes. Exit 0 only on an exact match. SRC may be a "
                    "model directory or a *.bin.index.json, DST a directory or a "
                    "*.safetensors.index.json with its shards.",
        epilog=_VERIFY_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    if every or command == "verify":
        ver.add_argument("src", help="torch checkpoint, model directory or *.bin.index.json "
                                     "(with --certificate: the output, OUT)")
        ver.add_argument("dst", nargs="?",
                         help="safetensors file, directory or *.safetensors.index.json (with "
                              "--certificate: the source, SRC, optional)")
        ver.add_argument("--certificate", action="store_true",
                         help="verify --certificate OUT [SRC]: check OUT against the certificate "
                              "convert --certificate wrote in it (every tensor's digest); with "
                              "SRC, re-derive every digest from the source as well")
        ver.add_argument("--key", metavar="K", help="compare only the subtree under this key")
        ver.add_argument("--skip-unsupported", action="store_true",
                         help="tensors safetensors cannot hold count as skipped, not missing (as "
                              "convert --skip-unsupported leaves them out)")
        _add_dtype(ver, "expect SRC's floating tensors cast to this dtype (as convert --dtype "
                        "casts them)")
        _add_selection(ver)
        _add_tag(ver)
        _add_reading(ver)
        out = ver.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="print a JSON report")
        _add_quiet(out, "print nothing: the exit code says it (0 exact match, 1 not)")
    sc = sub.add_parser(
        "scan", help="list what torch.load would do with files, without running anything",
        description="Scan checkpoints (files or directories, recursively; layout found from "
                    "the content): every action torch.load(weights_only=False) would take "
                    "(imports, calls, builds), judged by a vetted allowlist, and container "
                    "anomalies that make scanners and torch see different files. Every pickle "
                    "is walked, not only data.pkl. Exit 0 clean, 1 dangerous, anomalous or "
                    "unvetted, 2 unreadable, 3 nothing to scan.",
        epilog="examples:\n  torchless scan model.pt\n  torchless scan ./models/ --json\n"
               "  torchless scan sharded/pytorch_model.bin.index.json  # the index, its shards\n"
               "  torchless scan model.ckpt --strict   # unvetted actions count as dangerous\n"
               "  torchless scan ./hub-cache/ -j 4     # in 4 worker processes\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    if every or command == "scan":
        sc.add_argument("paths", nargs="+", metavar="PATH", help="file or directory")
        out = sc.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="print a JSON report")
        _add_quiet(out, "print nothing: the exit code says it (0 clean, 1 dangerous …)")
        _add_reading(sc, strict="count every action that is not vetted as dangerous")
        sc.add_argument("-v", "--verbose", action="store_true",
                        help="list every action (not only those not vetted) and skipped files")
        sc.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="scan files in N worker processes (default 1)")
    return p
