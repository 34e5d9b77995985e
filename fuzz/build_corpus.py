"""Write the seed corpora for the atheris harnesses from tests/data and the built seeds.

    python fuzz/build_corpus.py [--max-bytes 65536] [--out fuzz/corpus]

``<out>/open/`` gets whole checkpoints (every real file under tests/data no larger than
``--max-bytes``, plus hand-built TAR, ZIP and plain-pickle checkpoints); ``<out>/pickle/``
gets bare pickle streams: each ZIP checkpoint's ``data.pkl``, the object pickle of each
legacy stream and the plain pickles. Names are content hashes, so reruns add nothing twice.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import zipfile
from pathlib import Path

from _common import CORPUS, add_repo_to_path

add_repo_to_path()

from tests._fuzz_inputs import all_seeds  # noqa: E402

from torchless import CheckpointError, Limits  # noqa: E402
from torchless.pickle.machine import run_pickle  # noqa: E402


def _pickles(raw: bytes) -> list[bytes]:
    """The pickle streams inside one seed."""
    if raw[:2] == b"PK":
        try:
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                return [z.read(n) for n in z.namelist() if n.endswith(".pkl")]
        except (zipfile.BadZipFile, OSError, ValueError):
            return []
    out = []
    pos = 0
    while pos < len(raw) and raw[pos:pos + 1] in (b"\x80", b"("):
        try:  # a legacy stream is several pickles in a row: split it where each one stops
            _, end = run_pickle(raw, None, Limits(), start=pos)
        except CheckpointError:
            break
        out.append(raw[pos:end])
        pos = end
    return out


def _write(directory: Path, raw: bytes) -> bool:
    path = directory / hashlib.sha1(raw).hexdigest()
    if path.exists():
        return False
    path.write_bytes(raw)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--max-bytes", type=int, default=65536)
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args()
    open_dir, pickle_dir = args.out / "open", args.out / "pickle"
    open_dir.mkdir(parents=True, exist_ok=True)
    pickle_dir.mkdir(parents=True, exist_ok=True)
    n_open = n_pickle = 0
    for raw in all_seeds(args.max_bytes).values():
        n_open += _write(open_dir, raw)
        for p in _pickles(raw):
            if len(p) <= args.max_bytes:
                n_pickle += _write(pickle_dir, p)
    print(f"{n_open} new seeds in {open_dir}, {n_pickle} in {pickle_dir}")


if __name__ == "__main__":
    main()
