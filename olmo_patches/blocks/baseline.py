"""The baseline: OLMo-core's constant-width transformer with a SwiGLU FFN of hidden d_ff (or
ffn_ratio d_model), narrow-wide-narrow, at every layer. Every other kind starts from its config."""

from __future__ import annotations

from ..shapes.counts import swiglu_ffn_params
from .base import BlockKind, attention_params_of, register


class Baseline(BlockKind):
    name = "baseline"

    def layer_params_floor(self, m) -> int:
        return attention_params_of(m) + swiglu_ffn_params(m.d_model, m.resolved_d_ff)

    def describe(self, m) -> str:
        return f"SwiGLU d_ff {m.resolved_d_ff}"


BASELINE = register(Baseline())
