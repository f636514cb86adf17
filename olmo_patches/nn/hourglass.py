"""Paper 1: the hourglass FFN (arXiv:2602.06471).

Each layer's narrow-wide-narrow SwiGLU is replaced by K stacked wide-narrow-wide sub-MLPs,
each with its own norm and its own residual:

    h_0   = u                                  (the attention sublayer's output)
    h_i+1 = h_i + MLP_i(norm_i(h_i))           norm_placement="pre"  (the paper's equations)
    h_i+1 = h_i + norm_i(MLP_i(h_i))           norm_placement="post" (OLMo-2's reordered norm)

(under paper 2's muP, each sub-MLP's branch is scaled by m_residual, as every residual branch is).
    MLP_i(x) = W_u_i (SiLU(W_d1_i x) * (W_d2_i x))

W_d1_i, W_d2_i: d_h x d_model; W_u_i: d_model x d_h; no biases. The module owns its K norms and
K residual adds, so the block around it has no FFN norm or FFN residual of its own.

The weights of all K sub-MLPs are stored stacked, as ``w1`` (W_d1), ``w3`` (W_d2) and ``w2``
(W_u), with the names and fan-in that OLMo-core's ``InitMethod.init_feed_forward`` expects. With
K=1 the stacked tensors have the conventional FFN's element order, so the same seed gives the
conventional FFN's initial weights. Each stacked weight is one (K out, in) matrix, the K (out, in)
matrices one under the other (:attr:`StackedLinear.stacked` views it as (K, out, in)), so FSDP2
shards its K out rows as it shards any matrix (dim 0, the last rank padded): every rank holds an
even share whatever K, out and the world size are (docs/performance.md: the placements and their
all-gather cost).
"""

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.layer_norm import LayerNormConfig
from olmo_core.nn.transformer.init import init_linear

from ..shapes.choices import NormPlacement
from ..shapes.counts import hourglass_ffn_params

__all__ = ["StackedLinear", "HourglassFeedForward", "HourglassFeedForwardConfig"]


class StackedLinear(nn.Module):
    """K bias-free linear maps of the same shape, stored as one (K out_features, in_features)
    weight: map i is rows [i out_features, (i + 1) out_features); :attr:`stacked` is the (K, out,
    in) view.

    Duck-types ``nn.Linear`` for OLMo-core's initializers (``weight``, ``bias``, ``in_features``).
    After :meth:`to_float8` (nn/float8.py) each sub-MLP's matmul :meth:`linear` runs in float8.
    """

    bias = None
    float8 = None  # (torchao Float8LinearConfig, LinearMMConfig) once converted

    def __init__(
        self, K: int, in_features: int, out_features: int, *, dtype: torch.dtype, device: str
    ):
        super().__init__()
        self.K = K
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(
            torch.empty(K * out_features, in_features, dtype=dtype, device=device)
        )

    @property
    def stacked(self) -> torch.Tensor:
        """The weight as (K, out_features, in_features): a view (row-major, map i at index i)."""
        return self.weight.view(self.K, self.out_features, self.in_features)

    @property
    def matmul_shape(self) -> Tuple[int, int]:
        """Each map's (out, in), the matmul float8 casts on its own (nn/float8.py)."""
        return self.out_features, self.in_features

    def reset_parameters(self) -> None:
        init_linear(self, std=0.02)  # type: ignore[arg-type]

    def to_float8(self, config) -> None:
        """Run :meth:`linear` through torchao's float8 matmul with ``config`` (a
        Float8LinearConfig)."""
        from torchao.float8.float8_linear import Float8Linear

        # Float8Linear builds its GEMM configs (emulation, fast accumulation, padding) from the
        # config.
        self.float8 = (
            config,
            Float8Linear(1, 1, bias=False, device="meta", config=config).linear_mm_config,
        )

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x w^T for one sub-MLP's weight ``w`` (a slice of :attr:`weight`), in float8 once
        converted."""
        if self.float8 is None:
            return F.linear(x, w)
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        if torch.is_autocast_enabled():  # as Float8Linear.forward does
            x = x.to(torch.get_autocast_gpu_dtype())
        config, mm_config = self.float8
        return matmul_with_hp_or_float8_args.apply(x, w.t(), mm_config, config)

    def extra_repr(self) -> str:
        K = self.K
        f8 = ", float8" if self.float8 is not None else ""
        return (
            f"K={K}, in_features={self.in_features}, out_features={self.out_features},"
            f" bias=False{f8}"
        )


class HourglassFeedForward(nn.Module):
    """K residual wide-narrow-wide SwiGLU sub-MLPs: maps h_0 (*, d_model) to h_K (*, d_model)."""

    def __init__(
        self,
        *,
        d_model: int,
        d_h: int,
        K: int,
        layer_norm: LayerNormConfig,
        norm_placement: NormPlacement = NormPlacement.pre,
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
    ):
        super().__init__()
        self.d_model, self.d_h, self.K = d_model, d_h, K
        self.norm_placement = NormPlacement(norm_placement)
        self.w1 = StackedLinear(K, d_model, d_h, dtype=dtype, device=init_device)  # W_d1 (gate)
        self.w3 = StackedLinear(K, d_model, d_h, dtype=dtype, device=init_device)  # W_d2 (value)
        self.w2 = StackedLinear(K, d_h, d_model, dtype=dtype, device=init_device)  # W_u
        self.norms = nn.ModuleList(
            layer_norm.build(d_model, init_device=init_device) for _ in range(K)
        )
        self.residual_alpha = (
            1.0  # a: each sub-MLP's residual branch x a (muP's m_residual; set by the block)
        )

    @staticmethod
    def sub_mlp(x: torch.Tensor, w_down: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
        """MLP_i(x) = W_u_i (SiLU(W_d1_i x) * W_d2_i x), both down projections in one matmul."""
        gate, value = F.linear(x, w_down).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * value, w_up)

    def record_hidden(self, record: Callable[[torch.Tensor], None]) -> Callable[[], None]:
        """Hand each sub-MLP's hidden units, SiLU(W_d1_i x) * W_d2_i x, to ``record`` as forward
        runs (report/analysis.py's dead units); returns the undo."""

        def sub_mlp(x: torch.Tensor, w_down: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
            gate, value = F.linear(x, w_down).chunk(2, dim=-1)
            record(F.silu(gate) * value)
            return HourglassFeedForward.sub_mlp(x, w_down, w_up)

        self.sub_mlp = sub_mlp  # type: ignore[method-assign]  # the instance attribute shadows the static method
        return lambda: self.__dict__.pop("sub_mlp", None)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.w1.float8 is not None or self.w3.float8 is not None or self.w2.float8 is not None:
            return self._forward_float8(h)
        # One concatenation of [W_d1; W_d2] for all K per forward (a copy of 2 K d_h d_model weights
        # that autograd keeps until backward: saved_weight_copy), split with unbind: its backward is
        # one stack, where indexing weight[i] K times would build K zero-filled (K, out, in)
        # gradients. Storing the fused matrix instead measured no faster (docs/performance.md) and
        # would break OLMo-core's w1/w3 init.
        # K x (2 d_h, d_model)
        w_down = torch.cat((self.w1.stacked, self.w3.stacked), dim=1).unbind(0)
        w_up = self.w2.stacked.unbind(0)  # K x (d_model, d_h)
        for i, norm in enumerate(self.norms):
            if self.norm_placement == NormPlacement.pre:
                f = self.sub_mlp(norm(h), w_down[i], w_up[i])
            else:
                f = norm(self.sub_mlp(h, w_down[i], w_up[i]))
            h = self._residual(h, f)
        return h

    def _forward_float8(self, h: torch.Tensor) -> torch.Tensor:
        # Three matmuls per sub-MLP, each weight cast to float8 with its own scales (no [W_d1; W_d2]
        # concatenation); unbind gives views, its backward one stack per weight.
        w1, w3, w2 = self.w1.stacked.unbind(0), self.w3.stacked.unbind(0), self.w2.stacked.unbind(0)
        for i, norm in enumerate(self.norms):
            x = norm(h) if self.norm_placement == NormPlacement.pre else h
            f = self.w2.linear(F.silu(self.w1.linear(x, w1[i])) * self.w3.linear(x, w3[i]), w2[i])
            h = self._residual(h, f if self.norm_placement == NormPlacement.pre else norm(f))
        return h

    def _residual(self, h: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return h + (f if self.residual_alpha == 1.0 else self.residual_alpha * f)

    def num_flops_per_token(self, seq_len: int) -> int:
        del seq_len
        # 6 FLOPs per matmul weight (2 forward + 4 backward); norms and adds are not counted,
        # as OLMo-core does not count them for its own blocks.
        return 6 * hourglass_ffn_params(self.d_model, self.K, self.d_h)


@dataclass
class HourglassFeedForwardConfig(FeedForwardConfig):
    """Config of :class:`HourglassFeedForward`. ``hidden_size`` is the bottleneck width d_h."""

    K: int = 1
    layer_norm: Optional[LayerNormConfig] = None
    norm_placement: NormPlacement = NormPlacement.pre

    def validate_shape(self) -> None:
        if self.K < 1:
            raise OLMoConfigurationError(f"hourglass K must be >= 1, got K={self.K}")
        if self.hidden_size < 1:
            raise OLMoConfigurationError(f"hourglass d_h must be >= 1, got d_h={self.hidden_size}")
        if self.bias:
            raise OLMoConfigurationError("the hourglass FFN has no biases (bias must be false)")
        if self.layer_norm is None:
            raise OLMoConfigurationError(
                "the hourglass FFN needs a layer_norm config for its K norms"
            )

    def num_params(self, d_model: int) -> int:
        self.validate_shape()
        assert self.layer_norm is not None
        return hourglass_ffn_params(
            d_model, self.K, self.hidden_size
        ) + self.K * self.layer_norm.num_params(d_model)

    def saved_weight_copy(self, d_model: int) -> int:
        """Bytes of the bf16 [W_d1; W_d2] copy forward() concatenates and autograd keeps until
        backward (2 K d_h d_model weights; launch/memory.py counts it per block)."""
        return 2 * 2 * self.K * self.hidden_size * d_model

    def build(  # type: ignore[override]
        self, d_model: int, *, dtype: Optional[torch.dtype] = None, init_device: str = "cpu"
    ) -> HourglassFeedForward:
        self.validate_shape()
        assert self.layer_norm is not None
        if self.dtype is not None:
            dtype = self.dtype.as_pt()
        return HourglassFeedForward(
            d_model=d_model,
            d_h=self.hidden_size,
            K=self.K,
            layer_norm=self.layer_norm,
            norm_placement=NormPlacement(self.norm_placement),
            dtype=dtype or torch.float32,
            init_device=init_device,
        )
