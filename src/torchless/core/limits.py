"""Resource limits, checked while reading, before anything is allocated.

Each default is far above what a real checkpoint needs and far below what
would hurt the machine; the reason is written beside each field.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits", "allowing_download"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Bounds on what one file may make torchless do. Pass ``Limits(field=...)`` to change one."""

    #: Bytes of one pickle stream (``data.pkl``). Real state dicts pickle to a few MiB;
    #: a pure-Python interpreter would take minutes over more than this.
    max_pickle_bytes: int = 256 * MiB
    #: Opcodes executed in one pickle. About 30 per tensor in a state dict.
    max_opcodes: int = 50_000_000
    #: Distinct memo slots. A pickle memoises at most once per object it builds.
    max_memo: int = 10_000_000
    #: Values on the stack at once (a flat container of this many items needs as many).
    max_stack: int = 50_000_000
    #: Nesting of containers and of MARKs. Real checkpoints nest a dozen levels; deep
    #: nesting exists only to break recursive code that walks the result.
    max_depth: int = 256
    #: Items in one list, dict, tuple or set; also the values a nested tuple holds when
    #: expanded, and those hashed for all the tuple keys of one pickle (pickle.keycost).
    max_container_len: int = 50_000_000
    #: Bytes of one str or bytes value inside a pickle.
    max_str_bytes: int = 256 * MiB
    #: Decimal digits of one integer: text parsing is quadratic in digits, and Python
    #: refuses to print an int of more than 4,300 (binary LONG1/LONG4 are bounded too).
    max_int_digits: int = 4300
    #: Tensors in one checkpoint (counted as flat names, so aliases count).
    max_tensors: int = 1_000_000
    #: Characters of all flat tensor names together. A name repeats every key on its path,
    #: so a long key shared down a deep chain makes huge names from a tiny file; counted
    #: before any name is built. A million tensors with 64-character names fit.
    max_name_bytes: int = 64 * MiB
    #: Logical bytes of one tensor (numel x itemsize). A stride-0 view of one element can
    #: declare terabytes; converting it would write them all.
    max_tensor_bytes: int = 256 * GiB
    #: Dimensions of one tensor (torch itself allows 64).
    max_ndim: int = 64
    #: Bytes downloaded whole from an HTTP server that ignores ``Range`` (it answers with
    #: the whole body): up to this size the file is fetched into an unnamed temporary file
    #: and read from there; a larger one is refused before its body is read. 64 MiB is a
    #: second or two on a common link and holds any small model or a test fixture (and
    #: ``python -m http.server`` ignores ``Range``). ``allow_full_download=True`` /
    #: ``--download`` lifts it.
    max_download_bytes: int = 64 * MiB
    #: Entries in a ZIP or TAR archive.
    max_archive_entries: int = 1_000_000
    #: Bytes a deflated member may inflate to.
    max_inflated_bytes: int = 16 * GiB
    #: Inflated/compressed ratio for members that inflate to more than 64 MiB (zip bombs;
    #: torch.save never compresses, so only re-packed archives meet this).
    max_inflate_ratio: int = 200

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if type(value) is not int or value < 0:
                raise ValueError(f"Limits.{name} must be a non-negative int, got {value!r}")


def allowing_download(limits: Limits | None, allow_full_download: bool) -> Limits | None:
    """``allow_full_download=True``: ``limits`` with no bound on ``max_download_bytes``."""
    if not allow_full_download:
        return limits
    import dataclasses

    return dataclasses.replace(limits if limits is not None else Limits(),
                               max_download_bytes=(1 << 63) - 1)
