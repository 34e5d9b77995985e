"""torchless.convert / torchless.verify: torch checkpoints to safetensors, exact and atomic.

The oracles are torch (``torch.load`` of the source) and the ``safetensors`` package (its
numpy and torch loaders, and ``save_file``'s own layout for the same tensors).
"""

from __future__ import annotations

import errno
import gc
import itertools
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import torchless
from tests.containers.test_differential_zip_extra import big_endian  # noqa: F401 (a fixture)
from tests.project.test_hostile import hostile  # noqa: F401 (a fixture)
from tests.reader.test_differential_torch import NUMPY_DTYPES, tg  # noqa: F401 (tg is a fixture)
from torchless.cli.main import main
from torchless.io.source import Source
from torchless.model import chunks as _chunks
from torchless.write import stream as _stream

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
#: dtypes safetensors holds; the others are refused or skipped.
NO_ST_DTYPE = frozenset({"complex128", "complex32", "float8_e4m3fnuz", "float8_e5m2fnuz"})
ST_DTYPES = [d for d in NUMPY_DTYPES if d not in NO_ST_DTYPE]


def without_tree(header: dict[str, Any]) -> dict[str, Any]:
    """The header with the inert-tree metadata keys taken out (checked to be there)."""
    meta = dict(header["__metadata__"])
    assert meta.pop("torchless.inert") == "1"
    json.loads(meta.pop("torchless.tree"))
    return {**header, "__metadata__": meta}


def parse(path: Path) -> tuple[dict[str, Any], bytes, bytes]:
    """(header JSON, raw header bytes, data section), checking length, padding and tiling."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    text = raw[8:8 + n]
    assert text == text.rstrip(b" ") + b" " * (len(text) - len(text.rstrip(b" ")))
    header = json.loads(text)
    data = raw[8 + n:]
    pos = 0
    entries = [v for k, v in header.items() if k != "__metadata__"]
    for v in sorted(entries, key=lambda v: tuple(v["data_offsets"])):
        assert v["data_offsets"][0] == pos, "hole or overlap"
        pos = v["data_offsets"][1]
    assert pos == len(data)
    return header, text, data


def check_against_torch(torch: ModuleType, tg: ModuleType, src: Path, dst: Path,  # noqa: F811
                        expected: dict[str, Any]) -> None:
    """Both safetensors loaders give torch.load's values byte for byte."""
    import safetensors.numpy
    import safetensors.torch

    via_torch = safetensors.torch.load_file(dst)
    float8 = any(str(t.dtype).startswith("torch.float8") for t in expected.values())
    via_numpy = {} if float8 else safetensors.numpy.load_file(dst)
    assert set(via_torch) == set(expected)
    for name, t in expected.items():
        got = via_torch[name]
        assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape), name
        assert tg.contiguous_bytes(got) == tg.contiguous_bytes(t), name
        if name not in via_numpy:  # safetensors.numpy has no float8 types
            assert str(t.dtype).startswith("torch.float8"), name
            continue
        arr = via_numpy[name]
        assert tuple(arr.shape) == tuple(t.shape), name
        assert np.ascontiguousarray(arr).tobytes() == tg.contiguous_bytes(t), name
    report = torchless.verify(src, dst)
    assert report.ok and len(report.matched) == len(expected), report


# ---- the dtype x view x protocol matrix --------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("dtype", ST_DTYPES)
def test_dtype_views(torch: ModuleType, tg: ModuleType, tmp_path: Path,  # noqa: F811
                     dtype: str, protocol: int) -> None:
    import safetensors.torch

    saved = tg.views(dtype, seed=protocol)
    src = tmp_path / "views.pt"
    with tg.quiet():
        torch.save(saved, src, pickle_protocol=protocol)
        expected = torch.load(src, weights_only=False)
    report = torchless.convert(src)
    dst = tmp_path / "views.safetensors"
    assert report.dst == str(dst) and report.tensors == len(expected)
    assert report.bytes == dst.stat().st_size
    check_against_torch(torch, tg, src, dst, expected)
    # the same layout as the safetensors package writes for these tensors
    ref = tmp_path / "ref.safetensors"
    safetensors.torch.save_file({k: v.clone(memory_format=torch.contiguous_format)
                                 for k, v in expected.items()}, ref,
                                metadata={"format": "pt", "source": "views.pt"})
    ours, _, data = parse(dst)
    theirs, _, ref_data = parse(ref)
    assert list(ours)[1:] == list(theirs)[1:]
    assert without_tree(ours) == theirs and data == ref_data
    # the stored tree names every tensor by its entry, and loads back to torch's values
    back = torchless.load(dst)
    assert set(back) == set(expected)
    for name, t in expected.items():
        assert back[name].shape == tuple(t.shape), name
        assert np.ascontiguousarray(back[name]).tobytes() == tg.contiguous_bytes(t), name


@pytest.mark.parametrize("layout", ["legacy", "deflated", "big_endian", "tar", "torchscript"])
def test_layouts(torch: ModuleType, tg: ModuleType, tmp_path: Path,  # noqa: F811
                 big_endian: tuple[Path, dict[str, Any]], layout: str) -> None:  # noqa: F811
    if layout == "big_endian":
        src, expected = big_endian
        # the writer's values (torch.load of the little-endian original) are the oracle
        expected = {k: v for k, v in expected.items() if k.split(".")[0] not in NO_ST_DTYPE}
        dst = tmp_path / "big.safetensors"
        torchless.convert(src, dst, skip_unsupported=True)
    else:
        saved = {**tg.views("float32"), **{f"h.{k}": v for k, v in tg.views("int16").items()}}
        src = tmp_path / "in.pt"
        if layout == "legacy":
            torch.save(saved, src, _use_new_zipfile_serialization=False)
        elif layout == "tar":
            from tests._legacy_writer import write_tar

            write_tar(torch, saved, str(src), views=False)
        elif layout == "torchscript":
            import warnings

            module = torch.nn.Module()
            for i, t in enumerate(saved.values()):
                module.register_buffer(f"b{i}", t)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.jit.save(torch.jit.script(module), src)
                expected = dict(torch.jit.load(src).state_dict())
        else:
            plain = tmp_path / "plain.pt"
            torch.save(saved, plain)
            tg.repack(plain, src, lambda name: True)
        if layout != "torchscript":
            expected = torch.load(src, weights_only=False)
        dst = tmp_path / "in.safetensors"
        torchless.convert(src, dst)
    import safetensors.torch

    got = safetensors.torch.load_file(dst)
    assert set(got) == set(expected)
    for name, t in expected.items():
        assert tg.contiguous_bytes(got[name]) == tg.contiguous_bytes(t), name
    assert torchless.verify(src, dst, skip_unsupported=True).ok


def test_chunked_and_fallback_paths_agree(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                          tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks (every strided tensor split by rows, then within rows) and each copy path
    (copy_file_range, sendfile, writes from the map, gathering) give the same file."""
    saved = {"big": torch.arange(40000, dtype=torch.float32).reshape(200, 200),
             "t": torch.arange(40000, dtype=torch.float32).reshape(200, 200).t(),
             "x": torch.arange(10, dtype=torch.int64).expand(300, 10),
             "v": torch.arange(1000, dtype=torch.int16)[::3]}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    torchless.convert(src, tmp_path / "a.st")
    reference = (tmp_path / "a.st").read_bytes()
    monkeypatch.setattr(_chunks, "CHUNK_BYTES", 64)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 1000)  # "big" is a run
    monkeypatch.setattr(_stream, "READ_COPY_BYTES", 0)  # runs are the kernel's to copy

    def fail(*args: Any) -> int:
        raise OSError(errno.ENOSYS, "not here")

    released: list[tuple[int, int]] = []
    real_release = Source.release

    def spy(self: Source, offset: int, n: int) -> None:
        released.append((offset, n))
        real_release(self, offset, n)

    # no kernel copy: runs written from the map in 100-byte blocks, pages released every
    # 1000 bytes; small pieces gathered 64 bytes at a time
    with monkeypatch.context() as m:
        m.setattr(_stream, "KERNEL_COPY", ())
        m.setattr(_stream, "COPY_BLOCK_BYTES", 100)
        m.setattr(_stream, "RELEASE_BYTES", 1000)
        m.setattr(_stream, "GATHER_BYTES", 64)
        m.setattr(Source, "release", spy)
        torchless.convert(src, tmp_path / "map.st")
    assert (tmp_path / "map.st").read_bytes() == reference
    # the contiguous 160,000-byte "big" went out in releases of 1000 bytes, in order
    runs = [(o, n) for o, n in released if n == 1000]
    assert len(runs) == 160 and all(
        b[0] - a[0] == 1000 for a, b in itertools.pairwise(runs))
    # with kernel copies: copy_file_range, else sendfile, else writes from the map
    variants: list[tuple[str, ...]] = [(), ("copy_file_range",), ("copy_file_range",
                                                                  "sendfile")]
    for i, broken in enumerate(variants):
        with monkeypatch.context() as m:
            calls: list[str] = []
            for name in ("copy_file_range", "sendfile"):
                if name in broken:
                    m.setattr(os, name, fail)
                else:
                    real = getattr(os, name)
                    m.setattr(os, name, lambda *a, _r=real, _n=name, _c=calls:
                              _c.append(_n) or _r(*a))
            torchless.convert(src, tmp_path / f"b{i}.st")
        assert (tmp_path / f"b{i}.st").read_bytes() == reference, broken
        expected = [n for n in ("copy_file_range", "sendfile") if n not in broken][:1]
        assert sorted(set(calls)) == expected, (broken, calls)
    check_against_torch(torch, tg, src, tmp_path / "a.st", torch.load(src, weights_only=False))


def _count_kernel_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range",
                        lambda s, d, n, *a: counts.append(n) or real(s, d, n, *a))
    return counts


def test_adjacent_tensors_are_one_kernel_copy(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors that follow each other in the file and in the output (slices of one storage,
    in name order) go out in one copy_file_range call; the bytes are torch's."""
    flat = torch.arange(30000, dtype=torch.float32)
    saved = {"a": flat[:10000], "b": flat[10000:25000], "c": flat[25000:],
             "d": torch.ones(300, dtype=torch.float32)}  # a storage of its own
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 1000)
    monkeypatch.setattr(_stream, "READ_COPY_BYTES", 0)
    counts = _count_kernel_copies(monkeypatch)
    torchless.convert(src, tmp_path / "o.st", tree=False)
    assert counts == [120000, 1200]  # a+b+c as one run, then d
    check_against_torch(torch, tg, src, tmp_path / "o.st", saved)


def _runs_file(torch: ModuleType, tmp_path: Path) -> tuple[Path, dict[str, Any], int]:
    """A checkpoint of 12 float32 tensors of 40,000 bytes each (runs once KERNEL_MIN_BYTES
    is 1000), their bytes in all."""
    saved = {f"r{i:02d}": torch.arange(10_000, dtype=torch.float32) * (i + 1)
             for i in range(12)}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    return src, saved, 12 * 40_000


def test_runs_read_through_the_buffer_then_copied_by_the_kernel(
        torch: ModuleType, tg: ModuleType, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first READ_COPY_BYTES of the runs go through the buffer (preadv, write), the rest
    by copy_file_range, from the very byte where the budget ended (mid-tensor too): the file
    is the same bytes as with kernel copies only, and torch's."""
    src, saved, total = _runs_file(torch, tmp_path)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 1000)
    monkeypatch.setattr(_stream, "GATHER_BYTES", 16_384)  # several reads a tensor
    with monkeypatch.context() as m:
        m.setattr(_stream, "READ_COPY_BYTES", 0)
        counts = _count_kernel_copies(m)
        torchless.convert(src, tmp_path / "kernel.st", tree=False)
    assert sum(counts) == total
    reference = (tmp_path / "kernel.st").read_bytes()
    for budget in (100_000, total, 1 << 40):  # ends in the third tensor; at the end; never
        dst = tmp_path / f"read{budget}.st"
        with monkeypatch.context() as m:
            m.setattr(_stream, "READ_COPY_BYTES", budget)
            counts = _count_kernel_copies(m)
            torchless.convert(src, dst, tree=False)
        assert dst.read_bytes() == reference, budget
        assert sum(counts) == max(0, total - budget), (budget, counts)
        if budget == 100_000:  # the rest of the third tensor, then one call per tensor
            assert counts == [3 * 40_000 - budget] + [40_000] * 9
    check_against_torch(torch, tg, src, tmp_path / "read100000.st", saved)


def test_a_run_ending_early_while_read_is_an_error_and_leaves_nothing(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, _, _ = _runs_file(torch, tmp_path)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 1000)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0)
    monkeypatch.setattr(os, "copy_file_range", lambda *a: pytest.fail("no kernel copy"))
    with pytest.raises(torchless.ConversionError, match="ended early"):
        torchless.convert(src, out / "o.st")
    assert list(out.iterdir()) == []


def test_slow_writes_hand_the_rest_to_the_kernel(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes through the buffer are timed per SPEED_WINDOW_BYTES: while each window is as
    fast as the best, they go on; the first window SLOW_WRITE times slower per byte ends
    them, and the kernel copies the rest. (A fake clock: each write takes 1 s a byte while
    fast, 10 s a byte once slow.)"""
    src, _, total = _runs_file(torch, tmp_path)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 1000)
    monkeypatch.setattr(_stream, "GATHER_BYTES", 10_000)
    monkeypatch.setattr(_stream, "SPEED_WINDOW_BYTES", 50_000)
    monkeypatch.setattr(_stream, "READ_COPY_BYTES", 1 << 40)
    torchless.convert(src, tmp_path / "ref.st", tree=False)
    reference = (tmp_path / "ref.st").read_bytes()
    real_write = os.write

    def run(slow_after: int | None) -> list[int]:
        """Convert with writes slowing down after ``slow_after`` bytes of runs; the kernel
        copies' sizes."""
        state = {"now": 0.0, "written": 0, "pending": 0.0}

        def write(fd: int, data: Any) -> int:
            n = real_write(fd, data)
            if n == 10_000:  # a buffer of run bytes (the header and gathers are not)
                slow = slow_after is not None and state["written"] >= slow_after
                state["pending"] = n * (10.0 if slow else 1.0)
                state["written"] += n
            return n

        def clock() -> float:
            state["now"] += state["pending"]
            state["pending"] = 0.0
            return state["now"]

        with monkeypatch.context() as m:
            m.setattr(os, "write", write)
            m.setattr(_stream, "_clock", clock)
            counts = _count_kernel_copies(m)
            dst = tmp_path / f"o{slow_after}.st"
            torchless.convert(src, dst, tree=False)
        assert dst.read_bytes() == reference
        return counts

    assert run(None) == []  # steady writes: all through the buffer
    # slow from byte 200,000: the window of 200,000..250,000 is 10x slower than the best
    # (the first four): the budget ends at 250,000, mid-tensor
    assert run(200_000) == [280_000 - 250_000] + [40_000] * 5
    # slow from the start: no faster window to compare with, so READ_COPY_BYTES bounds it
    assert run(0) == []
    assert run(50_000) == [20_000] + [40_000] * 9  # ends after the second window, at 100,000
    assert total == 480_000


def test_writeback_started_behind_the_copy(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                          tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every WRITEBACK_BYTES written, the written range (and only bytes already written) is
    handed to posix_fadvise(DONTNEED); the ranges follow each other from byte 0 and the
    output is the same bytes."""
    saved = {f"p{i:02d}": torch.full((3000 + i,), float(i)) for i in range(40)}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    torchless.convert(src, tmp_path / "ref.st")
    monkeypatch.setattr(_stream, "WRITEBACK_BYTES", 5000)
    monkeypatch.setattr(_stream, "KERNEL_MIN_BYTES", 10000)  # kernel copies and gathers
    advised: list[tuple[int, int, int]] = []
    sizes: list[int] = []
    real_advise, real_fstat = os.posix_fadvise, os.fstat

    threads: set[str] = set()

    def advise(fd: int, offset: int, n: int, advice: int) -> None:
        advised.append((offset, n, advice))
        sizes.append(real_fstat(fd).st_size)
        threads.add(threading.current_thread().name)
        real_advise(fd, offset, n, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    torchless.convert(src, tmp_path / "o.st")
    # made by the writer's own thread, which is done when the conversion returns
    assert threads == {"torchless-writeback"}
    assert not any(t.name == "torchless-writeback" for t in threading.enumerate())
    data = (tmp_path / "o.st").read_bytes()
    assert data == (tmp_path / "ref.st").read_bytes()
    assert advised and len(data) - sum(n for _, n, _ in advised) < 5000, advised
    assert all(a == os.POSIX_FADV_DONTNEED and n >= 5000 for _, n, a in advised)
    assert [o for o, _, _ in advised] == [0, *itertools.accumulate(n for _, n, _ in advised)][:-1]
    assert all(o + n <= size for (o, n, _), size in zip(advised, sizes, strict=True))
    check_against_torch(torch, tg, src, tmp_path / "o.st", saved)


def test_writeback_thread_is_joined_when_the_write_fails(
        torch: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails after writeback requests were queued: the error is ours, no output
    is left, and the writeback thread has ended before the file was closed (no request can
    reach a descriptor the process opens again)."""
    saved = {f"p{i:02d}": torch.full((3000,), float(i)) for i in range(40)}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    monkeypatch.setattr(_stream, "WRITEBACK_BYTES", 5000)
    monkeypatch.setattr(_stream, "GATHER_BYTES", 16_384)  # many writes
    closed_with_thread: list[bool] = []
    real_write, real_close = os.write, os.close
    state = {"written": 0}

    def write(fd: int, data: Any) -> int:
        if state["written"] > 100_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, data)
        state["written"] += n
        return n

    def close(fd: int) -> None:
        closed_with_thread.append(any(t.name == "torchless-writeback"
                                      for t in threading.enumerate()))
        real_close(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "close", close)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(torchless.ConversionError, match="space"):
        torchless.convert(src, out / "o.st", tree=False)
    assert list(out.iterdir()) == []
    assert closed_with_thread and not any(closed_with_thread)


def test_small_tensors_are_gathered(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small tensors are copied into one buffer and written together, not one write
    per tensor (nor one kernel copy each)."""
    saved = {f"p{i:03d}": torch.full((50,), float(i)) for i in range(300)}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    fd_writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: fd_writes.append(len(b)) or real_write(fd, b))
    monkeypatch.setattr(os, "copy_file_range", lambda *a: pytest.fail("no kernel copy"))
    torchless.convert(src, tmp_path / "o.st", tree=False)
    data = [n for n in fd_writes if n > 8]
    assert len(data) == 1 and data[0] > 300 * 200, fd_writes
    check_against_torch(torch, tg, src, tmp_path / "o.st", saved)


def test_collector_paused_while_converting(tmp_path: Path) -> None:
    """The cyclic garbage collector is off during a conversion and on again after it, also
    when the conversion fails (the one policy, core/collector: paused only where this is the
    process's only thread)."""
    if threading.active_count() != 1:
        pytest.skip(f"another thread is alive in this test process: {threading.enumerate()}")
    assert gc.isenabled()
    seen: list[bool] = []
    torchless.convert(REPO / "examples" / "tiny.pt", tmp_path / "o.st",
                      progress=lambda done, total: seen.append(gc.isenabled()))
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(torchless.CheckpointError):
        torchless.convert(tmp_path / "missing.pt", tmp_path / "x.st")
    assert gc.isenabled()


# ---- determinism, header, names -----------------------------------------------------------


def test_deterministic_and_header(torch: ModuleType, tmp_path: Path) -> None:
    saved = {"b": torch.ones(3, dtype=torch.float16), "a": torch.zeros(5, dtype=torch.int64),
             "é\n": torch.ones(1, dtype=torch.bool), "c": torch.ones(2, dtype=torch.bfloat16)}
    src = tmp_path / "m.pt"
    torch.save(saved, src)
    torchless.convert(src, tmp_path / "1.safetensors")
    time.sleep(0.01)
    torchless.convert(src, tmp_path / "2.safetensors")
    one = (tmp_path / "1.safetensors").read_bytes()
    assert one == (tmp_path / "2.safetensors").read_bytes()
    header, text, _ = parse(tmp_path / "1.safetensors")
    assert without_tree(header)["__metadata__"] == {"format": "pt", "source": "m.pt"}
    assert list(header) == ["__metadata__", "a", "c", "b", "é\n"]  # I64, BF16, F16, BOOL
    assert "é".encode() in text


@pytest.mark.parametrize("name", ["__metadata__", "bad\ud800"])
def test_invalid_names(torch: ModuleType, tmp_path: Path, name: str) -> None:
    src = tmp_path / "m.pt"
    torch.save({name: torch.ones(2)}, src)
    with pytest.raises(torchless.InvalidKeyError):
        torchless.convert(src)
    assert os.listdir(tmp_path) == ["m.pt"]


def test_key_subtree_and_missing_key(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "m.pt"
    torch.save({"state_dict": {"w": torch.ones(2), "sub": {"b": torch.zeros(1)}},
                "opt": {"m": torch.ones(3)}, "epoch": 3}, src)
    report = torchless.convert(src, key="state_dict")
    header, _, _ = parse(tmp_path / "m.safetensors")
    assert set(header) - {"__metadata__"} == {"w", "sub.b"} and report.tensors == 2
    assert torchless.verify(src, tmp_path / "m.safetensors", key="state_dict").ok
    with pytest.raises(torchless.ConversionError, match="'state_dict', 'opt', 'epoch'"):
        torchless.convert(src, tmp_path / "x.safetensors", key="model")


# ---- aliases and unsupported dtypes ---------------------------------------------------------


def test_aliases_default_and_dedupe(torch: ModuleType, tmp_path: Path) -> None:
    import safetensors.torch

    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    src = tmp_path / "tied.pt"
    torch.save({"emb": w, "head": w, "half": w[1], "format": w}, src)
    torchless.convert(src, tmp_path / "all.st")
    got = safetensors.torch.load_file(tmp_path / "all.st")
    assert set(got) == {"emb", "head", "half", "format"}
    assert torch.equal(got["head"], w) and torch.equal(got["half"], w[1])
    report = torchless.convert(src, tmp_path / "dd.st", dedupe=True)
    # 'format' cannot be recorded in __metadata__ (it holds format: pt): kept as a tensor
    assert dict(report.aliases) == {"head": "emb"}
    header, _, _ = parse(tmp_path / "dd.st")
    assert without_tree(header)["__metadata__"] == {"format": "pt", "source": "tied.pt",
                                                    "head": "emb"}
    assert set(header) == {"__metadata__", "emb", "half", "format"}
    verified = torchless.verify(src, tmp_path / "dd.st")
    assert verified.ok and dict(verified.aliases) == {"head": "emb"}


def test_unsupported_dtypes_error_or_skip(torch: ModuleType, tg: ModuleType,  # noqa: F811
                                          tmp_path: Path) -> None:
    src = tmp_path / "c.pt"
    with tg.quiet():
        torch.save({"ok": torch.ones(2), "c128": torch.ones(2, dtype=torch.complex128),
                    "c32": torch.ones(2, dtype=torch.complex32),
                    "fnuz": torch.zeros(2, dtype=torch.float8_e4m3fnuz)}, src)
    with pytest.raises(torchless.ConversionError, match=r"c128 \(torch.complex128\)") as e:
        torchless.convert(src)
    assert "c32" in str(e.value) and "fnuz" in str(e.value)
    assert os.listdir(tmp_path) == ["c.pt"]
    report = torchless.convert(src, skip_unsupported=True, verify=True)
    assert report.skipped == ("c128", "c32", "fnuz") and report.tensors == 1
    assert report.verified is not None and report.verified.skipped == ("c128", "c32", "fnuz")
    assert not torchless.verify(src, report.dst, skip_unsupported=False).ok


# ---- atomicity and faults ------------------------------------------------------------------


def test_existing_dst_refused_without_force(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2)}, src)
    dst = tmp_path / "m.safetensors"
    dst.write_bytes(b"keep me")
    with pytest.raises(torchless.ConversionError, match="exists"):
        torchless.convert(src)
    assert dst.read_bytes() == b"keep me"
    torchless.convert(src, force=True)
    assert parse(dst)[0]["w"]["shape"] == [2]
    with pytest.raises(torchless.ConversionError, match="source file"):
        torchless.convert(src, src, force=True)
    assert sorted(os.listdir(tmp_path)) == ["m.pt", "m.safetensors"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_write_leaves_nothing(torch: ModuleType, tmp_path: Path,
                                          exc: type[BaseException]) -> None:
    src = tmp_path / "m.pt"
    torch.save({"a": torch.ones(1000), "b": torch.ones(1000).expand(3, 1000)}, src)

    def progress(done: int, total: int) -> None:
        if done > 100:
            raise exc("stop")

    with pytest.raises((exc, torchless.ConversionError)):
        torchless.convert(src, progress=progress)
    assert os.listdir(tmp_path) == ["m.pt"]


def test_unreadable_source(tmp_path: Path) -> None:
    with pytest.raises(torchless.CheckpointError, match="cannot open"):
        torchless.convert(tmp_path / "missing.pt")
    with pytest.raises(torchless.CheckpointError, match="no Hugging Face weights here"):
        torchless.convert(tmp_path, tmp_path / "x.safetensors")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(torchless.CheckpointError):
        torchless.convert(tmp_path / "junk.pt")
    assert sorted(os.listdir(tmp_path)) == ["junk.pt"]


def test_file_size_limit(torch: ModuleType, tmp_path: Path) -> None:
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(1 << 20), "t": torch.ones(300, 300).t()}, src)
    code = textwrap.dedent(f"""
        import resource, signal, torchless
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            torchless.convert({str(src)!r})
        except torchless.ConversionError as e:
            print("ConversionError:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "ConversionError:" in out.stdout and "cannot write" in out.stdout, out
    assert os.listdir(tmp_path) == ["m.pt"]


# ---- CLI -----------------------------------------------------------------------------------


def test_cli_convert_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = REPO / "examples" / "tiny.pt"
    dst = tmp_path / "tiny.safetensors"
    assert main(["convert", str(src), "-o", str(dst), "--verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tensors"] == 26 and doc["verify"]["ok"] and doc["dst"] == str(dst)
    assert main(["convert", str(src), "-o", str(dst)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchless: error:") and "exists" in err and err.count("\n") == 2
    assert err.splitlines()[1].startswith("torchless: hint: ") and "--force" in err
    assert main(["verify", str(src), str(dst)]) == 0
    assert "identical (26 tensors match" in capsys.readouterr().out
    assert main(["convert", str(src), "-o", str(tmp_path / "sd.st"), "--key",
                 "state_dict"]) == 0
    assert "6 tensors" in capsys.readouterr().out
    assert main(["verify", str(src), str(tmp_path / "sd.st"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["ok"] and doc["missing"] and doc["extra"]


def test_cli_quiet_when_piped(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "torchless", "convert",
                          str(REPO / "examples" / "tiny.pt"), "-o", str(tmp_path / "t.st")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == ""
    out = subprocess.run([sys.executable, "-m", "torchless", "convert", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert "examples:" in out.stdout and "--skip-unsupported" in out.stdout


# ---- hostile inputs --------------------------------------------------------------------------


def test_hostile_check_reader(hostile: Any, tmp_path: Path) -> None:  # noqa: F811
    """check_reader.py grades torchless.convert itself (it writes the output file): no
    EXECUTED, crash, timeout, stray file or partial output on the code-execution cases and a
    sample of the rest."""
    ids = list(hostile.cases)
    code_exec = [c for c in ids if hostile.cases[c]["category"] == "code-exec"]
    rest = [c for c in ids if c not in set(code_exec)]
    sample = set(code_exec[::2] + rest[::12])
    man = json.loads((hostile.root / "manifest.json").read_text())
    man["cases"] = [c for c in man["cases"] if c["id"] in sample]
    sub = tmp_path / "manifest.json"
    sub.write_text(json.dumps(man))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = subprocess.run(
        [sys.executable, str(hostile.shared / "check_reader.py"), "--manifest", str(sub),
         "--api", "torchless:convert", "--error", "torchless:CheckpointError",
         "--mem", str(3 << 30), "--timeout", "20"],
        cwd=hostile.root, env=env, capture_output=True, text=True, timeout=900)
    lines = out.stdout.splitlines()
    assert any("cases ok" in ln for ln in lines), out.stdout[-2000:] + out.stderr[-2000:]
    fatal = re.compile(r"EXECUTED|\bcrash\b|\btimeout\b|wrote extra files|partial output")
    bad = [ln for ln in lines if ln.startswith("BAD") and fatal.search(ln)]
    assert not bad, "\n".join(bad)
