"""Hourglass experts: an MoE whose routed experts are stacks of K hourglass sub-MLPs (new here).

Paper 1 (arXiv:2602.06471) replaces a layer's FFN by K residual wide-narrow-wide SwiGLU sub-MLPs
and names MoE as future work; paper 2's MoE (and OLMo-core's) uses narrow-wide-narrow SwiGLU
experts. Here each of the E routed experts is its own hourglass stack at the layer's width d_model
(= w_l in a variable-width model), with its own K norms and K residuals, inside OLMo-core's dropless
MoE (its router, load-balancing and z losses, token dispatch, expert/FSDP sharding):

    u      = x + a Attn(norm(x))                (the block's attention sublayer)
    g, S   = top-k of softmax(W_r norm_r(u))    (OLMo-core's router; norm_r: the block's FFN norm)
    z_e,0  = u
    z_e,k  = z_e,k-1 + a W2_e,k (SiLU(W1_e,k norm_e,k(z_e,k-1)) * W3_e,k norm_e,k(z_e,k-1))
                                                (k = 1..K)
    E_e(u) = z_e,K - u                          (the sum of the expert's K sub-MLP outputs)
    z'     = u + sum_{e in S} g_e E_e(u)

W1_e,k, W3_e,k: d_h x d_model (the two down projections W_d1, W_d2), W2_e,k: d_model x d_h (the up
projection W_u), no biases; norm_e,k: the model's norm with its own gain; a: the block's residual
multiplier (1, or muP's m_residual on every residual branch, here each sub-MLP's). The experts read
the un-normalised stream u, as paper 1's stack does (its block has no pre-FFN norm); the block keeps
its FFN norm as the router's input norm, so the module names, the init and OLMo-core's parameter
count of the block are OLMo-core's MoE block's. With K=1 and every norm_e,1 equal to norm_r this is
exactly OLMo-core's MoE block with SwiGLU experts of hidden d_h.

Parameters of the MoE: router d_model E + E K (3 d_model d_h + d_model); active per token: the
router + top_k K (3 d_model d_h + d_model). Training FLOPs per token: 6 (d_model E + top_k K 3
d_model d_h) (norms not counted, as OLMo-core counts its blocks).

Weights are stored sub-MLP-major: ``w1``, ``w3`` and ``w2`` (used untransposed) are (K E d_h,
d_model) matrices, so sub-MLP k's E expert matrices (rows [k E d_h, (k + 1) E d_h), viewed (E, d_h,
d_model)) are one contiguous block, as grouped_gemm needs. OLMo-core's MoE init
(``w1``/``w2``/``w3``, fan-in d_model and d_h) applies unchanged; K=1 has OLMo-core's element order,
so the same seed gives OLMo-core's initial expert weights. FSDP2 shards them as any matrix (dim 0,
the last rank padded), so every rank holds an even share at any world size (nn/shards.py).
Expert parallelism shards the rows by expert, which is one block
of rows only for K=1. The E K gains are one flat ``norm_weight`` (E K d_model), expert-major,
sharded with the experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.distributed.utils import get_local_tensor
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.layer_norm import LayerNormConfig
from olmo_core.nn.moe import MoEType
from olmo_core.nn.moe.mlp import DroplessMoEMLP, MoEMLPBase, gmm
from olmo_core.nn.moe.moe import DroplessMoE
from olmo_core.nn.moe.parallel_mlp import ParallelDroplessMLP
from olmo_core.nn.transformer.config import TransformerBlockConfig, TransformerBlockType
from olmo_core.ops import attach_auxiliary_loss
from torch.distributed import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from ..shapes.counts import hourglass_ffn_params
from .hourglass import fold_gain, inv_rms
from .moe import LayerMoEConfig, PortableDroplessMLP, ScaledMoETransformerBlock

__all__ = [
    "hourglass_moe_counts",
    "HourglassExperts",
    "HourglassMoE",
    "HourglassMoEConfig",
    "HourglassMoEBlock",
    "HourglassMoEBlockConfig",
]


def hourglass_moe_counts(d_model: int, *, num_experts: int, top_k: int, K: int, d_h: int) -> dict:
    """Closed form of one hourglass-expert MoE (router + experts with their norm gains; not the
    block's norms).

    Returns {'total', 'active', 'flops_per_token'}; training FLOPs at 6 per weight, norms not
    counted.
    """
    weights = hourglass_ffn_params(d_model, K, d_h)  # one expert's matrices, 3 K d_model d_h
    expert = weights + K * d_model  # and its K norm gains
    router = d_model * num_experts
    return {
        "total": router + num_experts * expert,
        "active": router + top_k * expert,
        "flops_per_token": 6 * (router + top_k * weights),
    }


class HourglassExperts(MoEMLPBase):
    """E experts, each K residual hourglass sub-MLPs: maps u (rows grouped by expert) to
    E_e(u) = z_K - u."""

    # OLMo-core's grouped GEMM, or its per-expert loop without grouped_gemm
    gmm = DroplessMoEMLP.gmm

    def __init__(
        self,
        *,
        d_model: int,
        hidden_size: int,
        num_experts: int,
        K: int,
        layer_norm: LayerNormConfig,
        residual_alpha: float = 1.0,
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__(d_model=d_model, hidden_size=hidden_size, num_experts=num_experts)
        self.K = K
        self.residual_alpha = (
            residual_alpha  # a: each sub-MLP's residual branch x a (set by the block)
        )
        shape = (K * num_experts * hidden_size, d_model)  # K blocks of E d_h rows
        self.w1 = nn.Parameter(torch.empty(shape, device=init_device, dtype=dtype))  # W_d1 (gate)
        # W_u (transposed)
        self.w2 = nn.Parameter(torch.empty(shape, device=init_device, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(shape, device=init_device, dtype=dtype))  # W_d2 (value)
        self.norm_weight = nn.Parameter(
            torch.empty(num_experts * K * d_model, device=init_device, dtype=dtype)
        )
        self.eps = layer_norm.eps if layer_norm.eps is not None else 1e-5  # OLMo-core's default
        self._gmm = gmm
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # OLMo-core's expert default; the model's init replaces it
        for w in (self.w1, self.w2, self.w3):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        nn.init.ones_(self.norm_weight)

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, K={self.K}, d_model={self.d_model},"
            f" d_h={self.hidden_size}"
        )

    def _shard_experts(self, mesh: DeviceMesh):
        if self.num_experts % mesh.size() != 0:
            raise OLMoConfigurationError(
                f"'num_experts' ({self.num_experts}) must be divisible by the expert parallel"
                f" shard degree ({mesh.size()})."
            )
        if self.K != 1:
            raise OLMoConfigurationError(
                "expert parallelism needs hourglass experts with K=1 (an expert's rows),"
                f" not K={self.K}"
            )
        self.ep_mesh, self.ep_pg = mesh, mesh.get_group()
        self.num_local_experts = self.num_experts // mesh.size()
        for name in ("w1", "w2", "w3", "norm_weight"):  # along the experts
            self.register_parameter(
                name, nn.Parameter(distribute_tensor(getattr(self, name), mesh, [Shard(0)]))
            )

    def forward(self, x: torch.Tensor, batch_size_per_expert: torch.Tensor) -> torch.Tensor:
        """:param x: (N, d_model), rows grouped by expert; ``batch_size_per_expert``: rows of each
        local expert."""
        K, d_h, d = self.K, self.hidden_size, self.d_model
        w1, w2, w3 = (get_local_tensor(w).view(K, -1, d_h, d) for w in (self.w1, self.w2, self.w3))
        gains = get_local_tensor(self.norm_weight).view(-1, K, d)
        z, out = x, None
        for k in range(K):
            # W_e,k norm_e,k(z) = ((W_e,k diag g_e,k) z) / rms(z), each gain folded into its
            # expert's weights (nn/hourglass.py): no normalised or gain-gathered rows are written
            g, r = gains[:, k, None, :], inv_rms(z, self.eps)
            a = self.gmm(z, fold_gain(w1[k], g), batch_size_per_expert, trans_b=True)
            b = self.gmm(z, fold_gain(w3[k], g), batch_size_per_expert, trans_b=True)
            hidden = (F.silu(a * r) * (b * r)).type_as(a)
            f = self.gmm(hidden, w2[k], batch_size_per_expert)
            if self.residual_alpha != 1.0:
                f = f * self.residual_alpha
            z = z + f
            out = f if out is None else out + f  # z_K - u, summed without the cancellation
        assert out is not None
        return out


class HourglassMoE(DroplessMoE):
    """OLMo-core's dropless MoE with :class:`HourglassExperts`; the router may read a normalised
    copy of u."""

    def _init_parallel_mlp(  # type: ignore[override]
        self,
        *,
        d_model: int,
        num_experts: int,
        hidden_size: int,
        K: int,
        layer_norm: LayerNormConfig,
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> ParallelDroplessMLP:
        experts = HourglassExperts(
            d_model=d_model,
            hidden_size=hidden_size,
            num_experts=num_experts,
            K=K,
            layer_norm=layer_norm,
            dtype=dtype,
            init_device=init_device,
        )
        return PortableDroplessMLP(mlp=experts, top_k=self.router.top_k, cache=cache)  # type: ignore[arg-type]

    def forward(
        self,
        x: torch.Tensor,
        *,
        router_input: Optional[torch.Tensor] = None,
        loss_div_factor: Optional[Union[torch.Tensor, float]] = None,
    ) -> torch.Tensor:
        """sum_{e in S} g_e E_e(x); the router reads ``router_input`` (norm_r(x) in a block), else
        x."""
        expert_weights, expert_indices, batch_size_per_expert, router_aux_loss = self.router(
            x if router_input is None else router_input, loss_div_factor=loss_div_factor
        )
        routed_x = x if router_aux_loss is None else attach_auxiliary_loss(x, router_aux_loss)
        return self.experts(routed_x, expert_weights, expert_indices, batch_size_per_expert)

    def num_flops_per_token(self, seq_len: int) -> int:
        del seq_len
        mlp = self.experts.mlp
        counts = hourglass_moe_counts(
            mlp.d_model,
            num_experts=self.num_experts,
            top_k=self.top_k,
            K=mlp.K,
            d_h=mlp.hidden_size,  # type: ignore[arg-type]
        )
        return counts["flops_per_token"]


@dataclass
class HourglassMoEConfig(LayerMoEConfig):
    """A layer's MoE (:class:`LayerMoEConfig`) with hourglass experts; ``hidden_size`` is d_h."""

    K: int = 1  # hourglass sub-MLPs per expert
    layer_norm: Optional[LayerNormConfig] = None  # the model's norm; each sub-MLP has its own gain

    def validate_shape(self) -> None:
        if self.name != MoEType.dropless:
            raise OLMoConfigurationError("hourglass experts need the dropless MoE (name: dropless)")
        if self.K < 1:
            raise OLMoConfigurationError(f"hourglass experts need K >= 1, got K={self.K}")
        if self.hidden_size < 1:
            raise OLMoConfigurationError(
                f"hourglass experts need d_h >= 1, got d_h={self.hidden_size}"
            )
        if self.layer_norm is None:
            raise OLMoConfigurationError(
                "hourglass experts need a layer_norm config for their K norms"
            )
        if (
            self.layer_norm.bias
            or self.layer_norm.elementwise_affine is False
            or ("rms" not in str(self.layer_norm.name))
        ):
            raise OLMoConfigurationError(
                "hourglass experts' norms are RMSNorms with a gain and no bias"
                " (layer_norm: name rms, bias false, elementwise_affine true)"
            )
        if self.shared_mlp is not None or self.latent_moe is not None:
            raise OLMoConfigurationError(
                "hourglass experts support neither a shared MLP nor a latent MoE"
            )

    def _counts(self, d_model: int) -> dict:
        self.validate_shape()
        return hourglass_moe_counts(
            d_model,
            num_experts=self.num_experts,
            top_k=self.router.top_k,
            K=self.K,
            d_h=self.hidden_size,
        )

    def num_params(self, d_model: int) -> int:
        return self._counts(d_model)["total"]

    def num_active_params(self, d_model: int) -> int:
        return self._counts(d_model)["active"]

    def build(  # type: ignore[override]
        self,
        d_model: int,
        *,
        n_layers: int = 1,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> HourglassMoE:
        self.validate_shape()
        return HourglassMoE(
            **self._module_kwargs(
                d_model, n_layers, init_device, cache, drop=("name", "capacity_factor")
            )
        )


class HourglassMoEBlock(ScaledMoETransformerBlock):
    """u = x + a Attn(norm(x)); z' = u + HourglassMoE(u), its router reading feed_forward_norm(u).
    The residual multiplier a scales each sub-MLP residual inside the experts (every residual
    branch x a)."""

    def __init__(self, *, residual_alpha: float = 1.0, **kwargs):
        super().__init__(residual_alpha=residual_alpha, **kwargs)
        self.feed_forward_moe.experts.mlp.residual_alpha = residual_alpha

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss_div_factor: Optional[Union[torch.Tensor, float]] = None,
        **kwargs,
    ) -> torch.Tensor:
        u = x + self.residual_alpha * self.dropout(self.attention(self.attention_norm(x), **kwargs))
        moe = self.feed_forward_moe(
            u, router_input=self.feed_forward_norm(u), loss_div_factor=loss_div_factor
        )
        return u + self.dropout(moe)


@dataclass
class HourglassMoEBlockConfig(TransformerBlockConfig):
    """OLMo-core's MoE block config (``name: moe``) built as :class:`HourglassMoEBlock` (a
    constant-width model)."""

    def build(  # type: ignore[override]
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> HourglassMoEBlock:
        if self.name != TransformerBlockType.moe or not isinstance(
            self.feed_forward_moe, HourglassMoEConfig
        ):
            raise OLMoConfigurationError(
                "an hourglass-expert block needs name: moe and an HourglassMoEConfig"
            )
        assert self.layer_norm is not None
        return HourglassMoEBlock(
            d_model=d_model,
            block_idx=block_idx,
            n_layers=n_layers,
            sequence_mixer=self.sequence_mixer,
            feed_forward_moe=self.feed_forward_moe,
            layer_norm=self.layer_norm,
            dropout=self.dropout or 0.0,
            residual_alpha=self.attention_residual_alpha or 1.0,
            init_device=init_device,
            cache=cache,
        )
