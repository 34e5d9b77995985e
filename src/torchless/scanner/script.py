"""What the code of a TorchScript archive calls, read as text.

``torch.jit.load`` (and ``torch.load`` of a TorchScript archive with
``weights_only=False``) compiles the Python-like text in ``code/`` and runs some of it while
loading: every ``__setstate__`` of a scripted class runs as its object is unpickled. That
code can call any operator torch has, and some of them touch files or the network:
``torch.from_file(name, shared=True, size)`` creates and maps a file, ``torch.save`` writes
one, ``rpc_async`` talks to another process. The pickles of the archive show none of this.

Here each ``code/**/*.py`` member is read as text (never compiled or run): string literals
are blanked, then every call of a dotted name under ``torch.`` or ``ops.`` and every call of
the few bare builtins that reach outside the process is listed, as the operator it names
(``aten::from_file``, ``myns::op``, ``class myns.Thing``). What this cannot prove is said in
``docs/scan.md``: it lists what the text names, not what runs, and it cannot know what a
custom operator or class from a native library does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DANGEROUS", "KNOWN_NAMESPACES", "ScriptCall", "script_calls"]

#: Operators that read, write or map files, or reach other processes, with the reason.
DANGEROUS: dict[str, str] = {
    "aten::from_file": "creates, reads and maps a file (torch.from_file)",
    "aten::save": "writes a file (torch.save inside TorchScript code)",
    "aten::load": "reads a file (torch.load inside TorchScript code)",
    "aten::_load_for_mobile": "reads a file",
    "prim::rpc_async": "calls another process over RPC",
    "prim::rpc_sync": "calls another process over RPC",
    "prim::rpc_remote": "calls another process over RPC",
    "aten::to_here": "fetches a value from another process over RPC",
}
#: Operator namespaces that ship with torch and its domain libraries, whose operators
#: compute on tensors; an operator from any other namespace comes from a native library
#: the loading process must have loaded, and what it does cannot be read from the file.
KNOWN_NAMESPACES = frozenset({"aten", "prim", "quantized", "_quantized", "quantized_decomposed",
                              "torchvision", "torchaudio", "_caffe2", "profiler"})

_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
# the word first, then the look back at what precedes it (``(?<![\w.])torch`` is the same
# set of matches, but a pattern that opens with a look-behind is tried at every character)
_CALL = re.compile(r"((?:torch(?<![\w.]torch)|ops(?<![\w.]ops))(?:\s*\.\s*\w+)+)\s*\(")
_BARE = re.compile(r"(?<![\w.])(?<!def )(rpc_async|rpc_sync|rpc_remote|remote)\s*\(")
_SPACE = re.compile(r"\s+")
#: String literals and calls looked for where ``str.find`` finds their first characters
#: (:func:`_matches`), not by the patterns' own search (the shortcut tests switch it off).
QUOTES_BY_FIND = True
#: Every name _BARE matches holds one of these (code without them is not searched).
_BARE_WORDS = ("remote", "rpc_")
_BARE_OPS = {"rpc_async": "prim::rpc_async", "rpc_sync": "prim::rpc_sync",
             "rpc_remote": "prim::rpc_remote", "remote": "prim::rpc_remote"}


@dataclass(frozen=True)
class ScriptCall:
    """One call the code names: the operator (``aten::linear``, ``myns::op``, ``class
    myns.Thing``), where its text starts in the member, and why it matters (empty for an
    operator that only computes on tensors; ``unknown`` set for custom code)."""

    op: str
    offset: int
    danger: str = ""
    unknown: bool = False


def _blank_strings(text: str) -> str:
    """The text with every string literal's body blanked (offsets kept), so that a call
    spelled inside a string is not counted."""
    if not QUOTES_BY_FIND:
        return _STRING.sub(lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) +
                           m.group(0)[0], text)
    pieces: list[str] = []
    last = 0
    for m in _matches(text, ("'", '"'), _STRING.match):
        start, end = m.span()
        pieces += (text[last:start + 1], " " * (end - start - 2))
        last = end - 1
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def _matches(text: str, words: tuple[str, str],
             match: Callable[[str, int], re.Match[str] | None]) -> list[re.Match[str]]:
    """What ``pattern.finditer(text)`` finds, for a pattern whose every match starts
    with one of ``words``: tried only where ``str.find`` finds one (a regular expression
    that starts with a choice is tried at every character, many times slower)."""
    out = []
    find = text.find
    a, b = (find(w) for w in words)
    while a >= 0 or b >= 0:
        at = b if a < 0 or 0 <= b < a else a
        m = match(text, at)
        nxt = at + 1 if m is None else m.end()
        if m is not None:
            out.append(m)
        if 0 <= a < nxt:
            a = find(words[0], nxt)
        if 0 <= b < nxt:
            b = find(words[1], nxt)
    return out


@functools.lru_cache(maxsize=1024)
def _operator(dotted: str) -> tuple[str, bool]:
    """The operator a dotted call names, and whether it comes from outside torch."""
    parts = dotted.split(".")
    if parts[0] == "torch" and len(parts) > 2 and parts[1] == "ops":
        parts = parts[1:]
    if parts[0] == "ops" and len(parts) >= 3:
        return f"{parts[1]}::{'.'.join(parts[2:])}", parts[1] not in KNOWN_NAMESPACES
    if parts[0] == "torch" and len(parts) >= 4 and parts[1] == "classes":
        return f"class {parts[2]}.{'.'.join(parts[3:])}", True
    if parts[0] == "torch" and len(parts) == 2:
        return f"aten::{parts[1]}", False
    return dotted, False


def script_calls(text: str) -> list[ScriptCall]:
    """Every call of an operator the code text names, in text order."""
    clean = _blank_strings(text)
    out: list[ScriptCall] = []
    calls = _matches(clean, ("torch", "ops"), _CALL.match) if QUOTES_BY_FIND else \
        _CALL.finditer(clean)
    for m in calls:
        op, unknown = _operator(_SPACE.sub("", m.group(1)))
        danger = DANGEROUS.get(op, "")
        out.append(ScriptCall(op, m.start(), danger, unknown and not danger))
    if any(word in clean for word in _BARE_WORDS):
        for m in _BARE.finditer(clean):
            op = _BARE_OPS[m.group(1)]
            out.append(ScriptCall(op, m.start(), DANGEROUS[op]))
        out.sort(key=lambda c: c.offset)
    return out
