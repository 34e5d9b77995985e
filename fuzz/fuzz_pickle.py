"""Coverage-guided fuzzing of the pickle VM alone, with the inert and the torch resolvers.

The input is one pickle stream, run twice: with the default :class:`Resolver` (everything
inert) and with the torch rules (``TorchResolver``, persistent ids answered with a missing
storage, as for a plain pickle), then finished and flattened as ``torchless.open`` does.
Only :class:`torchless.CheckpointError` subclasses may come out.

    python fuzz/build_corpus.py
    python fuzz/fuzz_pickle.py fuzz/corpus/pickle -atheris_runs=1000000 \
        -max_len=65536 -rss_limit_mb=2048 -timeout=10

See fuzz/README.md.
"""

from __future__ import annotations

import sys
from typing import Any

import atheris  # type: ignore[import-untyped]
from _common import add_repo_to_path

add_repo_to_path()

with atheris.instrument_imports(include=["torchless"]):
    from torchless import CheckpointError, Limits
    from torchless.model.graph import finish, flatten
    from torchless.model.tensor import MissingStorage
    from torchless.pickle.machine import run_pickle
    from torchless.rules.resolver import TorchResolver

_LIMITS = Limits()


def _missing(pid: Any, offset: int) -> Any:
    return MissingStorage(pid)


def test_one_input(data: bytes) -> None:
    try:
        run_pickle(data, None, _LIMITS)
    except CheckpointError:
        pass
    try:
        value, _ = run_pickle(data, TorchResolver(_LIMITS, _missing), _LIMITS)
        flatten(finish(value, _LIMITS), _LIMITS)
    except CheckpointError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
