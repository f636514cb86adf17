"""Paper 2's variable-width transformer: layer l runs at its own width w_l inside one residual
stream of width d_model = h, resized without parameters (carry-forward, §3); its FFN a SwiGLU or an
hourglass stack scaled with w_l, or a mixture of experts (the paper's 3B MoE). The module is
nn/variable_width.py, its MoE nn/moe.py and nn/hourglass_moe.py; the width schedules
shapes/widths.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

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
from .base import WIDTH, BlockKind, ConfigError, built_counts, register, w2_input
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
    values: Optional[List[int]] = field(default=None, metadata=WIDTH)  # schedule=list: the widths
    resize: ResizeMode = ResizeMode.carry_forward  # carry_forward | zero | learned
    init: Init = Init.olmo  # olmo (OLMo-core's init) | mup (the paper's multipliers and init below)
    m_width: float = field(default=8.0, metadata=WIDTH)  # mup: logits / m_width (paper)
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

    K: int = 1  # an hourglass FFN's or expert's sub-MLPs (no coordinate-check axis here)
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


def _input_view(block) -> int:
    """The width of the tensor that layer l's input is a slice of: the stream S (carry-forward,
    zero), y_l-1 (learned), or its own where a resize or zeros widened it."""
    w, w_in = block.width, block.in_width
    if block.resize != "carry_forward" and w_in < w:
        return w
    return w_in if block.resize == "learned" else block.stream_width


def _hourglass_experts(m) -> bool:
    return m.moe is not None and m.moe.experts == "hourglass"


class VariableWidth(BlockKind):
    name = "variable_width"
    spec = VariableWidthModel

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

    def widths(self, m) -> List[int]:
        return m.resolved_widths

    def label(self, m) -> str:
        """A constant schedule is the baseline; another its shape (x, v, ^, 3), with its resizing
        unless carry-forward; "MoE" added."""
        w = m.widths
        shape = "baseline" if w.schedule == "constant" else w.shape
        resize = "" if w.schedule == "constant" or w.resize == "carry_forward" else f" ({w.resize})"
        return shape + resize + (" MoE" if m.moe is not None else "")

    def describe(self, m) -> str:
        ffn = (
            f"MoE {m.moe.num_experts} {m.moe.experts} experts top-{m.moe.top_k}"
            if m.moe is not None
            else m.ffn
        )
        if _hourglass_experts(m):
            ffn += f" (K {m.K}, d_h {m.resolved_d_h} at h)"
        return f"{ffn}, widths {self.widths(m)}"

    def record_hidden(self, m, block, record: Callable) -> List[Callable[[], None]]:
        if m.moe is not None:
            return []
        if _hourglass_ffn(m):
            return [block.feed_forward.record_hidden(record)]
        return w2_input(block.feed_forward, record)

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

    def paper_counts(self, m, vocab: int, seq: int) -> Dict[str, Any]:
        """Paper 2's counts (its compute_metrics and solver, shapes/widths.py) where its layers are
        the authors' (SwiGLU 4 w_l or their experts, hourglass experts of K d_h as those, heads that
        follow w_l), else the built weights' (the idle slices computed); beside them the widths, the
        FLOP ratios to the constant-width twin (same h, L, V, s; ``flops_ratio``: OLMo-core's
        count of the two built models) and, with an MoE, every expert computed, each layer's expert
        size, the authors' solver's parameter counts (embeddings 2 V h included) and the twin's
        built ``baseline_total`` / ``baseline_active``."""
        from ..nn.accounting import breakdown

        widths, h, L, moe = self.widths(m), m.d_model, m.n_layers, m.moe_shape
        twin = replace(m, widths=replace(m.widths, schedule="constant"))
        built = [breakdown(x.build(vocab).build(init_device="meta"), seq) for x in (m, twin)]
        own = _paper_counts(m, widths, vocab, seq, moe)
        report: Dict[str, Any] = {
            **own,
            "widths": widths,
            "mean_width_ratio": sum(widths) / len(widths) / h,
            "paper_flops_ratio": own["authors_flops_per_token"]
            / _paper_counts(twin, [h] * L, vocab, seq, moe)["authors_flops_per_token"],
            "flops_ratio": built[0].flops_per_token / built[1].flops_per_token,
        }
        if moe is None:
            return report
        if _hourglass_experts(m):
            report["expert_K"] = m.K  # sub-MLPs per expert
        emb = 2 * vocab * h
        return report | dict(
            # hourglass experts: d_h of each sub-MLP
            expert_hidden=[expert_hidden_size(w, m.moe_hidden, h) for w in widths],
            paper_total_flops_ratio=paper_flops(widths, h, vocab, seq, moe, False)
            / paper_flops([h] * L, h, vocab, seq, moe, False),
            paper_params=emb + paper_params(widths, h, moe),
            paper_active_params=emb + paper_active_params(widths, h, moe),
            baseline_paper_params=emb + paper_params([h] * L, h, moe),
            baseline_paper_active_params=emb + paper_active_params([h] * L, h, moe),
            baseline_total=built[1].total,
            baseline_active=built[1].active,
        )

    def memory_layers(self, m, config: "TransformerConfig") -> List["LayerMemory"]:
        """Layer l at its width w_l, its input a slice of a wider tensor (:func:`_input_view`): its
        FFN a SwiGLU or an hourglass stack (K sub-MLPs of d_h scaled with w_l), or top-k experts
        (hourglass experts: K folded sub-MLPs each, nn/hourglass_moe.py)."""
        from .hourglass import hourglass_memory
        from .memory import Saved, layer_memory, router_bytes

        layers, post = [], m.norm_placement == "post"
        for block, w in zip(config.resolved_block_configs, self.widths(m)):
            layer, S = layer_memory(block, w), _input_view(block)
            if _hourglass_ffn(m):
                layer = hourglass_memory(layer, block.feed_forward)
            if _hourglass_experts(m):
                moe, d_h = block.feed_forward_moe, block.feed_forward_moe.hidden_size
                E, k, K = moe.num_experts, moe.router.top_k, moe.K
                # per sub-MLP: z (eager also in fp32 for 1/rms), 1/rms, then a and b in bf16 and
                # times 1/rms in fp32, SiLU in fp32, the product in bf16 (18 d_h); the gains folded
                # into copies of the weights that the grouped matmuls keep (bf16)
                sub = Saved(6 * w + 4 + 18 * d_h, 2 * w + 4 + 18 * d_h)
                ffn = router_bytes(w, E, k) + k * (Saved(2 * w, 2 * w) + K * sub)
                fp32 = Saved(2 * w * (k * K + 1), 6 * w * k * K)
                layer = replace(layer, ffn=ffn, weight_copy=4 * K * E * d_h * w, fp32_stream=fp32)
            # the slice of the stream: kept where the block keeps its input (bf16: compiled, or a
            # post-norm's Q/K/V input); fp32: a pre-norm's norm keeps it (eager) and it is kept in
            # fp32 (compiled), a post-norm's matmuls keep bf16 casts instead
            view = 2 * (S - w)
            extra = Saved(-view, -view) if post else Saved(2 * view, 2 * S)
            layer = replace(
                layer, view=Saved(view if post else 0, view), fp32_stream=layer.fp32_stream + extra
            )
            layers.append(layer)
        return layers

    def routed_experts(self, m) -> bool:
        return m.moe is not None

    def fsdp_splits(self, m) -> List[str]:
        """The hourglass FFN's stacked maps, and the hourglass experts' (nn/hourglass_moe.py)."""
        from .hourglass import STACKED_SPLIT

        experts = "hourglass experts' (K E d_h, d_model) weights: rows"
        return [STACKED_SPLIT] * _hourglass_ffn(m) + [experts] * _hourglass_experts(m)

    def hf_config(self, m, built: "TransformerConfig") -> Dict[str, Any]:
        """The FFN form, each layer's width w_l and FFN hidden size (as OLMo-core's config rounds
        it), the resizing and the paper's muP forward multipliers; no mixture of experts."""
        from .hourglass import HOURGLASS

        if m.moe is not None:
            raise ConfigError("model.moe: the Hugging Face export has no mixture-of-experts model")
        hourglass = _hourglass_ffn(m)
        config = (
            HOURGLASS.hf_config(m, built)
            if hourglass
            else dict(ffn="swiglu", ffn_hidden=m.resolved_d_ff)
        )
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


def _paper_counts(m, widths: List[int], vocab: int, seq: int, moe) -> Dict[str, Any]:
    """``matched_params`` and ``authors_flops_per_token`` of paper 2 (3 x the forward of
    ``paper_flops``) for the authors' layers (SwiGLU of 4 d_model, heads of d_model / n_heads, one
    key/value head per query head), else :func:`built_counts`."""
    authors = m.ffn == "swiglu" and m.resolved_d_ff == 4 * m.d_model and m.head_dim is None
    if not authors or m.resolved_n_kv_heads != m.n_heads:
        return built_counts(m, vocab, seq)
    return {
        "matched_params": round(paper_params(widths, m.d_model, moe)),
        "authors_flops_per_token": 3 * paper_flops(widths, m.d_model, vocab, seq, moe) / seq,
    }


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
