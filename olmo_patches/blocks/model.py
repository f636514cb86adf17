"""The model keys every block kind shares (``ModelSpec``: sizes, attention, norms, RoPE,
vocabulary), and how a spec becomes OLMo-core's ``TransformerConfig``. A kind with knobs of its own
subclasses ModelSpec in its module (blocks/hourglass.py's ``HourglassModel``), and a config of that
kind loads into its subclass: the keys of another kind are no keys of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

from omegaconf import MISSING

from ..shapes.choices import NormPlacement, StrEnum

if TYPE_CHECKING:  # the model's classes are imported by build(): loading a config imports no torch
    from olmo_core.nn.rope import StepwiseRoPEScalingConfig
    from olmo_core.nn.transformer import TransformerConfig

__all__ = ["AttentionBackend", "ModelSpec", "RoPEScalingSpec"]


class AttentionBackend(StrEnum):
    auto = "auto"  # flash attention where it runs, else torch
    torch = "torch"
    flash_2 = "flash_2"
    flash_3 = "flash_3"
    flash_4 = "flash_4"
    te = "te"


@dataclass
class RoPEScalingSpec:
    """Llama-3.1 ("llama3") RoPE scaling, in Hugging Face's names; OLMo-core's
    StepwiseRoPEScalingConfig."""

    factor: float = 32.0  # low frequencies divided by this
    low_freq_factor: float = 1.0  # wavelengths above original / low_freq_factor: fully scaled
    high_freq_factor: float = 4.0  # wavelengths below original / high_freq_factor: unchanged
    original_max_position_embeddings: int = 8192

    def build(self) -> "StepwiseRoPEScalingConfig":
        from olmo_core.nn.rope import StepwiseRoPEScalingConfig

        return StepwiseRoPEScalingConfig(
            factor=self.factor,
            low_freq_proportion=1 - 1 / self.low_freq_factor,
            high_freq_proportion=1 / self.high_freq_factor,
            old_context_len=self.original_max_position_embeddings,
        )


@dataclass
class ModelSpec:
    """The keys of ``model`` every kind reads: a constant-width SwiGLU transformer (the baseline's
    whole config). A kind's own knobs are the fields of its subclass."""

    # a registered kind (olmo_patches/blocks/): baseline | hourglass | variable_width
    block: str = "baseline"
    d_model: int = MISSING  # d_model: width of the residual stream
    n_layers: int = MISSING  # L: number of transformer layers
    n_heads: int = MISSING  # attention (query) heads
    head_dim: Optional[int] = (
        None  # per-head size; attention width = n_heads x head_dim (null: d_model / n_heads)
    )
    n_kv_heads: Optional[int] = None  # GQA: key/value heads, dividing n_heads (null: n_heads, MHA)
    ffn_ratio: int = 4  # baseline FFN hidden size = ffn_ratio * d_model (the conventional 4) ...
    d_ff: Optional[int] = None  # ... or this explicit hidden size
    # pre: x + f(norm(x)) (papers); post: x + norm(f(x)) (OLMo-2)
    norm_placement: NormPlacement = NormPlacement.pre
    qk_norm: bool = False  # RMSNorm on queries and keys (OLMo-2)
    rope_theta: int = 500_000
    norm_eps: float = 1e-6  # RMSNorm epsilon
    vocab_size: Optional[int] = None  # default: the tokenizer's vocabulary padded to 128
    rope_scaling: Optional[RoPEScalingSpec] = None  # Llama-3.1 RoPE scaling (null: off)
    tie_embeddings: bool = False
    init_std: float = 0.02  # OLMo-core's init: normal(0, init_std) cut at 3 std
    # auto | torch | flash_2/3/4 | te (nn/attention.py)
    attention_backend: AttentionBackend = AttentionBackend.auto

    @property
    def layer_widths(self) -> List[int]:
        """w_1..w_L as the block kind lays them out (constant-width kinds: d_model at every
        layer)."""
        from .base import block_of  # the registry imports this module

        return block_of(self).widths(self)

    @property
    def head_dims(self) -> List[int]:
        """Every layer's head_dim: model.head_dim, else w_l / n_heads (a variable-width layer's
        own)."""
        return [self.head_dim or w // self.n_heads for w in self.layer_widths]

    @property
    def resolved_d_ff(self) -> int:
        return self.d_ff if self.d_ff is not None else self.ffn_ratio * self.d_model

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def build(self, vocab_size: int) -> "TransformerConfig":
        """OLMo-core's ``TransformerConfig`` for this shape (init seed set by the trainer)."""
        from olmo_core.nn.feed_forward import FeedForwardConfig
        from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

        from .base import block_of

        post = self.norm_placement == NormPlacement.post
        config = TransformerConfig.llama_like(
            d_model=self.d_model,
            vocab_size=self.vocab_size or vocab_size,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            rope_scaling=self.rope_scaling.build() if self.rope_scaling is not None else None,
            qk_norm=self.qk_norm,
            layer_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            block_name=TransformerBlockType.reordered_norm
            if post
            else TransformerBlockType.default,
            feed_forward=FeedForwardConfig(hidden_size=self.resolved_d_ff, bias=False),
            tie_word_embeddings=self.tie_embeddings,
            init_std=self.init_std,
        )
        return block_of(self).build(self, config)
