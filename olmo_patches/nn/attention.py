"""Which of OLMo-core's attention backends a model runs with (``model.attention_backend``).

OLMo-core 3.0.0 offers ``torch`` (PyTorch SDPA, every device), ``flash_2`` (flash-attn 2, Ampere and
newer), ``flash_3`` (flash-attn 3 from flash-attn's ``hopper/``, SM 9.0), ``flash_4`` (flash-attn's
CUTE kernels, Blackwell) and ``te`` (Transformer Engine). Left unset, OLMo-core itself picks
``torch`` (flash_2 only for sliding-window attention). ``auto`` here picks flash attention where it
can run: a CUDA device, bf16 compute, the package importing (OLMo-core's own checks, which include the
device's compute capability for flash_3) and every layer's head_dim within the kernel's limits;
anything else resolves to ``torch``. An explicit flash backend on a machine without CUDA falls back
to ``torch``, as OLMo-core does, so a GPU config can still be tested on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.attention import flash_attn_api
from olmo_core.nn.transformer import TransformerConfig

__all__ = ["ATTENTION_BACKENDS", "BackendChoice", "head_dims", "resolve_attention_backend", "set_attention_backend"]

ATTENTION_BACKENDS = ("auto", *(b.value for b in AttentionBackendName))
FLASH_2_MAX_HEAD_DIM = 256  # flash-attn 2: head_dim <= 256 (its README; other than a multiple of 8 it pads)
FLASH_3_HEAD_DIMS = (64, 96, 128, 192, 256)  # the head dims flash-attn 3's hopper/ build compiles
FLASH = ("flash_2", "flash_3", "flash_4")


@dataclass(frozen=True)
class BackendChoice:
    name: str  # an AttentionBackendName value
    reason: str  # why, in a few words (printed by the dry run, logged by the trainer)

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def head_dims(config: TransformerConfig) -> list[int]:
    """Every layer's head_dim (a variable-width layer l has w_l / n_heads)."""
    mixer = config.block.sequence_mixer
    n_heads = getattr(mixer, "n_heads", 1)
    fixed = getattr(mixer, "head_dim", None)
    widths = getattr(config, "widths", None) or [config.d_model] * config.n_layers
    return [fixed or w // n_heads for w in widths]


def _flash_fits(name: str, dims: Sequence[int]) -> bool:
    if name == "flash_3":
        return all(d in FLASH_3_HEAD_DIMS for d in dims)
    return all(d <= FLASH_2_MAX_HEAD_DIM for d in dims)


def _installed(name: str) -> bool:
    return {"flash_2": flash_attn_api.has_flash_attn_2, "flash_3": flash_attn_api.has_flash_attn_3}[name]()


def resolve_attention_backend(requested: str, dims: Sequence[int], *, cuda: bool, bf16: bool) -> BackendChoice:
    """The backend a run uses: ``requested`` on a device that can run it, else ``torch`` (see the module).
    Raises ValueError for a flash backend requested on a CUDA machine that cannot run it."""
    if requested != "auto":
        if requested != "torch" and not cuda:
            return BackendChoice("torch", f"{requested} requested, no CUDA device: OLMo-core's fallback")
        if requested in ("flash_2", "flash_3") and not _installed(requested):
            raise ValueError(f"{requested} does not import here (or not on this GPU); pip install 'hourglass-olmo[gpu]' or use auto")
        if requested in ("flash_2", "flash_3") and not _flash_fits(requested, dims):
            raise ValueError(f"head_dim {sorted(set(dims))} is outside {requested}'s limits; use auto or torch")
        return BackendChoice(requested, "requested")
    if not cuda:
        return BackendChoice("torch", "auto: no CUDA device")
    if not bf16:
        return BackendChoice("torch", "auto: fp32 compute, flash attention needs bf16/fp16")
    for name in ("flash_3", "flash_2"):  # flash-attn 3 is the faster one where it runs (H100/H200)
        if _installed(name) and _flash_fits(name, dims):
            return BackendChoice(name, f"auto: CUDA, bf16, head_dim {sorted(set(dims))}")
    if not _installed("flash_2"):
        return BackendChoice("torch", "auto: flash-attn does not import (pip install 'hourglass-olmo[gpu]')")
    return BackendChoice("torch", f"auto: head_dim {sorted(set(dims))} outside flash-attn's limits")


def set_attention_backend(config: TransformerConfig, name: str) -> None:
    """Set the backend on every block config of ``config`` (the template and any overrides)."""
    blocks = [config.block, *(config.block_overrides or {}).values()]
    for block in blocks:
        block.sequence_mixer.backend = AttentionBackendName(name)  # type: ignore[union-attr]
