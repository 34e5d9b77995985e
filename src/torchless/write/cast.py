"""Casting floating tensors to bfloat16, float16 or float32 while they are written, with
torch's semantics bit for bit (``tensor.to(dtype)`` on this machine's CPU build).

The pure functions take a block of a tensor's contiguous little-endian bytes and return the
cast block; :func:`cast_tensor` wraps a tensor in a streamed one of the target dtype, so the
safetensors writer (and verification) read it through :func:`~torchless.model.chunks.chunks`
unchanged, block by block (the next one cast in a thread while one is written): memory stays
bounded by a few blocks of :data:`BLOCK_BYTES` whatever the tensor's size.

What torch 2.x computes, measured on x86-64 (AVX2 and AVX-512 builds), and what is done here:

* rounding is to nearest, ties to even, with subnormals kept (no flush to zero) and finite
  values past the target's largest rounding to ±inf (float16: from 65520);
* float64 goes through float32 first (torch's conversions take a ``float``), so a value can
  round twice: ``1 + 2**-8 + 2**-40`` becomes bfloat16 1.0, not the nearest 1.0078125;
* float32 → bfloat16 is the integer rounding ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` on the
  bits; every NaN becomes 0xFFFF (torch's vectorized path blends that constant in);
* float32 / bfloat16 → float16: a NaN keeps its sign and top payload bits, quieted:
  ``sign | 0x7E00 | (mantissa >> 13)`` (NumPy's ``astype`` does not quiet it);
* float16 → float32: a NaN keeps its sign and payload, quieted (``0x7FC00000``);
* float16 → bfloat16: every NaN becomes 0x7FC0, its sign dropped;
* bfloat16 → float32: the 16 bits shifted up (exact, NaN payloads included);
* float64 → float32: the hardware conversion (NaN quieted, top payload bits kept).

Two of torch's NaN results depend on where an element falls in its vectorized loop (the last
``n % 8`` or ``n % 16`` elements of each thread's range take a scalar path), so no function of
the element alone reproduces them: float64 → bfloat16 NaN is 0xFFFF in the vector body and
0x7FC0 in the tail, and float16 → float32 NaN is quieted with its payload in the body and
0x7FFFFFFF in the tail. Both take the vector body's result here (what all but a handful of a
large tensor's NaNs get, and the same rule as the float32 paths). Every other result, NaN or
not, is what torch gives whatever the position.

float8 sources (``float8_e4m3fn``, ``float8_e5m2``) are widened through a table of their 256
codes, built from the formats' definitions (OCP FP8: E4M3 with bias 7, no infinities, NaN at
S.1111.111; E5M2 with bias 15, IEEE infinities and NaNs): every finite value is exact in all
three targets, ±0 and ±inf keep their sign, and NaNs become what torch gives (the same in
any position: torch converts float8 element by element):

* E4M3 → float32 / float16: the NaN's sign, the target's all-ones exponent and its mantissa
  bits shifted up (``0x7F`` → ``0x7FF00000`` / ``0x7F80``), not quieted;
* E5M2 → float32 / float16: as a float16 NaN (E5M2 is float16's top byte), quieted
  (``sign | 0x7FC00000 | mantissa << 13``; ``bits << 8 | 0x0200``);
* either → bfloat16: 0x7FC0, its sign dropped.

Integer, bool and complex tensors are never cast; nor is ``float8_e8m0fnu`` (refused by
name: widening it to float16 would round, with rules this module does not have).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from torchless.core.dtypes import DType, by_torch_name
from torchless.errors import ConversionError
from torchless.model.chunks import chunks, is_plain
from torchless.model.tensor import Storage, Tensor

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["BLOCK_BYTES", "CASTABLE", "METADATA_KEY", "TARGETS", "Cast", "cast_block",
           "cast_tensor", "target_dtype"]

#: Largest block of source (or target) bytes cast at once: big enough that NumPy's per-call
#: cost is small against the work (CPU time per 256 MiB of float32 → bfloat16: 0.06 s with
#: 1 and 2 MiB blocks, 0.07 s with 4 MiB, 0.09 s with 256 KiB), small enough that the blocks in
#: flight and their temporaries keep the peak RSS flat; the bfloat16 and float16 blocks of
#: float32 (1 MiB) are then written without being gathered (``stream.KERNEL_MIN_BYTES``).
BLOCK_BYTES = 2 << 20
#: The ``__metadata__`` key recording what was cast (JSON text: see :meth:`Cast.record`).
METADATA_KEY = "torchless.cast"
#: The dtypes a cast may produce, by the names ``--dtype`` takes.
TARGETS = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
           "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32"}
#: The float8 formats widened by table: (exponent bits, mantissa bits, exponent bias, and
#: whether the all-ones exponent holds infinities and NaNs as in IEEE 754; else only the
#: code with every bit of exponent and mantissa set is NaN, "fn": finite).
_FLOAT8 = {"float8_e4m3fn": (4, 3, 7, False), "float8_e5m2": (5, 2, 15, True)}
#: The source dtypes cast (floating types NumPy can compute on, and the float8 tables).
CASTABLE = frozenset({"float64", "float32", "float16", "bfloat16", *_FLOAT8})
_REFUSED_PREFIX = "float8"

_U16, _U32 = np.dtype("<u2"), np.dtype("<u4")
#: Elements of float32 cast to bfloat16 at once inside a block (1 MiB of source: two pieces
#: a block; with its scratch and output, 2.5 MiB per thread stay in the shared L3 cache, and
#: NumPy's cost per call, six calls a piece, is spread over more elements than with pieces
#: that fit a core's 1 MiB L2). User CPU time of ``cast_block`` over the 4 GiB source of
#: ``benchmarks/cast_convert.py`` read through its map (one thread, nothing written), medians
#: of 10 interleaved runs on the shared 2-core machine: 1.62 s with 256 Ki elements, against
#: 1.91 s with 64 Ki (256 KiB of source) and 1.82 s with whole 512 Ki blocks (6 runs: 1.58 s
#: with 256 Ki, 1.67 s with 128 Ki, 1.83 s with 64 Ki). Before, a fresh temporary per pass
#: on whole blocks: 0.38 s of CPU per 512 MiB against 0.26 s with pieces.
_SUB_ELEMENTS = 256 << 10
#: Elements of float32 cast to float16 at once (:func:`_f32_to_f16`: four scratch buffers
#: of 256 KiB or less a thread).
_F16_ELEMENTS = 64 << 10
#: Blocks cast at once by :func:`_ahead`'s threads: one per core, two at most (with the
#: writer's thread beside them, more would only contend).
_WORKERS = max(1, min(2, os.cpu_count() or 1))


def target_dtype(name: str) -> DType:
    """The dtype ``--dtype NAME`` means (bf16, fp16, fp32 or a torch name of one)."""
    torch_name = TARGETS.get(name.lower().removeprefix("torch."))
    dtype = by_torch_name(torch_name) if torch_name else None
    if dtype is None:
        raise ConversionError(f"cannot cast to {name!r}: the dtype is one of bf16, fp16, fp32",
                              hint="pass --dtype bf16, --dtype fp16 or --dtype fp32")
    return dtype


# ---- the casts, on blocks of bits ------------------------------------------------------------


def _nan(floats: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """The NaN mask of ``floats``, or None when there is none (found by ``max``, which
    propagates NaN: one pass and no mask for the usual block)."""
    if not floats.size or not np.isnan(floats.max()):
        return None
    mask: np.ndarray[Any, Any] = np.isnan(floats)
    return mask


_local = threading.local()


def _scratch(name: str = "scratch", size: int | None = None,
             dtype: np.dtype[Any] = _U32) -> np.ndarray[Any, Any]:
    """This thread's buffer ``name`` of ``size`` (:data:`_SUB_ELEMENTS`) elements (one per
    thread, kept: a fresh one per block costs page faults)."""
    buf: np.ndarray[Any, Any] | None = vars(_local).get(name)
    if buf is None:
        buf = np.empty(_SUB_ELEMENTS if size is None else size, dtype)
        setattr(_local, name, buf)
    return buf


def _f32_to_bf16(u: np.ndarray[Any, Any], nan: int | None = 0xFFFF) -> np.ndarray[Any, Any]:
    """bfloat16 bits of float32 bits, rounded to nearest even; NaN -> ``nan`` (None: the
    caller sets them).

    The block is done in pieces of :data:`_SUB_ELEMENTS` that stay in the cache:
    four in-place passes on one scratch buffer of 32-bit words, the last shift narrowing
    straight into the output, and the NaN test (``max``) on the piece still in cache."""
    out = np.empty(u.size, _U16)
    r_all = _scratch()
    nans = False
    for i in range(0, u.size, _SUB_ELEMENTS):
        x = u[i:i + _SUB_ELEMENTS]
        r = r_all[:x.size]
        np.right_shift(x, 16, out=r)
        np.bitwise_and(r, 1, out=r)
        np.add(r, x, out=r)  # wraps only for NaNs, overwritten below
        np.add(r, 0x7FFF, out=r)
        np.right_shift(r, 16, out=out[i:i + _SUB_ELEMENTS], casting="unsafe")
        if nan is not None and not nans:
            nans = bool(np.isnan(x.view("<f4").max()))
    if nans and nan is not None:
        out[np.isnan(u.view("<f4"))] = nan
    return out


def _f32_to_f16(u: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float16 bits of float32 bits, rounded to nearest even (subnormals kept, from 65520
    to inf), NaNs quieted with their sign and top payload bits as torch does.

    On the magnitude ``a`` (the sign put back at the end), in pieces of
    :data:`_F16_ELEMENTS` on this thread's scratch buffers: a normal result is the integer
    rounding ``(a - (112 << 23) + 0xFFF + ((a >> 13) & 1)) >> 13`` (which also carries to
    inf past the largest half); below 2**-14 (``113 << 23``) the hardware rounds, adding 0.5
    as float32 (its ulp is float16's least subnormal, 2**-24) and taking the bits above
    0.5's; from 2**16 (``143 << 23``: inf and NaN too) 0x7C00, NaNs then set from the mask.
    NumPy's own ``astype`` (a scalar loop) took 5.8 ns an element against 3.7 ns for these
    16 passes (CPU time, 32 Mi normal floats, one thread, the shared machine)."""
    out = np.empty(u.size, _U16)
    a_all, t_all = _scratch("f16_a", _F16_ELEMENTS), _scratch("f16_t", _F16_ELEMENTS)
    d_all, m_all = (_scratch("f16_d", _F16_ELEMENTS),
                    _scratch("f16_m", _F16_ELEMENTS, np.dtype(bool)))
    nans = False
    with np.errstate(invalid="ignore"):  # NaN + 0.5, overwritten
        for i in range(0, u.size, _F16_ELEMENTS):
            x = u[i:i + _F16_ELEMENTS]
            a, t, d, m = a_all[:x.size], t_all[:x.size], d_all[:x.size], m_all[:x.size]
            np.bitwise_and(x, 0x7FFFFFFF, out=a)
            np.right_shift(a, 13, out=t)
            np.bitwise_and(t, 1, out=t)
            np.add(t, a, out=t)
            np.add(t, 0xC8000FFF, out=t)  # - (112 << 23) + 0xFFF, modulo 2**32
            np.right_shift(t, 13, out=t)
            np.add(a.view("<f4"), np.float32(0.5), out=d.view("<f4"))
            np.subtract(d, 0x3F000000, out=d)
            np.less(a, 113 << 23, out=m)
            np.copyto(t, d, where=m)
            np.greater_equal(a, 143 << 23, out=m)
            np.copyto(t, 0x7C00, where=m)
            np.right_shift(x, 16, out=d)
            np.bitwise_and(d, 0x8000, out=d)
            np.bitwise_or(t, d, out=t)
            np.copyto(out[i:i + _F16_ELEMENTS], t, casting="unsafe")
            if not nans:
                nans = bool(np.isnan(x.view("<f4").max()))
    if nans:
        mask = np.isnan(u.view("<f4"))
        n = u[mask]
        out[mask] = ((n >> 16) & 0x8000) | 0x7E00 | ((n >> 13) & 0x3FF)
    return out


def _f16_to_f32(h: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    f = h.view("<f2")
    out = f.astype("<f4").view(_U32)
    mask = _nan(f)
    if mask is not None:
        n = h[mask].astype(_U32)
        out[mask] = ((n & 0x8000) << 16) | 0x7FC00000 | ((n & 0x3FF) << 13)
    return out


def _f64_to_f32(d: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(all="ignore"):
        return d.view("<f8").astype("<f4").view(_U32)


def _bf16_to_f32(b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = b.astype(_U32)
    np.left_shift(out, 16, out=out)
    return out


def _f16_to_bf16(h: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    f = h.view("<f2")
    out = _f32_to_bf16(f.astype("<f4").view(_U32), nan=None)
    mask = _nan(f)
    if mask is not None:
        out[mask] = 0x7FC0
    return out


#: (source, target) -> the function from the source's bits to the target's.
_CASTS: dict[tuple[str, str], Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]] = {
    ("float32", "bfloat16"): _f32_to_bf16,
    ("float64", "bfloat16"): lambda d: _f32_to_bf16(_f64_to_f32(d)),
    ("float16", "bfloat16"): _f16_to_bf16,
    ("float32", "float16"): _f32_to_f16,
    ("float64", "float16"): lambda d: _f32_to_f16(_f64_to_f32(d)),
    ("bfloat16", "float16"): lambda b: _f32_to_f16(_bf16_to_f32(b)),
    ("float64", "float32"): _f64_to_f32,
    ("float16", "float32"): _f16_to_f32,
    ("bfloat16", "float32"): _bf16_to_f32,
}
_UINT = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def _float8_bits(source: str, target: str, code: int) -> int:
    """The ``target`` bits torch gives for the float8 ``code`` (module docstring)."""
    e_bits, m_bits, bias, ieee = _FLOAT8[source]
    sign, e, m = code >> 7, (code >> m_bits) & ((1 << e_bits) - 1), code & ((1 << m_bits) - 1)
    top = e == (1 << e_bits) - 1
    nan = top and (m != 0 if ieee else m == (1 << m_bits) - 1)
    wide = target == "float32"
    if nan and target == "bfloat16":
        return 0x7FC0
    if ieee and top:  # E5M2: float16's top byte
        h = code << 8
        if not nan:  # ±inf
            return (sign << 31) | 0x7F800000 if wide else (
                (sign << 15) | 0x7F80 if target == "bfloat16" else h)
        return (sign << 31) | 0x7FC00000 | ((h & 0x3FF) << 13) if wide else h | 0x0200
    if nan:  # E4M3's NaN, shifted up
        return (sign << 31) | 0x7F800000 | (m << (23 - m_bits)) if wide else (
            (sign << 15) | 0x7C00 | (m << (10 - m_bits)))
    value = (-1.0) ** sign * (m / (1 << m_bits) + (e > 0)) * 2.0 ** (max(e, 1) - bias)
    if target == "float16":
        return int(np.array(value, "<f2").view(_U16))
    bits = int(np.array(value, "<f4").view(_U32))  # exact: 3 mantissa bits at most
    return bits >> 16 if target == "bfloat16" else bits


def _float8_cast(source: str, target: str) -> Callable[[np.ndarray[Any, Any]],
                                                      np.ndarray[Any, Any]]:
    """The cast of ``source`` float8 codes to ``target`` bits, by a table of all 256."""
    table: np.ndarray[Any, Any] | None = None

    def cast(codes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        nonlocal table
        if table is None:
            table = np.array([_float8_bits(source, target, c) for c in range(256)],
                             dtype=_U32 if target == "float32" else _U16)
        out: np.ndarray[Any, Any] = table[codes]
        return out

    return cast


_CASTS.update({(s, t): _float8_cast(s, t) for s in _FLOAT8
               for t in ("bfloat16", "float16", "float32")})


def cast_block(source: DType, target: DType, data: bytes | memoryview) -> memoryview:
    """``data``, whole elements of ``source`` (contiguous, little-endian), cast to
    ``target``: the target's little-endian bytes."""
    if source.name == target.name:
        return memoryview(data).cast("B")
    try:
        fn = _CASTS[source.name, target.name]
    except KeyError:
        raise ConversionError(f"cannot cast torch.{source.name} to torch.{target.name}"
                              ) from None
    bits = np.frombuffer(data, dtype=_UINT[source.itemsize])
    return fn(bits).data.cast("B")


# ---- tensors ---------------------------------------------------------------------------------


def _source_blocks(t: Tensor, block: int, spill_dir: str | None) -> Iterator[memoryview]:
    """The tensor's contiguous little-endian bytes in blocks of at most ``block`` bytes
    (whole elements)."""
    if is_plain(t) and not t.storage.streams:
        begin = t.storage_offset * t.dtype.itemsize
        view = memoryview(t.storage.buffer()).cast("B")[begin:begin + t.nbytes]
        for i in range(0, len(view), block):
            yield view[i:i + block]
        return
    for part in chunks(t, spill_dir):
        mv = memoryview(part).cast("B")
        for i in range(0, len(mv), block):
            yield mv[i:i + block]


def _ahead(pieces: Iterator[memoryview], cast: Callable[[memoryview], memoryview],
           release: Callable[[memoryview], None] | None) -> Iterator[memoryview]:
    """``cast`` of each piece, in order, the next ones computed in worker threads while the
    caller writes the one before (NumPy and ``os.write`` release the GIL: the casts and the
    write overlap); each piece is released once cast. :data:`_WORKERS` casts run at once
    (one per core, two at most), the caller's write beside them."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor  # large tensors only

    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="torchless-cast") as pool:
        pending: deque[tuple[memoryview, Future[memoryview]]] = deque()
        for piece in pieces:
            pending.append((piece, pool.submit(cast, piece)))
            if len(pending) > _WORKERS:
                yield _done(*pending.popleft(), release)
        while pending:
            yield _done(*pending.popleft(), release)


def _fed(pieces: Iterator[memoryview], feed: Callable[[memoryview], None]
         ) -> Iterator[memoryview]:
    for piece in pieces:
        feed(piece)
        yield piece


def _done(piece: memoryview, future: Future[memoryview],
          release: Callable[[memoryview], None] | None) -> memoryview:
    out = future.result()
    if release is not None:
        release(piece)
    return out


def cast_tensor(t: Tensor, target: DType, *,
                release: Callable[[memoryview], None] | None = None,
                spill_dir: str | None = None,
                observe: Callable[[], Callable[[memoryview], None]] | None = None) -> Tensor:
    """``t`` as a contiguous tensor of ``target`` whose bytes are cast as they are read
    (a streamed storage: :meth:`Storage.iter_bytes` casts block by block). ``release``
    hands back the source map's pages behind each block read. ``observe()``, called each
    time the tensor is read, gives a function that is handed the source's bytes (contiguous,
    little-endian) block by block, in order, as they are cast (the certificate's source
    digest: :mod:`torchless.write.digest`)."""
    source = t.dtype
    if source.name not in CASTABLE:  # pragma: no cover - Cast.plan refuses them first
        raise ConversionError(f"cannot cast torch.{source.name}")

    def stream(chunk: int) -> Iterator[memoryview]:
        # blocks of at most ``chunk`` target bytes, whole elements
        elements = max(1, min(chunk, BLOCK_BYTES) // max(source.itemsize, target.itemsize))
        block = elements * source.itemsize
        pieces = _source_blocks(t, block, spill_dir)
        if observe is not None:  # fed here, in order, whichever worker casts a block
            pieces = _fed(pieces, observe())

        def one(piece: memoryview) -> memoryview:
            return cast_block(source, target, piece)

        if t.nbytes <= block:
            for piece in pieces:
                yield one(piece)
                if release is not None:
                    release(piece)
            return
        yield from _ahead(pieces, one, release)

    def load() -> bytes:  # the whole cast tensor, for a reader that asks for all of it
        return b"".join(bytes(b) for b in stream(BLOCK_BYTES))

    storage = Storage(t.storage.key, target, t.numel * target.itemsize, load,
                      location=t.storage.location, stream=stream)
    stride = tuple(math.prod(t.shape[i + 1:]) for i in range(t.ndim))
    return Tensor(storage, target, t.shape, stride, 0, requires_grad=t.requires_grad,
                  is_parameter=t.is_parameter, is_storage=t.is_storage, attrs=t.attrs)


@dataclass(frozen=True)
class Cast:
    """A ``--dtype`` request: floating tensors (those whose flat name matches one of
    ``filters``, every one when there are none) cast to ``dtype``."""

    dtype: DType
    filters: tuple[str, ...] = ()

    @classmethod
    def of(cls, dtype: str | DType | None, filters: Sequence[str] = ()) -> Cast | None:
        """The request ``dtype=`` / ``dtype_filter=`` make (None: no cast)."""
        if dtype is None:
            if filters:
                raise ConversionError("dtype_filter (--dtype-filter) needs dtype (--dtype)")
            return None
        target = dtype if isinstance(dtype, DType) else target_dtype(dtype)
        if target.name not in ("bfloat16", "float16", "float32"):
            raise ConversionError(f"cannot cast to torch.{target.name}: the dtype is one of "
                                  "bf16, fp16, fp32")
        return cls(target, tuple(filters))

    def chosen(self, name: str) -> bool:
        return not self.filters or any(fnmatch.fnmatchcase(name, g) for g in self.filters)

    def plan(self, tensors: Mapping[str, Tensor]) -> dict[str, DType]:
        """name -> source dtype of the tensors to cast (those of another dtype than the
        target); other float8 tensors chosen (``float8_e8m0fnu``, the ``fnuz`` kinds) are
        refused by name."""
        out: dict[str, DType] = {}
        refused = []
        for name, t in tensors.items():
            if not self.chosen(name) or t.dtype.name == self.dtype.name:
                continue
            if t.dtype.name in CASTABLE:
                out[name] = t.dtype
            elif t.dtype.name.startswith(_REFUSED_PREFIX):
                refused.append(f"{name} (torch.{t.dtype.name})")
        if refused:
            shown = ", ".join(refused[:20]) + (f" and {len(refused) - 20} more"
                                               if len(refused) > 20 else "")
            raise ConversionError(f"cannot cast {len(refused)} float8 tensor(s) to "
                                  f"torch.{self.dtype.name}: {shown}",
                                  hint="choose the names to cast with --dtype-filter GLOB "
                                       "(dtype_filter=): float8 tensors are left as they are")
        return out

    def apply(self, tensors: Mapping[str, Tensor], *,
              release: Callable[[memoryview], None] | None = None,
              spill_dir: str | None = None,
              observe: Callable[[str], Callable[[memoryview], None]] | None = None
              ) -> tuple[dict[str, Tensor], str]:
        """The tensors with those chosen cast (streamed), and the record of what was cast
        for ``__metadata__``; ``observe(name)`` as for :func:`cast_tensor`."""
        planned = self.plan(tensors)

        def watch(name: str) -> Callable[[], Callable[[memoryview], None]] | None:
            return None if observe is None else lambda: observe(name)

        out = {n: cast_tensor(t, self.dtype, release=release, spill_dir=spill_dir,
                              observe=watch(n))
               if n in planned else t for n, t in tensors.items()}
        return out, self.record(planned)

    def record(self, planned: Mapping[str, DType]) -> str:
        """``{"dtype": target, "filter": [globs], "cast": {source dtype: [names]}}`` as
        compact JSON with sorted keys (safetensors dtype names)."""
        by_source: dict[str, list[str]] = {}
        for name, dtype in planned.items():
            by_source.setdefault(dtype.safetensors or dtype.name, []).append(name)
        return json.dumps({"dtype": self.dtype.safetensors, "filter": list(self.filters),
                           "cast": {k: sorted(v) for k, v in sorted(by_source.items())}},
                          ensure_ascii=False, separators=(",", ":"), sort_keys=True)
