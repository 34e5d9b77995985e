"""Every global a pickle stream names and every action loading it takes (the scanner's pickle
pass), found by running it through the one interpreter, never by unpickling it.

Each stream is run by :class:`~torchless.pickle.machine.Machine` in trace mode with the
execution model's recording resolver (:func:`.modelrun.trace`): the reader's own opcode loop,
memo, frames, argument readers and limits, so the scanner and the reader can never decode a
stream differently. The resolver records each name (the exact operands of every
``STACK_GLOBAL``, memo tricks and decoys included; operands that are not two strings as a name
that cannot be read, which is dangerous), each ``EXT1/2/4`` code, and each action
torch.load would take (imports, calls, builds, updates), and refuses nothing.

Where CPython's two unpicklers disagree (an argument across a FRAME's end, a frame inside a
frame, values left at STOP, INT/GET text with a NUL byte), the trace reads on as the C
unpickler inside ``torch.load`` does and each place is a problem (an anomaly: such a file is
never clean). GLOBALs "buried" inside an argument that straddles a frame run in neither
unpickler (C reads the argument whole; the Python unpickler refuses the stream at the frame's
end), so they are not names. Where the run breaks (malformed data C refuses too, or a limit),
the actions found before the break stay recorded and the break is a problem: nothing after a
point where the C unpickler stops runs, and a limit is an anomaly.

Nothing here imports, calls or unpickles anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import CheckpointError, LimitError
from torchless.scanner.modelrun import FoundGlobal, trace
from torchless.scanner.plain import PlainStreams
from torchless.scanner.report import Action, Severity

__all__ = ["DOTTED_NAME", "MAX_CHAINED", "NOT_AN_OPCODE", "PICKLE_START", "RUNS_OUT",
           "FoundGlobal",
           "StreamScan", "looks_like_pickle", "plausible", "scan_stream"]


@dataclass
class StreamScan:
    """What one pickle stream holds, and where it went wrong."""

    start: int
    #: Offset after STOP, or where decoding gave up.
    end: int
    stopped: bool
    globals: list[FoundGlobal] = field(default_factory=list)
    #: (offset, message) of every place a reader would break or disagree.
    problems: list[tuple[int, str]] = field(default_factory=list)
    #: The inert value when the interpreter finished the stream, else None.
    value: Any = None
    #: Persistent ids the stream passed to BINPERSID (storages), in order.
    pids: list[Any] = field(default_factory=list)
    #: True when a Limits bound stopped the run before the end of the stream.
    limited: bool = False
    #: What torch.load would do with the stream (offsets from the stream's base).
    actions: list[Action] = field(default_factory=list)
    #: The worst severity of the actions each name (by its opcode's offset) takes part in.
    worst: dict[int, Severity] = field(default_factory=dict)


#: Short plain-data streams already run (:mod:`.plain`): a legacy stream's header pickles.
PLAIN = PlainStreams()
#: What a GLOBAL or INST must name to be importable: a dotted Python name.
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def scan_stream(data: Any, start: int = 0, end: int | None = None,
                limits: Limits | None = None, *, want_value: bool = False,
                member: str | None = None, header: str = "", pids: str = "storage",
                plain: bool = False, returned: bool = True) -> StreamScan:
    """The traced run of the pickle at ``data[start:end]`` (``data``: bytes or an mmap).

    ``member``: the archive member it is, for the actions' report (bytes that need not be a
    pickle are run alike: the caller drops them unless :func:`plausible`); ``want_value``:
    the caller reads the value (a legacy stream's pickles); ``header``: what the stream is,
    when it is one of :data:`.plain.HEADERS`; ``pids``: what the loader's persistent_load
    makes of an id (:data:`.modelrun.PIDS`); ``plain``: torch reads the stream with plain
    ``pickle.load`` (:mod:`torchless.rules.findclass`); ``returned``: the value reaches the
    program, so every callable in it counts as called (False: torch's loader consumes it, a
    header's)."""
    stop = len(data) if end is None else end
    scan = StreamScan(start, stop, False)
    lim = limits or Limits()
    view = data if stop == len(data) else data[:stop]
    if want_value and header:
        known = PLAIN.find(header, data, start, stop, lim)
        if known is not None:
            scan.value, scan.end = known
            scan.stopped = True
            return scan
    machine, recorder = trace(view, lim, member, pids, plain)
    try:
        scan.value, scan.end = machine.run(start)
        scan.stopped = True
        if returned:
            recorder.model_result(scan.value, start)
    except CheckpointError as e:
        scan.limited = isinstance(e, LimitError)
        scan.end = e.offset if e.offset is not None else start
        scan.problems.append((scan.end, e.message))
    scan.problems[:0] = machine.anomalies
    found = recorder.found
    scan.globals = [found[k] for k in sorted(found)]
    scan.pids = recorder.pids
    scan.actions = recorder.log.finished()
    scan.worst = recorder.log.worst
    if header and scan.stopped and not (scan.globals or scan.pids or scan.actions
                                        or scan.problems):
        PLAIN.keep(header, view, start, scan.end, scan.value, lim)
    return scan


#: Pickles followed one after another in a plain file or after a legacy stream.
MAX_CHAINED = 1000
PICKLE_START = frozenset(b"(cNIJKLMFSTUVXG]})\x8a\x8c\x95\x80")
#: How the run says that the bytes ran out (a stream cut short by the data's end): the
#: messages of :class:`~torchless.errors.TruncatedInputError` the interpreter raises.
RUNS_OUT = re.compile(r"ends without a STOP|remain$|has no end of line|expected \d+ bytes, "
                      r"got \d+$")

#: How the run says that a byte is no pickle opcode at all (no unpickler reads on from it).
NOT_AN_OPCODE = re.compile(r"^unknown opcode byte")


def looks_like_pickle(head: Any, limits: Limits) -> bool:
    """Whether bytes that need not be a pickle (a member not named .pkl, data around an
    archive) are one: run, they end at a STOP without a fault; or they open with PROTO and
    name a well-formed global before breaking (a payload in a broken stream).
    Tensor bytes pass neither test by chance, so real checkpoints raise no false alarm."""
    if not head or head[0] not in PICKLE_START:
        return False
    probe = scan_stream(head, 0, len(head), limits)
    if not probe.stopped and probe.end >= len(head) and probe.globals:
        return True  # the sniffed window ends inside a stream that names globals
    return plausible(probe, head)


def plausible(result: StreamScan, data: Any) -> bool:
    """A stream worth reporting among bytes that need not be a pickle: it names a global,
    every name the run read inline (GLOBAL, INST) or from the stack is a well-formed dotted
    name (bytes that merely decode as a GLOBAL cannot be imported) and it is whole, or opens
    with PROTO and breaks after them."""
    if not result.globals or not all(
            g.unresolved or (DOTTED_NAME.match(g.module) and DOTTED_NAME.match(g.name))
            for g in result.globals):
        return False
    if result.stopped and not result.problems:
        return True
    start = result.start
    return data[start] == 0x80 and len(data) > start + 1 and 2 <= data[start + 1] <= 5
