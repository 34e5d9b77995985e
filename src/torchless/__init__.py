"""torchless: read PyTorch checkpoints without PyTorch and without running pickle code."""

from __future__ import annotations

from ._batch import BatchResult, batch
from ._checkpoint import Checkpoint, load, open
from ._convert import ConversionReport, OpaqueObjectWarning, VerifyReport, convert, verify
from ._dtypes import DType
from ._errors import (
    AmbiguousArchiveError,
    ArchiveFormatError,
    CheckpointError,
    ChecksumError,
    ConversionError,
    FormatError,
    InternalError,
    InvalidKeyError,
    LimitError,
    NotACheckpointError,
    PickleError,
    StorageError,
    TensorGeometryError,
    TruncatedInputError,
    UnsafeGlobalError,
    UnsafePathError,
    UnsupportedError,
    UnsupportedOpcodeError,
)
from ._inert import TypeRegistry, register_type
from ._limits import Limits
from ._rules import GlobalRecord
from ._scan import ScanReport, scan
from ._store import save
from ._tensor import Tensor, UnsupportedTensor
from ._values import Global, Opaque
from ._version import __version__

__all__ = [
    "AmbiguousArchiveError",
    "BatchResult",
    "ArchiveFormatError",
    "Checkpoint",
    "CheckpointError",
    "ChecksumError",
    "ConversionError",
    "ConversionReport",
    "DType",
    "FormatError",
    "Global",
    "GlobalRecord",
    "InternalError",
    "InvalidKeyError",
    "LimitError",
    "Limits",
    "NotACheckpointError",
    "Opaque",
    "OpaqueObjectWarning",
    "PickleError",
    "ScanReport",
    "StorageError",
    "Tensor",
    "TensorGeometryError",
    "TruncatedInputError",
    "TypeRegistry",
    "UnsafeGlobalError",
    "UnsafePathError",
    "UnsupportedError",
    "UnsupportedOpcodeError",
    "UnsupportedTensor",
    "VerifyReport",
    "__version__",
    "batch",
    "convert",
    "load",
    "open",
    "register_type",
    "save",
    "scan",
    "verify",
]
