"""The inert run of the scanner's pickle pass: the interpreter with the execution model's
resolver (:mod:`.model`), which records every name a stream gives (with the exact operands of
each ``STACK_GLOBAL``) and every action torch.load would take, and refuses nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchless.pickle.machine import Machine, Resolver
from torchless.pickle.opcodes import by_code
from torchless.pickle.values import Global, Opaque
from torchless.rules.findclass import EXTENSION
from torchless.scanner.model import ActionLog, Model

__all__ = ["FoundGlobal", "ModelMachine", "ModelRecorder", "new_found"]


@dataclass(frozen=True)
class FoundGlobal:
    """One name a stream references: ``opcode`` at ``offset`` (from the stream's base)."""

    module: str
    name: str
    offset: int
    opcode: str
    #: Why the name could not be read statically, if it could not ("" when it was).
    unresolved: str = ""


_new = object.__new__


def new_found(module: str, name: str, offset: int, opcode: str,
              unresolved: str = "") -> FoundGlobal:
    """``FoundGlobal(module, name, offset, opcode, unresolved)`` without the frozen
    dataclass's __init__ (see ``report.new_action``)."""
    g = _new(FoundGlobal)
    d = g.__dict__
    d["module"] = module
    d["name"] = name
    d["offset"] = offset
    d["opcode"] = opcode
    d["unresolved"] = unresolved
    return g


class _Persistent:
    """What a persistent id stands for in the inert run."""

    def __init__(self, pid: Any) -> None:
        self.pid = pid


class _Recorder(Resolver):
    """Records every name; refuses nothing; lets every update of an object pass."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.found: dict[int, FoundGlobal] = {}
        self.pids: list[Any] = []

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self._record(module, name, offset)
        return Global(module, name, offset)

    def _record(self, module: str, name: str, offset: int) -> None:
        """Note the name a GLOBAL, STACK_GLOBAL or INST at ``offset`` imports."""
        op = by_code(self.data[offset])
        self.found[offset] = new_found(module, name, offset, op.name if op else "?")

    def extension(self, code: int, offset: int) -> Any:
        op = by_code(self.data[offset])
        self.found[offset] = FoundGlobal("copyreg.extension", str(code), offset,
                                         op.name if op else "EXT")
        return Global("copyreg.extension", str(code), offset)

    def build(self, obj: Any, state: Any, offset: int) -> Any:
        return super().build(obj, state, offset) if isinstance(obj, Opaque) else obj

    def persistent_load(self, pid: Any, offset: int) -> Any:
        self.pids.append(pid)
        return _Persistent(pid)

    def append(self, obj: Any, items: list[Any], offset: int) -> None:
        if isinstance(obj, Opaque):
            super().append(obj, items, offset)

    def setitems(self, obj: Any, pairs: list[tuple[Any, Any]], offset: int) -> None:
        if isinstance(obj, Opaque):
            super().setitems(obj, pairs, offset)

    def additems(self, obj: Any, items: list[Any], offset: int) -> None:
        if isinstance(obj, Opaque):
            super().additems(obj, items, offset)


class ModelRecorder(Model, _Recorder):
    """The recorder, with the execution model deciding what each name and call does."""

    def __init__(self, data: Any, member: str | None = None) -> None:
        super().__init__(data)
        self.log = ActionLog(data, member)

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self._record(module, name, offset)  # not _Recorder's, whose Global is not needed
        return self.model_global(module, name, offset)

    def extension(self, code: int, offset: int) -> Any:
        value = super().extension(code, offset)
        self.log.add("import", f"copyreg.extension.{code}", "dangerous", EXTENSION, offset,
                     offset)
        return value

    def call(self, func: Any, args: Any, offset: int) -> Any:
        return self.model_call(func, args if isinstance(args, tuple) else (args,), None,
                               offset)

    def new_object(self, cls: Any, args: Any, kwargs: Any, offset: int) -> Any:
        return self.model_call(cls, args if isinstance(args, tuple) else (args,),
                               kwargs if isinstance(kwargs, dict) else None, offset, new=True)

    def build(self, obj: Any, state: Any, offset: int) -> Any:
        return self.model_build(obj, state, offset)

    def append(self, obj: Any, items: list[Any], offset: int) -> None:
        self.model_update(obj, offset)

    def setitems(self, obj: Any, pairs: list[tuple[Any, Any]], offset: int) -> None:
        self.model_update(obj, offset)

    def additems(self, obj: Any, items: list[Any], offset: int) -> None:
        self.model_update(obj, offset)


class ModelMachine(Machine):
    """The interpreter, except that a STACK_GLOBAL on non-strings is recorded, not fatal."""

    def op_STACK_GLOBAL(self) -> None:
        name = self.pop()
        module = self.pop()
        if type(module) is str and type(name) is str:
            self.push(self.resolver.find_global(module, name, self.op_start))
            return
        assert isinstance(self.resolver, ModelRecorder)
        what = (f"operands are {type(module).__name__} and {type(name).__name__}, "
                "not two strings")
        self.resolver.found[self.op_start] = FoundGlobal(
            _show(module), _show(name), self.op_start, "STACK_GLOBAL", what)
        self.resolver.log.add("import", f"{_show(module)}.{_show(name)}", "dangerous",
                              f"STACK_GLOBAL whose name cannot be read statically ({what})",
                              self.op_start, self.op_start)
        self.push(Global("?", "?", self.op_start))


def _show(value: Any) -> str:
    if isinstance(value, Global):
        return value.path
    return value if isinstance(value, str) else f"<{type(value).__name__}>"
