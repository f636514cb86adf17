"""OLMo-core block configs that assemble attention with an FFN.

- ``baseline``: OLMo-core's own ``TransformerBlockConfig`` with a SwiGLU FFN of hidden 4 d_model
  (block type ``default`` for pre-norm, ``reordered_norm`` for OLMo-2's post-norm).
- ``hourglass``: :class:`HourglassBlockConfig`, attention plus :class:`HourglassFeedForward`,
  which owns the FFN's K norms and K residuals (the block adds no FFN norm or residual of its own).
"""

from dataclasses import dataclass
from typing import Optional, Union

import torch
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.attention.base import SequenceMixerConfig
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.layer_norm import LayerNormConfig
from olmo_core.nn.transformer.block import TransformerBlock, TransformerBlockBase
from olmo_core.nn.transformer.config import TransformerBlockConfig
from olmo_core.nn.transformer.config import TransformerDataParallelWrappingStrategy as Wrapping
from torch.distributed import DeviceMesh

from .hourglass import HourglassFeedForwardConfig, NormPlacement

__all__ = ["HourglassBlock", "HourglassBlockConfig"]


class HourglassBlock(TransformerBlockBase):
    """u = z + a Attn(norm(z)) (or z + a norm(Attn(z)) with post norms); z' = HourglassFFN(u), each
    of its K sub-MLP branches also x a (a = 1, or muP's m_residual)."""

    def __init__(
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        sequence_mixer: SequenceMixerConfig,
        feed_forward: HourglassFeedForwardConfig,
        layer_norm: LayerNormConfig,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
        residual_alpha: float = 1.0,
    ):
        super().__init__(n_layers=n_layers)
        self.d_model = d_model
        self.block_idx = block_idx
        # `attention` and `feed_forward` are the names OLMo-core's init, FSDP and checkpoints use.
        self.attention = sequence_mixer.build(
            d_model, layer_idx=block_idx, n_layers=n_layers, init_device=init_device, cache=cache
        )
        self.attention_norm = layer_norm.build(d_model, init_device=init_device)
        self.feed_forward = feed_forward.build(d_model, init_device=init_device)
        self.feed_forward.residual_alpha = residual_alpha
        self.residual_alpha = residual_alpha
        self.norm_placement = self.feed_forward.norm_placement

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss_div_factor: Optional[Union[torch.Tensor, float]] = None,
        **kwargs,
    ) -> torch.Tensor:
        del loss_div_factor
        if self.norm_placement == NormPlacement.pre:
            a = self.attention(self.attention_norm(x), **kwargs)
        else:
            a = self.attention_norm(self.attention(x, **kwargs))
        return self.feed_forward(x + (a if self.residual_alpha == 1.0 else self.residual_alpha * a))

    def apply_tp(self, tp_mesh, *, input_layout, float8_enabled: bool = False):
        del tp_mesh, input_layout, float8_enabled
        raise OLMoConfigurationError(
            "tensor parallelism is not supported for hourglass blocks (the K sub-MLP residuals "
            "would need K all-reduces per layer); use FSDP/HSDP data parallelism"
        )

    def apply_fsdp(
        self,
        dp_mesh: Optional[DeviceMesh] = None,
        prefetch_factor: int = 0,
        wrapping_strategy: Wrapping = Wrapping.full,
        **fsdp_kwargs,
    ):
        # OLMo-core's per-block wrapping (the whole FFN, all K sub-MLPs, is one FSDP unit); the
        # stacked weights are (K out, in) matrices, sharded on their rows as every matrix
        # (nn/hourglass.py).
        TransformerBlock.apply_fsdp(
            self, dp_mesh, prefetch_factor, wrapping_strategy, **fsdp_kwargs
        )

    # Context parallelism as OLMo-core's own block: it only touches `attention`.
    apply_cp = TransformerBlock.apply_cp

    def num_flops_per_token(self, seq_len: int) -> int:
        return self.attention.num_flops_per_token(seq_len) + self.feed_forward.num_flops_per_token(
            seq_len
        )


@dataclass
class HourglassBlockConfig(TransformerBlockConfig):
    """Block config for :class:`HourglassBlock`; ``feed_forward`` must be an hourglass FFN
    config."""

    def _check(self) -> HourglassFeedForwardConfig:
        if not isinstance(self.feed_forward, HourglassFeedForwardConfig):
            raise OLMoConfigurationError("an hourglass block needs an HourglassFeedForwardConfig")
        if self.layer_norm is None:
            raise OLMoConfigurationError("an hourglass block needs a layer_norm config")
        return self.feed_forward

    def build(  # type: ignore[override]
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> HourglassBlock:
        ffn = self._check()
        assert self.layer_norm is not None  # _check() raised otherwise
        return HourglassBlock(
            d_model=d_model,
            block_idx=block_idx,
            n_layers=n_layers,
            sequence_mixer=self.sequence_mixer,
            feed_forward=ffn,
            layer_norm=self.layer_norm,
            init_device=init_device,
            cache=cache,
        )

    def num_params(self, d_model: int) -> int:
        ffn = self._check()
        assert self.layer_norm is not None
        attention = self.sequence_mixer.num_params(d_model) + self.layer_norm.num_params(d_model)
        return attention + ffn.num_params(d_model)
