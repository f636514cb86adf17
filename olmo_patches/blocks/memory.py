"""What the memory model (launch/memory.py) reads of a model: each layer's terms in plain numbers,
stated by the model's kind (``BlockKind.memory_layers``, base.py's ``model_memory``) from its own
OLMo-core build, so that the launch builds no model config and knows no block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

__all__ = ["LayerMemory", "ModelMemory", "layer_memory", "norm_bytes", "swiglu_bytes"]


@dataclass(frozen=True)
class LayerMemory:
    """One layer as the memory model counts it (launch/memory.py's docstring)."""

    width: int  # w_l
    params: int  # the layer's parameters (one FSDP unit)
    n_heads: int
    head_dim: int
    n_kv_heads: int
    qk_norm: bool  # OLMo-2's norms of Q and K
    ffn: int  # bytes a token its FFN saves for backward (its own norms included)
    widest: int  # the widest input of its FFN's matmuls (float8's cast of it)
    norms: int = 2  # the block's norms outside attention and FFN, each saving norm_bytes(w)
    weight_copy: int = 0  # bytes of weight copies autograd keeps per micro-batch
    moe: bool = False  # a mixture of experts


@dataclass(frozen=True)
class ModelMemory:
    """A model as the memory model reads it: its size, vocabulary and layers."""

    d_model: int  # the residual stream's width (embedding, final norm, LM head)
    vocab_size: int
    params: int  # every parameter (P)
    layers: Tuple[LayerMemory, ...]


def norm_bytes(w: int) -> int:
    """OLMo-core's RMSNorm at width ``w``: its fp32 input and output a token, and the rsqrt."""
    return 8 * w + 4


def swiglu_bytes(w: int, hidden: int) -> int:
    """A SwiGLU at width ``w``: its bf16 input, and w1, w3, SiLU and product (bf16, ``hidden``)."""
    return 2 * w + 8 * hidden


def layer_memory(block, w: int) -> LayerMemory:
    """An OLMo-core block config at width ``w``: its attention, one SwiGLU FFN (OLMo-core's MoE: its
    top-k experts) and the block's two norms, no weight copy."""
    mixer, moe = block.sequence_mixer, block.feed_forward_moe
    hidden = (block.feed_forward if moe is None else moe).hidden_size
    return LayerMemory(
        width=w,
        params=block.num_params(w),
        n_heads=mixer.n_heads,
        head_dim=getattr(mixer, "head_dim", None) or w // mixer.n_heads,
        n_kv_heads=getattr(mixer, "n_kv_heads", None) or mixer.n_heads,
        qk_norm=bool(getattr(mixer, "qk_norm", None)),
        ffn=(1 if moe is None else moe.router.top_k) * swiglu_bytes(w, hidden),
        widest=max(w, hidden),
        moe=moe is not None,
    )
