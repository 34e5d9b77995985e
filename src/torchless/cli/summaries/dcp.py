"""Distributed checkpoints (``torch.distributed.checkpoint``): the ranks that wrote shards
and how many, from the container's ``.metadata``; the step (``epoch``, ``step``) from the
tree."""

from __future__ import annotations

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import pairs
from torchless.cli.summaries.training import progress_of

__all__ = ["summary"]


def summary(seen: Seen) -> list[Found]:
    if seen.format != "dcp":
        return []
    shards = seen.info.get("shards")
    ranks = seen.info.get("ranks")
    n = len(shards) if isinstance(shards, list) else 0
    line = f"DCP checkpoint (version {seen.info.get('dcp_version')}): {n} shard file"
    line += "s" * (n != 1)
    if isinstance(ranks, list) and ranks:
        line += f" from {len(ranks)} rank{'s' * (len(ranks) != 1)} ({_span(ranks)})"
    line += f", {seen.info.get('storage_format')}"
    told = progress_of(seen.top)
    if told:
        line += f"; {pairs(told)}"
    return [("dcp", line)]


def _span(ranks: list[int]) -> str:
    ordered = sorted(ranks)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))
