"""JSON from a file, with its nesting bounded before it is parsed.

``json.loads`` recurses once per nested array or object, so ten thousand ``[`` raise
``RecursionError`` (or exhaust the C stack) instead of a parse error. :func:`loads` first
measures the nesting in linear time, without recursion: complete strings are cut out with
one regular expression (whatever brackets they hold are not structure), everything but
brackets is dropped, and the deepest prefix count of ``[{`` minus ``]}`` is taken by
``itertools.accumulate`` over the brackets as signed bytes (no NumPy: scanning a safetensors
file must not import it). Text after an unterminated string is not structure either: the
parser stops there.
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate
from typing import Any

from torchless.errors import FormatError, LimitError

__all__ = ["loads", "nesting"]

# the unrolled form: linear, no backtracking between its alternatives
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r'[^\[\]{}"]+')
#: An opening bracket counts 1, a closing one -1 (0xff as a signed byte).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar)."""
    structure = _NOT_BRACKET.sub("", _STRING.sub("", text)).split('"', 1)[0]
    steps = array("b", structure.encode("ascii").translate(_STEPS))
    return max(accumulate(steps, initial=0))


def loads(text: str, *, max_depth: int, what: str, **options: Any) -> Any:
    """``json.loads(text, **options)``, refusing nesting deeper than ``max_depth`` with a
    :class:`LimitError` before parsing. Invalid JSON raises ``ValueError`` as ``json`` does;
    a number of more digits than Python converts (4,300), valid JSON that ``json`` answers
    with a bare ``ValueError``, raises :class:`FormatError` (a ``ValueError`` too)."""
    depth = nesting(text)
    if depth > max_depth:
        raise LimitError("max_depth", max_depth, depth, f"nesting of {what}")
    try:
        return json.loads(text, **options)
    except RecursionError:  # a max_depth raised beyond what the parser's stack allows
        raise LimitError("max_depth", max_depth, depth,
                         f"nesting of {what}, deeper than Python's JSON parser can go"
                         ) from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # int(): past sys.get_int_max_str_digits() digits
        raise FormatError(f"{what} holds a number Python cannot read: {e}",
                          hint="no writer puts a number of thousands of digits in a header: "
                               "the file was edited or is damaged; fetch it again") from None
