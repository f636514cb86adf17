"""What a block kind is: the model keys every kind shares (``ModelSpec``), the kind itself
(``BlockKind``), and the registry that lists the kinds.

A block kind owns what one transformer shape means: its own ``model`` keys (the fields of its
``ModelSpec`` subclass; a config of another kind cannot set them), its checks, its layers' widths
w_1..w_L, its OLMo-core build, its label in reports, the learning-rate groups it needs. Everything
else asks ``block_of`` (or ``get_block`` for a recorded config) and never names a
kind: a new shape is one module that subclasses :class:`BlockKind` and calls ``register``
(docs/adding_a_block.md). Loading a config imports no torch: a kind imports OLMo-core inside
:meth:`BlockKind.build` only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from omegaconf import MISSING

from ..shapes.choices import NormPlacement, StrEnum

if TYPE_CHECKING:  # the model's classes are imported by build(): loading a config imports no torch
    from olmo_core.nn.rope import StepwiseRoPEScalingConfig
    from olmo_core.nn.transformer import TransformerConfig

    from .memory import LayerMemory, ModelMemory

__all__ = [
    "AttentionBackend",
    "BLOCKS",
    "BlockKind",
    "ModelSpec",
    "RoPEScalingSpec",
    "block_of",
    "get_block",
    "model_spec",
    "register",
]


class AttentionBackend(StrEnum):
    auto = "auto"  # flash attention where it runs, else torch
    torch = "torch"
    flash_2 = "flash_2"
    flash_3 = "flash_3"
    flash_4 = "flash_4"
    te = "te"


@dataclass
class RoPEScalingSpec:
    """Llama-3.1 ("llama3") RoPE scaling, in Hugging Face's names; OLMo-core's
    StepwiseRoPEScalingConfig."""

    factor: float = 32.0  # low frequencies divided by this
    low_freq_factor: float = 1.0  # wavelengths above original / low_freq_factor: fully scaled
    high_freq_factor: float = 4.0  # wavelengths below original / high_freq_factor: unchanged
    original_max_position_embeddings: int = 8192

    def build(self) -> "StepwiseRoPEScalingConfig":
        from olmo_core.nn.rope import StepwiseRoPEScalingConfig

        return StepwiseRoPEScalingConfig(
            factor=self.factor,
            low_freq_proportion=1 - 1 / self.low_freq_factor,
            high_freq_proportion=1 / self.high_freq_factor,
            old_context_len=self.original_max_position_embeddings,
        )


@dataclass
class ModelSpec:
    """The keys of ``model`` every kind reads: a constant-width SwiGLU transformer (the baseline's
    whole config). A kind's own knobs are the fields of its subclass."""

    # a registered kind (olmo_patches/blocks/): baseline | hourglass | variable_width
    block: str = "baseline"
    d_model: int = MISSING  # d_model: width of the residual stream
    n_layers: int = MISSING  # L: number of transformer layers
    n_heads: int = MISSING  # attention (query) heads
    head_dim: Optional[int] = (
        None  # per-head size; attention width = n_heads x head_dim (null: d_model / n_heads)
    )
    n_kv_heads: Optional[int] = None  # GQA: key/value heads, dividing n_heads (null: n_heads, MHA)
    ffn_ratio: int = 4  # baseline FFN hidden size = ffn_ratio * d_model (the conventional 4) ...
    d_ff: Optional[int] = None  # ... or this explicit hidden size
    # pre: x + f(norm(x)) (papers); post: x + norm(f(x)) (OLMo-2)
    norm_placement: NormPlacement = NormPlacement.pre
    qk_norm: bool = False  # RMSNorm on queries and keys (OLMo-2)
    rope_theta: int = 500_000
    norm_eps: float = 1e-6  # RMSNorm epsilon
    vocab_size: Optional[int] = None  # default: the tokenizer's vocabulary padded to 128
    rope_scaling: Optional[RoPEScalingSpec] = None  # Llama-3.1 RoPE scaling (null: off)
    tie_embeddings: bool = False
    init_std: float = 0.02  # OLMo-core's init: normal(0, init_std) cut at 3 std
    # auto | torch | flash_2/3/4 | te (nn/attention.py)
    attention_backend: AttentionBackend = AttentionBackend.auto

    @property
    def layer_widths(self) -> List[int]:
        """w_1..w_L as the block kind lays them out (constant-width kinds: d_model at every
        layer)."""
        return block_of(self).widths(self)

    @property
    def head_dims(self) -> List[int]:
        """Every layer's head_dim: model.head_dim, else w_l / n_heads (a variable-width layer's
        own)."""
        return [self.head_dim or w // self.n_heads for w in self.layer_widths]

    @property
    def resolved_d_ff(self) -> int:
        return self.d_ff if self.d_ff is not None else self.ffn_ratio * self.d_model

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    def build(self, vocab_size: int) -> "TransformerConfig":
        """OLMo-core's ``TransformerConfig`` for this shape (init seed set by the trainer)."""
        from olmo_core.nn.feed_forward import FeedForwardConfig
        from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

        post = self.norm_placement == NormPlacement.post
        config = TransformerConfig.llama_like(
            d_model=self.d_model,
            vocab_size=self.vocab_size or vocab_size,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            rope_scaling=self.rope_scaling.build() if self.rope_scaling is not None else None,
            qk_norm=self.qk_norm,
            layer_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta,
            block_name=TransformerBlockType.reordered_norm
            if post
            else TransformerBlockType.default,
            feed_forward=FeedForwardConfig(hidden_size=self.resolved_d_ff, bias=False),
            tie_word_embeddings=self.tie_embeddings,
            init_std=self.init_std,
        )
        return block_of(self).build(self, config)


class BlockKind:
    """One transformer shape. Override what differs from a constant-width SwiGLU transformer."""

    name: str = ""  # the value of model.block
    label: str = ""  # its name in tables and figures
    spec: type = ModelSpec  # its model keys: ModelSpec, or a subclass adding the kind's knobs
    # (model key, value): its keys added since a run folder's record may have been written whose
    # earlier behaviour is not their default; a record without one ran as this value
    earlier: Tuple[Tuple[str, str], ...] = ()

    @property
    def knobs(self) -> Tuple[str, ...]:
        """The model keys of this kind that ModelSpec does not have."""
        common = {f.name for f in fields(ModelSpec)}
        return tuple(f.name for f in fields(self.spec) if f.name not in common)

    def check(self, m, fail: Callable) -> None:
        """The checks of a model of this kind: each knob in its domain, then the shapes that must
        fit together; ``fail(key, value, why)`` for the first bad one."""

    def ffn_hidden(self, m) -> Tuple[str, int]:
        """The key that sets one FFN matrix's hidden size, and that size (the matrix-size check)."""
        return ("model.d_ff" if m.d_ff is not None else "model.ffn_ratio"), m.resolved_d_ff

    olmo2_layers: bool = (
        False  # its layers are transformers' Olmo2 layers (export as Olmo2ForCausalLM)
    )

    def routed_experts(self, m) -> bool:
        """Whether its FFN is a mixture of OLMo-core's grouped experts (no float8, no whole-block
        activation checkpointing)."""
        return False

    def widths(self, m) -> List[int]:
        """w_1..w_L: each layer's width inside the residual stream of width d_model."""
        return [m.d_model] * m.n_layers

    constant_width: bool = True  # every layer d_model wide (else w_l is known only once solved)

    def layer_params_floor(self, m) -> int:
        """At most one layer's attention and FFN weights, known without building per-layer lists
        (the size check at load, config/spec.py; 0 where unknown)."""
        from ..shapes.counts import attention_params, swiglu_ffn_params

        head_dim, n_kv = m.resolved_head_dim, m.resolved_n_kv_heads
        attention = attention_params(m.d_model, m.n_heads * head_dim, n_kv * head_dim)
        return attention + swiglu_ffn_params(m.d_model, m.resolved_d_ff)

    def build(self, m, config: "TransformerConfig") -> "TransformerConfig":
        """OLMo-core's config of this shape, from the constant-width SwiGLU ``config`` with ``m``'s
        attention, norms, RoPE and vocabulary."""
        return config

    def constant_width_twin(self, m) -> "ModelSpec":
        """The same model with every layer d_model wide (what a width schedule is measured
        against)."""
        return m

    def width_counts(self, m, vocab: int, seq: int) -> Dict[str, Any]:
        """Its layers' widths against the constant-width twin as its paper counts them
        (``count_params --json`` of a kind that is not constant-width)."""
        return {}

    def describe(self, m) -> str:
        """The shape beyond d_model, L and heads, for count_params' title (empty: nothing more)."""
        return ""

    def matched_params(self, m, non_embedding: int) -> int:
        """The parameters a budget is matched on, given the built model's non-embedding count (the
        papers: attention and FFN weight matrices)."""
        return non_embedding

    def authors_flops_per_token(self, m, vocab: int, seq: int) -> Optional[float]:
        """Training FLOPs per token as a paper's authors count this model, where they have a rule of
        their own for it (None: report/scaling.py counts the built weights)."""
        return None

    def family(self, model: Mapping[str, Any]) -> str:
        """The curve a recorded config's run belongs to in scaling fits (a constant-width variant of
        a kind is the baseline)."""
        return self.name

    def optim_groups(self, m) -> List[Tuple[List[str], float]]:
        """(parameter-name globs, learning-rate multiplier) pairs beyond AdamW's defaults."""
        return []

    # The Hugging Face export (export/hf.py): a model that is not transformers' Olmo2 is written
    # with the stand-alone modeling file export/modeling_hourglass_olmo.py, configured by these.

    def hf_refusal(self, m) -> Optional[str]:
        """Why a model of this kind has no Hugging Face export (``key: why``; None: it has)."""
        return None

    def hf_config(self, m, built: "TransformerConfig") -> Dict[str, Any]:
        """Its fields of the modeling file's ``HourglassOlmoConfig``, from ``m`` and OLMo-core's
        ``built`` config: the FFN form and sizes, the layers' widths, the ``wiring`` of a layer's
        attention, FFN and norms (default: attention then FFN, as ``model.norm_placement``). The
        attention, RoPE, norm eps and vocabulary are the export's."""
        return dict(ffn="swiglu", ffn_hidden=m.resolved_d_ff)

    def hf_weights(self, m, state: Dict[str, Any]) -> Dict[str, Any]:
        """OLMo-core's ``state`` (names kept) with each tensor in the modeling file's shape."""
        return state

    def hf_card(self, m) -> List[str]:
        """The export's model card lines on the shape beyond the block, d_model, layers and heads
        (markdown list items)."""
        return []

    def memory_layers(self, m, config: "TransformerConfig") -> List["LayerMemory"]:
        """Each layer's terms for the memory model (launch/memory.py), read off this kind's built
        ``config`` (blocks/memory.py): OLMo-core's blocks at d_model, attention and one SwiGLU."""
        from .memory import layer_memory

        return [layer_memory(block, config.d_model) for block in config.resolved_block_configs]

    def fsdp_splits(self, m) -> List[str]:
        """How FSDP2 splits this kind's weights where they are not one matrix per map (the dry run's
        FSDP row, report/plan.py); its block's ``apply_fsdp`` places them (OLMo-core's: one unit a
        block). Empty: every weight a matrix or vector, split on its rows (nn/shards.py)."""
        return []

    def own_axes(self, m) -> List[str]:
        """Coordinate-check axes of its own beyond width and depth (the hourglass: K)."""
        return []

    def scaled(self, m, axis: str, k: int) -> List[str]:
        """Overrides that scale this kind's own knobs by ``k`` along a coordinate-check axis
        (train/coordcheck.py): ``width`` (with d_model) or an axis of its own (``K``)."""
        return []


BLOCKS: Dict[str, BlockKind] = {}


def register(kind: BlockKind) -> BlockKind:
    """Add ``kind`` to the registry under ``kind.name`` (a second kind of the same name is
    refused)."""
    if not kind.name or kind.name in BLOCKS and type(BLOCKS[kind.name]) is not type(kind):
        raise ValueError(f"block kind {kind.name!r}: empty or already registered")
    BLOCKS[kind.name] = kind
    return kind


def get_block(name: str) -> BlockKind:
    """The registered kind called ``name`` (KeyError naming the registered ones)."""
    try:
        return BLOCKS[name]
    except KeyError:
        raise KeyError(f"model.block={name}: choose one of {', '.join(BLOCKS)}") from None


def block_of(m) -> BlockKind:
    """The kind of a model spec (``m.block``)."""
    return get_block(str(m.block))


def model_spec(block: str, **keys: Any) -> ModelSpec:
    """The model of kind ``block`` with these keys, as a config's ``model`` section loads."""
    return get_block(block).spec(block=block, **keys)


def model_memory(m, vocab_size: int) -> "ModelMemory":
    """The memory model's view (blocks/memory.py) of the model of spec ``m`` at ``vocab_size``: its
    kind builds it and states each layer's terms (:meth:`BlockKind.memory_layers`)."""
    from .memory import ModelMemory

    config = m.build(vocab_size)
    return ModelMemory(
        d_model=config.d_model,
        vocab_size=config.vocab_size,
        params=config.num_params,
        layers=tuple(block_of(m).memory_layers(m, config)),
    )
