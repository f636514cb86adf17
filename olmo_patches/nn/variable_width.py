"""Paper 2: variable-width transformers (Wu et al., arXiv:2606.18246), on OLMo-core.

Layers l = 1..L have their own hidden widths w_l (wide-narrow-wide across depth: the "x" shape).
h is the constant-width baseline's width: the embedding and the LM head stay h wide.

The width schedule w_1..w_L is solved in ``shapes/widths.py``.

The residual stream and resizing (the exact rule)
-------------------------------------------------
Let S = max(h, max_l w_l). s_0 = [embedding (h dims), 0 ... 0] is S wide. Layer l reads
x_l = s_l-1[:w_l] (a slice, no copy), computes y_l = Block_l(x_l) (its own residuals, all w_l
wide), and

- ``carry_forward`` (default, the authors' ``move_up``): s_l = [y_l, s_l-1[w_l:]]. Dimensions a
  layer does not have keep the value of the most recent layer that wrote them (or the embedding, for
  dims < h), and dims that no layer ever had are zero. So a widening layer l (w_l > w_l-1) reads
  dims [w_l-1, w_l) from the most recent layer that was that wide.
- ``zero``: a widening layer reads zeros in [w_l-1, w_l): x_l = [y_l-1, 0] (x_l = y_l-1[:w_l] when
  narrowing). The stream still carries forward (s_l = [y_l, s_l-1[w_l:]]) for the output below.
- ``learned``: no stream; x_l = y_l-1[:w_l] when shrinking and x_l = P_l y_l-1 (a bias-free learned
  w_l x w_l-1 projection, ``resize``) when widening (y_0 = the embedding, h wide). Dims a narrower
  layer dropped are lost.

Output: RMSNorm over the first w_L dims of the last layer's output, then to h dims: truncate when
w_L >= h; when w_L < h, carry_forward and zero both append s_L[w_L:h] (un-normalised; the authors'
output resize turns zero into move_up, width_varying_model.py:735), learned projects with a w_L -> h
matrix. Then the untied h x V LM head.

Interaction with the zero-initialised dims: with carry_forward or zero and w_1 > h, layer 1's input
has zeros in [h, w_1). RMSNorm over w_1 counts them (rms over w_1 dims, so the embedding is scaled
by sqrt(w_1 / h) relative to a width-h norm), and layer 1's Q/K/V columns for those dims get exactly
zero gradient (the "input waste" the solver subtracts). In learned mode, the projection of the zero
padding does not arise: P_1 maps the h-dim embedding to w_1 dims, and every dim of x_1 is a learned
mix.

Each layer at its own width: n_heads fixed (head_dim = w_l / n_heads, or a fixed ``head_dim``: every
layer's attention is then n_heads x head_dim wide whatever w_l), RMSNorm over w_l, RoPE over
head_dim (each block has its own RoPE buffer cache: OLMo-core's cache key omits the head size), and
either SwiGLU (hidden ``ffn_hidden_ratio`` w_l), the hourglass FFN (d_h scaled with w_l) or a
mixture of experts (OLMo-core's MoE at w_l with experts of hidden round(w_l expert_hidden / h);
``moe.py``). With an MoE the solver matches the baseline's total parameters, per layer (4 + 3 E r)
w_l^2 + E w_l (every expert, the router; r = expert_hidden / h) with output waste E r w_L (w_L - h),
as the authors' solver does for their 3B MoE. Hourglass experts (``hourglass_moe.py``, new here: K
sub-MLPs of round(w_l d_h / h)) count as r = K d_h / h.

Initialisation: OLMo-core's (``init_method``, ``init_std``), or the paper's muP-style one
(:class:`MuPConfig`): embedding std = init_range, block weights std = init_range / sqrt(m_width) *
sqrt(h / w_l), the attention and FFN output projections (w_out, w2) a further / sqrt(2 L) with L the
model's depth (lm-engine's c_proj), LM head std = init_range (plain normal, as lm-engine); forward
multipliers: embedding x m_emb, every residual branch x m_residual, logits / m_width, attention
scores 1 / head_dim. Learned resize projections use PyTorch's nn.Linear default U(+-1/sqrt(fan_in))
(the authors' nn.Linear).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from olmo_core.config import Config
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.layer_norm import LayerNormType, RMSNorm
from olmo_core.nn.lm_head import LMHead, LMHeadConfig, LMHeadType
from olmo_core.nn.transformer import (
    Transformer,
    TransformerBlockConfig,
    TransformerConfig,
    TransformerType,
)
from olmo_core.nn.transformer.block import ReorderedNormTransformerBlock, TransformerBlock
from olmo_core.nn.transformer.config import TransformerBlockType
from olmo_core.nn.transformer.init import _apply_init
from olmo_core.nn.transformer.model import MoETransformer

from .hourglass_block import HourglassBlock
from .hourglass import HourglassFeedForwardConfig
from .hourglass_moe import HourglassMoEBlock, HourglassMoEConfig
from ..shapes.choices import ResizeMode
from ..shapes.widths import expert_hidden_size
from .moe import ScaledMoETransformerBlock

__all__ = [
    "MuPConfig",
    "VariableWidthBlockConfig",
    "VariableWidthLMHeadConfig",
    "VariableWidthTransformerConfig",
    "VariableWidthTransformer",
    "VariableWidthMoETransformer",
    "OutputNorm",
]


# --- modules -------------------------------------------------------------------------------------


@dataclass
class MuPConfig(Config):
    """The paper's muP-style multipliers and init (paper 2, docs/papers.md, the authors'
    configs)."""

    m_width: float = 8.0  # logits / m_width; block init std / sqrt(m_width)
    m_emb: float = 12.0  # embedding output x m_emb
    m_residual: float = 0.22  # every residual branch x m_residual
    init_range: float = 0.1  # base init std


class _Resizing:
    """Mixin for a block at width w_l that reads and writes the first w_l dims of the stream."""

    width: int
    in_width: int
    stream_width: int
    resize_mode: ResizeMode
    resize: Optional[nn.Linear]

    def __init__(
        self,
        *,
        width: int,
        in_width: int,
        stream_width: int,
        resize: ResizeMode,
        init_device: str = "cpu",
        **kwargs,
    ):
        super().__init__(d_model=width, init_device=init_device, **kwargs)  # type: ignore[call-arg]
        self.width, self.in_width, self.stream_width = width, in_width, stream_width
        self.resize_mode = ResizeMode(resize)
        learned = self.resize_mode == ResizeMode.learned and in_width < width
        self.resize = (
            nn.Linear(in_width, width, bias=False, device=init_device) if learned else None
        )

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.resize_mode == ResizeMode.learned:  # x is y_l-1 (or the embedding)
            inp = self.resize(x) if self.resize is not None else x[..., : self.width]
            return super().forward(inp, **kwargs)  # type: ignore[misc]
        if x.shape[-1] < self.stream_width:  # the embedding: dims h..S start at zero
            x = F.pad(x, (0, self.stream_width - x.shape[-1]))
        inp = x[..., : self.width]
        # new dims read zeros
        if self.resize_mode == ResizeMode.zero and self.in_width < self.width:
            inp = F.pad(inp[..., : self.in_width], (0, self.width - self.in_width))
        y = super().forward(inp, **kwargs)  # type: ignore[misc]
        if self.width == self.stream_width:
            return y
        # the stream carries forward in both modes
        return torch.cat((y, x[..., self.width :]), dim=-1)

    def num_flops_per_token(self, seq_len: int) -> int:
        extra = 6 * self.resize.weight.numel() if self.resize is not None else 0
        return super().num_flops_per_token(seq_len) + extra  # type: ignore[misc]


class VariableWidthBlock(_Resizing, TransformerBlock):
    """OLMo-core's pre-norm block at width w_l inside the wide stream."""


class VariableWidthReorderedNormBlock(_Resizing, ReorderedNormTransformerBlock):
    """OLMo-2's post-norm block at width w_l inside the wide stream."""


class VariableWidthHourglassBlock(_Resizing, HourglassBlock):
    """Attention + hourglass FFN at width w_l inside the wide stream (a shape neither paper
    tried)."""


class VariableWidthMoEBlock(_Resizing, ScaledMoETransformerBlock):
    """Attention + OLMo-core's MoE at width w_l inside the wide stream (paper 2's 3B MoE)."""


class VariableWidthHourglassMoEBlock(_Resizing, HourglassMoEBlock):
    """Attention + an MoE of hourglass experts at width w_l inside the wide stream (new here)."""


@dataclass
class VariableWidthBlockConfig(TransformerBlockConfig):
    """One layer: the template block's modules at ``width``; reads ``in_width`` dims in learned
    mode."""

    width: int = 0
    in_width: int = 0
    stream_width: int = 0
    resize: ResizeMode = ResizeMode.carry_forward
    softmax_scale: Optional[float] = None  # muP: 1 / head_dim

    @property
    def is_hourglass(self) -> bool:
        return isinstance(self.feed_forward, HourglassFeedForwardConfig)

    def build(  # type: ignore[override]
        self,
        *,
        d_model: int,
        block_idx: int,
        n_layers: int,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ):
        # own width; own RoPE cache (OLMo-core's cache key ignores the head size)
        del (d_model, cache)
        assert self.layer_norm is not None
        kwargs: dict = dict(sequence_mixer=self.sequence_mixer, layer_norm=self.layer_norm)
        # its MoE: LayerMoEConfig.build(w_l) with hidden_size I_l
        if self.feed_forward_moe is not None:
            hourglass_experts = isinstance(self.feed_forward_moe, HourglassMoEConfig)
            cls: type = (
                VariableWidthHourglassMoEBlock if hourglass_experts else VariableWidthMoEBlock
            )
            kwargs.update(
                feed_forward_moe=self.feed_forward_moe,
                dropout=self.dropout or 0.0,
                residual_alpha=self.attention_residual_alpha or 1.0,
            )
        elif self.is_hourglass:
            cls, kwargs["feed_forward"] = VariableWidthHourglassBlock, self.feed_forward
            kwargs["residual_alpha"] = self.attention_residual_alpha or 1.0
        else:
            kwargs["feed_forward"] = self.feed_forward
            cls = (
                VariableWidthReorderedNormBlock
                if self.name == TransformerBlockType.reordered_norm
                else VariableWidthBlock
            )
            for key in ("dropout", "attention_residual_alpha", "feed_forward_residual_alpha"):
                if getattr(self, key) is not None:
                    kwargs[key] = getattr(self, key)
        block = cls(
            width=self.width,
            in_width=self.in_width,
            stream_width=self.stream_width,
            resize=self.resize,
            block_idx=block_idx,
            n_layers=n_layers,
            init_device=init_device,
            cache=BufferCache(),
            **kwargs,
        )
        if self.softmax_scale is not None:
            block.attention.backend.scale = self.softmax_scale
        return block

    def num_params(self, d_model: int) -> int:
        del d_model
        assert self.layer_norm is not None
        w = self.width
        ffn = self.feed_forward_moe if self.feed_forward_moe is not None else self.feed_forward
        assert ffn is not None
        params = (
            self.sequence_mixer.num_params(w) + self.layer_norm.num_params(w) + ffn.num_params(w)
        )
        if not self.is_hourglass:
            # the FFN's norm (the hourglass FFN owns its K norms)
            params += self.layer_norm.num_params(w)
        if self.resize == ResizeMode.learned and self.in_width < w:
            params += self.in_width * w
        return params

    def num_active_params(self, d_model: int) -> int:
        del d_model
        # OLMo-core's: this config's num_params at w_l less the MoE's inactive experts
        return super().num_active_params(self.width)


class OutputNorm(RMSNorm):
    """RMSNorm over the last layer's first w_L dims, then to h dims; the LM head's ``norm``."""

    def __init__(
        self,
        *,
        last_width: int,
        d_model: int,
        resize: ResizeMode,
        logit_scale: float,
        init_device: str,
        **kwargs,
    ):
        super().__init__(size=last_width, init_device=init_device, **kwargs)
        self.last_width, self.d_model, self.resize_mode = last_width, d_model, ResizeMode(resize)
        self.logit_scale = logit_scale
        learned = self.resize_mode == ResizeMode.learned and last_width < d_model
        self.resize = (
            nn.Linear(last_width, d_model, bias=False, device=init_device) if learned else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x[..., : self.last_width])
        if self.last_width >= self.d_model:
            y = y[..., : self.d_model]
        elif self.resize is not None:
            y = self.resize(y)
        else:
            # carry forward, also in zero mode (the authors' output resize, WVM:735): dims
            # [w_L, h) of the stream
            y = torch.cat((y, x[..., self.last_width : self.d_model]), dim=-1)
        return y * self.logit_scale if self.logit_scale != 1.0 else y


@dataclass
class VariableWidthLMHeadConfig(LMHeadConfig):
    """OLMo-core's LM head (h x V) whose norm is an :class:`OutputNorm` over the last layer's
    width."""

    last_width: int = 0
    resize: ResizeMode = ResizeMode.carry_forward
    logit_scale: float = 1.0  # muP: 1 / m_width

    def _resize_params(self, d_model: int) -> int:
        return (
            self.last_width * d_model
            if self.resize == ResizeMode.learned and self.last_width < d_model
            else 0
        )

    def num_params(self, d_model: int, vocab_size: int) -> int:
        params = (
            d_model * vocab_size + (vocab_size if self.bias else 0) + self._resize_params(d_model)
        )
        if self.layer_norm is not None:
            params += self.layer_norm.num_params(self.last_width)
        return params

    def build(self, *, d_model: int, vocab_size: int, init_device: str = "cpu") -> LMHead:
        if self.name != LMHeadType.default:
            raise OLMoConfigurationError("a variable-width model needs the default LM head")
        head = LMHead(
            d_model=d_model,
            vocab_size=vocab_size,
            layer_norm=None,
            dtype=self.dtype.as_pt(),
            bias=bool(self.bias),
            init_device=init_device,
            loss_implementation=self.loss_implementation,
        )
        if self.layer_norm is not None:
            ln = self.layer_norm
            if ln.name != LayerNormType.rms:
                raise OLMoConfigurationError(f"a variable-width model needs RMSNorm, got {ln.name}")
            head.norm = OutputNorm(
                last_width=self.last_width,
                d_model=d_model,
                resize=self.resize,
                logit_scale=self.logit_scale,
                init_device=init_device,
                eps=ln.eps if ln.eps is not None else 1e-5,
                bias=bool(ln.bias),
                dtype=ln.dtype.as_pt() if ln.dtype is not None else torch.float32,
            )
        return head


@dataclass
class VariableWidthTransformerConfig(TransformerConfig):
    """OLMo-core's ``TransformerConfig`` with per-layer widths; ``d_model`` is h, ``block`` the
    template."""

    widths: List[int] = field(default_factory=list)  # w_1..w_L
    resize: ResizeMode = ResizeMode.carry_forward
    ffn_hidden_ratio: float = (
        4.0  # FFN hidden (SwiGLU) or d_h (hourglass) per layer: ratio x w_l ...
    )
    ffn_hidden_multiple: int = 1  # ... rounded to this multiple
    mup: Optional[MuPConfig] = None  # None: OLMo-core's init (init_method, init_std)

    def __post_init__(self):
        super().__post_init__()
        if self.name != TransformerType.default or self.block_overrides or self.block_pattern:
            raise OLMoConfigurationError("a variable-width model builds its own per-layer blocks")
        if len(self.widths) != self.n_layers:
            raise OLMoConfigurationError(
                f"widths has {len(self.widths)} entries for n_layers={self.n_layers}"
            )
        assert isinstance(self.block, TransformerBlockConfig)
        mixer = self.block.sequence_mixer
        # head_dim: any w_l
        n_heads = 1 if getattr(mixer, "head_dim", None) else getattr(mixer, "n_heads", 1)
        for l, w in enumerate(self.widths, start=1):
            if w < 1 or w % n_heads:
                raise OLMoConfigurationError(
                    f"w_{l}={w} is not a positive multiple of n_heads={n_heads}"
                )
        if self.tie_word_embeddings:
            raise OLMoConfigurationError("a variable-width model needs untied embeddings")
        if self.mup is not None:
            self.embed_scale = self.mup.m_emb
        head = self.lm_head
        self.lm_head = VariableWidthLMHeadConfig(
            layer_norm=head.layer_norm,
            bias=head.bias,
            dtype=head.dtype,
            loss_implementation=head.loss_implementation,
            last_width=self.widths[-1],
            resize=ResizeMode(self.resize),
            logit_scale=1.0 / self.mup.m_width if self.mup is not None else 1.0,
        )

    @property
    def stream_width(self) -> int:
        return max(self.d_model, *self.widths)

    def _head_dim(self, w: int) -> int:
        """Layer width w's head size: the attention's explicit head_dim, else w / n_heads."""
        mixer = self.block.sequence_mixer  # type: ignore[union-attr]
        return getattr(mixer, "head_dim", None) or w // getattr(mixer, "n_heads")

    def _hidden(self, w: int) -> int:
        m = self.ffn_hidden_multiple
        return int(round(self.ffn_hidden_ratio * w / m)) * m

    @property
    def resolved_block_configs(self) -> list[TransformerBlockConfig]:
        template = self.block
        assert isinstance(template, TransformerBlockConfig)
        ffn, moe = template.feed_forward, template.feed_forward_moe
        configs: list[TransformerBlockConfig] = []
        prev = self.d_model
        for w in self.widths:
            alpha = self.mup.m_residual if self.mup is not None else None
            configs.append(
                VariableWidthBlockConfig(
                    name=template.name,
                    sequence_mixer=template.sequence_mixer,
                    layer_norm=template.layer_norm,
                    feed_forward=replace(ffn, hidden_size=self._hidden(w))
                    if ffn is not None
                    else None,
                    feed_forward_moe=replace(
                        moe, hidden_size=expert_hidden_size(w, moe.hidden_size, self.d_model)
                    )
                    if moe is not None
                    else None,
                    dropout=template.dropout,
                    attention_residual_alpha=alpha or template.attention_residual_alpha,
                    feed_forward_residual_alpha=alpha or template.feed_forward_residual_alpha,
                    width=w,
                    in_width=prev,
                    stream_width=self.stream_width,
                    resize=ResizeMode(self.resize),
                    softmax_scale=1 / self._head_dim(w) if self.mup is not None else None,
                )
            )
            prev = w
        return configs

    @property
    def is_moe(self) -> bool:
        return (
            isinstance(self.block, TransformerBlockConfig)
            and self.block.feed_forward_moe is not None
        )

    def build(self, *, init_device: str = "cpu") -> "VariableWidthTransformer":  # type: ignore[override]
        cls = VariableWidthMoETransformer if self.is_moe else VariableWidthTransformer
        return cls(
            widths=self.widths,
            mup=self.mup,
            d_model=self.d_model,
            vocab_size=self.vocab_size,
            n_layers=self.n_layers,
            block=self.block,
            block_overrides=dict(enumerate(self.resolved_block_configs)),
            lm_head=self.lm_head,
            embedding_norm=self.embedding_norm,
            dtype=self.dtype.as_pt(),
            init_method=self.init_method,
            init_device=init_device,
            init_seed=self.init_seed,
            init_std=self.init_std,
            embedding_init_std=self.embedding_init_std,
            embed_scale=self.embed_scale,
        )


class VariableWidthTransformer(Transformer):
    """OLMo-core's ``Transformer`` whose blocks have their own widths (see the module docstring)."""

    def __init__(self, *, widths: List[int], mup: Optional[MuPConfig] = None, **kwargs):
        super().__init__(**kwargs)
        self.widths = list(widths)
        self.mup = mup

    def apply_compile(self):
        # All blocks share one forward code object and each width is its own graph: raise dynamo's
        # per-code recompile limit (default 8) so that no width falls back to eager.
        cfg = torch._dynamo.config
        needed = 2 * len(set(self.widths)) + 8
        cfg.recompile_limit = max(cfg.recompile_limit, needed)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * needed)
        super().apply_compile()

    @torch.no_grad()
    def init_weights(self, **kwargs) -> torch.Generator:  # type: ignore[override]
        # OLMo-core's init of every block at its own width
        generator = super().init_weights(**kwargs)
        for (
            module
        ) in self.modules():  # learned resize projections: nn.Linear's default distribution
            if isinstance(resize := getattr(module, "resize", None), nn.Linear):
                bound = resize.in_features**-0.5
                _apply_init(nn.init.uniform_, resize.weight, a=-bound, b=bound, generator=generator)
        if self.mup is not None:
            self._init_mup(generator)
        return generator

    def _init_mup(self, generator: torch.Generator) -> None:
        m = self.mup
        assert m is not None

        def normal(weight: torch.Tensor, std: float):
            _apply_init(nn.init.normal_, weight, mean=0.0, std=std, generator=generator)

        normal(self.embeddings.weight, m.init_range)
        # lm-engine's c_proj (attention, MLP, experts): / sqrt(2 L) (LME attention.py:128-131,
        # mlp.py:44-46, moe.py:212-220)
        out_proj = ("attention.w_out.weight", "feed_forward.w2.weight", "experts.mlp.w2")
        for block, w in zip(self.blocks.values(), self.widths):
            std = m.init_range / math.sqrt(m.m_width) * math.sqrt(self.d_model / w)
            for name, p in block.named_parameters():  # the MoE router's weight is stored flat (1-D)
                if (p.dim() >= 2 or name.endswith("router.weight")) and "resize" not in name:
                    normal(
                        p, std / math.sqrt(2 * self.n_layers) if name.endswith(out_proj) else std
                    )
        normal(self.lm_head.w_out.weight, m.init_range)


class VariableWidthMoETransformer(VariableWidthTransformer, MoETransformer):
    """A variable-width model whose layers are MoE blocks: OLMo-core's ``MoETransformer`` (router
    metrics, post-batch hooks) with the per-layer widths."""
