"""A block kind that is not the papers', from this one file: the parallel block (GPT-J; PaLM,
Chowdhery et al. 2022, §2 "Parallel Layers"): attention and the SwiGLU FFN read the same normed
input, one norm per layer,

    y = x + Attn(norm(x)) + FFN(norm(x)).

tests/test_new_block.py loads it through ``HOURGLASS_BLOCKS=tests._parallel_block`` and runs the
commands on it, the Hugging Face export too, with no other file changed (docs/adding_a_block.md
walks through it)."""

from dataclasses import dataclass, replace
from typing import Optional, Union

import torch
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.transformer.block import TransformerBlock, TransformerBlockBase
from olmo_core.nn.transformer.config import TransformerBlockConfig

from olmo_patches.blocks import BlockKind, register
from olmo_patches.blocks.base import w2_input
from olmo_patches.blocks.memory import Saved, layer_memory


class ParallelBlock(TransformerBlockBase):
    def __init__(
        self,
        *,
        d_model,
        block_idx,
        n_layers,
        sequence_mixer,
        feed_forward,
        layer_norm,
        init_device="cpu",
        cache=None,
    ):
        super().__init__(n_layers=n_layers)
        self.d_model, self.block_idx = d_model, block_idx
        # `attention`, `attention_norm` and `feed_forward`: the names OLMo-core's init, FSDP and
        # checkpoints use
        self.attention = sequence_mixer.build(
            d_model, layer_idx=block_idx, n_layers=n_layers, init_device=init_device, cache=cache
        )
        self.attention_norm = layer_norm.build(d_model, init_device=init_device)
        self.feed_forward = feed_forward.build(d_model=d_model, init_device=init_device)

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss_div_factor: Optional[Union[torch.Tensor, float]] = None,
        **kwargs,
    ) -> torch.Tensor:
        del loss_div_factor
        n = self.attention_norm(x)
        return x + self.attention(n, **kwargs) + self.feed_forward(n)

    apply_fsdp = TransformerBlock.apply_fsdp  # one FSDP unit per block, as OLMo-core's own
    apply_cp = TransformerBlock.apply_cp

    def apply_tp(self, tp_mesh, *, input_layout, float8_enabled: bool = False):
        raise NotImplementedError("tensor parallelism: not for this block")

    def num_flops_per_token(self, seq_len: int) -> int:
        return self.attention.num_flops_per_token(seq_len) + self.feed_forward.num_flops_per_token(
            seq_len
        )


@dataclass
class ParallelBlockConfig(TransformerBlockConfig):
    def build(
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ):
        assert self.feed_forward is not None and self.layer_norm is not None
        return ParallelBlock(
            d_model=d_model,
            block_idx=block_idx,
            n_layers=n_layers,
            sequence_mixer=self.sequence_mixer,
            feed_forward=self.feed_forward,
            layer_norm=self.layer_norm,
            init_device=init_device,
            cache=cache,
        )

    def num_params(self, d_model: int) -> int:
        assert self.feed_forward is not None and self.layer_norm is not None
        return (
            self.sequence_mixer.num_params(d_model)
            + self.layer_norm.num_params(d_model)
            + self.feed_forward.num_params(d_model)
        )


class Parallel(BlockKind):
    name = "parallel"

    def check(self, m, fail) -> None:
        if m.norm_placement != "pre":
            fail(
                "model.norm_placement",
                m.norm_placement,
                "the parallel block norms its input once (pre)",
            )

    def build(self, m, config):
        b = config.block
        config.block = ParallelBlockConfig(
            sequence_mixer=b.sequence_mixer, feed_forward=b.feed_forward, layer_norm=b.layer_norm
        )
        return config

    def record_hidden(self, m, block, record):
        return w2_input(block.feed_forward, record)  # OLMo-core's SwiGLU, as the baseline's

    def memory_layers(self, m, config):
        """OLMo-core's attention and SwiGLU, one norm, whose output both save once: the FFN keeps
        no input of its own."""
        d = config.d_model
        layers = [layer_memory(b, d) for b in config.resolved_block_configs]
        shared, casts = Saved(-2 * d, -2 * d), Saved(8 * d, 2 * d)  # fp32 stream: 5 matmul casts
        return [
            replace(layer, norms=1, ffn=layer.ffn + shared, fp32_stream=casts) for layer in layers
        ]

    def hf_config(self, m, built):
        """The Hugging Face export's layer: OLMo-core's SwiGLU, and one residual step of two
        branches through the one norm (modeling_hourglass_olmo.py's ``wiring``; the modules keep
        OLMo-core's names)."""
        parallel = [["attention_norm", "attention"], ["attention_norm", "feed_forward"]]
        return dict(ffn="swiglu", ffn_hidden=m.resolved_d_ff, wiring=[parallel])


register(Parallel())
