"""MkDocs hook: the command-line reference is generated from torchless's own parser."""

from __future__ import annotations

import argparse
from typing import Any

MARKER = "<!-- cli-reference -->"


def _reference() -> str:
    from torchless.cli.parser import build_parser

    parser = build_parser()
    parser.prog = "torchless"
    parts = ["```text", parser.format_help().rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.prog = f"torchless {name}"
                parts += ["", f"## `torchless {name}`", "", "```text",
                          sub.format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, _reference()) if MARKER in markdown else markdown
