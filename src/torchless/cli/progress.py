"""A one-line progress display on stderr, drawn only when stderr is a terminal: done and
total (bytes or files), the percentage, the rate and the time left, redrawn at most ten
times a second; for a conversion also the tensors written, for a scan the files scanned.
``-q``, ``TORCHLESS_QUIET=1`` or ``TORCHLESS_PROGRESS=0`` turn it off."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "eta", "progress_wanted", "quiet_from_env"]

#: Seconds before the first draw (a fast job shows no bar) and between two draws.
_FIRST_DRAW = 0.5
_REDRAW = 0.1
_WIDTH = 24


def _env_flag(name: str) -> bool | None:
    """True for 1/yes/true/on, False for 0/no/false/off, None when unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    return value not in ("0", "no", "false", "off")


def quiet_from_env() -> bool:
    """``TORCHLESS_QUIET=1``: as ``-q`` on every command."""
    return bool(_env_flag("TORCHLESS_QUIET"))


def progress_wanted(quiet: bool, stream: TextIO | None = None) -> bool:
    """A bar is drawn on a terminal only, never with ``-q`` or ``TORCHLESS_PROGRESS=0``."""
    stream = sys.stderr if stream is None else stream
    if quiet or _env_flag("TORCHLESS_PROGRESS") is False:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a stand-in without it, or a closed stream
        return False


def eta(seconds: float) -> str:
    """``M:SS``, or ``H:MM:SS`` from an hour on."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """``progress(done, total)``: the callback :func:`torchless.convert` takes (bytes), or
    files of a batch or a scan (``unit="files"``). ``count`` adds "N tensors" once known;
    ``convert`` sets it through :meth:`tensors` ("12/26 tensors")."""

    def __init__(self, human: Callable[[int], str], *, unit: str = "bytes",
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.human = human
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.start = clock()
        self.last = -1.0
        self.shown = False
        self.count: str | None = None
        self._width = 0

    def line(self, done: int, total: int, now: float) -> str:
        """The line drawn for ``done`` of ``total`` at ``now`` (without the carriage
        return): bar, percentage, done/total, rate and time left."""
        frac = min(1.0, done / total) if total > 0 else 1.0
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        filled = int(frac * _WIDTH)
        if self.unit == "bytes":
            amount = f"{self.human(done)} / {self.human(total)}"
            speed = f"{self.human(int(rate))}/s"
        else:
            amount = f"{done}/{total} {self.unit}"
            speed = f"{rate:.1f} {self.unit}/s"
        left = eta((total - done) / rate) if rate > 0 and done < total else (
            "0:00" if done >= total else "?")
        extra = f"  {self.count}" if self.count else ""
        return (f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {frac * 100:5.1f}%  {amount}  "
                f"{speed}  ETA {left}{extra}")

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.start < _FIRST_DRAW and not self.shown and done < total:
            return
        if now - self.last < _REDRAW and done < total:
            return
        self.last = now
        self.shown = True
        text = self.line(done, total, now)
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def tensors(self, done: int, total: int) -> None:
        """``convert`` tells the tensors written of those it writes (before the bytes)."""
        self.count = f"{done}/{total} tensors"

    def clear(self) -> None:
        """Wipe the line (before another line is printed on the same terminal)."""
        if self.shown and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def close(self) -> None:
        if self.shown:
            self.clear()
            self.shown = False
