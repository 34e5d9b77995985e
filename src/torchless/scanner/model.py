"""The execution model: every action ``torch.load(weights_only=False)`` would take on a pickle.

A resolver for the inert interpreter (:class:`~torchless.pickle.machine.Machine`) that, instead
of rebuilding values, follows what CPython's unpickler inside ``torch.load`` would do and
records each step as an :class:`~torchless.scanner.report.Action`:

* **import**: ``GLOBAL``/``STACK_GLOBAL``/``INST`` import a module and read a name, as
  :func:`torchless.rules.findclass.find_class` states torch's resolution (storage names
  without an import in torch's own unpickler, an import in a plain ``pickle.load`` pass;
  ``torch.tensor`` to ``torch._tensor``; Python 2 names mapped below protocol 3);
* **call**: ``REDUCE``/``INST``/``OBJ`` call a value, ``NEWOBJ``/``NEWOBJ_EX`` call
  ``cls.__new__``; calls a vetted rule *forwards* (``copyreg._reconstructor``'s base,
  ``_rebuild_from_type_v2``'s func, a ``functools.partial``'s function, NumPy's RNG
  constructor callbacks, ``hmac``'s digestmod) are calls of their own;
* **build**: ``BUILD`` calls the object's ``__setstate__`` (or its ``__setattr__`` for slot
  state); **update**: ``APPEND``/``SETITEM``/``ADDITEMS`` on an object call its methods;
* **duck-typed calls**: a callable value the file hands on (in the value torch.load returns,
  or in what a callable is given) counts as called, where the callee's argument spec
  (``allowlist.SPECS``) says it calls that method of the value, or anywhere for a callee
  without a spec; an object remembers what it keeps (its *holders*) for such look-ups.

Each action gets a severity from :mod:`torchless.rules.allowlist`. Values stay symbolic: a
name is a :class:`Global`, a call's result an :class:`_Made` that remembers what made it
(so that a later call or BUILD on it is judged by its maker), a ``functools.partial``
remembers its function (a ``BUILD`` can swap it). Nothing is imported or called.
"""

from __future__ import annotations

from typing import Any

from torchless.core import dtypes as _dtypes
from torchless.pickle.opcodes import by_code
from torchless.pickle.values import Global, new_global
from torchless.rules.allowlist import (
    FORWARDS,
    SPECS,
    Severity,
    call_verdict,
    forwarded,
    import_verdict,
    method_verdict,
)
from torchless.rules.findclass import Failure, StorageName, find_class
from torchless.scanner.duck import DUCK_DEPTH, FORWARDING, INERT, DuckCalls, Made
from torchless.scanner.report import SEVERITY_ORDER, Action, ActionKind, new_action

__all__ = ["IMPORTS", "ActionLog", "Made", "Model", "imported", "static_args",
           "storage_verdict"]

_TEXT_CODECS = frozenset({"latin1", "latin-1", "iso-8859-1", "iso8859-1", "utf-8", "utf8",
                          "ascii"})
_TYPING = frozenset({"typing", "typing_extensions", "collections.abc", "builtins"})
#: The maker of what a 1-argument ``type(x)`` returns (a class: Py_TYPE(x)).
_TYPE_OF = "builtins.type()"
#: The maker of a union of classes (``int | None``: ``reduce(operator.or_, …)``).
_UNION = "types.UnionType"
#: Modules whose classes a ``types.GenericAlias`` may subscript in a vetted annotation
#: (``list[int]``, ``collections.OrderedDict[str, int]``): the alias keeps its origin, and
#: reads every attribute it does not have from it (and calling it calls the origin).
_ALIAS_ORIGINS = frozenset({*_TYPING, "collections"})
#: The classes of those modules whose lower-case names are classes (the others are
#: functions: ``eval``, ``collections.namedtuple``, ``typing.get_type_hints``).
_ALIAS_CLASSES = frozenset({"list", "dict", "tuple", "set", "frozenset", "type",
                            "defaultdict", "deque"})


def _alias_origin(base: Any) -> bool:
    """A class ``types.GenericAlias`` may keep in a vetted annotation: a builtin container
    class, a ``collections`` class, a typing or ``collections.abc`` form."""
    if not isinstance(base, Global) or base.module not in _ALIAS_ORIGINS or "." in base.name:
        return False
    if base.module in ("builtins", "collections"):
        return base.name in _ALIAS_CLASSES or (base.module == "collections"
                                               and base.name[:1].isupper())
    return base.name[:1].isupper()


_OR = frozenset({"operator.or_", "_operator.or_"})
_REDUCE = frozenset({"functools.reduce", "_functools.reduce"})
#: The calls :meth:`Model._annotating` judges.
_ANNOTATING = frozenset({"types.GenericAlias", *_OR, *_REDUCE})
#: The most values an annotation's key may hold (``Union[...]`` of that many classes).
_ANNOTATION_MAX = 256


def _annotation_key(key: Any) -> bool:
    """Whether subscripting a typing form with ``key`` runs only typing's own code: its
    ``__getitem__`` type-checks, compares and hashes each member (``_type_check``,
    ``_deduplicate``), so every member must be a name the file gives (a class or function:
    its metaclass's ``__eq__``/``__hash__``, its import judged on its own), a vetted typing
    result (``List[int]`` in ``Dict[str, List[int]]``), ``type(x)``'s class, or plain data
    (``Literal`` values, forward-reference strings: compiled, never run); lists and tuples of
    those (``Callable[[int], str]``)."""
    stack, seen = [key], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _ANNOTATION_MAX:
            return False
        if type(v) in (tuple, list):
            stack.extend(v)
        elif isinstance(v, Made):
            if not _annotation_made(v):
                return False
        elif not (isinstance(v, Global) or v is None or v is Ellipsis
                  or type(v) in (str, bytes, int, bool)):
            return False
    return True


def _annotation_made(v: Made) -> bool:
    """A vetted annotation made by a call: ``type(x)``'s class, a typing form or builtin
    class subscripted (``List[int]``, ``list[int]``), a union of classes."""
    if v.severity != "vetted":
        return False
    if v.maker == _TYPE_OF or v.maker == _UNION:
        return True
    return v.maker.endswith("[…]") and v.maker[:-3].rpartition(".")[0] in _ALIAS_ORIGINS


def _union_members(members: Any) -> bool:
    """Whether ``a | b | …`` of ``members`` runs only the language's and typing's own code:
    each is None, a class of ``builtins``/``typing`` (``type.__or__``, typing's ``__or__``)
    or a vetted annotation (``list[int] | None``); the union compares them (``__eq__``, as
    a subscript does)."""
    if type(members) not in (tuple, list) or not members or len(members) > _ANNOTATION_MAX:
        return False
    for m in members:
        if isinstance(m, Made):
            if not _annotation_made(m):
                return False
        elif not (m is None or (isinstance(m, Global) and m.module in _TYPING)):
            return False
    return True


#: Characters of a static argument rendering kept in a report.
_ARGS_MAX = 160
#: Actions listed one by one per stream; past this, those of one kind, target and severity
#: are counted on the first (a hostile stream may repeat a call a million times).
_MAX_LISTED = 1000


#: Characters of a maker's name: ``f()()()…`` past this is cut to one name.
_MAKER_MAX = 120


def _called(maker: str) -> str:
    """The maker's name of what calling an object made by ``maker`` returns, bounded: a file
    can call each result again (``f()()()…``, two bytes a call), and names growing with the
    chain would make the report quadratic in it; cut, the names repeat and are counted."""
    name = f"{maker}()"
    return name if len(name) <= _MAKER_MAX else f"{name[:_MAKER_MAX - 4]}…()"


def _plain(value: Any, depth: int = 2) -> bool:
    """A value of plain data (an Enum's value: scalars, or a tuple of them)."""
    if value is None or isinstance(value, (str, bytes, int, float, complex)):
        return True
    return depth > 0 and isinstance(value, (tuple, frozenset)) and len(value) <= 64 and \
        all(_plain(v, depth - 1) for v in value)


def _origin(value: Any) -> int | None:
    if isinstance(value, Global):
        return value.offset
    if isinstance(value, Made):
        return value.origin
    return None


def static_args(args: Any) -> str | None:
    """A short rendering of arguments the file spells out (None if none)."""
    text = _show(args, 4)
    return text if len(text) <= _ARGS_MAX else text[:_ARGS_MAX - 1] + "…"


def _show(value: Any, depth: int) -> str:
    kind = type(value)  # the plain types first, by their exact type (the commonest)
    if kind is str or kind is bytes:
        return repr(value[:80])
    if kind is int:
        bits = value.bit_length()
        return f"<int of {bits} bits>" if bits > 256 else repr(value)
    if kind is bool or kind is float or value is None:
        return repr(value)
    if kind is not tuple:  # a plain tuple is none of these
        if isinstance(value, Global):
            return value.path
        if isinstance(value, Made):
            return repr(value)
        if hasattr(value, "pid"):  # a persistent id: a storage of the archive
            return f"<storage {_show(value.pid, 1)}>"
        if isinstance(value, (str, bytes, int, float, complex)):
            return repr(value if not isinstance(value, (str, bytes)) or len(value) <= 80
                        else value[:80])
    if depth <= 0:
        return "…"
    if isinstance(value, tuple):
        inner = ", ".join([_show(v, depth - 1) for v in value[:8]])
        return f"({inner}{', …' if len(value) > 8 else ''}{',' if len(value) == 1 else ''})"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v, depth - 1) for v in value[:8]) + \
            (", …]" if len(value) > 8 else "]")
    if isinstance(value, dict):
        items = list(value.items())[:6]
        return "{" + ", ".join(f"{_show(k, 0)}: {_show(v, depth - 1)}" for k, v in items) + \
            (", …}" if len(value) > 6 else "}")
    return f"<{type(value).__name__}>"


class ActionLog:
    """Actions of one stream; vetted ones are counted per (kind, target), the others kept
    one by one."""

    def __init__(self, data: Any, member: str | None = None) -> None:
        self.data = data
        self.member = member
        self.actions: list[Action] = []
        self._vetted: dict[tuple[str, str], int] = {}
        self._counts: dict[int, int] = {}
        self.worst: dict[int, Severity] = {}  # per origin offset

    def add(self, kind: ActionKind, target: str, severity: Severity, reason: str, offset: int,
            origin: int | None, args: Any = None) -> None:
        if origin is not None:
            was = self.worst.get(origin)
            if was is None or SEVERITY_ORDER[severity] > SEVERITY_ORDER[was]:
                self.worst[origin] = severity
        actions = self.actions
        if severity == "vetted" or len(actions) >= _MAX_LISTED:
            key = (kind, target) if severity == "vetted" else (kind, f"{severity}:{target}")
            at = self._vetted.get(key)
            if at is not None:
                self._counts[at] = self._counts.get(at, 0) + 1  # repeats after the first
                return
            self._vetted[key] = len(actions)
        actions.append(new_action(kind, target, severity, reason, offset,
                                  _opcode(self.data, offset),
                                  static_args(args) if args is not None else None, origin,
                                  self.member))

    def finished(self) -> list[Action]:
        """The actions, each listed once with its count (1 unless counted)."""
        if not self._counts:
            return self.actions
        out = list(self.actions)
        for i, n in self._counts.items():
            out[i] = out[i].counted(n + 1)
        return out


def _opcode(data: Any, offset: int) -> str:
    if 0 <= offset < len(data):
        op = by_code(data[offset])
        if op is not None:
            return op.name
    return "?"


_STORAGE_NAME = "torch's find_class maps a storage name to its type without an import"


def storage_verdict(module: str, name: str, *, plain: bool = False) -> tuple[Severity, str] | None:
    """The verdict on a name torch's unpickler maps to a storage type without an import
    (None for any other name, which is an import: :func:`imported`). ``plain``: the stream
    is one torch reads with plain ``pickle.load``, where no name is a storage type."""
    if isinstance(find_class(module, name, 0, "plain" if plain else "torch"), StorageName):
        return "vetted", _STORAGE_NAME
    return None


def imported(module: str, name: str, proto: int = 2,
             plain: bool = False) -> tuple[str, str, str, Severity, str]:
    """What a GLOBAL of ``module`` and ``name`` imports at protocol ``proto`` (``plain``: in
    a plain ``pickle.load`` pass), as :func:`~torchless.rules.findclass.find_class` states
    torch's resolution: (module, name, dotted path), and the verdict on the import."""
    found = find_class(module, name, proto, "plain" if plain else "torch")
    if isinstance(found, StorageName):
        return module, name, f"{module}.{name}", "vetted", _STORAGE_NAME
    if isinstance(found, Failure):
        return module, name, f"{module}.{name}", "vetted", f"the unpickler fails: {found.reason}"
    module, name = found.module, found.name
    severity, reason = import_verdict(module, name)
    if severity == "vetted" and _dtypes.names_storage_type(module, name) and \
            name != "UntypedStorage" and _dtypes.by_storage_name(name) is None:
        # torch's persistent_load reads .dtype of what the storage slot names: no torch
        # has this class (torch 2.13's import fails), so it is no proof (the reader refuses)
        severity, reason = "unvetted", ("torch has no such storage type: torch.save never "
                                        "writes this name, and find_class imports it")
    return module, name, f"{module}.{name}", severity, reason


#: :func:`imported` of the names met so far in this process, up to :data:`IMPORTS_MAX` of
#: them (a hostile file may name millions).
IMPORTS: dict[tuple[str, str, int, bool], tuple[str, str, str, Severity, str]] = {}
IMPORTS_MAX = 4096


class Model(DuckCalls):
    """The resolver half of the model (mixed into the scanner's recording resolver)."""

    log: ActionLog
    #: The protocol in force (the interpreter sets it) and whether torch reads the stream
    #: with plain ``pickle.load`` (the scanner's pass sets it).
    proto: int
    plain: bool = False

    def known_constant(self, module: str, name: str) -> bool:
        return storage_verdict(module, name, plain=self.plain) is not None

    # ---- names -------------------------------------------------------------------------

    def model_global(self, module: str, name: str, offset: int) -> Global:
        key = (module, name, min(self.proto, 4), self.plain)  # protocols 4 and 5 walk alike
        known = IMPORTS.get(key)
        if known is None:
            known = imported(module, name, self.proto, self.plain)
            if len(IMPORTS) < IMPORTS_MAX:
                IMPORTS[key] = known
        module, name, path, severity, reason = known
        self.log.add("import", path, severity, reason, offset, offset)
        return new_global(module, name, offset)

    # ---- calls -------------------------------------------------------------------------

    def model_call(self, func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None,
                   offset: int, *, new: bool = False, via: str = "", handed: str = "") -> Any:
        """``func(*args, **kwargs)`` (``new``: ``func.__new__(func, *args)``); ``via``: the
        forwarding rule that makes the call (then only a vetted callable is clean);
        ``handed``: where a callable handed on was found (judged as called, its own
        severity)."""
        log = self.log
        origin = _origin(func)
        if isinstance(func, Global):
            path = func.path
            if not new and path in FORWARDING and (args or kwargs):
                self._handed(path, args, kwargs, offset)
            if not new and path in FORWARDS:
                return self._forwarding(func, args, kwargs or {}, offset, via)
            if not new and path in ("copyreg.__newobj__", "copyreg.__newobj_ex__"):
                self._add_call(func, "vetted", FORWARDS.get(path, "NEWOBJ"), offset, args)
                cls = args[0] if args else None
                rest = args[1] if path.endswith("ex__") and len(args) > 1 else args[1:]
                return self.model_call(cls, rest if isinstance(rest, tuple) else (),
                                       None, offset, new=True, via=via)
            severity, reason = call_verdict(func.module, func.name, new=new)
            if (severity == "unvetted" and not via and not new and func.module == "__main__"
                    and func.name[:1].isupper() and "." not in func.name and len(args) <= 1
                    and all(_plain(a) for a in args)):
                severity, reason = "vetted", ("an Enum member lookup (or a one-value "
                                              "constructor) of the loading program's own class")
            if path == "_codecs.encode" and not (
                    len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str)
                    and args[1].lower().replace("_", "-") in _TEXT_CODECS):
                severity, reason = "unvetted", ("_codecs.encode with a codec other than a "
                                                "text one: the lookup imports encodings.<name>")
            if via and severity != "vetted":
                severity, reason = "dangerous", f"{via} calls a callable the file chose, " \
                                                f"{path}, which is not vetted ({reason})"
            elif handed and severity != "vetted":
                reason = f"{handed} of {path}, which counts as called: {reason}"
            log.add("call", f"{path}.__new__" if new else path, severity, reason, offset,
                    origin, args)
            made = Made(path, severity, origin)
            if new:
                made.cls = func
            if args or kwargs:
                self._handed(path, args, kwargs, offset, result=made)
            return made
        if isinstance(func, Made):
            if func.func is not None and not new:  # a functools.partial
                if self.duck_depth >= DUCK_DEPTH:
                    log.add("call", func.maker, "dangerous", "partials nested too deep to "
                            "follow", offset, origin)
                    return Made("?", "dangerous", origin)
                self.duck_depth += 1
                try:
                    return self.model_call(func.func, (*func.pargs, *args),
                                           {**func.pkw, **(kwargs or {})}, offset,
                                           via=via or "functools.partial")
                finally:
                    self.duck_depth -= 1
            if func.maker == "__new__" and func.attr is not None:
                target = func.pargs[0] if func.pargs else None
                return self.model_call(target, args[1:], kwargs, offset, new=True, via=via)
            what = (f"a method ({func.attr!r}) of an object the file built"
                    if func.attr is not None else f"an object the file built ({func.maker})")
            log.add("call", f"{func.maker}.{func.attr or '__call__'}", "dangerous",
                    f"calls {what}: torch.load would run that code (how gadget chains "
                    "run code)", offset, origin, args)
            return Made(_called(func.maker), "dangerous", origin)
        if func is None or isinstance(func, (str, bytes, int, float, tuple, list, dict)):
            return Made("?", "vetted", None)  # the unpickler fails here: nothing runs
        log.add("call", f"<{type(func).__name__}>", "dangerous",
                "calls a value that is not a name the file gave", offset, origin, args)
        return Made("?", "dangerous", origin)

    def _annotating(self, func: Global, args: tuple[Any, ...], kwargs: dict[Any, Any],
                    offset: int) -> Made:
        """``list[int]`` (``types.GenericAlias(list, (int,))``) and ``int | None``
        (``functools.reduce(operator.or_, (int, NoneType))``, or one ``operator.or_``):
        vetted when they keep and combine classes; otherwise each callable they are handed
        counts as called (reduce calls its function, ``|`` its operands' ``__or__``)."""
        path = func.path
        if len(args) + len(kwargs) < 2:
            self._add_call(func, "vetted", f"{path} takes two arguments: the call fails, "
                           "nothing runs", offset, args)
            return Made("?", "vetted", func.offset)
        two = len(args) == 2 and not kwargs
        if path == "types.GenericAlias":
            ok = two and _alias_origin(args[0]) and _annotation_key(args[1])
            maker = f"{_show(args[0] if args else None, 1)}[…]"
            why = "keeps a class subscripted with classes (list[int] is pickled so)"
        else:
            if path in _REDUCE:  # reduce(operator.or_, members)
                ok = two and isinstance(args[0], Global) and args[0].path in _OR and \
                    _union_members(args[1])
            else:  # a | b
                ok = two and _union_members(args)
            maker = _UNION
            why = "a union of classes (int | None is pickled so): type's or typing's __or__"
        if ok:
            self._add_call(func, "vetted", why, offset, args)
            return Made(maker, "vetted", func.offset)
        self._add_call(func, "unvetted", f"{path} with what the file chose: it calls the "
                       "function it is given" if path in _REDUCE else
                       f"{path} of objects the file chose: their __or__, __eq__ or attribute "
                       "lookups run, which is not vetted", offset, args)
        self._walk((args, kwargs), f"what {path} is handed", offset, self.duck_seen)
        return Made(maker, "unvetted", func.offset)

    def _add_call(self, func: Global, severity: Severity, reason: str, offset: int,
                  args: Any) -> None:
        self.log.add("call", func.path, severity, reason, offset, func.offset, args)

    def _forwarding(self, func: Global, args: tuple[Any, ...], kwargs: dict[Any, Any],
                    offset: int, via: str) -> Any:
        path = func.path
        reason = FORWARDS[path]
        origin = func.offset
        if path == "functools.partial":
            self._add_call(func, "vetted", reason, offset, args)
            made = Made(path, "vetted", origin)
            made.func = args[0] if args else None
            made.pargs = tuple(args[1:])
            made.pkw = dict(kwargs)
            return made
        if path == "builtins.getattr":
            return self._getattr(func, args, offset)
        if path == "builtins.type":
            # type(x) is Py_TYPE(x); type(name, bases, namespace) runs the bases' metaclass,
            # __init_subclass__ and the namespace values' __set_name__: code of the classes
            # handed to it, each judged as called (they are not HANDED_ON)
            ok = len(args) == 1
            self._add_call(func, "vetted" if ok else "unvetted",
                           "type(x) only reads the type of x" if ok else
                           "type(name, bases, namespace) makes a class: its bases' and "
                           "metaclass's code runs, which is not vetted", offset, args)
            return Made(_TYPE_OF if ok else "builtins.type(…)", "vetted" if ok else "unvetted",
                        origin)
        if path in ("operator.getitem", "_operator.getitem"):
            base = args[0] if args else None
            ok = isinstance(base, Global) and base.module in _TYPING and len(args) == 2 \
                and _annotation_key(args[1])
            severity: Severity = "vetted" if ok else "unvetted"
            if not ok and isinstance(base, Made) and base.severity == "dangerous":
                severity = "dangerous"
            self._add_call(func, severity,
                           "subscripts a typing form with classes (how typing.Optional[int] "
                           "is pickled): typing's own __getitem__ runs" if ok else
                           "subscripts an object the file chose, or a typing form with "
                           "objects the file built: their __getitem__, __eq__ or __hash__ "
                           "runs, which is not vetted", offset, args)
            made = Made(f"{_show(base, 1)}[…]", severity, origin)
            if not ok and isinstance(base, Made) and base.factory is not None:
                self._judge_any(base.factory, f"{path} subscripts a defaultdict, whose "
                                "factory runs on a missing key:", offset)
            return made
        if path in _ANNOTATING:
            return self._annotating(func, args, kwargs, offset)
        if path.startswith("hmac."):
            calls = forwarded(path, args, kwargs)
            self._add_call(func, "unvetted", "the standard library's hmac is not vetted",
                           offset, args)
            for target, fargs in calls:
                self.model_call(target, fargs, None, offset, via=f"{path} (digestmod)")
            return Made(path, "unvetted", origin)
        self._add_call(func, "vetted", reason, offset, args)
        for target, fargs in forwarded(path, args, kwargs):
            if path == "copyreg._reconstructor" and target is not None:
                self.model_call(target, fargs, None, offset, via=path)
            else:
                self.model_call(target, fargs, None, offset, via=path)
        if path == "copyreg._reconstructor" and len(args) == 3:
            cls = args[0]
            if isinstance(cls, Global):
                severity, why = call_verdict(cls.module, cls.name, new=True)
                if severity != "dangerous":  # object.__new__ runs none of the class's code
                    severity, why = "vetted", "object.__new__(cls) runs none of its code"
                self.log.add("call", f"{cls.path}.__new__", severity, why, offset, cls.offset)
                made = Made(cls.path, call_verdict(cls.module, cls.name, new=True)[0],
                            cls.offset)
                made.cls = cls
                return made
        if path in ("torch._tensor._rebuild_from_type_v2", "torch._tensor._rebuild_from_type"):
            new_type = args[1] if len(args) > 1 else None
            if isinstance(new_type, Global) and new_type.path not in (
                    "torch._tensor.Tensor", "torch.Tensor"):
                severity, why = call_verdict(new_type.module, new_type.name, new=True)
                self.log.add("build", new_type.path, severity,
                             f"the tensor becomes a {new_type.path} whose state is restored: "
                             + why, offset, new_type.offset)
        if path == "torch._utils._rebuild_wrapper_subclass" and args:
            cls = args[0]
            if isinstance(cls, Global):
                severity, why = call_verdict(cls.module, cls.name, new=True)
                self.log.add("call", f"{cls.path}.__new__", severity, why, offset, cls.offset)
        return Made(path, "vetted", origin)

    def _getattr(self, func: Global, args: tuple[Any, ...], offset: int) -> Any:
        """``getattr(obj, name)``: vetted only for ``cls.__new__`` and an attribute of a
        module or class the file names (judged as that name); the bound method of an object
        made by a named class's ``__new__`` is judged by :func:`method_verdict` (unvetted
        for an unvetted class's method: its code, not a known danger); dangerous for a name
        that is not a constant identifier, for any dunder other than ``cls.__new__``
        (``__globals__``, ``__builtins__``, ``__class__``, ``__subclasses__``, ``__reduce__``,
        ``__init__`` …: they reach the interpreter's objects, and no pickler writes them), and
        for an object whose class the model does not know."""
        if len(args) != 2 or type(args[1]) is not str or not args[1].isidentifier():
            self._add_call(func, "dangerous", "getattr is asked for something other than a "
                           "plain attribute name", offset, args)
            return Made("getattr()", "dangerous", func.offset)
        obj, attr = args
        if attr == "__new__" and isinstance(obj, Global):
            self._add_call(func, "vetted", "reads cls.__new__ (the protocol-2 form of NEWOBJ)",
                           offset, args)
            made = Made("__new__", "vetted", obj.offset)
            made.attr, made.pargs = attr, (obj,)
            return made
        if attr.startswith("__") and attr.endswith("__"):
            self._add_call(func, "dangerous", f"getattr reaches the dunder attribute {attr}",
                           offset, args)
            return Made("getattr()", "dangerous", func.offset)
        if isinstance(obj, Global):
            self._add_call(func, "vetted", "reads one attribute of a module or class the "
                           "file names", offset, args)
            name = Global(obj.module, f"{obj.name}.{attr}", obj.offset)
            self.duck_unnamed[id(name)] = name  # no GLOBAL reported their import
            return name
        maker = obj.maker if isinstance(obj, Made) else type(obj).__name__
        if isinstance(obj, Made) and obj.cls is not None and obj.attr is None and \
                obj.func is None:
            severity, reason = method_verdict(obj.cls, attr, obj.severity)
            self._add_call(func, severity, reason, offset, args)
            self.judge_kept(obj, attr, offset)  # an instance attribute shadows the method
            made = Made(maker, severity, _origin(obj))
            made.attr, made.method = attr, f"{obj.cls.path}.{attr}"
            return made
        self._add_call(func, "dangerous", f"reads the attribute {attr!r} of an object whose "
                       f"class is not known ({maker}): what it finds may be any callable",
                       offset, args)
        made = Made(maker, "dangerous", _origin(obj))
        made.attr = attr
        return made

    # ---- updates -----------------------------------------------------------------------

    def model_build(self, obj: Any, state: Any, offset: int) -> Any:
        if isinstance(obj, Made) and obj.func is not None and obj.maker == "functools.partial":
            # partial.__setstate__ takes any tuple (a call's result may be one) of a callable,
            # a tuple of arguments, a dict of keywords or None, and its __dict__ (any value)
            if type(state) is tuple and len(state) == 4 and type(state[1]) is tuple and \
                    (state[2] is None or type(state[2]) is dict):
                obj.func, obj.pargs, obj.pkw = state[0], state[1], state[2] or {}
                self.log.add("build", "functools.partial", "vetted", "partial.__setstate__ "
                             "sets its function (judged when the partial is called)", offset,
                             obj.origin, state)
            elif type(state) in INERT or type(state) in (list, dict, set, frozenset) or \
                    (type(state) is tuple and len(state) != 4):
                self.log.add("build", "functools.partial", "vetted", "partial.__setstate__ "
                             "refuses a state that is not a tuple of four: nothing runs",
                             offset, obj.origin, state)
            else:  # its function, arguments or keywords are objects the file built
                obj.func = Made("functools.partial.__setstate__()", "dangerous", obj.origin)
                obj.pargs, obj.pkw = (), {}
                self.log.add("build", "functools.partial", "dangerous", "partial.__setstate__ "
                             "sets its function and arguments from objects the file built: "
                             "calling the partial calls whatever they hold", offset,
                             obj.origin, state)
            if type(state) is tuple and len(state) == 4 and state[3] is not None and \
                    (type(state[3]) is not dict or not obj.hold(state[3])):
                # its __dict__: where .keys() … are looked up
                self._walk(state[3], "a functools.partial's __dict__", offset, self.duck_seen)
            if self.duck_judged.pop(id(obj), None) is not None:  # judged with its old function
                self._judge(obj, "a functools.partial rebuilt after it was handed on", offset)
            return obj
        self._update("build", obj, offset, state)
        if isinstance(obj, Made) and obj.cls is not None and not (
                type(state) is dict or (type(state) is tuple and len(state) == 2 and
                                        state[1] is None)):
            obj.cls = None  # slot state is set with setattr: its __class__ may change
        if isinstance(obj, (Made, Global)) and type(state) not in INERT:
            maker = obj.maker if isinstance(obj, Made) else obj.path
            self._handed(maker if isinstance(obj, Made) else "", state, None, offset,
                         f"the BUILD state of {maker}",
                         obj if isinstance(obj, Made) else None, state=True)
        return obj

    def _update(self, kind: ActionKind, obj: Any, offset: int, args: Any = None) -> None:
        what = "__setstate__ or __setattr__" if kind == "build" else "item methods"
        if isinstance(obj, Made):
            if obj.attr is not None or obj.severity == "dangerous":
                self.log.add(kind, obj.maker, "dangerous", f"calls {what} of an object a "
                             "dangerous call made", offset, obj.origin, args)
            elif obj.severity == "unvetted":
                self.log.add(kind, obj.maker, "unvetted", f"calls {what} of {obj.maker}, "
                             "which is not vetted", offset, obj.origin, args)
            else:
                self.log.add(kind, obj.maker, "vetted", f"{what} of a vetted class", offset,
                             obj.origin)
        elif isinstance(obj, Global):
            self.log.add(kind, obj.path, "dangerous", f"calls {what} of the class {obj.path} "
                         "itself (no pickler writes that: it can rebind the class's "
                         "attributes)", offset, obj.offset, args)

    def model_update(self, obj: Any, offset: int, items: Any = None) -> None:
        if isinstance(obj, (Made, Global)):
            self._update("update", obj, offset)
            if not items:
                return
            if isinstance(obj, Made) and obj.maker in SPECS and obj.hold(items):
                return  # kept (an attribute dict reads missing attributes from its items)
            maker = obj.maker if isinstance(obj, Made) else obj.path
            self._walk(items, f"the items put in {maker}", offset, self.duck_seen)


def worst(severities: list[Severity]) -> Severity:
    """The most severe of ``severities`` ('vetted' for none)."""
    return max(severities, key=SEVERITY_ORDER.__getitem__, default="vetted")
