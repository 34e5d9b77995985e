"""Which name of a tied weight ``dedupe`` keeps in a Hugging Face layout: the one transformers
keeps, so ``from_pretrained`` of the output finds every weight it loads and re-ties the rest.

transformers' ``save_pretrained`` removes, from each group of names sharing one storage, the
names its model class lists in ``_tied_weights_keys`` (the *targets* of a tie: the output
head ``lm_head.weight``, BERT's ``cls.predictions.decoder.weight``, T5's
``encoder.embed_tokens.weight`` …) and keeps the source (``transformer.wte.weight``,
``model.embed_tokens.weight``, ``shared.weight``). On load, the targets are expected to be
missing and are tied back to the source; a missing *source* is not re-created (4.x leaves it
on the ``meta`` device). torchless has no model class to ask, so the targets are recognised
by the names transformers' classes declare (a census of ``_tied_weights_keys`` over the
models of transformers 4.57 and 5.x):

* rank 2, output heads: ``lm_head.weight`` (and ``lm_head.decoder.*``,
  ``lm_head.out_proj.weight``), ``*.predictions.decoder.*``, ``embed_out``,
  ``output_projection``, ``generator_lm_head``, ``proj_out``, ``pred_layer.proj``,
  ``vocab_projector``, ``lm_loss``, ``mlm_score.decoder.*``, ``*_head.decoder.bias``;
* rank 1, per-stack copies of a shared embedding: ``encoder.embed_tokens.weight`` and
  ``decoder.embed_tokens.weight`` (under any prefix);
* rank 0: every other name.

From each alias group the first name (sorted) of the lowest rank is kept and every name of
rank 1 or 2 is recorded as its alias; other rank-0 names of the group are written in full (a
name transformers would neither remove nor re-tie must be in the file). When the directory's
``config.json`` says ``"tie_word_embeddings": false``, groups holding an output head are
written in full: transformers would not tie them back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from torchless.conversion.common import prepare as _prepare
from torchless.conversion.common import same_views
from torchless.core import jsondepth as _json
from torchless.core.limits import Limits
from torchless.errors import CheckpointError
from torchless.inert import schema as _inert
from torchless.model.tensor import Tensor
from torchless.reader import checkpoint as _checkpoint

__all__ = ["aliases", "prepare", "rank", "tie_word_embeddings"]

_HEADS = re.compile(
    r"(?:^|\.)(?:lm_head\.(?:decoder\.)?(?:weight|bias)|lm_head\.out_proj\.weight"
    r"|predictions\.decoder\.(?:weight|bias)|embed_out\.weight|output_projection\.weight"
    r"|generator_lm_head\.weight|proj_out\.weight|pred_layer\.proj\.weight"
    r"|vocab_projector\.weight|lm_loss\.weight|mlm_score\.decoder\.(?:weight|bias)"
    r"|\w+_head\.decoder\.bias)$")
_STACK_COPIES = re.compile(r"(?:^|\.)(?:encoder|decoder)\.embed_tokens\.weight$")
_MAX_CONFIG_BYTES = 10_000_000

Parts = tuple[dict[str, Tensor], dict[str, str], dict[str, str], dict[str, str]]


def rank(name: str) -> int:
    """2 for an output head, 1 for a per-stack embedding copy, 0 otherwise (see above)."""
    if _HEADS.search(name):
        return 2
    return 1 if _STACK_COPIES.search(name) else 0


def tie_word_embeddings(directory: str) -> bool | None:
    """``config.json``'s ``tie_word_embeddings`` (None when absent or unreadable: the
    aliases in the weights then say what was tied)."""
    try:
        with open(os.path.join(directory, "config.json"), "rb") as f:
            raw = f.read(_MAX_CONFIG_BYTES + 1)
        if len(raw) > _MAX_CONFIG_BYTES:
            return None
        doc: Any = _json.loads(raw.decode("utf-8"), max_depth=Limits.max_depth,
                               what="config.json")
    except (OSError, ValueError, UnicodeDecodeError, CheckpointError):
        return None
    value = doc.get("tie_word_embeddings") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def aliases(tensors: dict[str, Tensor], tied: bool | None,
            reserved: set[str]) -> dict[str, str]:
    """removed name -> kept name, as transformers would save the group (module docstring)."""
    out: dict[str, str] = {}
    for names in same_views(tensors):
        ranks = {n: rank(n) for n in names}
        if tied is False and 2 in ranks.values():
            continue
        kept = min(names, key=lambda n: (ranks[n], n))
        for name in names:
            if name != kept and ranks[name] > 0 and name not in reserved:
                out[name] = kept
    return out


def prepare(ckpt: _checkpoint.Checkpoint, key: str | None, dedupe: bool,
            skip_unsupported: bool, tied: bool | None,
            names: Mapping[str, str] | None = None) -> Parts:
    """:func:`torchless.conversion.common.prepare` with transformers' choice of aliases."""
    written, metadata, bad, _ = _prepare(ckpt, key, False, skip_unsupported, names)
    if not dedupe:
        return written, metadata, bad, {}
    removed = aliases(written, tied, {*metadata, _inert.FORMAT_KEY, _inert.TREE_KEY})
    for name, kept in removed.items():
        metadata[name] = kept
    return {n: t for n, t in written.items() if n not in removed}, metadata, bad, removed
