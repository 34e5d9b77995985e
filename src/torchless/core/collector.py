"""The one garbage-collector policy: paused while torchless builds what it keeps.

Opening, converting or scanning a checkpoint makes hundreds of thousands of objects, almost
none in cycles, all kept until the work ends: the cyclic collector's full passes over them
find nothing to free (they were 17-30 % of opening 30,000 small tensors, a fifth of
converting 20,000). Every entry point pauses it the same way, here.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collector_paused", "importing", "own_process", "pause_collector"]


def pause_collector() -> bool:
    """Pause the cyclic garbage collector for one run, only where no one else can see it.

    A run keeps every object it builds, so the collector's full passes (each over the whole
    process heap) find nothing to free; with them, opening a checkpoint of 30,000 small
    tensors costs 17-30 % more CPU. But ``gc.disable`` is process-wide: it is paused only
    when this is the process's only Python thread (no other thread can allocate, or toggle
    the collector, while the run holds it) and the collector is on; the caller re-enables it
    after, so a nested run, which finds it off, leaves it to the outer one. With other
    threads the collector is left alone. Returns whether it was paused.
    """
    if not gc.isenabled() or threading.active_count() != 1:
        return False
    gc.disable()
    return True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for a block, as for one run
    (:func:`pause_collector`): opening a checkpoint keeps what it builds, around the run too
    (the archive's directory, the tree's walks), and the collector's passes over 30,000
    tensors' objects were 8 % of an open."""
    paused = pause_collector()
    try:
        yield
    finally:
        if paused:
            gc.enable()


#: Whether this process is torchless's own command line (``python -m torchless``), where
#: what the start-up imports made may be frozen for good (:func:`importing`); never in a
#: program that calls torchless, whose heap is not ours to freeze.
_OWN_PROCESS = False


def own_process() -> None:
    """Note that this process is ``python -m torchless`` (its ``__main__`` calls this)."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """A command's start-up imports: the collector paused while they run, as for one run
    (:func:`pause_collector`); in the command line's own process (:func:`own_process`), what
    they made is then moved out of the collector's view (``gc.freeze``: modules, classes,
    functions and tables live as long as the process). The collector's passes over them,
    during the imports and at interpreter exit, were 8 % of the instructions of
    ``python -m torchless scan`` of one small file."""
    paused = pause_collector()
    try:
        yield
    finally:
        if paused:
            if _OWN_PROCESS:
                gc.freeze()
            gc.enable()
