"""The GPUs this project plans for: each card's memory (for the hardware presets) and dense bf16
peak (for MFU and the dry run's GPU-hours), from the vendors' datasheets."""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, replace
from typing import Optional

from ..shapes.roofline import Roof

__all__ = [
    "GIB", "Card", "CARDS", "MODELS", "card_for_device", "known_card", "detect", "no_cuda_driver",
]  # fmt: skip

GIB = 2**30


@dataclass(frozen=True)
class Card:
    name: str
    memory_gib: float
    device_name: str = ""  # torch.cuda.get_device_name of this card, exactly
    bf16_flops: Optional[float] = (
        None  # dense bf16 tensor-core FLOP/s (datasheet, no sparsity): MFU, GPU-hours
    )
    bandwidth: Optional[float] = None  # memory bytes/s (datasheet): float8's size filter

    @property
    def roof(self) -> Optional[Roof]:
        """The card's roofline (shapes/roofline.py), where the datasheet gives both figures."""
        return Roof(self.bf16_flops, self.bandwidth) if self.bf16_flops and self.bandwidth else None


# The one table of the GPUs this project plans for (vendor datasheets): memory for the presets, peak
# for MFU (the trainer's and the benchmark's) and for the dry run's GPU-hours.
CARDS = {
    # the paper's GPU; 1457 FP8 sparse / 4; 960 GB/s
    "rtx6000ada": Card("rtx6000ada", 48.0, "NVIDIA RTX 6000 Ada Generation", 364.2e12, 0.96e12),
    # SXM5: 1979 TFLOP/s sparse / 2; 3.35 TB/s
    "h100": Card("h100", 80.0, "NVIDIA H100 80GB HBM3", 989.4e12, 3.35e12),
    "h200": Card("h200", 141.0, "NVIDIA H200", 989.5e12, 4.8e12),  # SXM, the H100's die; 4.8 TB/s
    # the paper's other GPU (HGX B200, per GPU); 8 TB/s
    "b200": Card("b200", 180.0, "NVIDIA B200", 2250e12, 8.0e12),
}
# Every model known by its exact device name, each at its own datasheet memory and peak: the
# presets, the lower-clocked PCIe/NVL forms of a preset's chip (planned as that preset, counted at
# their own peak), and other cards (a preset sized by their memory; MFU at their peak).
MODELS = {
    card.device_name: card
    for card in (
        *CARDS.values(),
        Card("h100", 80.0, "NVIDIA H100 PCIe", 756.0e12, 2.0e12),  # 1513 TFLOP/s sparse / 2
        Card("h100", 94.0, "NVIDIA H100 NVL", 835.5e12, 3.9e12),  # 1671 sparse / 2
        Card("h200", 141.0, "NVIDIA H200 NVL", 835.5e12, 4.8e12),  # 1671 sparse / 2
        Card("a100", 80.0, "NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        Card("a100", 40.0, "NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
        Card("a100", 80.0, "NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
        Card("a100", 40.0, "NVIDIA A100-PCIE-40GB", 312e12, 1.555e12),
        Card("l40s", 48.0, "NVIDIA L40S", 362.05e12, 0.864e12),  # 733 sparse / 2
    )
}


def card_for_device(device_name: str, memory_gib: float) -> Card:
    """The preset of a CUDA device (torch.cuda.get_device_name, total memory); another GPU gets a
    preset sized by its own memory. Never more memory than the device reports (MIG slices)."""
    if (card := known_card(device_name)) is not None:
        return replace(card, memory_gib=min(card.memory_gib, memory_gib))
    return Card(f"gpu ({device_name})", memory_gib, device_name)


def known_card(device_name: str) -> Optional[Card]:
    """The card of :data:`MODELS` that torch's device name names exactly, else None (a variant not
    listed is never counted at a relative's peak)."""
    return MODELS.get(device_name.strip())


def no_cuda_driver() -> str:
    """Why CUDA is surely unavailable here, found without importing torch (empty: "ask torch"): on
    Linux, no device visible (CUDA_VISIBLE_DEVICES set empty) or no NVIDIA driver library
    (``libcuda.so.1``, which torch's CUDA needs; loading it does not initialise CUDA)."""
    if not sys.platform.startswith("linux"):
        return ""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return "CUDA_VISIBLE_DEVICES is set empty"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver: libcuda.so.1"
    return ""


def detect() -> Optional[Card]:
    import torch

    if not torch.cuda.is_available():
        return None
    return card_for_device(
        torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory / GIB
    )
