"""Parameter and FLOP accounting.

:func:`breakdown` classifies the parameters of a built model (meta device is fine) by name: exact by
construction, it is what ``count_params`` prints. The papers' closed form (norms excluded, no
biases) is the other, independent view: ``olmo_patches.shapes.counts`` (attention
2 d_model (a + a_kv), SwiGLU FFN 3 d_model d_ff, hourglass FFN 3 K d_model d_h); the shape solvers
use it and tests hold it against :func:`breakdown`.

"Non-embedding" follows the papers: attention + FFN weight matrices, without the embeddings, the
LM head and the norms (OLMo-core's own ``num_non_embedding_params`` keeps the head and norms).
An MoE's router and experts count as FFN; "active" leaves out the experts a token does not use
((E - k) / E of each layer's expert weights), as OLMo-core's ``num_active_params`` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch.nn as nn
from olmo_core.nn.moe import MoEBase

__all__ = ["ParamBreakdown", "breakdown", "kv_cache_per_token"]


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int  # input embedding plus an untied LM head (both vocab x d_model)
    attention: int  # Q, K, V, O projections
    ffn: int  # FFN weight matrices (SwiGLU or hourglass)
    norm: int  # every norm weight (block, sub-MLP, QK and final norms)
    flops_per_token: int  # OLMo-core's training FLOPs per token (forward + backward)
    resize: int = 0  # learned resize projections (variable-width ablation; not in non_embedding)
    inactive: int = 0  # MoE: the expert weights a token does not use, (E - k) / E of each layer's
    kv_cache_per_token: int = (
        0  # K and V elements a token leaves in the inference cache, summed over layers
    )

    @property
    def non_embedding(self) -> int:
        return self.attention + self.ffn

    @property
    def active(self) -> int:
        return self.total - self.inactive

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.ffn + self.norm + self.resize

    @property
    def attention_share(self) -> float:
        return self.attention / self.non_embedding

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "non_embedding": self.non_embedding,
            "total": self.total,
            "active": self.active,
            "attention_share": self.attention_share,
        }


def _category(name: str) -> str:
    if name.startswith("resize.") or ".resize." in name:
        return "resize"
    if "norm" in name:
        return "norm"
    if name.startswith("embeddings.") or name.startswith("lm_head."):
        return "embedding"
    if ".attention." in name:
        return "attention"
    if ".feed_forward." in name or ".feed_forward_moe." in name:
        return "ffn"
    raise ValueError(f"unclassified parameter {name}")


def breakdown(model: nn.Module, seq_len: int) -> ParamBreakdown:
    """Classify every parameter of an OLMo-core transformer (tied weights counted once)."""
    counts = {"embedding": 0, "attention": 0, "ffn": 0, "norm": 0, "resize": 0}
    for name, p in model.named_parameters():  # named_parameters() skips tied duplicates
        counts[_category(name)] += p.numel()
    inactive = 0
    for m in model.modules():
        if isinstance(m, MoEBase):
            experts = sum(p.numel() for p in m.experts.parameters())
            inactive += experts * (m.num_experts - m.top_k) // m.num_experts
    return ParamBreakdown(
        **counts,
        inactive=inactive,
        flops_per_token=model.num_flops_per_token(seq_len),  # type: ignore[operator]
        kv_cache_per_token=kv_cache_per_token(model),
    )


def kv_cache_per_token(model: nn.Module) -> int:
    """sum over layers of 2 n_kv_heads head_dim (K and V; each layer's own head_dim, GQA's shared
    heads once)."""
    return sum(2 * b.attention.n_kv_heads * b.attention.head_dim for b in model.blocks.values())  # type: ignore[union-attr, operator]
