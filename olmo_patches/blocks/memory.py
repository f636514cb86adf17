"""What the memory model (launch/memory.py) reads of a model: each layer's terms in plain numbers,
stated by the model's kind (``BlockKind.memory_layers``, base.py's ``model_memory``) from its own
OLMo-core build, so that the launch builds no model config and knows no block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

__all__ = ["LayerMemory", "ModelMemory", "layer_memory"]


@dataclass(frozen=True)
class LayerMemory:
    """One layer as the memory model counts it (launch/memory.py's docstring)."""

    width: int  # w_l
    params: int  # the layer's parameters (one FSDP unit)
    n_heads: int
    head_dim: int
    n_kv_heads: int
    qk_norm: bool  # OLMo-2's norms of Q and K
    mlps: int  # MLPs a token runs through: 1 SwiGLU, K sub-MLPs, top-k experts (x K)
    hidden: int  # each one's hidden size
    mlp_norms: bool  # each MLP has its own norm (else the block's second norm counts)
    weight_copy: int  # bytes of weight copies autograd keeps per micro-batch (0: none)
    moe: bool  # a mixture of experts


@dataclass(frozen=True)
class ModelMemory:
    """A model as the memory model reads it: its size, vocabulary and layers."""

    d_model: int  # the residual stream's width (embedding, final norm, LM head)
    vocab_size: int
    params: int  # every parameter (P)
    layers: Tuple[LayerMemory, ...]


def layer_memory(block, w: int) -> LayerMemory:
    """An OLMo-core block config at width ``w``: its attention, one SwiGLU FFN (OLMo-core's MoE:
    its top-k experts) and the block's two norms, no weight copy."""
    mixer, moe = block.sequence_mixer, block.feed_forward_moe
    return LayerMemory(
        width=w,
        params=block.num_params(w),
        n_heads=mixer.n_heads,
        head_dim=getattr(mixer, "head_dim", None) or w // mixer.n_heads,
        n_kv_heads=getattr(mixer, "n_kv_heads", None) or mixer.n_heads,
        qk_norm=bool(getattr(mixer, "qk_norm", None)),
        mlps=1 if moe is None else moe.router.top_k,
        hidden=(block.feed_forward if moe is None else moe).hidden_size,
        mlp_norms=False,
        weight_copy=0,
        moe=moe is not None,
    )
