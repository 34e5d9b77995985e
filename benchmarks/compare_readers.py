#!/usr/bin/env python
"""Which checkpoints each reader reads: torchless against torch.load(weights_only=True),
measured in one run over the fixtures and the corpus of real checkpoints.

Usage::

    python benchmarks/compare_readers.py            # tests/data/fixtures + tests/data/corpus

For each file torch 2.13 reads (REFERENCE.json / the corpus manifest say so), it records
whether ``torch.load(f, weights_only=True)`` reads it (torch's safe mode), whether
``torchless.load`` reads it (its values are checked against torch by tests/test_fixtures.py
and tests/test_corpus.py), and why each refuses. Each torch call runs in a child process
with a timeout, so that nothing a file does can touch this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
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


def main() -> int:
    ref = json.loads((ROOT / "tests/data/fixtures/REFERENCE.json").read_text())
    files = [ROOT / "tests/data/fixtures" / k for k, v in ref.items() if v["ok"]]
    corpus = ROOT / "tests/data/corpus"
    files += sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix in (
        ".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl") and "PROVENANCE" not in p.name)
    rows = []
    for path in files:
        rows.append((path.relative_to(ROOT).as_posix(), weights_only(path), ours(path)))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
