"""``batch(..., report=FILE)`` over files whose names are not UTF-8: each result line is
written (the surrogate escapes Python gives such a name as ``\\udcXX``, which JSON reads back
as the same path); writing the line raised UnicodeEncodeError, an internal error that ended
the batch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import torchless
from tests._fuzz_inputs import small_zip_checkpoint

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="byte file names (Linux)")


def test_report_lines_for_names_that_are_not_utf8(tmp_path: Path) -> None:
    good = os.fsdecode(os.fsencode(tmp_path) + b"/g\xff.pt")
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/b\xfe.pt")
    with open(good, "wb") as f:
        f.write(small_zip_checkpoint())
    with open(bad, "wb") as f:
        f.write(b"not a checkpoint at all")
    report = tmp_path / "r.jsonl"
    results = torchless.batch([good, bad], "inspect", report=report)
    assert [r.ok for r in results] == [True, False]
    lines = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [d["path"] for d in lines] == [good, bad]
    assert [d["ok"] for d in lines] == [True, False]
