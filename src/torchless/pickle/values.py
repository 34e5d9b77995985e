"""Inert values the pickle interpreter produces for what it does not rebuild.

A pickle names callables (``GLOBAL``) and asks for them to be called
(``REDUCE``, ``NEWOBJ``, ``INST``/``OBJ``) or updated (``BUILD``, ``APPEND``,
``SETITEM`` on objects). torchless never looks a name up and never calls
anything: a name becomes a :class:`Global` and a call becomes an
:class:`Opaque` record that keeps the arguments and later updates as data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

from torchless.errors import UnsupportedError

__all__ = ["Global", "Opaque", "new_global"]


@dataclass(frozen=True)
class Global:
    """A reference to ``module.name`` as written in the file. Never resolved."""

    module: str
    name: str
    offset: int = field(default=-1, compare=False)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"Global({self.path})"

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Code that takes the reference for the class it names (Lightning calls a saved
        ``hparams_type``) learns why it is not one, instead of ``'Global' object is not
        callable``."""
        raise UnsupportedError(
            f"{self.path} is an inert reference to what the file names: torchless never "
            "imports or calls it",
            hint="register the type so inert files rebuild it (torchless.register_type; "
                 "torchless.integrations.configs.register_omegaconf() for OmegaConf "
                 "configs), or read the value's fields as data")


_new = object.__new__


def new_global(module: str, name: str, offset: int = -1) -> Global:
    """``Global(module, name, offset)`` without the frozen dataclass's ``__init__`` (which
    sets each field through ``object.__setattr__``): the interpreter makes one for every
    name a pickle gives; the objects are the same (tests/scanner/test_scan_records.py)."""
    g = _new(Global)
    d = g.__dict__
    d["module"] = module
    d["name"] = name
    d["offset"] = offset
    return g


class _NotSet:
    def __repr__(self) -> str:
        return "NOTSET"


#: Calls of results an :attr:`Opaque.class_path` spells out.
_MAX_CALLS_SHOWN = 8

#: Marks an :class:`Opaque` whose ``state`` was never set by ``BUILD``.
NOTSET: Any = _NotSet()


class Opaque:
    """An object torchless keeps as inert data: what would have been called, with what.

    ``callable`` is usually a :class:`Global` (the class or function the file
    names); ``args``/``kwargs`` are what it would have been called with;
    ``state`` is what ``BUILD`` would have passed to ``__setstate__``
    (``NOTSET`` if none); ``items`` and ``dict_items`` collect ``APPEND`` and
    ``SETITEM`` calls made on the object.
    """

    __slots__ = ("args", "callable", "dict_items", "items", "kwargs", "newobj", "state")

    def __init__(
        self,
        func: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[Any, Any] | None = None,
        *,
        newobj: bool = False,
    ) -> None:
        self.callable = func
        self.args = args
        self.kwargs = kwargs
        self.newobj = newobj
        self.state: Any = NOTSET
        self.items: list[Any] = []
        self.dict_items: list[tuple[Any, Any]] = []

    @property
    def class_path(self) -> str:
        """``module.name`` of what the file asked to call, or a short description.

        A call of a call's result nests (``<result of m.f>``), a few levels at most: an
        inert file can make a record its own callable (a cycle)."""
        c, calls = self.callable, 0
        while isinstance(c, Opaque) and calls < _MAX_CALLS_SHOWN and c is not self:
            c, calls = c.callable, calls + 1
        if isinstance(c, Opaque):
            base = "…"
        elif isinstance(c, Global):
            base = c.path
        else:
            base = f"<{type(c).__name__}>"
        return "<result of " * calls + base + ">" * calls

    def __repr__(self) -> str:
        return f"Opaque({self.class_path})"
