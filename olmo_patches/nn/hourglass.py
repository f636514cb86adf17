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
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.layer_norm import LayerNormConfig, RMSNorm
from olmo_core.nn.transformer.init import init_linear

from ..shapes.choices import NormPlacement
from ..shapes.counts import hourglass_ffn_params

__all__ = [
    "StackedLinear", "HourglassFeedForward", "HourglassFeedForwardConfig", "fold_gain", "foldable",
    "inv_rms",
]  # fmt: skip


class StackedLinear(nn.Module):
    """K bias-free linear maps of the same shape, stored as one (K out_features, in_features)
    weight: map i is rows [i out_features, (i + 1) out_features); :attr:`stacked` is the (K, out,
    in) view.

    Duck-types ``nn.Linear`` for OLMo-core's initializers (``weight``, ``bias``, ``in_features``).
    After :meth:`to_float8` (nn/float8.py) :meth:`matmul` runs in float8.
    """

    bias = None
    float8 = None  # (torchao Float8LinearConfig, LinearMMConfig) once converted

    def __init__(
        self, K: int, in_features: int, out_features: int, *, dtype: torch.dtype, device: str
    ):
        super().__init__()
        self.K, self.in_features, self.out_features = K, in_features, out_features
        self.weight = nn.Parameter(
            torch.empty(K * out_features, in_features, dtype=dtype, device=device)
        )

    @property
    def stacked(self) -> torch.Tensor:
        """The weight as (K, out_features, in_features): a view (row-major, map i at index i)."""
        return self.weight.view(self.K, self.out_features, self.in_features)

    @property
    def matmul_shape(self) -> Tuple[int, int]:
        """Each map's (out, in): the GEMM float8 converts or not (nn/float8.py)."""
        return self.out_features, self.in_features

    def reset_parameters(self) -> None:
        init_linear(self, std=0.02)  # type: ignore[arg-type]

    def to_float8(self, config) -> None:
        """Run :meth:`matmul` through torchao's float8 matmul with ``config`` (a
        Float8LinearConfig)."""
        from torchao.float8.float8_linear import Float8Linear

        # Float8Linear builds its GEMM configs (emulation, fast accumulation, padding) from config
        mm = Float8Linear(1, 1, bias=False, device="meta", config=config).linear_mm_config
        self.float8 = (config, mm)

    def maps(self) -> Sequence[torch.Tensor]:
        """This step's K (out, in) weights W_i: views, whose backward is one write of the gradient
        (no K zero-filled ones). In float8 with tensorwise weight scales the stack is cast once (one
        amax and one scale for its K maps) and each map is a slice of it; rowwise, each map's matmul
        casts its own weight (a rowwise stack cast is each map's for the forward GEMM, not for the
        backward's per-column scales)."""
        w = self.stacked
        if self.float8 is None or not _tensorwise_weights(self.float8[0]):
            return w.unbind(0)
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import GemmInputRole

        config, mm = self.float8
        w8 = hp_tensor_to_float8_dynamic(
            w.reshape(-1, self.in_features),
            config.cast_config_weight.target_dtype,
            mm,
            gemm_input_role=GemmInputRole.WEIGHT,
            round_scales_to_power_of_2=config.round_scales_to_power_of_2,
        )
        return w8.split(self.out_features)

    def matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x w^T for one of :meth:`maps`, through torchao's float8 matmul once converted."""
        if self.float8 is None:
            return F.linear(x, w)
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        if torch.is_autocast_enabled():  # as Float8Linear.forward does
            x = x.to(torch.get_autocast_gpu_dtype())
        return matmul_with_hp_or_float8_args.apply(x, w.t(), self.float8[1], self.float8[0])

    def extra_repr(self) -> str:
        f8 = ", float8" if self.float8 is not None else ""
        return (
            f"K={self.K}, in_features={self.in_features}, out_features={self.out_features},"
            f" bias=False{f8}"
        )


def _tensorwise_weights(config) -> bool:
    from torchao.float8.config import ScalingGranularity

    w, w_gi = config.cast_config_weight, config.cast_config_weight_for_grad_input
    return w == w_gi and w.scaling_granularity is ScalingGranularity.TENSORWISE


def foldable(norm: nn.Module) -> bool:
    """An RMSNorm without bias: g * h / rms(h), whose gain folds into the next matmul's weight."""
    return isinstance(norm, RMSNorm) and norm.bias is None


def fold_gain(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """W diag g, recomputed in backward rather than kept from forward (a weight-sized copy per layer
    otherwise, which inductor's partitioner would keep: W diag g feeds a matmul there)."""
    mul = lambda w, g: (w * g).type_as(w)  # noqa: E731
    return torch.utils.checkpoint.checkpoint(mul, w, g, use_reentrant=False)


def inv_rms(h: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms(h) over the last dim, in fp32 or wider (as OLMo-core's RMSNorm computes it)."""
    x = h.to(torch.promote_types(h.dtype, torch.float32))
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class HourglassFeedForward(nn.Module):
    """K residual wide-narrow-wide SwiGLU sub-MLPs: maps h_0 (*, d_model) to h_K (*, d_model).

    Compiled, pre-norm RMSNorms fold into the down projections: W_d n_i = ((W_d diag g_i) h_i) /
    rms(h_i), so the normalised n_i is never written nor kept for backward; 1 / rms(h_i) (one
    number per token) scales the two matmuls' outputs inside SiLU(.) * (.), which inductor fuses
    into one kernel. The cost is one weight-sized op per step and its recomputation in backward
    (:func:`fold_gain`: no weight copy is kept; docs/performance.md: its bytes). Eager (each op a
    kernel of its own: the fold's scalings cost more than the norm's write), post norms, other norms
    and float8 (whose input cast writes a float8 copy whatever is folded, and scales best from
    normalised rows) run the equations as written; ``fold_norms`` overrides the choice
    (None: fold where compiled)."""

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
        self.residual_alpha = 1.0  # a: each branch x a (muP's m_residual; set by the block)
        self.record: Optional[Callable[[torch.Tensor], None]] = None  # see record_hidden
        self.fold_norms: Optional[bool] = None

    def up(self, a, b, w2, r: Optional[torch.Tensor] = None) -> torch.Tensor:
        """W_u (SiLU(a r) * b r) (r = 1 unless the norm is folded), in a's dtype."""
        hidden = F.silu(a) * b if r is None else F.silu(a * r) * (b * r)
        if self.record is not None:
            self.record(hidden)
        return self.w2.matmul(hidden.type_as(a), w2)

    def record_hidden(self, record: Callable[[torch.Tensor], None]) -> Callable[[], None]:
        """Hand each sub-MLP's hidden units, SiLU(W_d1_i x) * W_d2_i x, to ``record`` as forward
        runs (report/analysis.py's dead units); returns the undo."""
        self.record = record

        def undo() -> None:
            self.record = None

        return undo

    def folds_norms(self) -> bool:
        fold = torch.compiler.is_compiling() if self.fold_norms is None else self.fold_norms
        return (
            fold
            and self.norm_placement == NormPlacement.pre
            and self.w1.float8 is None
            and all(foldable(n) for n in self.norms)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        fold, pre = self.folds_norms(), self.norm_placement == NormPlacement.pre
        w1, w3, w2 = self.w1.maps(), self.w3.maps(), self.w2.maps()
        for i, norm in enumerate(self.norms):
            if fold:  # W_d n_i = ((W_d diag g_i) h_i) / rms(h_i)
                # r before the matmuls: inductor's partitioner then recomputes h_i's fp32 cast in
                # backward (after a matmul it would keep it: 4 w bytes a token)
                g, r = norm.weight, inv_rms(h, norm.eps)
                a, b = (F.linear(h, w if g is None else fold_gain(w, g)) for w in (w1[i], w3[i]))
                f = self.up(a, b, w2[i], r)
            else:  # MLP_i(norm_i(h_i)) or norm_i(MLP_i(h_i))
                x = norm(h) if pre else h
                f = self.up(self.w1.matmul(x, w1[i]), self.w3.matmul(x, w3[i]), w2[i])
                f = f if pre else norm(f)
            h = h + (f if self.residual_alpha == 1.0 else self.residual_alpha * f)
        return h

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

    def build(  # type: ignore[override]
        self, d_model: int, *, dtype: Optional[torch.dtype] = None, init_device: str = "cpu"
    ) -> HourglassFeedForward:
        self.validate_shape()
        assert self.layer_norm is not None
        if self.dtype is not None:
            dtype = self.dtype.as_pt()
        return HourglassFeedForward(
            d_model=d_model, d_h=self.hidden_size, K=self.K, layer_norm=self.layer_norm,
            norm_placement=NormPlacement(self.norm_placement), dtype=dtype or torch.float32,
            init_device=init_device,
        )  # fmt: skip
