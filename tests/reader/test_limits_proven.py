"""Each :class:`torchless.Limits` field stops an input built to exceed it, in bounded memory.

For every field there is at least one input (``CASES``) that breaks only that limit. Reading it
must raise :class:`torchless.LimitError` naming the field, and the peak memory traced by
:mod:`tracemalloc` while reading must stay under the case's stated ``bound``. The bound is far
below what the input needs when nothing stops it (``needs``, the arithmetic is beside each
case); for the inputs whose cost grows with the pickle, a control run of an eighth of the input
with the limit raised shows that the memory really is there to be taken.

A field added to :class:`Limits` without a case here fails
:func:`test_every_limit_field_has_a_case`.

Deflated ZIP members: a zip bomb (1 GiB of zeros in 1 MiB) is refused by
``max_inflate_ratio`` and a member declaring more than ``max_inflated_bytes`` by that limit,
through every path that inflates (whole member, block by block, ``Tensor.numpy``, ``load``),
before anything is inflated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import struct
import tarfile
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import torchless
from torchless import LimitError, Limits
from torchless.containers.ziparchive import ZipArchive
from torchless.io.source import Source
from torchless.pickle.machine import run_pickle

from .._fuzz_inputs import (
    ZipMember,
    make_zip,
    nested_tuples_pickle,
    state_dict_pickle,
    tensor_ops,
    tuple_call_chain_pickle,
    zip_checkpoint,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: Pointer size: one more value on a list or the stack costs at least this.
REF = 8


@dataclass
class Case:
    """An input that exceeds one limit."""

    write: Callable[[Path, int], None]  # (path, scale): scale 8 is the full input
    limits: Limits
    bound: int  # peak traced bytes allowed while refusing it
    needs: int | None  # bytes the input would take if the limit did not hold (a lower bound)
    control: bool = False  # an eighth of it, limit raised, must trace more than `bound`
    why: str = ""  # what the limit prevents, when that is not memory
    served: bool = False  # read from a local HTTP server that ignores Range, not the path


CASES: dict[str, list[Case]] = {}


def case(field: str, **kw: object) -> Callable[[Callable[[Path, int], None]],
                                               Callable[[Path, int], None]]:
    def register(write: Callable[[Path, int], None]) -> Callable[[Path, int], None]:
        CASES.setdefault(field, []).append(Case(write, **kw))  # type: ignore[arg-type]
        return write
    return register


def read_all(path: Path | str, limits: Limits) -> None:
    """What a user does: open, read every tensor, load the whole tree."""
    with torchless.open(path, limits=limits) as ckpt:
        for name in ckpt.tensors:
            ckpt.numpy(name)
    torchless.load(path, limits=limits)


def traced_peak(fn: Callable[[], object]) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        try:
            fn()
            err: BaseException | None = None
        except Exception as e:
            err = e
        return tracemalloc.get_traced_memory()[1], err
    finally:
        tracemalloc.stop()


def sparse(path: Path, head: bytes, size: int, tail: bytes) -> None:
    """``head``, zeros up to ``size`` bytes (a hole, not written), then ``tail``."""
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)
        f.seek(size)
        f.write(tail)


def zero_bomb(nbytes: int) -> bytes:
    """Raw deflate of ``nbytes`` zeros (a multiple of 1 MiB) in about nbytes / 1000 bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    return block * (nbytes // MiB) + b"\x03\x00"


def zeros_crc(nbytes: int) -> int:
    crc, block = 0, bytes(MiB)
    for _ in range(nbytes // MiB):
        crc = zlib.crc32(block, crc)
    return crc


def bomb_checkpoint(path: Path, inflated: int) -> None:
    """A ZIP checkpoint whose one uint8 storage is ``inflated`` zeros, deflated."""
    data = state_dict_pickle([("bomb", tensor_ops("0", inflated, 0, (inflated,), (1,),
                                                  storage="ByteStorage"))])
    path.write_bytes(make_zip([
        ZipMember("archive/data.pkl", data), ZipMember("archive/byteorder", b"little"),
        ZipMember("archive/data/0", zero_bomb(inflated), deflated=True, size=inflated,
                  crc=zeros_crc(inflated)),
        ZipMember("archive/version", b"3\n")]))


# ---- the pickle VM -------------------------------------------------------------------

N = 1_000_000  # values in the full-size VM inputs (scale 8)


@case("max_pickle_bytes", limits=Limits(max_pickle_bytes=64 * KiB), bound=512 * KiB,
      needs=N * REF, control=True)
def _many_small_ints(path: Path, scale: int) -> None:
    # MARK then N one-byte ints: all of them sit on the stack until APPENDS
    path.write_bytes(b"\x80\x02](" + b"K\x01" * (N * scale // 8) + b"e.")


@case("max_pickle_bytes", limits=Limits(max_pickle_bytes=MiB), bound=2 * MiB, needs=64 * MiB)
def _deflated_data_pkl(path: Path, scale: int) -> None:
    # data.pkl of a ZIP checkpoint declares 64 MiB (deflated to 64 KiB): refused uninflated
    n = 64 * MiB
    raw = b"\x80\x02X" + struct.pack("<I", n - 8) + bytes(n - 8) + b"."
    path.write_bytes(zip_checkpoint(raw, deflate_pickle=True))


@case("max_opcodes", limits=Limits(max_opcodes=10_000), bound=512 * KiB, needs=N * REF,
      control=True)
def _many_opcodes(path: Path, scale: int) -> None:
    _many_small_ints(path, scale)


@case("max_memo", limits=Limits(max_memo=10_000), bound=4 * MiB, needs=N * 40, control=True)
def _memoize_everything(path: Path, scale: int) -> None:
    # one None memoised N times after a first PUT at slot 2**32 - 1 (not the 0, 1, 2 …
    # picklers write, which the VM keeps in a list): a dict entry and an int key each
    path.write_bytes(b"\x80\x04Nr\xff\xff\xff\xff" + b"\x94" * (N * scale // 8) + b".")


@case("max_memo", limits=Limits(max_memo=10_000), bound=MiB, needs=N * REF)
def _memoize_in_order(path: Path, scale: int) -> None:
    # one None memoised N times by MEMOIZE (slots 0, 1, 2 …): a list slot each
    path.write_bytes(b"\x80\x04N" + b"\x94" * (N * scale // 8) + b".")


@case("max_stack", limits=Limits(max_stack=10_000), bound=512 * KiB, needs=N * REF,
      control=True)
def _many_nones(path: Path, scale: int) -> None:
    path.write_bytes(b"\x80\x02" + b"N" * (N * scale // 8) + b".")


@case("max_stack", limits=Limits(max_stack=10_000), bound=MiB, needs=1_000_000 * REF)
def _values_below_marks(path: Path, scale: int) -> None:
    # 200 segments of 5000 values, each under a MARK: no one segment is over the limit
    path.write_bytes(b"\x80\x02" + (b"N" * 5000 + b"(") * 200 + b".")


@case("max_depth", limits=Limits(), bound=MiB, needs=N * 56)
def _open_marks(path: Path, scale: int) -> None:
    # N MARKs: each opens a new (empty list) stack segment
    path.write_bytes(b"\x80\x02" + b"(" * (N * scale // 8) + b".")


@case("max_depth", limits=Limits(), bound=MiB, needs=N * 48)
def _nested_tuples(path: Path, scale: int) -> None:
    # {((((None,),),),): None} N deep: hashing the key overflowed the C stack (a crash)
    path.write_bytes(nested_tuples_pickle(N))


@case("max_depth", limits=Limits(), bound=MiB, needs=N // 4 * 48)
def _tuple_calls(path: Path, scale: int) -> None:
    # the same key built by builtins.tuple([previous]), a rule, not a TUPLE opcode
    path.write_bytes(tuple_call_chain_pickle(N // 4))


@case("max_container_len", limits=Limits(max_container_len=10_000), bound=512 * KiB,
      needs=N * REF, control=True)
def _long_list(path: Path, scale: int) -> None:
    # APPENDS of 1000 items at a time: the stack never holds more than 1000
    path.write_bytes(b"\x80\x02]" + (b"(" + b"K\x01" * 1000 + b"e") * (N * scale // 8000)
                     + b".")


@case("max_container_len", limits=Limits(max_container_len=10_000), bound=MiB,
      needs=N // 4 * 3 * REF)
def _big_dict(path: Path, scale: int) -> None:
    batches = (b"(" + b"".join(b"J" + struct.pack("<i", b * 500 + i) + b"N" for i in range(500))
               + b"u" for b in range(N // 4 // 500))
    path.write_bytes(b"\x80\x02}" + b"".join(batches) + b".")


@case("max_str_bytes", limits=Limits(max_str_bytes=MiB), bound=2 * MiB, needs=64 * MiB,
      control=True)
def _big_bytes(path: Path, scale: int) -> None:
    n = 64 * MiB * scale // 8
    sparse(path, b"\x80\x04\x8e" + struct.pack("<Q", n), 11 + n, b".")


@case("max_str_bytes", limits=Limits(max_str_bytes=MiB), bound=2 * MiB, needs=64 * MiB)
def _big_text_line(path: Path, scale: int) -> None:
    n = 64 * MiB
    with path.open("wb") as f:
        f.write(b"\x80\x02V")
        for _ in range(n // MiB):
            f.write(b"a" * MiB)
        f.write(b"\n.")


@case("max_int_digits", limits=Limits(), bound=MiB, needs=16 * MiB)
def _long_decimal(path: Path, scale: int) -> None:
    # a 16-million-digit protocol-0 long: parsing it is quadratic, the line alone 16 MiB
    with path.open("wb") as f:
        f.write(b"L")
        for _ in range(16):
            f.write(b"9" * MiB)
        f.write(b"L\n.")


@case("max_int_digits", limits=Limits(), bound=MiB, needs=16 * MiB)
def _long_binary(path: Path, scale: int) -> None:
    # a 16 MiB LONG4 (40 million digits): refused by its length, before it is read
    with path.open("wb") as f:
        f.write(b"\x80\x02\x8b" + struct.pack("<i", 16 * MiB))
        for _ in range(16):
            f.write(b"\x99" * MiB)
        f.write(b".")


# ---- tensors ---------------------------------------------------------------------------


@case("max_tensors", limits=Limits(), bound=4 * MiB, needs=1 << 41)
def _alias_explosion(path: Path, scale: int) -> None:
    # one tensor in a list, then 40 lists of the previous list twice: 2**41 tensor names
    body = b"\x80\x02" + b"]" + tensor_ops("0", 1, 0, (1,), (1,)) + b"a\x94"
    for level in range(40):
        body += b"0(" + b"h" + bytes([level]) + b"h" + bytes([level]) + b"l\x94"
    body += b"."
    path.write_bytes(zip_checkpoint(body, {"0": bytes(4)}))


@case("max_name_bytes", limits=Limits(), bound=4 * MiB, needs=100 << 20)
def _long_flat_names_case(path: Path, scale: int) -> None:
    # one 20,000-byte key memoised once and used down a 100-deep dict chain ending in 50
    # tensors: 50 names of 2 MB each (100 MB) from a 21 kB file
    body = b"\x80\x02X" + struct.pack("<I", 20_000) + b"k" * 20_000 + b"\x940"
    body += tensor_ops("0", 1, 0, (1,), (1,)) + b"q\x010"
    body += b"}(" + b"".join(b"J" + struct.pack("<i", i) + b"h\x01" for i in range(50))
    body += b"u" + b"q\x020}h\x00h\x02s" * 100 + b"."
    path.write_bytes(zip_checkpoint(body, {"0": bytes(4)}))


@case("max_tensor_bytes", limits=Limits(), bound=MiB, needs=4 << 40)
def _stride_zero_giant(path: Path, scale: int) -> None:
    # a (2**20, 2**20) float32 view of one element: 4 TiB once converted or copied
    data = state_dict_pickle([("t", tensor_ops("0", 1, 0, (1 << 20, 1 << 20), (0, 0)))])
    path.write_bytes(zip_checkpoint(data, {"0": bytes(4)}))


@case("max_ndim", limits=Limits(), bound=MiB, needs=None,
      why="numpy cannot make an array of more than 64 dimensions (ValueError)")
def _ten_thousand_dims(path: Path, scale: int) -> None:
    dims = (1,) * 10_000
    data = state_dict_pickle([("t", tensor_ops("0", 1, 0, dims, dims))])
    path.write_bytes(zip_checkpoint(data, {"0": bytes(4)}))


# ---- archives --------------------------------------------------------------------------


@case("max_archive_entries", limits=Limits(max_archive_entries=1000), bound=2 * MiB,
      needs=60_000 * 200)
def _zip_of_many_entries(path: Path, scale: int) -> None:
    members = [ZipMember("archive/data.pkl", b"\x80\x02N."),
               ZipMember("archive/version", b"3\n")]
    members += [ZipMember(f"archive/extra/{i}", b"") for i in range(60_000)]
    path.write_bytes(make_zip(members))


@case("max_archive_entries", limits=Limits(max_archive_entries=100), bound=MiB,
      needs=30_000 * 150)
def _tar_of_many_members(path: Path, scale: int) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(30_000):
            tar.addfile(tarfile.TarInfo(f"m{i}"), io.BytesIO(b""))
    path.write_bytes(out.getvalue())


@case("max_inflated_bytes", limits=Limits(max_inflated_bytes=16 * MiB,
                                          max_inflate_ratio=1 << 30),
      bound=4 * MiB, needs=256 * MiB)
def _big_deflated_storage(path: Path, scale: int) -> None:
    bomb_checkpoint(path, 256 * MiB)


@case("max_inflate_ratio", limits=Limits(), bound=4 * MiB, needs=GiB)
def _zip_bomb(path: Path, scale: int) -> None:
    bomb_checkpoint(path, GiB)


@case("max_download_bytes", limits=Limits(max_download_bytes=MiB), bound=8 * MiB,
      needs=64 * MiB, served=True)
def _whole_body(path: Path, scale: int) -> None:
    """A file of ``8 * scale`` MiB on a server that ignores Range: refused by its
    Content-Length before the body is read (the bound is the first import of the standard
    library's HTTP client, a few MiB)."""
    sparse(path, b"PK", 8 * scale * MiB, b"")


@contextlib.contextmanager
def _plain_server(root: Path) -> Iterator[str]:
    """The standard library's file server over ``root`` (no Range support; it streams a
    file in 64 KiB blocks, so its own memory does not count against the bound)."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, *args: object) -> None:  # the client hung up: expected
            pass

    from .._httpd import serving

    yield from serving(Server(("127.0.0.1", 0), functools.partial(Quiet,
                                                                  directory=str(root))))


# ---- the tests -------------------------------------------------------------------------

FIELDS = [f.name for f in dataclasses.fields(Limits)]


def test_every_limit_field_has_a_case() -> None:
    missing = [f for f in FIELDS if f not in CASES]
    assert not missing, f"Limits fields without a test that exceeds them: {missing}"
    assert not set(CASES) - set(FIELDS), "cases for fields Limits no longer has"


CASE_IDS = [(field, i) for field in FIELDS for i in range(len(CASES.get(field, [None])))]


@pytest.mark.parametrize(("field", "index"), CASE_IDS,
                         ids=[f"{f}-{CASES[f][i].write.__name__.strip('_')}"
                              if f in CASES else f for f, i in CASE_IDS])
def test_limit_stops_the_input_built_to_exceed_it(field: str, index: int,
                                                  tmp_path: Path) -> None:
    assert field in CASES, f"no case exceeds Limits.{field}"
    c = CASES[field][index]
    assert (c.needs is not None and c.bound * 4 <= c.needs) or c.why, (
        "the bound must be far below what the input needs")
    path = tmp_path / "over.pt"
    c.write(path, 8)
    with _plain_server(tmp_path) if c.served else contextlib.nullcontext("") as url:
        target = url + "over.pt" if url else path
        peak, err = traced_peak(lambda: read_all(target, c.limits))
    assert isinstance(err, LimitError), f"expected LimitError({field}), got {err!r}"
    assert err.limit_name == field
    assert f"limit {field}=" in str(err) and err.actual > err.limit
    assert peak < c.bound, f"peak traced memory {peak} over the bound {c.bound}"
    if c.control:
        raised = dataclasses.replace(c.limits, **{field: getattr(Limits(), field) * 64})
        small = tmp_path / "control.pt"
        c.write(small, 1)
        control_peak, control_err = traced_peak(
            lambda: torchless.open(small, limits=raised).close())
        assert not isinstance(control_err, LimitError) or control_err.limit_name != field
        assert control_peak > c.bound, (
            f"an eighth of the input traced only {control_peak} bytes with the limit raised: "
            "the case does not show what the limit saves")


def test_stack_limit_counts_values_below_marks_exactly() -> None:
    # 6 values, MARK, 4 more (10 at once), TUPLE, pop all 7, then one None
    stream = b"\x80\x02" + b"N" * 6 + b"(" + b"N" * 4 + b"t" + b"0" * 7 + b"N."
    assert run_pickle(stream, limits=Limits(max_stack=10))[0] is None
    with pytest.raises(LimitError) as info:
        run_pickle(stream, limits=Limits(max_stack=9))
    assert info.value.limit_name == "max_stack"
    assert info.value.offset == 2 + 6 + 1 + 3  # the fourth None above the MARK


# ---- deflated members: the ratio is bounded on every path that inflates ----------------


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.pt"
    bomb_checkpoint(path, GiB)
    assert path.stat().st_size < 2 * MiB  # ratio about 1000
    return path


def test_bomb_opens_lazily_and_refuses_on_read(bomb: Path) -> None:
    with torchless.open(bomb) as ckpt:  # opening reads no storage
        assert ckpt.tensors["bomb"].shape == (GiB,)
        peak, err = traced_peak(lambda: ckpt.numpy("bomb"))
    assert isinstance(err, LimitError) and err.limit_name == "max_inflate_ratio"
    assert peak < MiB


@pytest.mark.parametrize("path_kind", ["whole", "blocks"])
def test_bomb_refused_by_every_inflating_path(bomb: Path, path_kind: str) -> None:
    with Source(bomb) as src:
        archive = ZipArchive(src, Limits())

        def inflate() -> None:
            if path_kind == "whole":
                archive.data("archive/data/0", check_crc=False)
            else:
                for _ in archive.iter_member("archive/data/0", MiB, check_crc=False):
                    pass

        peak, err = traced_peak(inflate)
    assert isinstance(err, LimitError) and err.limit_name == "max_inflate_ratio"
    assert peak < MiB


def test_ratio_limit_applies_only_above_the_floor(tmp_path: Path) -> None:
    """Under 64 MiB a member may have any ratio (memory is bounded by the floor itself);
    above it, the same ratio is refused and raising the limit lets it through."""
    small = tmp_path / "small.pt"
    bomb_checkpoint(small, 16 * MiB)  # ratio ~1000, under the floor: read
    with torchless.open(small) as ckpt:
        assert ckpt.numpy("bomb").nbytes == 16 * MiB
    big = tmp_path / "big.pt"
    bomb_checkpoint(big, 80 * MiB)
    with torchless.open(big) as ckpt, pytest.raises(LimitError) as info:
        ckpt.numpy("bomb")
    assert info.value.limit_name == "max_inflate_ratio"
    with torchless.open(big, limits=Limits(max_inflate_ratio=2000)) as ckpt:
        assert ckpt.numpy("bomb").nbytes == 80 * MiB
