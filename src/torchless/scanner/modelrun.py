"""The scanner's pickle run: the one interpreter (:mod:`torchless.pickle.machine`) in trace
mode with the execution model's resolver (:mod:`.model`), which records every name a stream
gives (with the exact operands of each ``STACK_GLOBAL``, and the values it got where they are
not two strings) and every action torch.load would take, and refuses nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchless.core.limits import Limits
from torchless.pickle.machine import Machine, Resolver
from torchless.pickle.opcodes import by_code
from torchless.pickle.values import Global, Opaque
from torchless.rules.findclass import EXTENSION
from torchless.scanner.model import ActionLog, Model

__all__ = ["FoundGlobal", "ModelRecorder", "new_found", "trace"]


@dataclass(frozen=True)
class FoundGlobal:
    """One name a stream references: ``opcode`` at ``offset`` (from the stream's base)."""

    module: str
    name: str
    offset: int
    opcode: str
    #: Why the name could not be read (a STACK_GLOBAL on values that are not two strs),
    #: if it could not ("" when it was).
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


#: What the loader's persistent_load makes of an id: ``storage`` (a ZIP data.pkl: torch's
#: accepts only ('storage', …) ids), ``legacy`` (the legacy object pickle: ('module', cls,
#: file, source) gives the class itself, as _legacy_load's persistent_load), ``tar`` (the
#: TAR layout's pickle: any tuple id gives its first element).
PIDS = ("storage", "legacy", "tar")


class ModelRecorder(Model, _Recorder):
    """The recorder, with the execution model deciding what each name and call does."""

    def __init__(self, data: Any, member: str | None = None, pids: str = "storage",
                 plain: bool = False) -> None:
        super().__init__(data)
        self.log = ActionLog(data, member)
        self.pid_kind = pids
        self.plain = plain
        self.model_init()

    def persistent_load(self, pid: Any, offset: int) -> Any:
        value = super().persistent_load(pid, offset)
        if type(pid) is tuple and pid:
            if self.pid_kind == "tar":
                return pid[0]
            if self.pid_kind == "legacy" and len(pid) > 1 and pid[0] in ("module", b"module"):
                return pid[1]
        return value

    def find_global(self, module: str, name: str, offset: int) -> Any:
        self._record(module, name, offset)  # not _Recorder's, whose Global is not needed
        return self.model_global(module, name, offset)

    def unresolved_global(self, module: Any, name: Any, offset: int) -> Any:
        """A STACK_GLOBAL on values that are not two strs: recorded as a name that cannot be
        read (dangerous), and the run goes on."""
        what = (f"operands are {type(module).__name__} and {type(name).__name__}, "
                "not two strings")
        self.found[offset] = FoundGlobal(_show(module), _show(name), offset, "STACK_GLOBAL",
                                         what)
        self.log.add("import", f"{_show(module)}.{_show(name)}", "dangerous",
                     f"STACK_GLOBAL whose name cannot be read ({what})", offset, offset)
        return Global("?", "?", offset)

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
        self.model_update(obj, offset, items)

    def setitems(self, obj: Any, pairs: list[tuple[Any, Any]], offset: int) -> None:
        self.model_update(obj, offset, pairs)

    def additems(self, obj: Any, items: list[Any], offset: int) -> None:
        self.model_update(obj, offset, items)


def trace(data: Any, limits: Limits, member: str | None = None, pids: str = "storage",
          plain: bool = False) -> tuple[Machine, ModelRecorder]:
    """The scanner's run of ``data``: the one interpreter in trace mode (it reads on as the C
    unpickler does where the reader refuses, :class:`~torchless.pickle.machine.Machine`),
    with the recording resolver (``pids``: :data:`PIDS`; ``plain``: a plain ``pickle.load``
    pass, :mod:`torchless.rules.findclass`)."""
    recorder = ModelRecorder(data, member, pids, plain)
    return Machine(data, recorder, limits, trace=True), recorder


def _show(value: Any) -> str:
    if isinstance(value, Global):
        return value.path
    return value if isinstance(value, str) else f"<{type(value).__name__}>"
