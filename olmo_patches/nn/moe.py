"""A mixture of experts at one layer's width (paper 2's 3B MoE), from OLMo-core's own MoE.

Each layer l of a variable-width model gets OLMo-core's dropless MoE at width w_l: its linear router
(bias-free, w_l -> E, reading the layer's normalised input ln_2(h')), softmax over the E logits, top-k,
the k weights renormalised to sum 1 (= lm-engine's softmax over the k selected logits,
``normalized_topk``), dropless SwiGLU experts of hidden I_l = round(w_l expert_hidden / h), no shared
expert, and OLMo-core's load-balancing loss and router z-loss. The block is OLMo-core's
:class:`MoETransformerBlock` with the residual multiplier on both branches (lm-engine's ``m_residual``).

The authors' aux loss (lm-engine ``mlp_blocks/moe.py:284-292, 393-416``; ``model_wrapper/pretraining.py``),
per layer, summed over layers, times ``router_aux_loss_coef`` 0.01:

    aux_l = E sum_e P_e f_e + 0.1 mean_t logsumexp(logits_t)^2

(P_e the mean full-softmax probability, f_e the fraction of the k T assignments). OLMo-core's
``local_batch`` load-balancing loss is (E / k) sum_e count_e P_e / T = E sum_e f_e P_e, and its z-loss is
mean_t logsumexp^2: so ``lb_loss_weight`` 0.01 and ``z_loss_weight`` 0.001 with
``scale_loss_by_num_layers=False`` (summed, not averaged, over layers) give the authors' loss. Two
differences OLMo-core cannot express: the authors all-reduce the counts f over the data-parallel ranks
(OLMo-core's counts are the rank's micro-batch; equal on one rank), and OLMo-core divides by the
rank's batch tokens (``loss_div_factor``) where the authors divide by grad-accumulation steps: equal for
equal micro-batches. OLMo-core's router also computes its logits in float32 (lm-engine's ``gate`` runs in
the training dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import olmo_core.ops.moe as moe_ops
import torch
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.moe import DroplessMoE, MoEBase, MoEConfig, MoERouterConfig, MoEType
from olmo_core.nn.moe.mlp import DroplessMoEMLP
from olmo_core.nn.moe.parallel_mlp import ParallelDroplessMLP
from olmo_core.nn.transformer.block import MoETransformerBlock

__all__ = ["LayerMoEConfig", "ScaledMoETransformerBlock", "PortableDroplessMLP", "PortableDroplessMoE"]


@dataclass
class LayerMoEConfig(MoEConfig):
    """OLMo-core's ``MoEConfig`` for one layer (``hidden_size`` = I_l) with SwiGLU experts (a subclass
    per other kind of expert: hourglass_moe.HourglassMoEConfig)."""

    @classmethod
    def authors(
        cls, *, num_experts: int, top_k: int, hidden_size: int, lb_loss_weight: float, z_loss_weight: float
    ) -> "LayerMoEConfig":
        """The authors' routing: top-k weights renormalised, losses summed over layers, dropless."""
        return cls(
            name=MoEType.dropless,
            num_experts=num_experts,
            hidden_size=hidden_size,
            router=MoERouterConfig(top_k=top_k, normalize_expert_weights=1.0),  # k = 1: weight 1, as lm-engine's
            lb_loss_weight=lb_loss_weight or None,
            z_loss_weight=z_loss_weight or None,
            scale_loss_by_num_layers=False,
        )

    def build(  # type: ignore[override]
        self, d_model: int, *, n_layers: int = 1, init_device: str = "cpu", cache: Optional[BufferCache] = None
    ) -> MoEBase:
        """THE place a layer's MoE is built: width ``d_model`` = w_l, expert hidden ``hidden_size`` = I_l
        (OLMo-core's ``MoEConfig.build``; a subclass builds its own kind of experts)."""
        return PortableDroplessMoE(**self._module_kwargs(d_model, n_layers, init_device, cache))

    def _module_kwargs(
        self, d_model: int, n_layers: int, init_device: str, cache: Optional[BufferCache], drop: tuple = ("name",)
    ) -> dict:
        """OLMo-core's MoE constructor arguments for a layer of width ``d_model`` (this config's fields less ``drop``)."""
        kwargs = self.as_dict(exclude_none=True, recurse=False)
        for key in drop:
            kwargs.pop(key, None)
        kwargs.update(d_model=d_model, n_layers=n_layers, init_device=init_device, dtype=kwargs.pop("dtype").as_pt(), cache=cache)
        return kwargs


class PortableDroplessMLP(ParallelDroplessMLP):
    """OLMo-core's dropless expert dispatch; without its Triton kernels (a CPU, or no ``triton``) the
    permutation is plain PyTorch indexing: each of the k T (token, expert) pairs in expert order, then
    the weighted outputs summed back per token (megablocks' ``gather`` / ``scatter``)."""

    def permute_and_compute(  # type: ignore[override]
        self,
        x: torch.Tensor,
        *,
        batch_size_per_expert: torch.Tensor,
        indices: torch.Tensor,
        bin_ids: torch.Tensor,
        expert_weights: Optional[torch.Tensor],
        bins: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        if x.is_cuda and moe_ops.kernels is not None:
            return super().permute_and_compute(
                x,
                batch_size_per_expert=batch_size_per_expert,
                indices=indices,
                bin_ids=bin_ids,
                expert_weights=expert_weights,
                bins=bins,
                top_k=top_k,
            )
        x = x.view(-1, x.shape[-1])
        token = indices.long() // top_k  # indices: positions in the flattened (T, k) assignments, by expert
        y = self.mlp(x[token], batch_size_per_expert)
        if expert_weights is not None:
            y = y * expert_weights[indices.long()].unsqueeze(-1).to(y.dtype)
        return y.new_zeros(x.shape[0], y.shape[-1]).index_add_(0, token, y)


class PortableDroplessMoE(DroplessMoE):
    """OLMo-core's ``DroplessMoE`` whose dispatch also runs without Triton (:class:`PortableDroplessMLP`)."""

    def _init_parallel_mlp(  # type: ignore[override]
        self,
        *,
        d_model: int,
        num_experts: int,
        hidden_size: int,
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> ParallelDroplessMLP:
        mlp = DroplessMoEMLP(
            d_model=d_model, num_experts=num_experts, hidden_size=hidden_size, dtype=dtype, init_device=init_device
        )
        return PortableDroplessMLP(mlp=mlp, top_k=self.router.top_k, cache=cache)


class ScaledMoETransformerBlock(MoETransformerBlock):
    """OLMo-core's pre-norm MoE block with the residual multiplier on both branches (lm-engine layer.py:45-72):
    h = x + alpha Attn(ln_1 x); out = h + alpha MoE(ln_2 h)."""

    def __init__(self, *, residual_alpha: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.residual_alpha = residual_alpha

    def forward(self, x: torch.Tensor, *, loss_div_factor: Optional[Union[torch.Tensor, float]] = None, **kwargs) -> torch.Tensor:
        a = self.residual_alpha
        h = x + a * self.dropout(self.attention(self.attention_norm(x), **kwargs))
        return h + a * self.dropout(self.feed_forward_moe(self.feed_forward_norm(h), loss_div_factor=loss_div_factor))
