"""The execution model: every action ``torch.load(weights_only=False)`` would take on a pickle.

A resolver for the inert interpreter (:class:`~torchless.pickle.machine.Machine`) that, instead
of rebuilding values, follows what CPython's unpickler inside ``torch.load`` would do and
records each step as an :class:`~torchless.scanner.report.Action`:

* **import**: ``GLOBAL``/``STACK_GLOBAL``/``INST`` import a module and read a name (torch's
  own ``find_class`` maps storage names without an import, and ``torch.tensor`` to
  ``torch._tensor``; Python 2 names are mapped as the C unpickler maps them);
* **call**: ``REDUCE``/``INST``/``OBJ`` call a value, ``NEWOBJ``/``NEWOBJ_EX`` call
  ``cls.__new__``; calls a vetted rule *forwards* (``copyreg._reconstructor``'s base,
  ``_rebuild_from_type_v2``'s func, a ``functools.partial``'s function, NumPy's RNG
  constructor callbacks, ``hmac``'s digestmod) are calls of their own;
* **build**: ``BUILD`` calls the object's ``__setstate__`` (or its ``__setattr__`` for slot
  state); **update**: ``APPEND``/``SETITEM``/``ADDITEMS`` on an object call its methods.

Each action gets a severity from :mod:`torchless.rules.allowlist`. Values stay symbolic: a
name is a :class:`Global`, a call's result an :class:`_Made` that remembers what made it
(so that a later call or BUILD on it is judged by its maker), a ``functools.partial``
remembers its function (a ``BUILD`` can swap it). Nothing is imported or called.
"""

from __future__ import annotations

import _compat_pickle
from typing import Any

from torchless.core import dtypes as _dtypes
from torchless.pickle.opcodes import by_code
from torchless.pickle.values import Global
from torchless.rules.allowlist import (
    FORWARDS,
    HANDED_ON,
    METHODS_CALLED,
    SPECS,
    ArgSpec,
    Severity,
    call_verdict,
    forwarded,
    import_verdict,
)
from torchless.rules.policy import PYTHON_CONSTANTS, torch_constant
from torchless.scanner.report import SEVERITY_ORDER, Action, ActionKind, new_action

__all__ = ["IMPORTS", "ActionLog", "Made", "Model", "imported", "static_args",
           "storage_verdict"]

_MODULE_RENAMES = {"torch.tensor": "torch._tensor"}
_TEXT_CODECS = frozenset({"latin1", "latin-1", "iso-8859-1", "iso8859-1", "utf-8", "utf8",
                          "ascii"})
_TYPING = frozenset({"typing", "typing_extensions", "collections.abc", "builtins"})
#: Characters of a static argument rendering kept in a report.
_ARGS_MAX = 160
#: Actions listed one by one per stream; past this, those of one kind, target and severity
#: are counted on the first (a hostile stream may repeat a call a million times).
_MAX_LISTED = 1000


#: Values one object keeps for method look-ups; past this each is walked when handed over.
_HOLD_MAX = 64
#: Pairs of an item list searched for a method name.
_PAIRS_MAX = 4096


#: Characters of a maker's name: ``f()()()…`` past this is cut to one name.
_MAKER_MAX = 120


def _called(maker: str) -> str:
    """The maker's name of what calling an object made by ``maker`` returns, bounded: a file
    can call each result again (``f()()()…``, two bytes a call), and names growing with the
    chain would make the report quadratic in it; cut, the names repeat and are counted."""
    name = f"{maker}()"
    return name if len(name) <= _MAKER_MAX else f"{name[:_MAKER_MAX - 4]}…()"


class Made:
    """What a call or ``__new__`` returned: judged by what made it."""

    __slots__ = ("attr", "factory", "func", "holders", "maker", "origin", "pargs", "pkw",
                 "severity", "walked")

    def __init__(self, maker: str, severity: Severity, origin: int | None) -> None:
        self.maker = maker
        self.severity = severity
        self.origin = origin
        self.func: Any = None  # a functools.partial's function (None otherwise)
        self.pargs: tuple[Any, ...] = ()
        self.pkw: dict[Any, Any] = {}  # a functools.partial's keywords
        self.attr: str | None = None  # getattr(obj, attr) of an object the file built
        # what the object keeps of what it was handed (keyword dicts, BUILD states, items),
        # where a method looked up on it may find a callable; the walks follow it
        self.holders: list[Any] | None = None
        self.walked = 0  # holders the shared walk has followed
        self.factory: Any = None  # a defaultdict's factory

    def hold(self, value: Any) -> bool:
        """Keep ``value`` among the holders (False past :data:`_HOLD_MAX`: walk it now)."""
        if self.holders is None:
            self.holders = []
        if len(self.holders) >= _HOLD_MAX:
            return False
        self.holders.append(value)
        return True

    def __repr__(self) -> str:
        return f"<{self.maker}>"


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


def storage_verdict(module: str, name: str) -> tuple[Severity, str] | None:
    """torch's find_class maps a storage type's name without an import. A name that only
    contains "Storage" (DCP's ``TensorStorageMetadata``) goes on to the ordinary import there
    (``StorageType(name)`` raises KeyError and torch falls through), so it is judged as one
    (None); a torch name ending in "Storage" that is no storage type is what torch.save
    never writes."""
    if "Storage" not in name:
        return None
    if name == "UntypedStorage" or _dtypes.by_storage_name(name) is not None:
        return "vetted", "torch's find_class maps a storage name to its type without an import"
    if _dtypes.names_storage_type(module, name):
        # the reader's rule too (rules.resolver): torch.save never writes such a name
        return "dangerous", "torch has no such storage type: torch.save never writes this name"
    return None


def imported(module: str, name: str) -> tuple[str, str, str, Severity, str]:
    """What a GLOBAL of ``module`` and ``name`` imports, as torch's unpickler maps it (module,
    name, dotted path), and the verdict on the import: a function of the two names."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    module = _MODULE_RENAMES.get(module, module)
    severity, reason = storage_verdict(module, name) or import_verdict(module, name)
    return module, name, f"{module}.{name}", severity, reason


#: :func:`imported` of the names met so far in this process, up to :data:`IMPORTS_MAX` of
#: them (a hostile file may name millions).
IMPORTS: dict[tuple[str, str], tuple[str, str, str, Severity, str]] = {}
IMPORTS_MAX = 4096


#: Values the walks for handed-on callables follow in one stream, all walks together (each
#: container is followed once: the walks stay linear in the stream).
_DUCK_MAX = 4_000_000
#: How deep one handed-on callable's judgement may lead to the next (a partial of a partial).
_DUCK_DEPTH = 32
_INERT = frozenset({str, bytes, int, float, bool, complex, type(None), bytearray})
_FORWARDING = frozenset({*FORWARDS, "copyreg.__newobj__", "copyreg.__newobj_ex__"})
#: Per spec'd callee, the positions whose spec calls methods or keeps the value.
_ACTIVE: dict[str, tuple[tuple[int, ArgSpec], ...]] = {}


def _attributes(holder: Any, names: frozenset[str]) -> list[tuple[str, Any]]:
    """The values of attributes ``names`` an object keeps in ``holder`` (a keyword or state
    dict, or a list of item pairs: an attribute dict reads missing attributes from its items)."""
    if type(holder) is dict:
        return [(n, holder[n]) for n in names if n in holder]
    if type(holder) is list:
        return [(p[0], p[1]) for p in holder[:_PAIRS_MAX]
                if type(p) is tuple and len(p) == 2 and type(p[0]) is str and p[0] in names]
    return []


class Model:
    """The resolver half of the model (mixed into the scanner's recording resolver)."""

    log: ActionLog
    #: Containers the walks for handed-on callables followed (kept alive: ids stay unique).
    duck_seen: dict[int, Any]
    #: Callable values already judged as called (id -> value).
    duck_judged: dict[int, Any]
    duck_budget: int
    duck_depth: int

    def model_init(self) -> None:
        self.duck_seen = {}
        self.duck_judged = {}
        self.duck_budget = _DUCK_MAX
        self.duck_depth = 0

    # ---- duck-typed calls --------------------------------------------------------------

    def _handed(self, callee: str, args: Any, kwargs: dict[Any, Any] | None, offset: int,
                where: str = "", result: Made | None = None, state: bool = False) -> None:
        """What ``callee`` is handed: its arguments, or (``state``) its BUILD state
        ``args``. With an argument spec (:data:`~torchless.rules.allowlist.SPECS`), the
        methods it calls on each value are looked up (a callable found is judged as called)
        and what it keeps goes to ``result``; without one, each callable value anywhere in
        it counts as called (torch's code or the program may call it by duck typing),
        except those the rule forwards (judged as those calls)."""
        skip, skip_kw = HANDED_ON.get(callee, (frozenset(), frozenset()))
        if "*" in skip_kw:
            return
        spec = SPECS.get(callee)
        if spec is None:
            what = where or f"the arguments of {callee}"
            methods = METHODS_CALLED.get(callee)
            if methods:
                what += " (which calls " + ", ".join(f".{m}()" for _, m in methods) + ")"
            if state or not isinstance(args, tuple):
                self._walk(args, what, offset, self.duck_seen)
                return
            for i, value in enumerate(args):
                if i not in skip and type(value) not in _INERT:
                    self._walk(value, what, offset, self.duck_seen)
            for key, value in (kwargs or {}).items():
                if key not in skip_kw and type(value) not in _INERT:
                    self._walk(value, what, offset, self.duck_seen)
            return
        if state:
            for part in args if type(args) is tuple and len(args) == 2 else (args,):
                if type(part) not in _INERT:
                    self._use(callee, spec.state, part, offset, result)
            return
        if callee == "collections.defaultdict" and result is not None and args:
            result.factory = args[0]
        active = _ACTIVE.get(callee)
        if active is None:
            active = _ACTIVE[callee] = tuple((i, a) for i, a in enumerate(spec.args)
                                             if a.methods or a.keeps)
        rest = spec.rest
        for i, arg in active:
            if i < len(args) and type(args[i]) not in _INERT:
                self._use(callee, arg, args[i], offset, result)
        if rest.methods or rest.keeps:
            for value in args[len(spec.args):]:
                if type(value) not in _INERT:
                    self._use(callee, rest, value, offset, result)
        if kwargs and (rest.methods or rest.keeps):
            for value in kwargs.values():
                if type(value) not in _INERT:
                    self._use(callee, rest, value, offset, result)

    def _use(self, callee: str, arg: ArgSpec, value: Any, offset: int,
             result: Made | None) -> None:
        """``callee`` calls ``arg.methods`` on ``value``, and keeps it if ``arg.keeps``."""
        if arg.methods and isinstance(value, Made):
            if "__getitem__" in arg.methods and value.factory is not None:
                self._judge_any(value.factory, f"{callee} subscripts a defaultdict, whose "
                                "factory runs on a missing key:", offset)
            for holder in value.holders or ():
                for name, found in _attributes(holder, arg.methods):
                    self._judge_any(found, f"{callee} calls .{name}() of an object the file "
                                    f"built ({value.maker}), whose attribute {name} is",
                                    offset)
        if arg.keeps and (result is None or not result.hold(value)):
            self._walk(value, f"what {callee} keeps", offset, self.duck_seen)

    def _judge_any(self, value: Any, where: str, offset: int) -> None:
        if type(value) is Global or type(value) is Made:
            self._judge(value, where, offset)

    def model_result(self, value: Any, offset: int) -> None:
        """The value torch.load returns: every callable in it may be called by the program
        (a fresh walk: containers may have changed since they were handed on)."""
        if type(value) not in _INERT:
            self._walk(value, "the value torch.load returns (the program may call it)",
                       offset, {}, fresh=True)

    def _walk(self, value: Any, where: str, offset: int, seen: dict[int, Any],
              fresh: bool = False) -> None:
        """Judge every callable in ``value``, through plain containers and what objects
        keep; each container is followed once per ``seen`` (an object's holders once per
        stream by the shared walk, once by a ``fresh`` one), all walks within a budget."""
        todo = [value]
        while todo:
            v = todo.pop()
            kind = type(v)
            if kind in _INERT:
                continue
            if kind is tuple and len(v) == 2 and (type(v[0]) in _INERT or
                                                  type(v[1]) in _INERT):
                todo.append(v[1] if type(v[0]) in _INERT else v[0])  # a chain, not a DAG
            elif kind is tuple or kind is list or kind is dict or kind is set or \
                    kind is frozenset:
                if id(v) in seen:
                    continue
                seen[id(v)] = v
                if not self._spend(len(v) + 1, offset):
                    return
                if kind is dict:
                    todo.extend(v.keys())
                    todo.extend(v.values())
                else:
                    todo.extend(v)
            elif kind is Global:
                self._judge(v, where, offset)
            elif kind is Made:
                if v.func is not None or v.attr is not None:
                    self._judge(v, where, offset)
                if v.factory is not None:
                    todo.append(v.factory)
                if v.holders:
                    if fresh:
                        if id(v) in seen:
                            continue
                        seen[id(v)] = v
                        todo.extend(v.holders)
                    else:
                        todo.extend(v.holders[v.walked:])
                        v.walked = len(v.holders)

    def _spend(self, n: int, offset: int) -> bool:
        self.duck_budget -= n
        if self.duck_budget >= 0:
            return True
        if self.duck_budget + n >= 0:
            self.log.add("call", "<handed-on values>", "unvetted", "too many values handed "
                         "on to follow for callables", offset, None)
        return False

    def _judge(self, value: Global | Made, where: str, offset: int) -> None:
        """A callable value handed on, as the call it can become."""
        if id(value) in self.duck_judged:
            return
        self.duck_judged[id(value)] = value
        if isinstance(value, Global):
            if value.module in ("builtins", "__builtin__") and value.name in PYTHON_CONSTANTS:
                return
            if torch_constant(value.module, value.name) is not None or \
                    storage_verdict(value.module, value.name) is not None:
                return  # a layout, memory format or storage type: handled by their rules
            if import_verdict(value.module, value.name)[0] != "vetted":
                return  # the import is reported already, at least as severe
            severity, reason = call_verdict(value.module, value.name)
            if severity != "vetted":
                self.log.add("call", value.path, severity, f"{where} holds {value.path}, "
                             f"which counts as called: {reason}", offset, value.offset)
            return
        if value.func is None and value.attr is None:
            return  # an object: a vetted class's, or reported when it was made
        if self.duck_depth >= _DUCK_DEPTH:
            self.log.add("call", value.maker, "dangerous", "callables handed on nested too "
                         "deep to follow", offset, value.origin)
            return
        self.duck_depth += 1
        try:
            if value.func is not None:  # a functools.partial: its function with its arguments
                self.model_call(value.func, value.pargs, value.pkw, offset,
                                handed=f"{where} holds a functools.partial")
            else:
                self.model_call(value, (), None, offset)
        finally:
            self.duck_depth -= 1

    # ---- names -------------------------------------------------------------------------

    def model_global(self, module: str, name: str, offset: int) -> Global:
        known = IMPORTS.get((module, name))
        if known is None:
            known = imported(module, name)
            if len(IMPORTS) < IMPORTS_MAX:
                IMPORTS[module, name] = known
        module, name, path, severity, reason = known
        self.log.add("import", path, severity, reason, offset, offset)
        return Global(module, name, offset)

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
            if not new and path in _FORWARDING and (args or kwargs):
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
            if args or kwargs:
                self._handed(path, args, kwargs, offset, result=made)
            return made
        if isinstance(func, Made):
            if func.func is not None and not new:  # a functools.partial
                if self.duck_depth >= _DUCK_DEPTH:
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
            ok = len(args) == 1
            self._add_call(func, "vetted" if ok else "dangerous",
                           "type(x) only reads the type of x" if ok else
                           "type(name, bases, namespace) makes a class: its bases' and "
                           "metaclass's code runs", offset, args)
            return Made("builtins.type()", "vetted" if ok else "dangerous", origin)
        if path == "operator.getitem":
            base = args[0] if args else None
            ok = isinstance(base, Global) and base.module in _TYPING
            self._add_call(func, "vetted" if ok else "dangerous",
                           "subscripts a typing form (how typing.Optional[int] is pickled)"
                           if ok else "subscripts an object the file chose: its "
                           "__getitem__ runs", offset, args)
            return Made(f"{_show(base, 1)}[…]", "vetted" if ok else "dangerous", origin)
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
                return Made(cls.path, call_verdict(cls.module, cls.name, new=True)[0],
                            cls.offset)
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
            return Global(obj.module, f"{obj.name}.{attr}", obj.offset)
        severity: Severity = obj.severity if isinstance(obj, Made) else "vetted"
        self._add_call(func, severity, "reads an attribute of an object the file built",
                       offset, args)
        maker = obj.maker if isinstance(obj, Made) else type(obj).__name__
        made = Made(maker, severity, _origin(obj))
        made.attr = attr
        return made

    # ---- updates -----------------------------------------------------------------------

    def model_build(self, obj: Any, state: Any, offset: int) -> Any:
        if isinstance(obj, Made) and obj.func is not None and obj.maker == "functools.partial":
            if isinstance(state, tuple) and len(state) == 4:
                obj.func = state[0]
                obj.pargs = state[1] if isinstance(state[1], tuple) else ()
                obj.pkw = state[2] if isinstance(state[2], dict) else {}
            self.log.add("build", "functools.partial", "vetted", "partial.__setstate__ sets "
                         "its function (judged when the partial is called)", offset,
                         obj.origin, state)
            if isinstance(state, tuple) and len(state) == 4 and type(state[3]) is dict and \
                    not obj.hold(state[3]):  # its __dict__: where .keys() … are looked up
                self._walk(state[3], "a functools.partial's __dict__", offset, self.duck_seen)
            if self.duck_judged.pop(id(obj), None) is not None:  # judged with its old function
                self._judge(obj, "a functools.partial rebuilt after it was handed on", offset)
            return obj
        self._update("build", obj, offset, state)
        if isinstance(obj, (Made, Global)) and type(state) not in _INERT:
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
