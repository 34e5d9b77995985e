"""Where a container parser puts what it finds wrong with a file: one parser, two modes.

The reader and the scanner run the same ZIP, TAR and legacy parsers, because two parsers of
one format always come to disagree, and every disagreement is a file that the scanner passes
and torch reads differently. They differ only in what a finding does:

* **strict** (reading): the finding is raised, as the :class:`~torchless.errors.CheckpointError`
  that describes it; the file is refused at its first problem;
* **report** (scanning): the finding is recorded as an :class:`Anomaly` (its kind, the same
  message, where) and parsing goes on where it can, so that every byte some reader could
  interpret is still reached.

So whatever the strict parser refuses, the report parser lists: the same call site does both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchless.errors import CheckpointError, TruncatedInputError

__all__ = ["Anomaly", "Findings", "Mode"]

#: How a parser treats what it finds wrong: raise it, or record it and go on.
Mode = Literal["strict", "report"]


@dataclass(frozen=True)
class Anomaly:
    """A container or stream property that makes readers disagree about the file."""

    kind: str
    message: str
    member: str | None = None
    offset: int | None = None


class Findings:
    """The sink of one parse: raises in strict mode, records in report mode."""

    def __init__(self, mode: Mode = "strict") -> None:
        if mode not in ("strict", "report"):
            raise ValueError(f"mode must be 'strict' or 'report', not {mode!r}")
        self.strict = mode == "strict"
        self.anomalies: list[Anomaly] = []
        #: Report mode: the first finding that the file is cut short. A file torch cannot
        #: read for want of its end is unreadable, not anomalous.
        self.truncated: TruncatedInputError | None = None

    def __call__(self, kind: str, error: CheckpointError, member: str | None = None,
                 offset: int | None = None, *, report: str | None = None) -> None:
        """A finding: ``error`` is raised in strict mode; in report mode it is recorded with
        its message (or ``report``, where the scanner reads the bytes in a way the reader
        does not and says so) and the caller goes on."""
        if self.strict:
            raise error
        if self.truncated is None and isinstance(error, TruncatedInputError):
            self.truncated = error
        self.note(kind, report or error.message, member,
                  offset if offset is not None else error.offset)

    def note(self, kind: str, message: str, member: str | None = None,
             offset: int | None = None) -> None:
        """What only a tolerant reading meets (a local header no directory lists, bytes
        after a stream): recorded in report mode, nothing in strict mode, which has
        refused the file before it could get there."""
        if not self.strict:
            self.anomalies.append(Anomaly(kind, message, member, offset))
