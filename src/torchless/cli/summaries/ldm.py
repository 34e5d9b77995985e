"""Stable Diffusion / latent-diffusion ``.ckpt`` files, as CompVis ``ldm``'s
``LatentDiffusion`` lays its ``state_dict`` out (``ldm/models/diffusion/ddpm.py``): the UNet
under ``model.diffusion_model.``, the VAE under ``first_stage_model.``, the text encoder
under ``cond_stage_model.`` (SDXL's ``sgm``: ``conditioner.embedders.``), the EMA copy under
``model_ema.``; saved by Lightning (``global_step``, ``epoch``), or pruned to
``state_dict`` (or its entries) alone."""

from __future__ import annotations

from typing import Any

from torchless.cli.summaries.seen import Found, Seen

__all__ = ["summary"]

#: (label, prefixes) of each key group.
_GROUPS = (("UNet", ("model.diffusion_model.",)), ("VAE", ("first_stage_model.",)),
           ("text encoder", ("cond_stage_model.", "conditioner.embedders.")),
           ("EMA", ("model_ema.",)))


def _state(top: dict[Any, Any]) -> dict[Any, Any]:
    sd = top.get("state_dict")
    return sd if isinstance(sd, dict) else top


def summary(seen: Seen) -> list[Found]:
    sd = _state(seen.top)
    counts = dict.fromkeys((label for label, _ in _GROUPS), 0)
    for key in sd:
        if isinstance(key, str):
            for label, prefixes in _GROUPS:
                if key.startswith(prefixes):
                    counts[label] += 1
                    break
    if not counts["UNet"]:
        return []
    groups = ", ".join(f"{label} {prefixes[0].rstrip('.')} ({counts[label]} entries)"
                       for label, prefixes in _GROUPS[:3] if counts[label])
    line = f"Stable Diffusion (ldm) checkpoint: {groups}; "
    line += f"EMA present (model_ema, {counts['EMA']} entries)" if counts["EMA"] else "no EMA"
    if "global_step" in seen.top:
        line += f"; global_step {seen.top['global_step']}"
    return [("ldm", line)]
