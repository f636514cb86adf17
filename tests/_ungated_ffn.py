"""A block kind that changes only the FFN, from this one file: OLMo-core's blocks with the ungated
two-matrix GELU FFN of GPT-2 (Radford et al. 2019; Vaswani et al. 2017, Eq. 2),

    FFN(x) = W_2 GELU(W_1 x),   W_1: d_ff x d_model, W_2: d_model x d_ff.

tests/test_new_block.py loads it through ``HOURGLASS_BLOCKS=tests._ungated_ffn`` and runs the
commands on it with no other file changed (docs/adding_a_block.md, "Changing only the FFN")."""

from dataclasses import dataclass, replace

import torch.nn as nn
import torch.nn.functional as F
from olmo_core.nn.feed_forward import FeedForwardConfig

from olmo_patches.blocks import BlockKind, register
from olmo_patches.blocks.base import attention_params_of, w2_input
from olmo_patches.blocks.memory import Saved, layer_memory


class UngatedFFN(nn.Module):
    def __init__(self, d_model: int, hidden_size: int, init_device: str = "cpu"):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden_size, bias=False, device=init_device)
        self.w2 = nn.Linear(hidden_size, d_model, bias=False, device=init_device)

    # OLMo-core's init draws block.feed_forward's w1, w3 and w2: w3 is w1 here (drawn twice, both
    # from normal(0, init_std) under the project's init)
    w3 = property(lambda self: self.w1)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))

    def num_flops_per_token(self, seq_len: int) -> int:
        return 6 * (self.w1.weight.numel() + self.w2.weight.numel())  # as OLMo-core's FeedForward


@dataclass
class UngatedFFNConfig(FeedForwardConfig):
    def build(self, d_model: int, *, dtype=None, init_device: str = "cpu") -> UngatedFFN:
        return UngatedFFN(d_model, self.hidden_size, init_device=init_device)

    def num_params(self, d_model: int) -> int:
        return 2 * d_model * self.hidden_size


class Ungated(BlockKind):
    name = "ungated"

    def build(self, m, config):
        config.block.feed_forward = UngatedFFNConfig(hidden_size=m.resolved_d_ff, bias=False)
        return config

    def layer_params_floor(self, m) -> int:
        return attention_params_of(m) + 2 * m.d_model * m.resolved_d_ff

    def describe(self, m) -> str:
        return f"ungated GELU d_ff {m.resolved_d_ff}"

    def record_hidden(self, m, block, record):
        return w2_input(block.feed_forward, record)  # GELU(W_1 x)

    def memory_layers(self, m, config):
        """Its FFN saves its bf16 input (2 w), W_1 x for the GELU (2 d_ff) and GELU(W_1 x) for
        W_2 (2 d_ff) bytes a token, eager and compiled."""
        d = config.d_model
        layers = [(layer_memory(b, d), b.feed_forward) for b in config.resolved_block_configs]
        saved = lambda ffn: Saved(2 * d + 4 * ffn.hidden_size, 2 * d + 4 * ffn.hidden_size)  # noqa: E731
        casts = Saved(4 * d, 2 * d)  # fp32 stream: Q, K, V cast their own bf16 copies, W_1 one
        return [replace(layer, ffn=saved(ffn), fp32_stream=casts) for layer, ffn in layers]


register(Ungated())
