"""Every global a pickle stream names, found without running it (the scanner's pickle pass).

Two passes over one stream, because a scanner must not stop where a reader stops:

1. **Static walk** (:mod:`.walk`). Opcode by opcode (argument lengths checked
   against the bytes present, nothing allocated by a declared length), from the first byte
   to STOP or to the first byte that is not a decodable opcode. Every ``GLOBAL`` and ``INST``
   names its global inline; ``EXT1/2/4`` name one through the loader's extension registry.
   ``STACK_GLOBAL`` takes its operands from the stack: the walk follows string pushes and
   memo puts/gets closely enough to name them when the two values just before it are
   strings, and otherwise reports it unresolved (which the scanner calls dangerous).
2. **Inert run.** The repo's interpreter (:class:`._pickle.vm.Machine`) with the execution
   model's resolver (:mod:`.model`), which records each name and each action torch.load
   would take (imports, calls, builds, updates) and never refuses: it gives the exact
   operands of every ``STACK_GLOBAL`` it reaches, memo tricks and decoys included. Where it
   breaks (malformed data, a limit), the actions found before the break stay recorded; the
   names pass 1 found that the run never reached are judged as if called.

A stream whose every name is vetted to be called with any data (:data:`FAST_NAMES`: torch's
rebuild functions, storages, OrderedDict …) cannot take an action that is not vetted, whatever
its stack does (every name is an opcode the walk saw), so it is not run unless its value is
wanted; its names are listed as imports. A stream whose value is wanted (the small pickles of
a legacy stream or a TAR checkpoint) is run first, and walked statically only if the run
breaks: a run that reaches STOP has decoded every opcode the walk would.

Nothing here imports, calls or unpickles anything.
"""

from __future__ import annotations

import re
from typing import Any

from torchless.core.limits import Limits
from torchless.errors import CheckpointError, LimitError
from torchless.rules.allowlist import CALLS, call_verdict
from torchless.scanner.model import ActionLog, storage_verdict
from torchless.scanner.modelrun import FoundGlobal, ModelMachine, ModelRecorder
from torchless.scanner.plain import PlainStreams
from torchless.scanner.walk import MAX_LINE, StreamScan, static_walk

__all__ = ["DOTTED_NAME", "FAST_NAMES", "MAX_CHAINED", "PICKLE_START", "RUNS_OUT", "FoundGlobal",
           "StreamScan", "looks_like_pickle", "plausible", "scan_stream"]

#: Names vetted to be called with any data whose results are not callable and not
#: forwarding: a stream naming only these (and storage types) takes only vetted actions.
FAST_NAMES: frozenset[tuple[str, str]] = frozenset(
    tuple(path.rsplit(".", 1)) for path in CALLS  # type: ignore[misc]
    if path not in ("copyreg.__newobj__", "copyreg.__newobj_ex__", "_codecs.encode"))


_VETTED_ANY = "vetted to be called with any data"
#: Short plain-data streams already run (:mod:`.plain`): a legacy stream's header pickles.
PLAIN = PlainStreams()
#: What a GLOBAL or INST must name to be importable: a dotted Python name.
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def _not_a_pickle(static: dict[int, FoundGlobal]) -> bool:
    """A GLOBAL or INST names something no import could find."""
    return any(g.opcode in ("GLOBAL", "INST") and not (
        DOTTED_NAME.match(g.module) and DOTTED_NAME.match(g.name)) for g in static.values())


def _fast(g: FoundGlobal, plain: bool) -> bool:
    if (g.module, g.name) in FAST_NAMES:
        return True
    storage = storage_verdict(g.module, g.name, plain=plain)
    return storage is not None and storage[0] == "vetted" and not g.unresolved


def _judge_unreached(log: ActionLog, g: FoundGlobal, plain: bool) -> None:
    """A name the static walk found where the run did not reach: judged as if called."""
    if g.unresolved:
        log.add("import", f"{g.module}.{g.name}", "dangerous", f"{g.opcode} whose name cannot "
                f"be read statically ({g.unresolved})", g.offset, g.offset)
    elif g.module == "copyreg.extension":
        log.add("import", f"copyreg.extension.{g.name}", "dangerous", "names a global "
                "through the loading process's copyreg extension registry", g.offset, g.offset)
    elif _fast(g, plain):
        log.add("import", f"{g.module}.{g.name}", "vetted", _VETTED_ANY, g.offset, g.offset)
    else:
        severity, reason = call_verdict(g.module, g.name)
        log.add("call", f"{g.module}.{g.name}", severity, "not reached by the model run "
                f"(judged as called): {reason}", g.offset, g.offset)


def scan_stream(data: Any, start: int = 0, end: int | None = None,
                limits: Limits | None = None, *, want_value: bool = False,
                member: str | None = None, tentative: bool = False,
                header: str = "", plain: bool = False) -> StreamScan:
    """Both passes over the pickle at ``data[start:end]`` (``data``: bytes or an mmap);
    ``member``: the archive member it is, for the actions' report. ``tentative``: bytes that
    need not be a pickle, which the caller drops when a name read inline is no dotted name
    (``layouts.plausible``): such a stream is only walked (the run would name the same
    GLOBAL or INST at the same offset the same way), and has no actions. ``header``: what
    the stream is, when it is one of :data:`.plain.HEADERS` (a value is wanted). ``plain``:
    torch reads the stream with plain ``pickle.load`` (:mod:`torchless.rules.findclass`)."""
    stop = len(data) if end is None else end
    scan = StreamScan(start, stop, False)
    lim = limits or Limits()
    view = data if stop == len(data) else data[:stop]
    if want_value and stop - start <= MAX_LINE:
        if header:
            known = PLAIN.find(header, data, start, stop, lim)
            if known is not None:
                scan.value, scan.end = known
                scan.stopped = True
                return scan
        if _ran(scan, view, start, lim, member, plain):
            if header and not scan.globals and not scan.pids and not scan.actions:
                PLAIN.keep(header, view, start, scan.end, scan.value, lim)
            return scan
    static = static_walk(data, start, stop, scan, lim.max_pickle_bytes)
    if tentative and not want_value and _not_a_pickle(static):
        scan.globals = [static[k] for k in sorted(static)]
        return scan
    fast = all(_fast(g, plain) for g in static.values())
    if fast and not want_value:
        scan.globals = [static[k] for k in sorted(static)]
        log = ActionLog(data, member)
        for g in scan.globals:  # _judge_unreached of a name vetted to be called
            log.add("import", f"{g.module}.{g.name}", "vetted", _VETTED_ANY, g.offset,
                    g.offset)
        _finish(scan, log, start)
        return scan
    recorder = ModelRecorder(view, member)
    recorder.plain = plain
    machine = ModelMachine(view, recorder, lim)
    try:
        scan.value, _ = machine.run(start)
    except CheckpointError as e:
        scan.limited = scan.limited or isinstance(e, LimitError)
        where = e.offset if e.offset is not None else start
        message = e.message
        if not any(off == where for off, _ in scan.problems):
            scan.problems.insert(0, (where, message))
    except RecursionError:  # pragma: no cover - the interpreter bounds its own depth
        scan.problems.insert(0, (start, "nesting too deep to follow"))
    merged = dict(static)
    for offset, record in recorder.found.items():
        merged[offset] = record  # the interpreter's operands are exact
    scan.globals = [merged[k] for k in sorted(merged)]
    scan.pids = recorder.pids
    for offset in sorted(static.keys() - recorder.found.keys()):
        _judge_unreached(recorder.log, static[offset], plain)
    _finish(scan, recorder.log, start)
    return scan


def _ran(scan: StreamScan, view: Any, start: int, lim: Limits, member: str | None,
         plain: bool) -> bool:
    """The inert run alone, when it reaches STOP: then it has decoded every opcode the static
    walk would (the interpreter refuses what the walk reports on a whole stream: an argument
    across a frame's end; and no text line of a stream this short passes the walk's bound),
    and recorded every name exactly. False (nothing kept) when it breaks: both passes run."""
    recorder = ModelRecorder(view, member)
    recorder.plain = plain
    try:
        scan.value, scan.end = ModelMachine(view, recorder, lim).run(start)
    except (CheckpointError, RecursionError):
        return False
    scan.stopped = True
    scan.globals = [recorder.found[k] for k in sorted(recorder.found)]
    scan.pids = recorder.pids
    _finish(scan, recorder.log, start)
    return True


def _finish(scan: StreamScan, log: ActionLog, start: int) -> None:
    scan.actions = log.finished()
    scan.worst = log.worst


#: Pickles followed one after another in a plain file or after a legacy stream.
MAX_CHAINED = 1000
PICKLE_START = frozenset(b"(cNIJKLMFSTUVXG]})\x8a\x8c\x95\x80")
#: How the pickle walk says that the bytes ran out (a stream cut short by the data's end).
RUNS_OUT = re.compile(r"cut short|remain$|ends without a STOP|has no end of line")


def looks_like_pickle(head: Any, limits: Limits) -> bool:
    """Whether bytes that need not be a pickle (a member not named .pkl, data around an
    archive) are one: walked and run, they end at a STOP without a fault; or they open with
    PROTO and name a well-formed global before breaking (a payload in a broken stream).
    Tensor bytes pass neither test by chance, so real checkpoints raise no false alarm."""
    if not head or head[0] not in PICKLE_START:
        return False
    probe = scan_stream(head, 0, len(head), limits, tentative=True)
    if not probe.stopped and probe.end >= len(head) and probe.globals:
        return True  # the sniffed window ends inside a stream that names globals
    return plausible(probe, head)


def plausible(result: StreamScan, data: Any) -> bool:
    """A stream worth reporting among bytes that need not be a pickle: it names a global,
    every name it reads inline is a well-formed dotted name (bytes that merely decode as a
    GLOBAL cannot be imported) and it is whole, or opens with PROTO and breaks after them."""
    if not result.globals or not all(
            g.unresolved or (DOTTED_NAME.match(g.module) and DOTTED_NAME.match(g.name))
            for g in result.globals):
        return False
    if result.stopped and not result.problems:
        return True
    start = result.start
    return data[start] == 0x80 and len(data) > start + 1 and 2 <= data[start + 1] <= 5
