"""DeepSpeed checkpoints: a tag directory read whole (the ZeRO container: stage, world
size, tag), and its files as ``DeepSpeedEngine`` writes them
(``deepspeed/runtime/engine.py``): ``mp_rank_NN_model_states.pt`` (``module``,
``buffer_names``, ``optimizer``, ``lr_scheduler``, ``skipped_steps``, ``global_steps``,
``global_samples``, ``dp_world_size``, ``mp_world_size``, ``ds_config``, ``ds_version``, the
client state) and ``*_optim_states.pt`` (``optimizer_state_dict`` with ``zero_stage`` and
``partition_count``, ``ds_config``, ``ds_version``)."""

from __future__ import annotations

from torchless.cli.summaries.seen import Found, Seen
from torchless.cli.summaries.text import fields, pairs
from torchless.cli.summaries.training import progress_of

__all__ = ["summary"]

_STEPS = ("global_steps", "global_samples", "skipped_steps", "dp_world_size", "mp_world_size")


def summary(seen: Seen) -> list[Found]:
    out: list[Found] = []
    info, top = seen.info, seen.top
    if seen.format == "zero":
        saves = info.get("tags")
        keep = {"stage": info.get("zero_stage"), "world_size": info.get("world_size"),
                "tag": info.get("tag"),
                # the other saves of the run, which --tag reads
                "saves": " ".join(saves) if isinstance(saves, list) and len(saves) > 1
                else None, **progress_of(top)}
        out.append(("deepspeed", "DeepSpeed ZeRO checkpoint: " + pairs(
            {k: v for k, v in keep.items() if v is not None})))
    if "ds_version" not in top and "ds_config" not in top:
        return out
    version = top.get("ds_version")
    if "module" in top or "global_steps" in top:
        out.append(("deepspeed", f"DeepSpeed model states (deepspeed {version}): " + pairs(
            {k: top[k] for k in _STEPS if k in top})))
    osd = fields(top.get("optimizer_state_dict"))
    if osd is not None:
        keep = {k: osd[k] for k in ("zero_stage", "partition_count") if k in osd}
        out.append(("deepspeed", f"DeepSpeed optimizer states (deepspeed {version}): "
                    + pairs(keep)))
    return out
