"""Which tensors a conversion writes, and under which names: ``include``, ``exclude``,
``strip_prefix``, ``rename`` and ``ema`` (:mod:`.ema`).

Every step works on the flat names of :attr:`Checkpoint.tensors` (the one naming of
:mod:`torchless.model.walk`), in this order:

1. ``ema``: the EMA copy's weights under the model's names (:mod:`.ema`), on the whole
   checkpoint, so that ``key`` can then pick the model;
2. ``key``: the subtree under that dotted key, its names relative to it;
3. ``include`` / ``exclude``: a name is kept when it matches an ``include`` (any, when
   there are several; every name when there is none) and no ``exclude``. A pattern is a
   glob matched by :func:`fnmatch.fnmatchcase` on the whole name (``*`` matches dots too,
   as ``inspect --filter`` does), or a callable ``name -> bool``;
4. ``strip_prefix``: removed from the names that start with it (refused when none does:
   a flag that would do nothing is a mistake, not a choice);
5. ``rename``: each rule in order, the output of one the input of the next. A rule is a
   callable ``name -> name`` or sed's ``s/REGEX/REPL/`` (any delimiter not a letter,
   digit, backslash or space: ``s|a|b|``; the delimiter escaped with a backslash stands
   for itself, a literal character; REGEX is Python :mod:`re` syntax, REPL
   :func:`re.sub`'s (``\\1``, ``\\g<name>``); as in sed, the first match is replaced,
   every match with the flag ``g``).

The result maps each output name to the source name it is read from. Two source names
that end as one output name are refused, both named, before any output is opened; so is an
empty name and a selection that leaves no tensor. Unsupported tensors (refused, or
skipped with ``skip_unsupported``) are named by the same steps.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from torchless.errors import ConversionError

__all__ = ["NamePattern", "RenameRule", "Selection", "Shape", "substitution"]

#: an ``include`` / ``exclude`` pattern: a glob, or a predicate on flat names
NamePattern = str | Callable[[str], bool]
#: a ``rename`` rule: ``s/REGEX/REPL/[g]``, or a function of a flat name
RenameRule = str | Callable[[str], str]
#: a tensor's shape (None: an unsupported tensor, whose shape is not read)
Shape = tuple[int, ...] | None

_SHOWN = 10
_HINT = ("`torchless inspect FILE` lists the flat names the patterns see (after --key, "
         "before the renames)")


def substitution(rule: str) -> Callable[[str], str]:
    """sed's ``s/REGEX/REPL/[g]`` as a function of a name (module docstring)."""
    if len(rule) < 4 or rule[0] != "s" or rule[1].isalnum() or rule[1] in "\\ \t\n":
        raise ConversionError(f"a rename rule is s/REGEX/REPL/ (or s|REGEX|REPL|), not "
                              f"{rule!r}", hint="e.g. --rename 's/^model\\./encoder./'")
    delim, i = rule[1], 2
    parts: list[str] = []
    current: list[str] = []
    while i < len(rule):
        c = rule[i]
        if c == "\\" and i + 1 < len(rule):
            literal = re.escape(delim) if not parts else delim  # REGEX: escaped for re
            current.append(literal if rule[i + 1] == delim else rule[i:i + 2])
            i += 2
            continue
        if c == delim:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    if len(parts) != 2 or current not in ([], ["g"]):
        raise ConversionError(f"cannot read the rename rule {rule!r}: expected "
                              f"s{delim}REGEX{delim}REPL{delim} with at most the flag g "
                              "after it", hint="escape the delimiter inside REGEX or REPL "
                                               f"as \\{delim}, or use another delimiter")
    try:
        regex = re.compile(parts[0])
        regex.sub(parts[1], "")  # a bad group reference is refused here, not mid-way
    except (re.error, IndexError) as e:
        raise ConversionError(f"the rename rule {rule!r}: {e}") from None
    count = 0 if current else 1

    def rename(name: str) -> str:
        return regex.sub(parts[1], name, count=count)

    return rename


def _glob(pattern: str) -> Callable[[str], bool]:
    def match(name: str) -> bool:
        return fnmatch.fnmatchcase(name, pattern)

    return match


_F = TypeVar("_F", bound=Callable[[str], object])


def _labelled(value: object, what: str, parse: Callable[[str], _F],
              expected: str) -> tuple[tuple[str, _F], ...]:
    """Each pattern of ``value`` (one or many) as (how messages name it, its function): a
    string is parsed, a callable is used as it is."""
    out: list[tuple[str, _F]] = []
    for p in _many(value):
        if isinstance(p, str):
            out.append((f"'{p}'", parse(p)))
        elif callable(p):
            out.append((repr(p), cast(_F, p)))
        else:
            raise ConversionError(f"{what}: expected {expected}, not {type(p).__name__}")
    return tuple(out)


def _many(value: object) -> list[object]:
    if value is None:
        return []
    if isinstance(value, str) or callable(value):
        return [value]
    if isinstance(value, Iterable):
        return list(value)
    raise ConversionError(f"expected a pattern, a callable or a list of them, not "
                          f"{type(value).__name__}")


@dataclass(frozen=True)
class Selection:
    """The steps of the module docstring, parsed (bad patterns refused before any file is
    opened). :meth:`of` gives None when nothing is asked."""

    #: (how it was given, the predicate)
    include: tuple[tuple[str, Callable[[str], bool]], ...] = ()
    exclude: tuple[tuple[str, Callable[[str], bool]], ...] = ()
    strip_prefix: str | None = None
    #: (how it was given, the function)
    rename: tuple[tuple[str, Callable[[str], str]], ...] = ()
    ema: bool = False

    @classmethod
    def of(cls, include: NamePattern | Iterable[NamePattern] | None = None,
           exclude: NamePattern | Iterable[NamePattern] | None = None,
           rename: RenameRule | Iterable[RenameRule] | None = None,
           strip_prefix: str | None = None, ema: bool = False) -> Selection | None:
        rules = _labelled(rename, "rename", substitution, "s/REGEX/REPL/ or a callable")
        if strip_prefix == "":
            raise ConversionError("strip_prefix is empty", hint="give the prefix to remove, "
                                  "e.g. --strip-prefix model.")
        found = cls(_labelled(include, "include", _glob, "a glob or a callable"),
                    _labelled(exclude, "exclude", _glob, "a glob or a callable"),
                    strip_prefix, rules, bool(ema))
        return None if found == cls() else found

    def apply(self, names: Mapping[str, str], path: str | None) -> dict[str, str]:
        """Steps 3-5 on ``names`` (output name -> source name, after ``key``)."""
        kept = {n: s for n, s in names.items()
                if (not self.include or any(_call(p, n, "include") for p in self.include))
                and not any(_call(p, n, "exclude") for p in self.exclude)}
        if not kept:
            raise ConversionError(
                f"no tensor name is left by the selection (of {len(names)}: "
                f"{_some(names)})", path=path, hint=_HINT)
        if self.strip_prefix is not None:
            prefix = self.strip_prefix
            if not any(n.startswith(prefix) for n in kept):
                raise ConversionError(f"no tensor name starts with the prefix {prefix!r} "
                                      f"(the names: {_some(kept)})", path=path, hint=_HINT)
            kept = {n.removeprefix(prefix): s for n, s in _unique(
                ((n.removeprefix(prefix), n, s) for n, s in kept.items()),
                f"stripping {prefix!r}", path).items()}
        for rule in self.rename:
            kept = _unique(((_renamed(rule, n), n, s) for n, s in kept.items()),
                           f"the rename {rule[0]}", path)
        return kept


def _call(pattern: tuple[str, Callable[[str], bool]], name: str, what: str) -> bool:
    label, f = pattern
    try:
        return bool(f(name))
    except Exception as e:  # a caller's function: its error, named, not a torchless bug
        raise ConversionError(f"the {what} {label} raised {type(e).__name__}: {e} on "
                              f"{name!r}") from e


def _renamed(rule: tuple[str, Callable[[str], str]], name: str) -> str:
    label, f = rule
    try:
        out = f(name)
    except Exception as e:
        raise ConversionError(f"the rename {label} raised {type(e).__name__}: {e} on "
                              f"{name!r}") from e
    if not isinstance(out, str) or not out:
        raise ConversionError(f"the rename {label} turns {name!r} into {out!r}, not a name",
                              hint="a tensor name is a non-empty string")
    return out


def _unique(triples: Iterable[tuple[str, str, str]], step: str,
            path: str | None) -> dict[str, str]:
    """new name -> source, refusing two names that become one (both named)."""
    out: dict[str, str] = {}
    before: dict[str, str] = {}
    clashes: list[str] = []
    for new, old, source in triples:
        if new in out:
            clashes.append(f"{before[new]!r} and {old!r} both become {new!r}")
        else:
            out[new], before[new] = source, old
    if clashes:
        more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        raise ConversionError(f"{step}: {'; '.join(clashes[:3])}{more}; nothing was "
                              "written", path=path,
                              hint="make the rules give every tensor its own name, or leave "
                                   "one of them out with --exclude")
    return out


def _some(names: Iterable[str]) -> str:
    listed = list(names)
    return ", ".join(repr(n) for n in listed[:_SHOWN]) + (" …" if len(listed) > _SHOWN
                                                           else "") or "(none)"
