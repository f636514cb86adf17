"""Paper 2's variable-width transformer: layer l runs at its own width w_l inside one residual
stream of width d_model = h, resized without parameters (carry-forward, §3); its FFN a SwiGLU or an
hourglass stack scaled with w_l, or a mixture of experts (the paper's 3B MoE). The module is
nn/variable_width.py, its MoE nn/moe.py and nn/hourglass_moe.py; the width schedules
shapes/widths.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from omegaconf import MISSING

from ..shapes.choices import ResizeMode, StrEnum
from ..shapes.widths import (
    SHAPES,
    MoEShape,
    expert_hidden_size,
    paper_active_params,
    paper_flops,
    paper_params,
    schedule_widths,
)
from .base import BlockKind, register
from .hourglass import HourglassModel, check_bottleneck, check_knobs, hourglass_layers

if TYPE_CHECKING:
    from olmo_core.nn.transformer import TransformerConfig

    from .memory import LayerMemory


class Experts(StrEnum):
    swiglu = "swiglu"
    hourglass = "hourglass"


class LoadBalance(StrEnum):
    global_batch = (
        "global_batch"  # tokens per expert counted over every rank and micro-batch of the step
    )
    data_parallel = "data_parallel"  # over the ranks' micro-batches of one pass (lm-engine)
    micro_batch = "micro_batch"  # over this rank's micro-batch (OLMo-core's local_batch)


class Ffn(StrEnum):
    swiglu = "swiglu"
    hourglass = "hourglass"


class WidthSchedule(StrEnum):
    geometric = "geometric"
    arithmetic = "arithmetic"
    constant = "constant"
    list = "list"


class Init(StrEnum):
    olmo = "olmo"  # OLMo-core's init
    mup = "mup"  # the paper's multipliers and init


@dataclass
class WidthSpec:
    """Variable-width layers (paper 2): the schedule of w_1..w_L, the resizing and the init."""

    schedule: WidthSchedule = WidthSchedule.geometric  # geometric | arithmetic | constant | list
    shape: str = "x"  # x (wide-narrow-wide) | v | ^ | 3 (narrow-wide-narrow)
    r_l: float = 0.75  # position of the extreme layer, k = r_l L (paper)
    r_d: float = 0.3  # narrowest continuous width / d_model (paper)
    multiple: int = 32  # each w_l rounded to this multiple (paper)
    values: Optional[List[int]] = None  # schedule=list: the explicit widths
    resize: ResizeMode = ResizeMode.carry_forward  # carry_forward | zero | learned
    init: Init = Init.olmo  # olmo (OLMo-core's init) | mup (the paper's multipliers and init below)
    m_width: float = 8.0  # mup: logits / m_width (paper)
    m_emb: float = 12.0  # mup: embeddings x m_emb (paper)
    m_residual: float = 0.22  # mup: residual branches x m_residual (paper)
    init_range: float = 0.1  # mup: base init std (paper)


@dataclass
class MoESpec:
    """A mixture of experts in place of every layer's FFN (variable_width, paper 2's 3B MoE):
    OLMo-core's dropless MoE at each layer's width w_l (olmo_patches/nn/moe.py)."""

    num_experts: int = MISSING  # E: routed experts per layer (no shared expert)
    top_k: int = MISSING  # k: experts per token (softmax over the k selected logits)
    # swiglu: one expert's hidden size at width h; layer l uses round(w_l expert_hidden / h)
    expert_hidden: Optional[int] = None
    # load-balancing loss weight, per layer, summed (the authors' router_aux_loss_coef; 0: off)
    lb_loss_weight: float = 0.01
    # router z-loss weight per layer, summed over layers (the authors' 0.1 x 0.01; 0: off)
    z_loss_weight: float = 0.001
    # swiglu: OLMo-core's dropless SwiGLU experts | hourglass: K sub-MLPs of d_h (model.K, d_h)
    experts: Experts = Experts.swiglu
    # global_batch (any world size) | data_parallel | micro_batch
    load_balance: LoadBalance = LoadBalance.global_batch


@dataclass
class VariableWidthModel(HourglassModel):
    """The variable-width keys of ``model`` (d_model is h): the widths w_l, each layer's FFN, or a
    mixture of experts; K and d_h shape an hourglass FFN or hourglass experts."""

    # each layer's FFN, swiglu | hourglass (K, d_h scaled with w_l)
    ffn: Ffn = Ffn.swiglu
    widths: WidthSpec = field(default_factory=WidthSpec)  # w_1..w_L
    # a mixture of experts in every layer instead of the FFN (null: dense FFN)
    moe: Optional[MoESpec] = None

    @property
    def moe_hidden(self) -> int:
        """One expert's hidden size at width h: expert_hidden (swiglu), d_h of each of its K
        sub-MLPs (hourglass)."""
        assert self.moe is not None
        if self.moe.experts == "hourglass":
            return self.resolved_d_h
        return self.moe.expert_hidden  # type: ignore[return-value]

    @property
    def moe_shape(self) -> Optional[MoEShape]:
        """The MoE as the width solver counts it (None: dense FFN); an hourglass expert's 3 K d_h w
        weights count as a SwiGLU expert of hidden K d_h."""
        e = self.moe
        if e is None:
            return None
        K = self.K if e.experts == "hourglass" else 1
        return MoEShape(e.num_experts, e.top_k, K * self.moe_hidden / self.d_model)

    @property
    def resolved_widths(self) -> List[int]:
        """w_1..w_L (raises ValueError for an impossible schedule); with an MoE, matched to the
        baseline's total parameters (every expert), as the authors' solver does."""
        w = self.widths
        return schedule_widths(
            w.schedule,
            self.d_model,
            self.n_layers,
            shape=w.shape,
            r_l=w.r_l,
            r_d=w.r_d,
            multiple=w.multiple,
            widths=w.values,
            moe=self.moe_shape,
        )


def _hourglass_ffn(m) -> bool:
    return m.ffn == "hourglass"


def _hourglass_experts(m) -> bool:
    return m.moe is not None and m.moe.experts == "hourglass"


class VariableWidth(BlockKind):
    name = "variable_width"
    label = "variable width"
    spec = VariableWidthModel
    earlier = (("moe.load_balance", "micro_batch"),)  # before the key: OLMo-core's per micro-batch

    def check(self, m, fail: Callable) -> None:
        _check_width_knobs(m, fail)
        check_knobs(m, fail)
        if _hourglass_ffn(m) or _hourglass_experts(m):
            check_bottleneck(m, fail, experts=_hourglass_experts(m))
        else:
            _check_no_bottleneck(m, fail)
        if m.moe is not None:
            _check_moe(m, fail)
        _check_widths(m, fail)

    def ffn_hidden(self, m) -> Tuple[str, int]:
        return ("model.d_h", m.resolved_d_h) if _hourglass_ffn(m) else super().ffn_hidden(m)

    def routed_experts(self, m) -> bool:
        return m.moe is not None

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

    def constant_width_twin(self, m) -> VariableWidthModel:
        return replace(m, widths=replace(m.widths, schedule="constant"))

    def width_counts(self, m, vocab: int, seq: int) -> Dict[str, Any]:
        """The paper's counts (shapes/widths.py): the FLOP ratio to the twin with the MoE's k active
        experts; with an MoE also every expert computed, each layer's expert size, and the authors'
        solver's parameter counts (embeddings 2 V h included) of the model and its twin."""
        widths, h, L, moe = self.widths(m), m.d_model, m.n_layers, m.moe_shape

        def paper_ratio(active: bool) -> float:
            return paper_flops(widths, h, vocab, seq, moe, active) / paper_flops(
                [h] * L, h, vocab, seq, moe, active
            )

        report: Dict[str, Any] = {
            "widths": widths,
            "mean_width_ratio": sum(widths) / len(widths) / h,
            "paper_flops_ratio": paper_ratio(True),
        }
        if moe is None:
            return report
        if _hourglass_experts(m):
            report["expert_K"] = m.K  # sub-MLPs per expert
        emb = 2 * vocab * h
        return report | dict(
            # hourglass experts: d_h of each sub-MLP
            expert_hidden=[expert_hidden_size(w, m.moe_hidden, h) for w in widths],
            paper_total_flops_ratio=paper_ratio(False),
            paper_params=emb + paper_params(widths, h, moe),
            paper_active_params=emb + paper_active_params(widths, h, moe),
            baseline_paper_params=emb + paper_params([h] * L, h, moe),
            baseline_paper_active_params=emb + paper_active_params([h] * L, h, moe),
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

    def hf_refusal(self, m) -> Optional[str]:
        if m.moe is not None:
            return "model.moe: the Hugging Face export has no mixture-of-experts model"
        return None

    def hf_config(self, m, built: "TransformerConfig") -> Dict[str, Any]:
        """The FFN form, each layer's width w_l and FFN hidden size (as OLMo-core's config rounds
        it), the resizing and the paper's muP forward multipliers."""
        from .hourglass import HOURGLASS

        hourglass = _hourglass_ffn(m)
        config = HOURGLASS.hf_config(m, built) if hourglass else super().hf_config(m, built)
        blocks = built.resolved_block_configs  # type: ignore[attr-defined]
        config.update(
            widths=list(built.widths),  # type: ignore[attr-defined]
            hidden_sizes=[b.feed_forward.hidden_size for b in blocks],
            resize=str(built.resize),  # type: ignore[attr-defined]
        )
        if (mup := built.mup) is not None:  # type: ignore[attr-defined]
            config.update(
                embed_scale=mup.m_emb,
                residual_scale=mup.m_residual,
                logit_scale=1.0 / mup.m_width,
                attention_scale_power=1.0,
            )
        return config

    def hf_weights(self, m, state: Dict[str, Any]) -> Dict[str, Any]:
        from .hourglass import HOURGLASS

        return HOURGLASS.hf_weights(m, state) if _hourglass_ffn(m) else state

    def hf_card(self, m) -> List[str]:
        if (widths := self.widths(m)) == [m.d_model] * m.n_layers:
            return []
        return [
            f"- layer widths w_1..w_L: {', '.join(map(str, widths))} (resize {m.widths.resize}); "
            "each layer's heads and head size: config.json `layer_shapes`"
        ]

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


def _check_width_knobs(m, fail: Callable) -> None:
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


def _check_no_bottleneck(m, fail: Callable) -> None:
    """K and d_h shape only an hourglass FFN or hourglass experts: set with neither, refused."""
    for key, value, unset in (
        ("K", m.K, 1),
        ("d_h", m.d_h, None),
        ("d_h_ratio", m.d_h_ratio, None),
    ):
        if value != unset:
            fail(
                f"model.{key}",
                value,
                "read only with model.ffn=hourglass or model.moe.experts=hourglass",
            )


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
