"""What ``torchless inspect`` adds for a DCP directory: its shard files and ranks, and how
each tensor saved in several chunks is split."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["dcp_text"]

_MAX_CHUNKS_SHOWN = 8


def dcp_text(info: Mapping[str, Any], w: Callable[[str], Any], max_rows: int,
             human: Callable[[int], str]) -> None:
    shards, ranks = info.get("shards", []), info.get("ranks", [])
    w(f"  shards: {len(shards)} files, ranks {', '.join(map(str, ranks)) or '(unnamed)'}; "
      f"{info.get('values', 0)} non-tensor values\n")
    for s in shards[:max_rows]:
        rank = "" if s["rank"] is None else f"rank {s['rank']}"
        w(f"    {s['file']:<24} {rank:<8} {human(s['bytes']):>10}  {s['items']} items\n")
    split = {k: v for k, v in info.get("chunks", {}).items() if len(v) > 1}
    if not split:
        w("  chunk layout: every tensor is one chunk\n")
        return
    w("  chunk layout (tensors saved in several chunks: offsets + sizes @ file):\n")
    for name, chunks in list(split.items())[:max_rows]:
        parts = [f"{c['offsets']}+{c['sizes']} @{c['file']}" for c in chunks[:_MAX_CHUNKS_SHOWN]]
        more = f" … {len(chunks) - _MAX_CHUNKS_SHOWN} more" if len(chunks) > _MAX_CHUNKS_SHOWN \
            else ""
        w(f"    {name}: {len(chunks)} chunks: {', '.join(parts)}{more}\n")
    if len(split) > max_rows:
        w(f"    ... {len(split) - max_rows} more (use --all or --json)\n")
