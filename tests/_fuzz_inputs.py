"""Inputs for the fuzzers: seed checkpoints, hand-built containers, mutations, opcode streams.

Shared by ``tests/project/test_fuzz.py`` (hypothesis),
``tests/reader/test_limits_proven.py`` and the atheris
harnesses under ``fuzz/``. Standard library only (no torch): the seeds are the real
checkpoints under ``tests/data`` plus a few containers built here byte by byte (a TAR
checkpoint, ZIP checkpoints with chosen pickles, plain pickles of stdlib data), so that every
container reader has a valid starting point to mutate.
"""

from __future__ import annotations

import collections
import datetime
import io
import pickle
import struct
import tarfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torchless
from torchless.pickle.opcodes import OPCODES, Arg, Opcode

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
SEED_DIRS = (DATA / "fixtures", DATA / "corpus")
SEED_SUFFIXES = (".pt", ".pth", ".tar", ".jit", ".bin", ".pkl")

# ---- outcome of reading one file -----------------------------------------------------------


class Escape(AssertionError):
    """Something other than a proper torchless rejection came out of the reader."""


def read_everything(path: str | Path, limits: torchless.Limits | None = None) -> str:
    """Open, read every tensor, then load: ``"read"`` or ``"reject"``.

    A :class:`torchless.CheckpointError` subclass is a rejection. Any other exception
    escapes as itself; torchless's catch-all wrapper around an internal bug
    (:class:`torchless.InternalError`) is turned into :class:`Escape` so it fails a test just
    the same.
    """
    try:
        with torchless.open(path, limits=limits) as ckpt:
            for name in ckpt.tensors:
                arr = ckpt.numpy(name)
                if arr.size:
                    arr.reshape(-1)[:1].tobytes()  # touch the bytes
            for name in ckpt.unsupported:
                try:
                    ckpt.numpy(name)
                except torchless.UnsupportedError:
                    continue
                raise Escape(f"unsupported tensor {name!r} was read")
        torchless.load(path, limits=limits)
    except torchless.CheckpointError as e:
        if isinstance(e, torchless.InternalError):
            raise Escape(f"internal error escaped as a wrapper: {e}") from e
        return "reject"
    return "read"


# ---- seeds ------------------------------------------------------------------------------


def seed_paths(max_bytes: int = 1 << 20) -> list[Path]:
    """Real checkpoints under tests/data no larger than ``max_bytes``, in a stable order."""
    out = []
    for root in SEED_DIRS:
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.suffix in SEED_SUFFIXES and p.stat().st_size <= max_bytes:
                out.append(p)
    return out


def plain_pickles() -> dict[str, bytes]:
    """Plain pickles of stdlib data at every protocol (configs, training args …)."""
    obj: dict[str, Any] = {
        "epoch": 3, "lr": 1e-3, "name": "run", "flags": [True, False, None],
        "shape": (1, 2, 3), "blob": b"\x00\xff", "big": 1 << 80, "neg": -(1 << 40),
        "set": {1, 2}, "fs": frozenset({"a"}), "nested": {"a": [{"b": (1.5, "c")}]},
        "od": collections.OrderedDict(a=1, b=[2, 3]),
        "when": datetime.datetime(2020, 1, 2, 3, 4, 5),
        "ba": bytearray(b"xy"),
    }
    shared: list[Any] = [1, 2]
    obj["shared"] = [shared, shared]
    out = {f"plain_p{p}": pickle.dumps(obj, protocol=p) for p in range(6)}
    out["plain_list_p0"] = pickle.dumps([1, "two", 3.0, None, (4,)], protocol=0)
    return out


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _uni(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(1 << 31) <= n < (1 << 31):
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _tuple(items: list[bytes]) -> bytes:
    return b"(" + b"".join(items) + b"t"


def tensor_ops(key: str, numel: int, offset: int, shape: tuple[int, ...],
               stride: tuple[int, ...], storage: str = "FloatStorage") -> bytes:
    """Protocol-2 opcodes that rebuild one tensor the way torch.save pickles it."""
    pid = _tuple([_uni("storage"), _global("torch", storage), _uni(key), _uni("cpu"),
                  _int(numel)]) + b"Q"
    return (_global("torch._utils", "_rebuild_tensor_v2")
            + _tuple([pid, _int(offset), _tuple([_int(s) for s in shape]),
                      _tuple([_int(s) for s in stride]), b"\x89",
                      _global("collections", "OrderedDict") + b")R"])
            + b"R")


def state_dict_pickle(tensors: Iterable[tuple[str, bytes]]) -> bytes:
    """A protocol-2 pickle of ``OrderedDict(name -> tensor)`` from :func:`tensor_ops` items."""
    body = b"".join(_uni(name) + ops + b"s" for name, ops in tensors)
    return b"\x80\x02" + _global("collections", "OrderedDict") + b")R" + body + b"."


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


class ZipMember:
    """One member for :func:`make_zip`: its bytes as stored in the archive and what the
    directory declares (so that lies and bombs can be built without their inflated bytes)."""

    def __init__(self, name: str, payload: bytes, *, deflated: bool = False,
                 size: int | None = None, crc: int | None = None) -> None:
        self.name = name
        self.raw = _deflate(payload) if deflated and size is None else payload
        self.method = 8 if deflated else 0
        self.size = len(payload) if size is None else size
        self.crc = zlib.crc32(payload) if crc is None else crc


def make_zip(members: list[ZipMember]) -> bytes:
    """A plain ZIP archive (no ZIP64) as torch's strict readers expect it."""
    out = io.BytesIO()
    central = []
    for m in members:
        name = m.name.encode()
        offset = out.tell()
        out.write(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, m.method, 0, 0x21,
                              m.crc, len(m.raw), m.size, len(name), 0))
        out.write(name)
        out.write(m.raw)
        central.append(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, m.method,
                                   0, 0x21, m.crc, len(m.raw), m.size, len(name), 0, 0, 0, 0,
                                   0, offset) + name)
    cd_off = out.tell()
    cd = b"".join(central)
    out.write(cd)
    out.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members),
                          len(cd), cd_off, 0))
    return out.getvalue()


def zip_checkpoint(data_pkl: bytes, storages: dict[str, bytes] | None = None, *,
                   deflate_pickle: bool = False) -> bytes:
    """A torch ZIP checkpoint (``archive/``) around a given object pickle."""
    members = [ZipMember("archive/data.pkl", data_pkl, deflated=deflate_pickle),
               ZipMember("archive/byteorder", b"little")]
    for key, raw in (storages or {}).items():
        members.append(ZipMember(f"archive/data/{key}", raw))
    members.append(ZipMember("archive/version", b"3\n"))
    return make_zip(members)


def small_zip_checkpoint() -> bytes:
    """Three float32 tensors (one a transposed view) on two storages."""
    data = state_dict_pickle([
        ("w", tensor_ops("0", 6, 0, (2, 3), (3, 1))),
        ("wt", tensor_ops("0", 6, 0, (3, 2), (1, 3))),
        ("b", tensor_ops("1", 2, 0, (2,), (1,))),
    ])
    return zip_checkpoint(data, {"0": struct.pack("<6f", *range(6)),
                                 "1": struct.pack("<2f", 1.0, 2.0)})


def tar_checkpoint() -> bytes:
    """The pre-0.1.10 TAR layout, two tensors on one float storage plus a storage view."""
    proto2 = b"\x80\x02"
    sys_info = pickle.dumps({"protocol_version": 1000, "little_endian": True,
                             "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
    storages = (pickle.dumps(1, protocol=2)
                + proto2 + _tuple([_int(1), _uni("cpu"), _global("torch", "FloatStorage")])
                + b"." + struct.pack("<q", 6) + struct.pack("<6f", *range(6))
                + pickle.dumps([(1000, 1, 1, 5)], protocol=2))
    tensors = pickle.dumps(2, protocol=2)
    for key, shape, stride, offset in ((5000, (2, 3), (3, 1), 0), (5001, (5,), (1,), 1)):
        tensors += proto2 + _tuple([_int(key), _int(1), _global("torch", "FloatTensor")]) + b"."
        tensors += struct.pack("<i", len(shape)) + b"\0\0\0\0"
        tensors += struct.pack(f"<{len(shape)}q", *shape) + struct.pack(f"<{len(shape)}q", *stride)
        tensors += struct.pack("<q", offset)
    obj = (proto2 + b"}" + b"(" + _uni("w") + _uni("5000") + b"Q" + _uni("tail") + _uni("5001")
           + b"Q" + _uni("view") + _uni("1000") + b"Q" + b"u.")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, raw in (("sys_info", sys_info), ("pickle", obj), ("tensors", tensors),
                          ("storages", storages)):
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def nested_tuples_pickle(depth: int) -> bytes:
    """``{((…(None,)…),): None}``: a dict keyed by a tuple ``depth`` deep. Hashing the key
    recursed in C and crashed the interpreter past ~100k levels (found while proving
    max_depth; the VM now refuses tuples deeper than ``max_depth``)."""
    return b"\x80\x02}N" + b"\x85" * depth + b"Ns."


def tuple_call_chain_pickle(depth: int) -> bytes:
    """The same key built by calling ``builtins.tuple`` on ``[previous]`` ``depth`` times:
    tuples made by the rules bypassed the VM's nesting count."""
    level = b"q\x010h\x00(h\x01l\x85R"  # memo 1 = t; tuple([t])
    return b"\x80\x02}" + b"cbuiltins\ntuple\n\x940)" + level * depth + b"Ns."


def built_seeds() -> dict[str, bytes]:
    """Seeds built here: one per container the data directory lacks or has few of."""
    out = {"tar_checkpoint": tar_checkpoint(), "zip_built": small_zip_checkpoint(),
           "zip_deflated_pickle": zip_checkpoint(
               state_dict_pickle([("x", tensor_ops("0", 2, 0, (2,), (1,)))]),
               {"0": struct.pack("<2f", 1.0, 2.0)}, deflate_pickle=True)}
    out.update(plain_pickles())
    out["plain_nested_tuples"] = nested_tuples_pickle(300)
    out["plain_tuple_call_chain"] = tuple_call_chain_pickle(300)
    return out


def all_seeds(max_bytes: int = 1 << 20) -> dict[str, bytes]:
    """Every seed by name: the real files under tests/data and the built ones."""
    out = {str(p.relative_to(DATA)): p.read_bytes() for p in seed_paths(max_bytes)}
    out.update(built_seeds())
    return out


# ---- mutations --------------------------------------------------------------------------

#: Values that make length and offset fields interesting.
INTERESTING = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF,
               0xFFFFFFFF, 0x100000000, (1 << 63) - 1, (1 << 64) - 1)


def flip(data: bytes, pos: int, bit: int) -> bytes:
    if not data:
        return data
    pos %= len(data)
    return data[:pos] + bytes([data[pos] ^ (1 << (bit % 8))]) + data[pos + 1:]


def truncate(data: bytes, n: int) -> bytes:
    return data[:n % (len(data) + 1)]


def insert(data: bytes, pos: int, chunk: bytes) -> bytes:
    pos %= len(data) + 1
    return data[:pos] + chunk + data[pos:]


def delete(data: bytes, pos: int, n: int) -> bytes:
    pos %= len(data) + 1
    return data[:pos] + data[pos + n:]


def splice(a: bytes, b: bytes, pos_a: int, pos_b: int) -> bytes:
    """The head of ``a`` followed by the tail of ``b``."""
    return a[:pos_a % (len(a) + 1)] + b[pos_b % (len(b) + 1):]


def overwrite_int(data: bytes, pos: int, width: int, value: int, big: bool = False) -> bytes:
    """Write ``value`` as a ``width``-byte unsigned integer at ``pos`` (a length or offset)."""
    if len(data) < width:
        return data
    pos %= len(data) - width + 1
    raw = (value % (1 << (8 * width))).to_bytes(width, "big" if big else "little")
    return data[:pos] + raw + data[pos + width:]


MUTATORS: dict[str, Callable[..., bytes]] = {
    "flip": flip, "truncate": truncate, "insert": insert, "delete": delete,
    "splice": splice, "overwrite_int": overwrite_int}

# ---- opcode streams ---------------------------------------------------------------------

#: Globals a stream may name: rebuild rules, refused callables and unknown classes.
GLOBALS = (
    ("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"), ("torch", "FloatStorage"),
    ("torch", "HalfStorage"), ("torch", "UntypedStorage"), ("torch", "float32"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("builtins", "set"), ("__builtin__", "set"), ("datetime", "datetime"),
    ("argparse", "Namespace"), ("os", "system"), ("builtins", "eval"),
    ("torch.nn.modules.linear", "Linear"), ("mymodule", "MyClass"), ("copy_reg", "_reconstructor"),
)

_LEN_PREFIX = {Arg.STRING1: "<B", Arg.BYTES1: "<B", Arg.UNICODESTRING1: "<B", Arg.LONG1: "<B",
               Arg.STRING4: "<i", Arg.LONG4: "<i", Arg.BYTES4: "<I", Arg.UNICODESTRING4: "<I",
               Arg.BYTES8: "<Q", Arg.BYTEARRAY8: "<Q", Arg.UNICODESTRING8: "<Q"}
_FIXED = {Arg.UINT1: "<B", Arg.UINT2: "<H", Arg.INT4: "<i", Arg.UINT4: "<I", Arg.UINT8: "<Q"}


def encode_arg(arg: Arg, n: int, payload: bytes, lie: int | None = None) -> bytes:
    """A plausible inline argument of kind ``arg`` from a number and a payload.

    ``lie``, when given, replaces the declared length of a length-prefixed argument."""
    if arg is Arg.NONE:
        return b""
    if arg in _FIXED:
        fmt = _FIXED[arg]
        size = struct.calcsize(fmt)
        v = n % (1 << (8 * size))
        if fmt == "<i" and v >= 1 << 31:
            v -= 1 << 32
        return struct.pack(fmt, v)
    if arg in _LEN_PREFIX:
        fmt = _LEN_PREFIX[arg]
        size = struct.calcsize(fmt)
        if arg is Arg.LONG1 or arg is Arg.LONG4:
            payload = payload or n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
        if arg in (Arg.UNICODESTRING1, Arg.UNICODESTRING4, Arg.UNICODESTRING8):
            payload = payload.decode("utf-8", "replace").encode("utf-8", "surrogatepass")
        if size == 1:
            payload = payload[:255]
        declared = len(payload) if lie is None else lie % (1 << (8 * size))
        if fmt == "<i" and declared >= 1 << 31:
            declared -= 1 << 32
        if size == 1:
            declared = min(declared, 255)
        return struct.pack(fmt, declared) + payload
    if arg is Arg.FLOAT8:
        return struct.pack(">d", float(n % 10007) / 7.0)
    if arg is Arg.DECIMALNL_SHORT:
        return (b"01" if n == 1 else b"00" if n == 0 else str(n).encode()) + b"\n"
    if arg is Arg.DECIMALNL_LONG:
        return str(n).encode() + b"L\n"
    if arg is Arg.FLOATNL:
        return repr(n / 3.0).encode() + b"\n"
    text = payload.replace(b"\n", b"").replace(b"\r", b"")
    if arg is Arg.STRINGNL:
        return b"'" + text.replace(b"'", b"").replace(b"\\", b"") + b"'\n"
    if arg is Arg.STRINGNL_NOESCAPE:
        return text + b"\n"
    if arg is Arg.STRINGNL_NOESCAPE_PAIR:
        module, name = GLOBALS[n % len(GLOBALS)]
        return module.encode() + b"\n" + name.encode() + b"\n"
    if arg is Arg.UNICODESTRINGNL:
        return text.replace(b"\\", b"") + b"\n"
    raise AssertionError(f"unhandled argument kind {arg}")  # pragma: no cover


def assemble(ops: Iterable[tuple[Opcode, int, bytes, int | None]], proto: int = 4) -> bytes:
    """PROTO, the given opcodes with their arguments, and STOP."""
    body = b"".join(bytes([op.code]) + encode_arg(op.arg, n, payload, lie)
                    for op, n, payload, lie in ops)
    return b"\x80" + bytes([proto]) + body + b"."


OPCODE_BY_NAME = {op.name: op for op in OPCODES}
