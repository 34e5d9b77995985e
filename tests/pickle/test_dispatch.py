"""Each opcode is handled in exactly one place: inline in ``Machine._run`` (the ``INLINE``
set) or by its ``op_`` method, never both (a twin that never runs) and never neither; and how
the trace reads a FRAME's end, against what CPython's unpicklers do with one."""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
from typing import Any

import pytest

from torchless.core.limits import Limits
from torchless.errors import PickleError
from torchless.pickle.machine import INLINE, Machine, Resolver
from torchless.pickle.opcodes import OPCODES
from torchless.scanner.modelrun import trace
from torchless.scanner.pickles import scan_stream


def _places(name: str) -> int:
    return (name in INLINE) + (f"op_{name}" in vars(Machine))


@pytest.mark.parametrize("name", sorted({op.name for op in pickletools.opcodes}
                                        | {op.name for op in OPCODES}))
def test_every_opcode_has_one_handler(name: str) -> None:
    assert _places(name) == 1
    assert name in {op.name for op in OPCODES}  # our table has every opcode pickletools has


def test_no_stray_handlers() -> None:
    names = {op.name for op in OPCODES}
    assert INLINE <= names
    assert {n[3:] for n in vars(Machine) if n.startswith("op_")} <= names


def test_a_class_handling_an_opcode_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="handled inline"):
        class Twice(Machine):
            def op_BINPUT(self) -> None:
                pass
    with pytest.raises(TypeError, match="no opcode"):
        class Stray(Machine):
            def op_NOT_AN_OPCODE(self) -> None:
                pass


def test_stack_global_on_non_strings_asks_the_resolver() -> None:
    data = b"\x80\x04K\x01K\x02\x93."
    with pytest.raises(PickleError, match="STACK_GLOBAL operands must be str"):
        Machine(data).run()

    class Noting(Resolver):
        def unresolved_global(self, module: Any, name: Any, offset: int) -> Any:
            return ("unresolved", module, name, offset)

    assert Machine(data, Noting()).run()[0] == ("unresolved", 1, 2, 6)


# ---- frames ----------------------------------------------------------------------------

def _framed(size: int, body: bytes) -> bytes:
    return b"\x80\x04\x95" + struct.pack("<Q", size) + body


class _Recording(pickle.Unpickler):
    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.asked: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.asked.append((module, name))
        return lambda *args: None


class _PyRecording(pickle._Unpickler):  # type: ignore[name-defined,misc]
    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.asked: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.asked.append((module, name))
        return lambda *args: None


def test_a_global_buried_in_an_argument_across_a_frame_runs_in_no_unpickler() -> None:
    """The frame ends inside a string that spells ``cos\\nsystem\\n``. C reads the string
    whole (from bytes or a file it can peek into), or from after the frame (a file it cannot
    peek into); the Python unpickler refuses the stream at the frame's end. None asks for
    os.system: those bytes are never opcodes, so they are no name. The scan reads the string
    as C does, names nothing, and notes the frame (never clean)."""
    text = b"cos\nsystem\n"
    data = _framed(4, b"\x8c" + bytes([len(text)]) + text + b".")  # the frame ends after "co"
    for file in (io.BufferedReader(io.BytesIO(data)), io.BytesIO(data)):  # type: ignore[arg-type]
        u = _Recording(file)
        try:
            u.load()
        except Exception:  # out of a bare BytesIO the rest runs short
            pass
        assert u.asked == []
    py = _PyRecording(io.BytesIO(data))
    with pytest.raises(pickle.UnpicklingError, match="frame"):
        py.load()
    assert py.asked == []
    scan = scan_stream(data)
    assert scan.globals == [] and scan.stopped
    assert [offset for offset, why in scan.problems if "straddles" in why] == [11]


def test_the_trace_reads_a_crossed_frame_as_c_reads_bytes() -> None:
    """Where the reader refuses an argument across a frame's end, the trace reads it as the
    C unpickler reads bytes (``pickle.loads``), notes it, and names what follows."""
    body = b"\x8c\x05hello0c" + b"os\nsystem\n" + b"\x8c\x01x\x85R."
    data = _framed(3, body)
    u = _Recording(io.BufferedReader(io.BytesIO(data)))  # type: ignore[arg-type]
    u.load()
    assert u.asked == [("os", "system")]
    with pytest.raises(PickleError, match="straddles"):
        Machine(data).run()
    machine, recorder = trace(data, Limits())
    machine.run()
    assert [(g.module, g.name) for g in recorder.found.values()] == u.asked
    assert [offset for offset, _ in machine.anomalies] == [11]


# ---- where the trace reads on as C does --------------------------------------------------

def test_a_nul_in_int_or_get_text_is_read_as_c_reads_it() -> None:
    """C reads INT and GET text up to a NUL byte (python/cpython#126996); the reader refuses
    it, the trace reads on (noting it) and names what C names after it."""
    for text, where in ((b"I1\x00x\n0", 2), (b"N\x94g0\x00\n00", 4)):  # the INT, the GET
        data = b"\x80\x04" + text + b"cos\nsystem\n\x8c\x01x\x85R."
        u = _Recording(io.BufferedReader(io.BytesIO(data)))  # type: ignore[arg-type]
        u.load()
        assert u.asked == [("os", "system")]
        with pytest.raises(PickleError, match="NUL"):
            Machine(data).run()
        machine, recorder = trace(data, Limits())
        machine.run()
        assert [(g.module, g.name) for g in recorder.found.values()] == u.asked
        assert [offset for offset, why in machine.anomalies if "NUL" in why] == [where]


def test_a_global_name_that_is_no_text_is_reported_before_the_break() -> None:
    """The C unpickler refuses a GLOBAL whose name is not UTF-8 before importing anything;
    the trace reports the name the opcode spells (what the file tries to import) and breaks
    there as C does."""
    data = b"cmod\n\xf8\n"
    u = _Recording(io.BytesIO(data))
    with pytest.raises(UnicodeDecodeError):
        u.load()
    assert u.asked == []
    scan = scan_stream(data)
    assert [(g.module, g.name, g.offset) for g in scan.globals] == [("mod", "\\xf8", 0)]
    assert not scan.stopped and scan.problems[-1] == (0, "global name is not utf-8 text")
