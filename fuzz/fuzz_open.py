"""Coverage-guided fuzzing of the whole reader: ``torchless.open`` + every tensor + ``load``.

Each input is written to one file (on ``/dev/shm`` when it exists) and read as a checkpoint,
whatever format its bytes sniff as: ZIP, TorchScript, legacy stream, TAR or plain pickle. Only
:class:`torchless.CheckpointError` subclasses may come out, and never torchless's catch-all
wrapper around an internal bug; anything else is a crash that libFuzzer records. Memory and
time are bounded by libFuzzer (``-rss_limit_mb``, ``-timeout``).

    python fuzz/build_corpus.py                     # seeds from tests/data, once
    python fuzz/fuzz_open.py fuzz/corpus/open -atheris_runs=1000000 \
        -max_len=65536 -rss_limit_mb=2048 -timeout=10

See fuzz/README.md.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris  # type: ignore[import-untyped]
from _common import add_repo_to_path

add_repo_to_path()

with atheris.instrument_imports(include=["torchless"]):
    import torchless  # noqa: F401

from tests._fuzz_inputs import read_everything  # noqa: E402

_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_PATH = os.path.join(_DIR, f"torchless-fuzz-open-{os.getpid()}.pt")


def test_one_input(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        read_everything(_PATH)
    finally:  # libFuzzer ends the process with exit(): nothing may be left behind
        os.unlink(_PATH)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
