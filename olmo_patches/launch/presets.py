"""Hardware presets: ``train.hardware`` -> micro-batch size, activation checkpointing and compile.

``train.hardware`` is ``auto`` (the GPU torch sees: its name and memory), ``none`` (no GPU preset:
no checkpointing, no compile, the whole per-rank batch in one micro-batch) or a card:
``rtx6000ada`` (48 GB), ``h100`` (80 GB), ``h200`` (141 GB), ``b200`` (180 GB). A preset only fills
the keys the config left at null (``train.micro_batch_size``, ``train.activation_checkpointing``,
``train.compile``): any value a config file or the command line sets wins, and ``key=null`` hands a
key back to the preset. The values come from the memory estimate (memory.py) for the run's own
model, so each config gets its own micro-batch on each card.

A card's usable memory is 85% of it (CUDA context, NCCL buffers, allocator fragmentation). The
preset takes the first mode of :func:`preset_modes` (least recompute first: off, every 4th block,
every 2nd block, every block; an MoE model: off, its attention only) in which one sequence fits,
then the largest divisor of the per-rank batch that fits in that mode. Compile is on for every GPU
preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..config.spec import ActivationCheckpointing
from .cards import GIB, Card
from .memory import OFF, MemoryEstimate

__all__ = ["USABLE", "Settings", "preset_modes", "choose"]

USABLE = 0.85  # fraction of a card's memory the estimate may fill


def preset_modes(est: MemoryEstimate) -> list[ActivationCheckpointing]:
    """The modes a preset tries, least recompute first (OLMo-core cannot checkpoint whole MoE
    blocks)."""
    if est.moe:
        return [OFF, ActivationCheckpointing("selected_modules", modules=["blocks.*.attention"])]
    return [
        OFF,
        *(ActivationCheckpointing("selected_blocks", block_interval=n) for n in (4, 2)),
        ActivationCheckpointing("full"),
    ]


@dataclass(frozen=True)
class Settings:
    micro_batch_size: int
    activation_checkpointing: ActivationCheckpointing
    compile: bool


def _fits(est: MemoryEstimate, card: Card, micro: int, ac: ActivationCheckpointing) -> bool:
    return est.total(micro, ac) <= USABLE * card.memory_gib * GIB


def choose(
    est: MemoryEstimate,
    card: Card,
    per_rank_batch: int,
    micro_batch_size: Optional[int] = None,
    activation_checkpointing: Optional[ActivationCheckpointing] = None,
) -> Settings:
    """The preset for one card, around the values already given (an explicit micro-batch gets the
    first mode it fits in; an explicit mode sizes the micro-batch with it)."""
    modes = preset_modes(est) if activation_checkpointing is None else [activation_checkpointing]
    if micro_batch_size is not None:
        ac = next((m for m in modes if _fits(est, card, micro_batch_size, m)), modes[-1])
        return Settings(micro_batch_size, ac, True)
    for ac in modes:
        fitting = [
            m
            for m in range(1, per_rank_batch + 1)
            if per_rank_batch % m == 0 and _fits(est, card, m, ac)
        ]
        if fitting:
            return Settings(max(fitting), ac, True)
    raise ValueError(
        f"does not fit {card.name} at micro-batch 1 with activation checkpointing {modes[-1]}: "
        f"estimate {est.total(1, modes[-1]) / GIB:.1f} GiB of {USABLE * card.memory_gib:.1f} "
        "usable; use more GPUs or a bigger card"
    )
