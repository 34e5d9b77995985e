"""Text taken from a file, made safe to print on a terminal."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["line_writer", "printable"]

# C0 and C1 controls (line breaks, carriage return, ESC of terminal sequences, DEL), Unicode
# line separators and the bidirectional marks and overrides ("Trojan Source" reordering)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """``text`` with control characters written as ``\\xNN`` / ``\\uNNNN`` escapes, so a name
    from a file cannot start a line of its own, move the cursor, recolour or clear the
    screen, or reorder what is shown."""
    return _UNSAFE.sub(_escape, text)


def line_writer(out: Any) -> Callable[[str], None]:
    """A ``write`` for text made of whole lines: each call is one line (with any newlines
    before and after it), so a newline or control character inside it came from a file and
    is escaped."""

    def write(text: str) -> None:
        body = text.strip("\n")
        start = text.index(body) if body else len(text)
        out.write(text[:start] + printable(body) + text[start + len(body):])

    return write
