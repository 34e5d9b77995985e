"""torchless: read PyTorch checkpoints without PyTorch and without running pickle code."""

from __future__ import annotations

from torchless.api.batch import BatchResult, batch
from torchless.conversion.api import convert, verify
from torchless.conversion.common import (
    ConversionReport,
    OpaqueObjectWarning,
    VerifyReport,
)
from torchless.core.dtypes import DType
from torchless.core.limits import Limits
from torchless.errors import (
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
from torchless.inert.schema import TypeRegistry, register_type
from torchless.inert.store import save
from torchless.model.tensor import Tensor, UnsupportedTensor
from torchless.pickle.values import Global, Opaque
from torchless.reader.checkpoint import Checkpoint, load, open
from torchless.rules.resolver import GlobalRecord
from torchless.scanner.files import ScanReport, scan

from ._version import __version__

__all__ = [
    "AmbiguousArchiveError",
    "ArchiveFormatError",
    "BatchResult",
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
