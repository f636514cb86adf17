"""Paper 1's hourglass block: each layer's FFN is K stacked wide-narrow-wide SwiGLU sub-MLPs of
bottleneck d_h, each with its own norm and residual (Eq. 1: h_{i+1} = h_i + W_u_i(SiLU(W_d1_i n_i) *
W_d2_i n_i), n_i = norm_i(h_i)); the module is nn/hourglass.py, its block nn/hourglass_block.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from .base import WIDTH, BlockKind, ModelSpec, attention_params_of, register
from .checks import MAX_MATRIX

if TYPE_CHECKING:
    from olmo_core.nn.transformer import TransformerConfig

    from .memory import LayerMemory


@dataclass
class HourglassModel(ModelSpec):
    """The hourglass keys of ``model``: every layer's FFN is K sub-MLPs of bottleneck d_h."""

    K: int = field(default=1, metadata={"axis": "K"})  # stacked wide-narrow-wide sub-MLPs a layer
    d_h: Optional[int] = field(default=None, metadata=WIDTH)  # bottleneck width d_h ...
    d_h_ratio: Optional[float] = None  # ... or d_h / d_model, rounded to a multiple of d_h_multiple
    d_h_multiple: int = 1  # rounding multiple for d_h when given as a ratio

    @property
    def resolved_d_h(self) -> int:
        """d_h, from ``d_h`` or from ``d_h_ratio * d_model`` rounded to ``d_h_multiple``."""
        if self.d_h is not None:
            return self.d_h
        if self.d_h_ratio is not None:
            m = self.d_h_multiple
            return int(round(self.d_h_ratio * self.d_model / m)) * m
        return self.resolved_d_ff  # K=1 default: the conventional FFN width


def check_knobs(m, fail: Callable) -> None:
    """K, d_h, d_h_ratio and d_h_multiple in their domains."""
    if m.K < 1:
        fail("model.K", m.K, "must be >= 1")
    if m.d_h is not None and m.d_h < 1:
        fail("model.d_h", m.d_h, "must be >= 1")
    if m.d_h_ratio is not None and not m.d_h_ratio > 0:
        fail("model.d_h_ratio", m.d_h_ratio, "must be > 0")
    if m.d_h_multiple < 1:
        fail("model.d_h_multiple", m.d_h_multiple, "must be >= 1")


def check_bottleneck(m, fail: Callable, experts: bool = False) -> None:
    """d_h (given, or d_h_ratio d_model rounded) of K sub-MLPs: positive, given once, given for
    K > 1 (``experts``: the sub-MLPs of hourglass MoE experts, which have no default d_h)."""
    if experts and m.d_h is None and m.d_h_ratio is None:
        fail(
            "model.d_h",
            None,
            "hourglass experts need model.d_h (or model.d_h_ratio):"
            " each sub-MLP's bottleneck at width h",
        )
    if m.d_h is not None and m.d_h_ratio is not None:
        fail("model.d_h_ratio", m.d_h_ratio, "give d_h or d_h_ratio, not both")
    if m.resolved_d_h < 1:
        if m.d_h is None and m.d_h_ratio is not None:  # the ratio is what was set
            fail("model.d_h_ratio", m.d_h_ratio, f"gives d_h = {m.resolved_d_h}; it must be >= 1")
        fail("model.d_h", m.resolved_d_h, "must be >= 1")
    if m.K * m.resolved_d_h * m.d_model > MAX_MATRIX:  # the stacked (K d_h, d_model) weights
        key = "model.d_h" if m.d_h is not None or m.d_h_ratio is None else "model.d_h_ratio"
        value = m.d_h if key == "model.d_h" else m.d_h_ratio
        fail(key, value, f"a {m.K * m.resolved_d_h} x {m.d_model} weight matrix is over 2^40")
    if m.K > 1 and m.d_h is None and m.d_h_ratio is None:
        fail(
            "model.d_h",
            None,
            f"give d_h or d_h_ratio for K={m.K} (the default 4 d_model is the K=1 FFN)",
        )


def hourglass_layers(m, config: "TransformerConfig") -> "TransformerConfig":
    """``config`` with every block an hourglass block: K sub-MLPs of d_h, each normed as the block's
    attention is (``model.norm_placement``)."""
    from olmo_core.nn.transformer import TransformerBlockConfig

    from ..nn import hourglass as hg
    from ..nn.hourglass_block import HourglassBlockConfig

    block = config.block
    assert isinstance(block, TransformerBlockConfig) and block.layer_norm is not None
    config.block = HourglassBlockConfig(
        sequence_mixer=block.sequence_mixer,
        layer_norm=block.layer_norm,
        feed_forward=hg.HourglassFeedForwardConfig(
            hidden_size=m.resolved_d_h,
            K=m.K,
            bias=False,
            layer_norm=block.layer_norm,
            norm_placement=m.norm_placement,
        ),
    )
    return config


class Hourglass(BlockKind):
    name = "hourglass"
    spec = HourglassModel

    def check(self, m, fail: Callable) -> None:
        check_knobs(m, fail)
        check_bottleneck(m, fail)

    def build(self, m, config: "TransformerConfig") -> "TransformerConfig":
        return hourglass_layers(m, config)

    def layer_params_floor(self, m) -> int:
        from ..shapes.counts import hourglass_ffn_params

        return attention_params_of(m) + hourglass_ffn_params(m.d_model, m.K, m.resolved_d_h)

    def describe(self, m) -> str:
        return f"K {m.K}, d_h {m.resolved_d_h}"

    def record_hidden(self, m, block, record: Callable) -> List[Callable[[], None]]:
        return [block.feed_forward.record_hidden(record)]  # each sub-MLP's (nn/hourglass.py)

    def memory_layers(self, m, config: "TransformerConfig") -> List["LayerMemory"]:
        """The attention of every block, then the K sub-MLPs of its hourglass FFN."""
        from .memory import layer_memory

        blocks = config.resolved_block_configs
        return [hourglass_memory(layer_memory(b, config.d_model), b.feed_forward) for b in blocks]

    def fsdp_splits(self, m) -> List[str]:
        return [STACKED_SPLIT]

    def hf_config(self, m, built: "TransformerConfig") -> Dict[str, Any]:
        return dict(ffn="hourglass", K=m.K, d_h=m.resolved_d_h)

    def hf_weights(self, m, state: Dict[str, Any]) -> Dict[str, Any]:
        return stacked_as_hf(state, m.K)


HOURGLASS = register(Hourglass())

# OLMo-core's name of a layer's stacked hourglass matrix (nn/hourglass.py's StackedLinear)
_STACKED = re.compile(r"blocks\.\d+\.feed_forward\.w[123]\.weight")


def stacked_as_hf(state: Dict[str, Any], K: int) -> Dict[str, Any]:
    """A state with each layer's K sub-MLP matrices, stacked (K out, in) as OLMo-core's
    StackedLinear keeps them, as the modeling file's (K, out, in): the same rows, in order."""
    return {
        k: v.reshape(K, -1, v.shape[-1]) if _STACKED.fullmatch(k) else v for k, v in state.items()
    }


def hourglass_memory(layer: "LayerMemory", ffn) -> "LayerMemory":
    """``layer`` with an hourglass FFN (nn/hourglass.py's config ``ffn``): K SwiGLU sub-MLPs of
    hidden d_h, each with its own norm (the block has one more, its attention's). Compiled, pre-norm
    RMSNorms fold into the down projections: each sub-MLP's input h_i is the norm's input and the
    matmuls' at once (2 w less), unless float8 keeps them unfolded. With an fp32 stream, eager,
    each sub-MLP's w1 and w3 cast their own bf16 copies (2 w K more beside Q, K, V's 4 w); compiled,
    a pre-norm stack keeps each h_i in fp32 beside its bf16 cast (4 w K)."""
    from .memory import Saved, norm_bytes, swiglu_bytes

    w, ln, K, pre = layer.width, ffn.layer_norm, ffn.K, ffn.norm_placement == "pre"
    unfolded = 2 * w * K if pre and "rms" in str(ln.name) and ln.bias is False else 0
    saved = K * (norm_bytes(w) + swiglu_bytes(w, ffn.hidden_size))
    return replace(
        layer,
        ffn=replace(saved, compiled=saved.compiled - unfolded),
        widest=max(w, ffn.hidden_size),
        norms=1,
        unfolded=unfolded,
        fp32_stream=Saved(4 * w + 2 * w * K, 4 * w * K if pre else 0),
    )


# The K sub-MLPs' maps stacked in one matrix per w1/w3/w2 (nn/hourglass.py), split as any matrix.
STACKED_SPLIT = "hourglass FFN (K out, in) weights: rows"
