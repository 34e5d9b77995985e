"""RVC (Retrieval-based Voice Conversion) voice models, as ``savee`` and
``extract_small_model`` (``infer/lib/train/process_ckpt.py``) write them: ``weight`` (the
generator's tensors, half precision), ``config`` (the synthesizer's arguments, a list),
``info`` (``"Nepoch"`` or a note), ``sr`` (``"32k"``, ``"40k"``, ``"48k"``), ``f0`` (1 with
pitch guidance, 0 without) and ``version`` (``"v1"`` or ``"v2"``)."""

from __future__ import annotations

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import pairs

__all__ = ["summary"]


def summary(seen: Seen) -> list[Found]:
    top = seen.top
    weight = top.get("weight")
    if not isinstance(weight, dict) or "sr" not in top or "config" not in top:
        return []
    keep = {k: top[k] for k in ("sr", "f0", "version", "info") if k in top}
    return [("rvc", f"RVC voice model: {pairs(keep)}; {len(weight)} weights")]
