#!/usr/bin/env python
"""Which checkpoints each reader reads: torchless against torch.load(weights_only=True),
measured in one run over the fixtures and the corpus of real checkpoints.

Usage::

    python benchmarks/compare_readers.py            # tests/data/fixtures + tests/data/corpus
    python benchmarks/compare_readers.py --jobs 2   # two torch children at a time
    python benchmarks/compare_readers.py --quick    # two of them: a smoke run
    python benchmarks/compare_readers.py --save-paths   # also every save path of torch's
                                                        # test_serialization.py (needs torch)

For each file torch 2.13 reads (REFERENCE.json / the corpus manifest say so), it records
whether ``torch.load(f, weights_only=True)`` reads it (torch's safe mode), whether
``torchless.load`` reads it (its values are checked against torch by tests/reader/test_fixtures.py
and tests/reader/test_corpus.py), and why each refuses. Each torch call runs in a child process
with a timeout, so that nothing a file does can touch this process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torchless

ROOT = Path(__file__).resolve().parent.parent
_CHILD = r"""
import sys, warnings, torch
warnings.simplefilter("ignore")
try:
    torch.load(sys.argv[1], weights_only=True, map_location="cpu")
    print("ok")
except Exception as e:
    import re
    text = str(e)
    m = re.search(r"Unsupported (?:global|operand)[^\n]*", text)
    print("refused:", (m.group(0) if m else text.splitlines()[0] if text
                       else type(e).__name__)[:160])
"""


def weights_only(path: Path) -> str:
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "refused: timeout"
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else f"refused: crashed ({out.returncode})"


def ours(path: Path) -> str:
    try:
        obj = torchless.load(path)
    except torchless.CheckpointError as e:
        return f"refused: {type(e).__name__}"
    del obj
    return "ok"


def ours_open(path: Path) -> str:
    """torchless.open: every tensor named; sparse, quantized, nested and meta tensors as
    records of their parts; the kinds it does not read listed by name."""
    try:
        with torchless.open(path) as ckpt:
            unread = len(ckpt.unsupported) - len(ckpt.records)
            return "ok" if not ckpt.unsupported else (
                f"ok, {len(ckpt.records)} records" if not unread else f"ok, {unread} listed")
    except torchless.CheckpointError as e:
        return f"refused: {type(e).__name__}"


def save_paths(jobs: int, quick: bool) -> None:
    """Every save path of torch's test_serialization.py that torch on CPU writes
    (tests/_savepaths.py), read by torch.load(weights_only=True) and torchless.open."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from tests import _savepaths

    with tempfile.TemporaryDirectory() as tmp:
        generated = _savepaths.generate(Path(tmp))
        files = [g.path for g in generated.values()]
        if quick:
            files = files[:4]
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            torch_says = list(pool.map(weights_only, files))
        rows = [(p.name, w, ours_open(p)) for p, w in zip(files, torch_says, strict=True)]
    wo = sum(r[1] == "ok" for r in rows)
    tl = sum(r[2].startswith("ok") for r in rows)
    listed = sum(r[2].endswith("listed") for r in rows)
    records = sum(r[2].endswith("records") for r in rows)
    print(f"{len(rows)} files written by the save paths of torch's test_serialization.py")
    print(f"  torch.load(weights_only=True) reads {wo}, refuses {len(rows) - wo}")
    print(f"  torchless.open reads {tl} ({records} with sparse, quantized, nested or meta "
          f"tensors as records of their parts, {listed} with tensor kinds it lists as "
          f"unsupported), refuses {len(rows) - tl}")
    for name, w, t in rows:
        if not t.startswith("ok"):
            print(f"  torchless refuses {name}: {t} (weights_only: {w})")


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1,
                    help="torch children run at a time (1); the counts do not depend on it")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run in seconds: only the first fixture REFERENCE.json says "
                         "weights_only=True refuses and the smallest corpus checkpoint")
    ap.add_argument("--save-paths", action="store_true",
                    help="also write and read every save path of torch's own "
                         "test_serialization.py (tests/_savepaths.py; needs torch)")
    args = ap.parse_args(argv)
    ref = json.loads((ROOT / "tests/data/fixtures/REFERENCE.json").read_text())
    readable = [k for k, v in ref.items() if v["ok"]]
    if args.quick:
        readable = [next(k for k in readable if ref[k].get("weights_only") is False)]
    files = [ROOT / "tests/data/fixtures" / k for k in readable]
    corpus = ROOT / "tests/data/corpus"
    found = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix in (
        ".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl") and "PROVENANCE" not in p.name)
    if args.quick:
        found = sorted(found, key=lambda p: p.stat().st_size)[:1]
    files += found
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        torch_says = list(pool.map(weights_only, files))
    rows = [(path.relative_to(ROOT).as_posix(), w, ours(path))
            for path, w in zip(files, torch_says, strict=True)]
    wo = Counter(r[1] == "ok" for r in rows)
    tl = Counter(r[2] == "ok" for r in rows)
    both = sum(1 for r in rows if r[1] != "ok" and r[2] == "ok")
    print(f"{len(rows)} checkpoints that torch.load(weights_only=False) reads")
    print(f"  torch.load(weights_only=True) reads {wo[True]}, refuses {wo[False]}")
    print(f"  torchless.load reads {tl[True]}, refuses {tl[False]}")
    print(f"  read by torchless but refused by weights_only=True: {both}")
    reasons = Counter(r[1].split(":", 1)[1].strip()[:90] for r in rows if r[1] != "ok")
    for reason, n in reasons.most_common(8):
        print(f"    weights_only refusal x{n}: {reason}")
    for name, w, t in rows:
        if t != "ok":
            print(f"  torchless refuses {name}: {t} (weights_only: {w})")
    if args.save_paths:
        save_paths(args.jobs, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
