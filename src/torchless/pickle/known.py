"""Values the rules hand between the interpreter run and the walk that finishes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchless.pickle.values import Global, Opaque

__all__ = ["Known", "Pending", "unwrap"]


@dataclass(frozen=True, repr=False)
class Known(Global):
    """A global the rules rebuild; ``rule`` is the rebuild function's key. Where it stays a
    value (a class kept by reference), it is an ordinary inert :class:`Global`."""

    rule: str = ""


class Pending:
    """A value finished by a later BUILD (NumPy arrays and dtypes); resolved after the run."""

    __slots__ = ("args", "kind", "record", "state", "value")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind = kind
        self.args = args
        self.state: Any = None
        self.value: Any = None
        self.record: Opaque | None = None

    def resolved(self) -> Any:
        """The rebuilt value, or an inert record when NumPy's state was not understood (the
        same record each time: walks that meet it twice see one object)."""
        if self.value is not None:
            return self.value
        if self.record is None:
            self.record = Opaque(Global("numpy", self.kind), self.args)
            self.record.state = self.state
        return self.record


def unwrap(value: Any) -> Any:
    """A Pending's finished value (other values as they are)."""
    return value.value if isinstance(value, Pending) else value
