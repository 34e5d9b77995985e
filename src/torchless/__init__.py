"""torchless: read PyTorch checkpoints without PyTorch and without running pickle code.

The names below are imported when first used (``import torchless`` stays cheap: the command
line starts without loading what a command does not need)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchless._version import __version__
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
    MissingFileError,
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

if TYPE_CHECKING:
    from torchless.api.batch import BatchResult, batch
    from torchless.api.safeopen import safe_open
    from torchless.conversion.api import convert, verify, verify_certificate
    from torchless.conversion.common import (
        ConversionReport,
        OpaqueObjectWarning,
        VerifyReport,
    )
    from torchless.core.dtypes import DType
    from torchless.core.limits import Limits
    from torchless.inert.schema import TypeRegistry, register_type
    from torchless.inert.store import save
    from torchless.model.kinds import TensorRecord
    from torchless.model.tensor import Tensor, UnsupportedTensor
    from torchless.pickle.values import Global, Opaque
    from torchless.reader.checkpoint import Checkpoint, load, open
    from torchless.rules.resolver import GlobalRecord
    from torchless.scanner.files import ScanReport, scan


def _api_safeopen() -> Any:
    from torchless.api import safeopen as module

    return module


def _api_batch() -> Any:
    from torchless.api import batch as module

    return module


def _conversion_api() -> Any:
    from torchless.conversion import api as module

    return module


def _conversion_common() -> Any:
    from torchless.conversion import common as module

    return module


def _core_dtypes() -> Any:
    from torchless.core import dtypes as module

    return module


def _core_limits() -> Any:
    from torchless.core import limits as module

    return module


def _inert_schema() -> Any:
    from torchless.inert import schema as module

    return module


def _inert_store() -> Any:
    from torchless.inert import store as module

    return module


def _model_kinds() -> Any:
    from torchless.model import kinds as module

    return module


def _model_tensor() -> Any:
    from torchless.model import tensor as module

    return module


def _pickle_values() -> Any:
    from torchless.pickle import values as module

    return module


def _reader_checkpoint() -> Any:
    from torchless.reader import checkpoint as module

    return module


def _rules_resolver() -> Any:
    from torchless.rules import resolver as module

    return module


def _scanner_files() -> Any:
    from torchless.scanner import files as module

    return module


#: Each public name (but the errors, imported with the package) and the loader of the module
#: that defines it.
_WHERE: dict[str, Callable[[], Any]] = {
    "BatchResult": _api_batch,
    "Checkpoint": _reader_checkpoint,
    "ConversionReport": _conversion_common,
    "DType": _core_dtypes,
    "Global": _pickle_values,
    "GlobalRecord": _rules_resolver,
    "Limits": _core_limits,
    "Opaque": _pickle_values,
    "OpaqueObjectWarning": _conversion_common,
    "ScanReport": _scanner_files,
    "Tensor": _model_tensor,
    "TensorRecord": _model_kinds,
    "TypeRegistry": _inert_schema,
    "UnsupportedTensor": _model_tensor,
    "VerifyReport": _conversion_common,
    "batch": _api_batch,
    "convert": _conversion_api,
    "load": _reader_checkpoint,
    "open": _reader_checkpoint,
    "register_type": _inert_schema,
    "safe_open": _api_safeopen,
    "save": _inert_store,
    "scan": _scanner_files,
    "verify": _conversion_api,
    "verify_certificate": _conversion_api,
}


def __getattr__(name: str) -> Any:
    if name == "torch":  # the torch.load drop-in, a module (it imports torch when called)
        # imported by its full name: `from torchless import torch` would look the name up on
        # this package first, calling this function again without end
        import torchless.torch as drop_in

        return drop_in
    loader = _WHERE.get(name)
    if loader is None:
        raise AttributeError(f"module 'torchless' has no attribute {name!r}")
    value = vars(loader())[name]  # our own module, a name from the table above
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "MissingFileError",
    "NotACheckpointError",
    "Opaque",
    "OpaqueObjectWarning",
    "PickleError",
    "ScanReport",
    "StorageError",
    "Tensor",
    "TensorGeometryError",
    "TensorRecord",
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
    "safe_open",
    "save",
    "scan",
    "verify",
    "verify_certificate",
]
