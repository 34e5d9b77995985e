"""What a summary is given (the loaded tree, its path, the container's details) and what it
gives back: ``(kind, line)`` pairs, none when the file is not its library's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Found", "Seen", "Summary"]

#: (kind, text): ``kind`` names the structure (``--json`` shows it), ``text`` is one line.
Found = tuple[str, str]


@dataclass(frozen=True)
class Seen:
    """A loaded checkpoint as summaries see it; ``top`` is the tree when it is a dict, else
    empty."""

    tree: Any
    path: str = ""
    format: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def top(self) -> dict[Any, Any]:
        return self.tree if isinstance(self.tree, dict) else {}


#: A library's summary: the lines it has to say of a checkpoint, [] when it is not one of its.
Summary = Callable[[Seen], list[Found]]
