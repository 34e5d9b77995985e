"""The two lines every error prints (and the traceback a bug report needs): kept apart from
the rest of what the command line shows, so that printing an error loads nothing else."""

from __future__ import annotations

import sys

from torchless.core.text import printable
from torchless.errors import InternalError

__all__ = ["print_bug", "print_error"]


def print_error(error: str | None, hint: str | None) -> None:
    # one line each, whatever names from the file hold
    for label, text in (("error", error), ("hint", hint)):
        if text:
            sys.stderr.write(f"torchless: {label}: {printable(text)}\n")


def print_bug(e: InternalError) -> None:
    """The traceback a bug report needs, then the error and hint lines as for any error."""
    import traceback

    cause = e.__cause__ if e.__cause__ is not None else e
    for line in "".join(traceback.format_exception(cause)).splitlines():
        sys.stderr.write(printable(line) + "\n")
    print_error(str(e), e.hint)
