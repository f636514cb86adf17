"""Paper 2's variable-width transformer: layer l runs at its own width w_l inside one residual
stream of width d_model = h, resized without parameters (carry-forward, §3); its FFN a SwiGLU or an
hourglass stack scaled with w_l, or a mixture of experts (the paper's 3B MoE). The module is
nn/variable_width.py, its MoE nn/moe.py and nn/hourglass_moe.py; the width schedules
shapes/widths.py."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Tuple

from ..shapes.widths import SHAPES, expert_hidden_size, paper_flops, paper_params
from .base import BlockKind, register
from .hourglass import check_bottleneck, hourglass_layers

if TYPE_CHECKING:
    from olmo_core.nn.transformer import TransformerConfig

    from .memory import LayerMemory


def _hourglass_ffn(m) -> bool:
    return m.ffn == "hourglass"


def _hourglass_experts(m) -> bool:
    return m.moe is not None and m.moe.experts == "hourglass"


class VariableWidth(BlockKind):
    name = "variable_width"
    label = "variable width"
    knobs = ("ffn", "widths", "moe")

    def reads(self, m) -> Tuple[str, ...]:
        hourglass = _hourglass_ffn(m) or _hourglass_experts(m)
        return self.knobs + (("K", "d_h", "d_h_ratio") if hourglass else ())

    def check_domain(self, m, fail: Callable) -> None:
        w = m.widths
        if w.shape not in SHAPES:
            fail("model.widths.shape", w.shape, f"choose one of {', '.join(SHAPES)}")
        if not 0 <= w.r_l <= 1:
            fail("model.widths.r_l", w.r_l, "must be in [0, 1] (the extreme layer k = r_l L)")
        if not 0 < w.r_d < 1:
            fail("model.widths.r_d", w.r_d, "must be in (0, 1) (the narrowest width / d_model)")
        if w.multiple < 1:
            fail("model.widths.multiple", w.multiple, "must be >= 1")
        if w.values is not None and not all(v >= 1 for v in w.values):
            fail("model.widths.values", w.values, "every width must be >= 1")
        for key in ("m_width", "m_emb", "m_residual", "init_range"):
            if not getattr(w, key) > 0:
                fail(f"model.widths.{key}", getattr(w, key), "must be > 0")

    def check(self, m, fail: Callable) -> None:
        if _hourglass_ffn(m) or _hourglass_experts(m):
            check_bottleneck(m, fail, experts=_hourglass_experts(m))
        if m.moe is not None:
            _check_moe(m, fail)
        _check_widths(m, fail)

    def ffn_hidden(self, m) -> Tuple[str, int]:
        return ("model.d_h", m.resolved_d_h) if _hourglass_ffn(m) else super().ffn_hidden(m)

    def export_ffn(self, m) -> str:
        return "hourglass" if _hourglass_ffn(m) else "baseline"

    def widths(self, m) -> List[int]:
        return m.resolved_widths

    constant_width = False

    def layer_params_floor(self, m) -> int:
        return 0  # each layer's width is solved later: the embedding alone is counted

    def build(self, m, config: "TransformerConfig") -> "TransformerConfig":
        from olmo_core.nn.transformer import TransformerConfig

        from ..nn.hourglass_moe import HourglassMoEConfig
        from ..nn.moe import LayerMoEConfig
        from ..nn.variable_width import MuPConfig, VariableWidthTransformerConfig

        hourglass = _hourglass_ffn(m)
        if hourglass:
            config = hourglass_layers(m, config)
        if (
            e := m.moe
        ) is not None:  # every layer: OLMo-core's MoE at w_l (nn/moe.py), no dense FFN
            moe = (HourglassMoEConfig if e.experts == "hourglass" else LayerMoEConfig).authors(
                num_experts=e.num_experts,
                top_k=e.top_k,
                hidden_size=m.moe_hidden,
                lb_loss_weight=e.lb_loss_weight,
                z_loss_weight=e.z_loss_weight,
                load_balance=str(e.load_balance),
            )
            if e.experts == "hourglass":  # K sub-MLPs per expert, each with the model's norm
                moe = replace(moe, K=m.K, layer_norm=config.block.layer_norm)  # type: ignore[union-attr]
            config.block = replace(config.block, feed_forward=None, feed_forward_moe=moe)
        w = m.widths
        base = {f.name: getattr(config, f.name) for f in fields(TransformerConfig)}
        return VariableWidthTransformerConfig(
            **base,
            widths=self.widths(m),
            resize=w.resize,
            ffn_hidden_ratio=(m.resolved_d_h if hourglass else m.resolved_d_ff) / m.d_model,
            ffn_hidden_multiple=m.d_h_multiple if hourglass else 1,
            mup=MuPConfig(w.m_width, w.m_emb, w.m_residual, w.init_range)
            if w.init == "mup"
            else None,
        )

    def describe(self, m) -> str:
        ffn = (
            f"MoE {m.moe.num_experts} {m.moe.experts} experts top-{m.moe.top_k}"
            if m.moe is not None
            else m.ffn
        )
        if _hourglass_experts(m):
            ffn += f" (K {m.K}, d_h {m.resolved_d_h} at h)"
        return f"{ffn}, widths {self.widths(m)}"

    def matched_params(self, m, non_embedding: int) -> int:
        """The authors' counting rule (shapes/widths.py): each layer's matrices at w_l."""
        return round(paper_params(self.widths(m), m.d_model))

    def authors_flops_per_token(self, m, vocab: int, seq: int) -> Optional[float]:
        """Paper 2's count (its compute_metrics, 3 x the forward) for the authors' layers: SwiGLU 4
        w_l (or their SwiGLU experts), heads that follow w_l."""
        authors = m.ffn == "swiglu" and m.resolved_d_ff == 4 * m.d_model and m.head_dim is None
        if not authors or (m.moe is not None and m.moe.experts != "swiglu"):
            return None
        return 3 * paper_flops(self.widths(m), m.d_model, vocab, seq, m.moe_shape) / seq

    def family(self, model: Mapping[str, Any]) -> str:
        w = model.get("widths") or {}
        if w.get("schedule") == "constant":  # a constant schedule is the baseline
            return "baseline"
        resize = w.get("resize", "carry_forward")
        return str(w.get("shape", "x")) + ("" if resize == "carry_forward" else f" ({resize})")

    def optim_groups(self, m) -> List[Tuple[List[str], float]]:
        """Under the paper's muP the hidden matrices (attention and FFN weights; an MoE's router and
        experts) train at lr / m_width, as lm-engine's muP groups do."""
        if m.widths.init != "mup":
            return []
        ffn = (
            ["blocks.*.feed_forward_moe.router.weight", "blocks.*.feed_forward_moe.experts.mlp.w*"]
            if m.moe
            else ["blocks.*.feed_forward.w*.weight"]
        )
        return [(["blocks.*.attention.w_*.weight", *ffn], 1 / m.widths.m_width)]

    def memory_layers(self, m, config: "TransformerConfig") -> List["LayerMemory"]:
        """Layer l at its width w_l: its FFN a SwiGLU or an hourglass stack (K sub-MLPs of d_h
        scaled with w_l), or top-k experts (hourglass experts: K sub-MLPs each)."""
        from .hourglass import hourglass_memory
        from .memory import layer_memory

        layers = []
        for block, w in zip(config.resolved_block_configs, self.widths(m)):
            layer = layer_memory(block, w)
            if _hourglass_ffn(m):
                layer = hourglass_memory(layer, block.feed_forward)
            if _hourglass_experts(m):
                layer = replace(layer, mlps=layer.mlps * block.feed_forward_moe.K)
            layers.append(layer)
        return layers

    def fsdp_splits(self, m) -> List[str]:
        """The hourglass FFN's stacked maps, and the hourglass experts' (nn/hourglass_moe.py)."""
        from .hourglass import STACKED_SPLIT

        experts = "hourglass experts' (K E d_h, d_model) weights: rows"
        return [STACKED_SPLIT] * _hourglass_ffn(m) + [experts] * _hourglass_experts(m)

    def scaled(self, m, axis: str, k: int) -> List[str]:
        """Width: an explicit d_h, a list of widths w_l, and muP's m_width (d_model / d_base)."""
        from .hourglass import scaled_bottleneck

        if axis != "width":
            return []
        w, out = m.widths, scaled_bottleneck(m, k)
        if w.values:
            out.append(f"model.widths.values=[{','.join(str(v * k) for v in w.values)}]")
        if w.init == "mup":
            out.append(f"model.widths.m_width={w.m_width * k!r}")
        return out


def _check_moe(m, fail: Callable) -> None:
    e = m.moe
    if m.ffn != "swiglu":
        fail(
            "model.ffn",
            m.ffn,
            "the MoE replaces the FFN; give the experts' kind as model.moe.experts",
        )
    if m.norm_placement != "pre":
        fail(
            "model.norm_placement",
            m.norm_placement,
            "the variable-width MoE block is pre-norm (the authors' lm-engine block)",
        )
    if e.num_experts < 1:
        fail("model.moe.num_experts", e.num_experts, "must be >= 1")
    if not 1 <= e.top_k <= e.num_experts:
        fail("model.moe.top_k", e.top_k, f"must be in [1, model.moe.num_experts={e.num_experts}]")
    if e.experts == "hourglass":  # the experts' shape is model.K and model.d_h
        if e.expert_hidden is not None:
            fail(
                "model.moe.expert_hidden",
                e.expert_hidden,
                "hourglass experts take their shape from model.K and model.d_h; remove it",
            )
    elif e.expert_hidden is None or e.expert_hidden < 1:
        fail("model.moe.expert_hidden", e.expert_hidden, "must be >= 1 for swiglu experts")
    for key in ("lb_loss_weight", "z_loss_weight"):
        if not (math.isfinite(value := getattr(e, key)) and value >= 0):
            fail(f"model.moe.{key}", value, "must be finite and >= 0 (0: off)")


def _check_widths(m, fail: Callable) -> None:
    w = m.widths
    if m.tie_embeddings:
        fail(
            "model.tie_embeddings",
            m.tie_embeddings,
            "a variable-width model needs untied embeddings",
        )
    if w.schedule == "list" and (w.values is None or len(w.values) != m.n_layers):
        fail("model.widths.values", w.values, f"schedule=list needs n_layers={m.n_layers} widths")
    try:
        widths = m.resolved_widths
    except ValueError as e:
        key = "model.widths.r_l" if "extreme layer" in str(e) else "model.widths.schedule"
        fail(key, getattr(w, key.rsplit(".", 1)[1]), " ".join(str(e).split()))  # on one line
    key = "model.widths.values" if w.schedule == "list" else "model.widths.multiple"
    step = 1 if m.head_dim is not None else 2 * m.n_heads  # explicit head_dim: any width w_l
    why = (
        "positive"
        if m.head_dim is not None
        else f"a positive multiple of 2 model.n_heads={step} (even head_dim for RoPE)"
    )
    for layer, width in enumerate(widths, start=1):
        if width < 1 or width % step:
            fail(
                key,
                w.values if w.schedule == "list" else w.multiple,
                f"w_{layer}={width} is not {why}",
            )
    if m.moe is not None and expert_hidden_size(min(widths), m.moe_hidden, m.d_model) < 1:
        key = "model.d_h" if m.moe.experts == "hourglass" else "model.moe.expert_hidden"
        fail(
            key,
            m.moe_hidden,
            f"the narrowest layer (w={min(widths)}) would get experts of hidden size 0",
        )


VARIABLE_WIDTH = register(VariableWidth())
