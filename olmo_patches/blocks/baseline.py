"""The baseline: OLMo-core's constant-width transformer with a SwiGLU FFN of hidden d_ff (or
ffn_ratio d_model), narrow-wide-narrow, at every layer. Every other kind starts from its config."""

from __future__ import annotations

from .base import BlockKind, register


class Baseline(BlockKind):
    name = "baseline"
    label = "baseline"
    olmo2_layers = True


BASELINE = register(Baseline())
