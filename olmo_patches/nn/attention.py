"""Which of OLMo-core's attention backends a model runs with (``model.attention_backend``).

OLMo-core 3.0.0 offers ``torch`` (PyTorch SDPA, every device), ``flash_2`` (flash-attn 2, Ampere and
newer), ``flash_3`` (flash-attn 3 from flash-attn's ``hopper/``, SM 9.0), ``flash_4`` (flash-attn's
CUTE kernels, Blackwell) and ``te`` (Transformer Engine). Left unset, OLMo-core itself picks
``torch`` (flash_2 only for sliding-window attention). ``auto`` here picks flash attention where it
can run: a CUDA device, bf16 compute, the package importing (OLMo-core's own checks, which include
the device's compute capability for flash_3) and every layer's head_dim within the kernel's limits;
anything else resolves to ``torch``. An explicit flash backend on a machine without CUDA falls back
to ``torch``, as OLMo-core does, so a GPU config can still be tested on a CPU.

``torch`` on CUDA is PyTorch SDPA, which itself runs one of three kernels (flash, cuDNN, memory
efficient; the first that takes the inputs, in torch's order). :data:`SDPA_KERNELS` is the
measured fastest per head dim (the GPU check's attention section prints TFLOP/s per head dim and
kernel); where it names one kernel for every layer's head dim, the run enables only that one
(:func:`use_sdpa_kernel`, and SDPA's math fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from olmo_core.nn.attention import AttentionBackendName
from olmo_core.nn.attention import flash_attn_api
from olmo_core.nn.transformer import TransformerConfig

__all__ = [
    "BackendChoice",
    "head_dim_padding",
    "head_dims",
    "kernel_head_dim",
    "on_gpu",
    "SDPA_KERNELS",
    "sdpa_kernel",
    "use_sdpa_kernel",
    "resolve_attention_backend",
    "set_attention_backend",
    "FLASH",
]

# flash-attn (github.com/Dao-AILab/flash-attention): both kernels take head_dim <= 256 in multiples
# of 8 (csrc/flash_attn/flash_api.cpp mha_fwd: "head_size <= 256", "head_size % 8 == 0";
# hopper/flash_api.cpp mha_fwd: "head_size % alignment == 0", alignment 8 for bf16/fp16, and
# "head_size <= max_headdim", 256). flash-attn 2's Python interface pads any other head_dim to the
# next multiple of 8 (flash_attn_interface.py, FlashAttnFunc.forward: F.pad(q, [0, 8 - head_size_og
# % 8])); flash-attn 3's does not, so it refuses them. Each then runs the kernel compiled for the
# next of its head dims (FA2: csrc/flash_attn/src/static_switch.h HEADDIM_SWITCH; FA3:
# hopper/flash_api.cpp round_up_headdim), whose tiles compute over that width.
FLASH_MAX_HEAD_DIM = 256
FLASH_HEAD_DIM_MULTIPLE = 8
FLASH_KERNEL_HEAD_DIMS = {
    "flash_2": (32, 64, 96, 128, 192, 256),
    "flash_3": (64, 96, 128, 192, 256),
}
FLASH = ("flash_2", "flash_3", "flash_4")
# head_dim -> the fastest torch SDPA kernel on CUDA (flash | cudnn | efficient), bf16, causal,
# forward + backward, from `python scripts/gpu_check.py --only attention` (its "SDPA kernels" rows;
# docs/performance.md). Rows are added from a GPU run's table; a head dim not listed runs torch's
# own order.
SDPA_KERNELS: dict[int, str] = {}


@dataclass(frozen=True)
class BackendChoice:
    name: str  # an AttentionBackendName value
    reason: str  # why, in a few words (printed by the dry run, logged by the trainer)
    sdpa: Optional[str] = None  # torch SDPA's kernel from SDPA_KERNELS (None: torch's order)

    def __str__(self) -> str:
        sdpa = f", SDPA kernel {self.sdpa} (measured fastest)" if self.sdpa else ""
        return f"{self.name} ({self.reason}{sdpa})"


def sdpa_kernel(dims: Sequence[int], table: Optional[dict] = None) -> Optional[str]:
    """The SDPA kernel ``table`` (default :data:`SDPA_KERNELS`) names for every head dim in
    ``dims``, else None."""
    kernels = {(SDPA_KERNELS if table is None else table).get(d) for d in dims}
    return kernels.pop() if len(kernels) == 1 else None


def use_sdpa_kernel(name: Optional[str]) -> None:
    """Enable only torch SDPA's ``name`` kernel on CUDA (and its math fallback), process-wide; None
    leaves torch's order."""
    if name is None:
        return
    import torch

    torch.backends.cuda.enable_flash_sdp(name == "flash")
    torch.backends.cuda.enable_cudnn_sdp(name == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(name == "efficient")
    torch.backends.cuda.enable_math_sdp(True)


def head_dims(config: TransformerConfig) -> list[int]:
    """Every layer's head_dim (a variable-width layer l has w_l / n_heads)."""
    mixer = config.block.sequence_mixer
    n_heads = getattr(mixer, "n_heads", 1)
    fixed = getattr(mixer, "head_dim", None)
    widths = getattr(config, "widths", None) or [config.d_model] * config.n_layers
    return [fixed or w // n_heads for w in widths]


def _flash_fits(name: str, dims: Sequence[int]) -> bool:
    if name == "flash_3":  # no padding in flash-attn 3's interface: a multiple of 8 or an error
        return all(d <= FLASH_MAX_HEAD_DIM and d % FLASH_HEAD_DIM_MULTIPLE == 0 for d in dims)
    return all(d <= FLASH_MAX_HEAD_DIM for d in dims)


def kernel_head_dim(name: str, d: int) -> int:
    """The head dim ``name``'s kernel computes over for a head_dim ``d`` (see the constants above);
    ``d`` itself for torch SDPA and the backends not modelled here."""
    dims = FLASH_KERNEL_HEAD_DIMS.get(name)
    if dims is None:
        return d
    padded = -(-d // FLASH_HEAD_DIM_MULTIPLE) * FLASH_HEAD_DIM_MULTIPLE
    return next(k for k in dims if k >= padded)


def head_dim_padding(name: str, dims: Sequence[int]) -> str:
    """For the dry run: the head dims (``dims``: every layer's) that ``name``'s kernel computes over
    a wider one, and the share of the attention FLOPs (QK^T and PV, linear in the head dim) spent on
    the padding: each head dim's, and over all layers when they differ; "" when none."""
    padded = [(d, k) for d in sorted(set(dims)) if (k := kernel_head_dim(name, d)) != d]
    if not padded:
        return ""
    if len(padded) <= 3:
        text = ", ".join(
            f"head_dim {d} as {k} ({1 - d / k:.0%} of its attention FLOPs padding)"
            for d, k in padded
        )
    else:
        shares = [1 - d / k for d, k in padded]
        text = (
            f"{len(padded)} of {len(set(dims))} head dims padded"
            f" ({min(shares):.0%} to {max(shares):.0%} each)"
        )
    if len(set(dims)) > 1:
        waste = 1 - sum(dims) / sum(kernel_head_dim(name, d) for d in dims)
        text += f"; {waste:.0%} of all layers' attention FLOPs"
    return text


def _installed(name: str) -> bool:
    return {"flash_2": flash_attn_api.has_flash_attn_2, "flash_3": flash_attn_api.has_flash_attn_3}[
        name
    ]()


def resolve_attention_backend(
    requested: str, dims: Sequence[int], *, cuda: bool, bf16: bool
) -> BackendChoice:
    """The backend a run uses: ``requested`` on a device that can run it, else ``torch`` (see the
    module). Raises ValueError for a flash backend requested on a CUDA machine that cannot run
    it."""
    if requested != "auto":
        if requested != "torch" and not cuda:
            return BackendChoice(
                "torch", f"{requested} requested, no CUDA device: OLMo-core's fallback"
            )
        if requested in ("flash_2", "flash_3") and not _installed(requested):
            raise ValueError(
                f"{requested} does not import here (or not on this GPU);"
                " pip install 'hourglass-olmo[gpu]' or use auto"
            )
        if requested in ("flash_2", "flash_3") and not _flash_fits(requested, dims):
            raise ValueError(
                f"head_dim {sorted(set(dims))} is outside {requested}'s limits; use auto or torch"
            )
        sdpa = sdpa_kernel(dims) if cuda and requested == "torch" else None
        return BackendChoice(requested, "requested", sdpa)
    if not cuda:
        return BackendChoice("torch", "auto: no CUDA device")
    if not bf16:
        return BackendChoice("torch", "auto: fp32 compute, flash attention needs bf16/fp16")
    for name in ("flash_3", "flash_2"):  # flash-attn 3 is the faster one where it runs (H100/H200)
        if _installed(name) and _flash_fits(name, dims):
            return BackendChoice(name, f"auto: CUDA, bf16, head_dim {sorted(set(dims))}")
    sdpa = sdpa_kernel(dims)
    if not _installed("flash_2"):
        why = "auto: flash-attn does not import (pip install 'hourglass-olmo[gpu]')"
        return BackendChoice("torch", why, sdpa)
    why = f"auto: head_dim {sorted(set(dims))} outside flash-attn's limits"
    return BackendChoice("torch", why, sdpa)


def on_gpu(requested: str, dims: Sequence[int], *, bf16: bool) -> str:
    """What a CUDA node with flash-attn installed runs (``auto``: flash_3 on H100/H200, flash_2 on
    the other GPUs, as resolve_attention_backend picks there), with any head-dim padding and its
    cost: for the dry run on a machine without that GPU."""
    if requested == "auto":
        if not bf16:
            return "torch SDPA (fp32 compute)"
        if not _flash_fits("flash_2", dims):
            return f"torch SDPA (head_dim {sorted(set(dims))} above flash-attn's 256)"
        where = (
            [("flash_3", "H100/H200"), ("flash_2", "other GPUs")]
            if _flash_fits("flash_3", dims)
            else [("flash_2", "every GPU (flash_3 takes multiples of 8 only)")]
        )
    elif requested in FLASH_KERNEL_HEAD_DIMS:
        where = [(requested, "the GPU")]
    else:
        return f"{requested} (requested)"
    out = []
    for name, gpus in where:
        padding = head_dim_padding(name, dims)
        out.append(
            f"{name} on {gpus}: "
            + (
                f"computes {padding}"
                if padding
                else f"no head-dim padding (head_dim {sorted(set(dims))})"
            )
        )
    return "; ".join(out)


def set_attention_backend(config: TransformerConfig, name: str) -> None:
    """Set the backend on every block config of ``config`` (the template and any overrides)."""
    blocks = [config.block, *(config.block_overrides or {}).values()]
    for block in blocks:
        block.sequence_mixer.backend = AttentionBackendName(name)  # type: ignore[union-attr]
