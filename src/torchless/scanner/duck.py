"""Duck-typed calls: a callable the file hands on counts as called.

"Vetted to be called with data" is not "vetted to be called with anything": torch's and
CPython's code calls methods of what it is given (``Parameter.__new__`` calls ``data.detach()``,
``dict(x)`` calls ``x.keys()``, ``UUID.__setstate__`` subscripts its state, which runs a
``defaultdict``'s factory on a missing key), and the program calls what ``torch.load``
returns. So every callable value (a name the file gives, a ``functools.partial``, a method
read with ``getattr``) in the value torch.load returns, or in what a callable is given (its
arguments, its BUILD state, the items put into it), is judged as the call it can become:

* where the callee has an argument spec (:data:`~torchless.rules.allowlist.SPECS`), the methods
  it calls on each argument are looked up in what that object keeps (its *holders*: a
  Namespace's keywords, a BUILD state, items), and what the callee keeps joins the result's
  holders (part of the object graph);
* where it has none, every callable anywhere in what it is handed counts as called.

The walks follow plain containers and holders, each once per stream (a ``fresh`` walk of the
returned value once more), within one budget: linear in the stream, never a per-value deep walk.
Nothing is imported or called.
"""

from __future__ import annotations

from typing import Any, Protocol

from torchless.core.dtypes import by_torch_name
from torchless.pickle.values import Global
from torchless.rules.allowlist import (
    FORWARDS,
    HANDED_ON,
    METHODS_CALLED,
    SPECS,
    ArgSpec,
    Severity,
    call_verdict,
    import_verdict,
)
from torchless.rules.policy import PYTHON_CONSTANTS, torch_constant
from torchless.scanner.report import ActionKind

__all__ = ["DUCK_DEPTH", "FORWARDING", "INERT", "DuckCalls", "Made"]

#: Values one object keeps for method look-ups; past this each is walked when handed over.
_HOLD_MAX = 64
#: Pairs of an item list searched for a method name.
_PAIRS_MAX = 4096


class Made:
    """What a call or ``__new__`` returned: judged by what made it."""

    __slots__ = ("attr", "cls", "factory", "func", "holders", "maker", "method", "origin",
                 "pargs", "pkw", "severity", "walked")

    def __init__(self, maker: str, severity: Severity, origin: int | None) -> None:
        self.maker = maker
        self.severity = severity
        self.origin = origin
        self.func: Any = None  # a functools.partial's function (None otherwise)
        self.pargs: tuple[Any, ...] = ()
        self.pkw: dict[Any, Any] = {}  # a functools.partial's keywords
        self.attr: str | None = None  # getattr(obj, attr) of an object the file built
        # the class whose __new__ made the object (NEWOBJ, copyreg.__newobj__,
        # _reconstructor), while nothing can have changed it; None when the class is unknown
        self.cls: Global | None = None
        self.method: str | None = None  # a bound method's class.method (with ``cls`` known)
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



#: Values the walks for handed-on callables follow in one stream, all walks together (each
#: container is followed once: the walks stay linear in the stream).
_DUCK_MAX = 4_000_000
#: How deep one handed-on callable's judgement may lead to the next (a partial of a partial).
DUCK_DEPTH = 32
#: Types of values that are never callable and hold nothing.
INERT = frozenset({str, bytes, int, float, bool, complex, type(None), bytearray})
#: Callees that forward a callable they are given (judged as that call, not as handed on).
FORWARDING = frozenset({*FORWARDS, "copyreg.__newobj__", "copyreg.__newobj_ex__"})
#: Per spec'd callee, the positions whose spec calls methods or keeps the value.
_ACTIVE: dict[str, tuple[tuple[int, ArgSpec], ...]] = {}


def _torch_dtype(module: str, name: str) -> bool:
    """``torch.float16`` …: a dtype (torch pickles one by name), not callable; protocols 4
    and 5 may name it through a torch submodule (``torch._utils`` ``torch.float16``)."""
    if module == "torch":
        return by_torch_name(name) is not None
    head, _, rest = name.partition(".")
    return head == "torch" and module.startswith("torch.") and by_torch_name(rest) is not None


def _attributes(holder: Any, names: frozenset[str]) -> list[tuple[str, Any]]:
    """The values of attributes ``names`` an object keeps in ``holder`` (a keyword or state
    dict, or a list of item pairs: an attribute dict reads missing attributes from its items)."""
    if type(holder) is dict:
        return [(n, holder[n]) for n in names if n in holder]
    if type(holder) is list:
        return [(p[0], p[1]) for p in holder[:_PAIRS_MAX]
                if type(p) is tuple and len(p) == 2 and type(p[0]) is str and p[0] in names]
    return []



class _Log(Protocol):
    def add(self, kind: ActionKind, target: str, severity: Severity, reason: str,
            offset: int, origin: int | None, args: Any = None) -> None: ...


class DuckCalls:
    """The duck-typed half of the execution model (mixed into :class:`.model.Model`)."""

    log: _Log
    duck_seen: dict[int, Any]
    #: Callable values already judged as called (id -> value).
    duck_judged: dict[int, Any]
    duck_budget: int
    duck_depth: int
    #: ids of names read with getattr (no GLOBAL reported their import)
    duck_unnamed: dict[int, Global]

    def model_call(self, func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None,
                   offset: int, *, new: bool = False, via: str = "",
                   handed: str = "") -> Any:  # pragma: no cover - Model defines it
        raise NotImplementedError

    def known_constant(self, module: str, name: str) -> bool:  # pragma: no cover - Model's
        """A name the model's other rules judge (a storage type …), not a callable."""
        raise NotImplementedError

    def model_init(self) -> None:
        self.duck_seen = {}
        self.duck_judged = {}
        self.duck_budget = _DUCK_MAX
        self.duck_depth = 0
        self.duck_unnamed = {}

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
                if i not in skip and type(value) not in INERT:
                    self._walk(value, what, offset, self.duck_seen)
            for key, value in (kwargs or {}).items():
                if key not in skip_kw and type(value) not in INERT:
                    self._walk(value, what, offset, self.duck_seen)
            return
        if state:
            for part in args if type(args) is tuple and len(args) == 2 else (args,):
                if type(part) not in INERT:
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
            if i < len(args) and type(args[i]) not in INERT:
                self._use(callee, arg, args[i], offset, result)
        if rest.methods or rest.keeps:
            for value in args[len(spec.args):]:
                if type(value) not in INERT:
                    self._use(callee, rest, value, offset, result)
        if kwargs and (rest.methods or rest.keeps):
            for value in kwargs.values():
                if type(value) not in INERT:
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

    def judge_kept(self, obj: Made, attr: str, offset: int) -> None:
        """``getattr(obj, attr)`` may find what ``obj`` keeps under ``attr`` (a Namespace's
        keywords, its BUILD state): each callable found is judged as called."""
        names = frozenset((attr,))
        for holder in obj.holders or ():
            for _, found in _attributes(holder, names):
                self._judge_any(found, f"what {obj.maker} keeps (read by getattr as "
                                f"{attr})", offset)

    def _judge_any(self, value: Any, where: str, offset: int) -> None:
        if type(value) is Global or type(value) is Made:
            self._judge(value, where, offset)

    def model_result(self, value: Any, offset: int) -> None:
        """The value torch.load returns: every callable in it may be called by the program
        (a fresh walk: containers may have changed since they were handed on)."""
        if type(value) not in INERT:
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
            if kind in INERT:
                continue
            if kind is tuple and len(v) == 2 and (type(v[0]) in INERT or
                                                  type(v[1]) in INERT):
                todo.append(v[1] if type(v[0]) in INERT else v[0])  # a chain, not a DAG
            elif kind is tuple or kind is list or kind is dict or kind is set or \
                    kind is frozenset:
                if id(v) in seen:
                    continue
                seen[id(v)] = v
                n = len(v) + 1
                if self.duck_budget >= n:  # self._spend(n, offset), inlined
                    self.duck_budget -= n
                elif not self._spend(n, offset):
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
                    _torch_dtype(value.module, value.name) or \
                    self.known_constant(value.module, value.name):
                return  # a layout, memory format or storage type: handled by their rules
            if id(value) not in self.duck_unnamed and \
                    import_verdict(value.module, value.name)[0] != "vetted":
                return  # its import (a GLOBAL) is reported, at least as severe
            severity, reason = call_verdict(value.module, value.name)
            if severity != "vetted":
                self.log.add("call", value.path, severity, f"{where} holds {value.path}, "
                             f"which counts as called: {reason}", offset, value.offset)
            return
        if value.func is None and value.attr is None:
            return  # an object: a vetted class's, or reported when it was made
        if value.method is not None:  # a bound method of a known class, judged by getattr
            if value.severity != "vetted":
                self.log.add("call", value.method, value.severity, f"{where} holds the bound "
                             f"method {value.method}, which counts as called with unknown "
                             "arguments (its getattr says what it may run)", offset,
                             value.origin)
            return
        if self.duck_depth >= DUCK_DEPTH:
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
