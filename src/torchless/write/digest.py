"""Per-tensor digests taken while a safetensors file is written (the certificate's
``tensors``: :mod:`torchless.conversion.certificate`).

A digest is BLAKE2b with a 16-byte digest (``hashlib.blake2b(digest_size=16)``, 32 hex
characters: :data:`ALGORITHM`) of a tensor's bytes, contiguous, row-major (C order) and
little-endian: the bytes safetensors holds. 128 bits keep an accidental collision out of
reach (2**64 tensors for even odds) and keep the header small (:data:`HEX_DIGITS` characters
a digest); the certificate is a record against damage and mistakes, and a checker wanting a
longer digest has the sha256 of the source file.

``out`` digests are of the bytes written, taken as they go out: a tensor the kernel copies
(its pages never enter the process) is read from the source's map to be hashed, in a worker
thread beside the copy (``hashlib`` releases the GIL), its pages handed back behind the
hash; every other tensor is hashed block by block as it is written. ``src`` digests are of
a cast tensor's bytes before the cast, taken block by block as they are cast
(:func:`torchless.write.cast.cast_tensor`'s ``observe``); a tensor not cast has one digest
for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["ALGORITHM", "DIGEST_SIZE", "HASH_BLOCK_BYTES", "HEX_DIGITS", "PLACEHOLDER",
           "Digests", "digest_of", "new"]

#: Bytes of each digest (BLAKE2b's ``digest_size``).
DIGEST_SIZE = 16
#: The algorithm's name in the certificate.
ALGORITHM = "blake2b-128"
HEX_DIGITS = 2 * DIGEST_SIZE
#: What stands for a digest in the header written first (the same length: the header is
#: written again in place once the data is).
PLACEHOLDER = "0" * HEX_DIGITS
#: Block of a mapped tensor hashed at once (its pages released behind).
HASH_BLOCK_BYTES = 4 << 20
#: Mapped tensors at least this large are hashed in the worker thread.
BACKGROUND_BYTES = 1 << 20


def new() -> Any:
    """A fresh hash of the certificate's kind."""
    import hashlib  # with a certificate only: not at start-up

    return hashlib.blake2b(digest_size=DIGEST_SIZE)


def digest_of(blocks: Any) -> str:
    """The hex digest of the concatenated ``blocks`` (an iterable of bytes-like)."""
    h = new()
    for block in blocks:
        h.update(block)
    return str(h.hexdigest())


class Digests:
    """The digests of one output file's tensors, by output name."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.src: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: list[Future[None]] = []

    def output(self, name: str) -> Any:
        """The hash of ``name``'s bytes as written (a fresh one each call)."""
        h = self.out[name] = new()
        return h

    def source(self, name: str) -> Callable[[memoryview], None]:
        """The feed of ``name``'s bytes before its cast (a fresh hash each call: the last
        complete reading of the tensor counts)."""
        h = self.src[name] = new()
        return h.update  # type: ignore[no-any-return]

    def mapped(self, h: Any, view: memoryview, offset: int | None,
               release: Callable[[int, int], None] | None, background: bool) -> None:
        """Hash ``view`` (a view of the source's map, at ``offset`` in its file when known)
        into ``h``: in the worker thread when ``background`` and it is large, releasing
        the map's pages behind."""
        if not background or len(view) < BACKGROUND_BYTES:
            h.update(view)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchless-hash")
        self._jobs.append(self._pool.submit(_hash_blocks, h, view, offset, release))

    def wait(self) -> None:
        """Wait for the worker's hashes (its errors raised here)."""
        jobs, self._jobs = self._jobs, []
        try:
            for job in jobs:
                job.result()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def close(self) -> None:
        """Stop the worker (after an error: the hashes are not wanted)."""
        self._jobs = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def hexdigests(self) -> dict[str, tuple[str, str]]:
        """name -> (source digest, output digest), for every tensor written."""
        out = {}
        for name, h in self.out.items():
            o = str(h.hexdigest())
            s = self.src.get(name)
            out[name] = (o if s is None else str(s.hexdigest()), o)
        return out


def _hash_blocks(h: Any, view: memoryview, offset: int | None,
                 release: Callable[[int, int], None] | None) -> None:
    for pos in range(0, len(view), HASH_BLOCK_BYTES):
        block = view[pos:pos + HASH_BLOCK_BYTES]
        h.update(block)
        if release is not None and offset is not None:
            release(offset + pos, len(block))
