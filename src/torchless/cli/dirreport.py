"""What ``convert DIR`` did besides the weights (a :class:`DirectoryReport`): each other
checkpoint file converted, each other file linked or copied, what was left out."""

from __future__ import annotations

from typing import Any

from torchless.conversion.common import ConversionReport
from torchless.conversion.hfdir import DirectoryReport
from torchless.core.text import line_writer

__all__ = ["directory_json", "directory_text"]


def directory_json(report: ConversionReport, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (the weights' report) with ``converted``, ``brought`` and ``left_out``."""
    if isinstance(report, DirectoryReport):
        from torchless.cli.show import report_json

        doc["converted"] = [report_json(r) for r in report.converted]
        doc["brought"] = [{"src": s, "dst": d, "how": how} for s, d, how in report.brought]
        doc["left_out"] = list(report.left_out)
    return doc


def directory_text(report: ConversionReport, out: Any) -> None:
    """One line per file, after the weights' report."""
    if not isinstance(report, DirectoryReport):
        return
    w = line_writer(out)
    for r in report.converted:
        inert = f"; inert records: {', '.join(r.opaque)}" if r.opaque else ""
        w(f"  converted {r.src} -> {r.dst} ({r.tensors} tensors and its object tree{inert})\n")
    for src, dst, how in report.brought:
        w(f"  {how} {src} -> {dst}\n")
    for path in report.left_out:
        w(f"  left out (hidden, or a directory holding checkpoints): {path}\n")
