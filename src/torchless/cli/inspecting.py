"""``inspect FILE``: the text report (summary first), ``--json``, ``--tree`` or an
``--html`` page (several files or a directory go through :mod:`torchless.api.batch`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from torchless.core.limits import Limits
from torchless.core.text import line_writer

__all__ = ["run_inspect"]


def run_inspect(args: argparse.Namespace, limits: Limits | None) -> int:
    """One file: text (summary first), --json, --tree or an --html page."""
    from torchless.cli.show import inspect_json, inspect_text
    from torchless.reader import checkpoint as _checkpoint

    ckpt = _checkpoint.open(args.file[0], strict=args.strict, allow_globals=args.allow_global,
                            limits=limits, verify_crc=args.verify_crc)
    with ckpt:
        if args.html:
            _write_html(args, inspect_json(ckpt, args.filter), limits)
        elif args.tree:
            import fnmatch

            from torchless.cli.tree import tree_text

            pattern = args.filter
            tree_text(ckpt.tree, sys.stdout, None if pattern is None else
                      lambda name: fnmatch.fnmatchcase(name, pattern))
        elif args.json:
            json.dump(inspect_json(ckpt, args.filter), sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            inspect_text(ckpt, sys.stdout, 10**9 if args.all else 100, args.filter)
    return 0


def _write_html(args: argparse.Namespace, doc: dict[str, Any], limits: Limits | None) -> None:
    """The report page, with the scan verdict, written whole or not at all."""
    import tempfile

    from torchless.cli.html import page
    from torchless.cli.show import human
    from torchless.scanner.files import scan

    found = scan(args.file[0], strict=args.strict, limits=limits,
                 allow_globals=args.allow_global).files
    verdict: dict[str, Any] = {"status": "unknown"}
    if found:
        f = found[0]
        verdict = {"status": f.status, "error": f.error,
                   "dangerous": [f"{g.module}.{g.name}" for g in f.dangerous],
                   "anomalies": [a.message for a in f.anomalies]}
    text = page(doc, verdict, human)
    dst = args.output
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dst)), prefix=".torchless-",
                               suffix=".html")
    try:
        # a name may hold a lone surrogate (a pickle's BINUNICODE allows it): escaped
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    line_writer(sys.stdout)(f"{dst}: report of {doc['tensor_count']} tensors, scan verdict "
                            f"{verdict['status']}\n")
