"""What a block kind is: the model keys every kind shares (``ModelSpec``), the kind itself
(``BlockKind``), and the registry that lists the kinds.

A block kind owns what one transformer shape means: its model (its own ``model`` keys, the fields
of its ``ModelSpec`` subclass that a config of another kind cannot set; its checks, widths w_1..w_L
and OLMo-core build), its accounting (its papers' counts, memory terms, float8 and FSDP placement)
and its export. Everything else asks ``block_of`` (or ``get_block`` for a recorded config) and never
names a kind: a new shape is one module that subclasses :class:`BlockKind` and calls ``register``
(docs/adding_a_block.md). Loading a config imports no torch: a kind imports OLMo-core in the hooks
that read a built model only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NoReturn, Optional, Tuple

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
    "ConfigError",
    "ModelSpec",
    "WIDTH",
    "RoPEScalingSpec",
    "block_of",
    "axes",
    "get_block",
    "model_spec",
    "refuse",
    "register",
    "scaled",
]

# A key's place on a coordinate-check axis (train/coordcheck.py), as field metadata: WIDTH keys
# scale with d_model; a kind's own axis (the hourglass's K) is {"axis": name}.
WIDTH = {"axis": "width"}


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
    d_model: int = field(default=MISSING, metadata=WIDTH)  # d_model: width of the residual stream
    n_layers: int = field(default=MISSING, metadata={"axis": "depth"})  # L: transformer layers
    n_heads: int = MISSING  # attention (query) heads
    head_dim: Optional[int] = (
        None  # per-head size; attention width = n_heads x head_dim (null: d_model / n_heads)
    )
    n_kv_heads: Optional[int] = None  # GQA: key/value heads, dividing n_heads (null: n_heads, MHA)
    ffn_ratio: int = 4  # baseline FFN hidden size = ffn_ratio * d_model (the conventional 4) ...
    d_ff: Optional[int] = field(default=None, metadata=WIDTH)  # ... or this explicit hidden size
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
        return block_of(self).build(self, self.swiglu_config(vocab_size))

    def swiglu_config(self, vocab_size: int) -> "TransformerConfig":
        """OLMo-core's constant-width SwiGLU transformer of these keys: what a kind's ``build``
        starts from (the baseline's whole config)."""
        from olmo_core.nn.feed_forward import FeedForwardConfig
        from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

        post = self.norm_placement == NormPlacement.post
        return TransformerConfig.llama_like(
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


class ConfigError(ValueError):
    """A bad config, or a tool a model's kind cannot serve: the message is one line naming the key
    (or the kind and the hook) and the value."""


def refuse(kind: "BlockKind", hook: str, need: str) -> NoReturn:
    """The one line for a tool that needs ``hook`` of ``kind`` where the default cannot answer."""
    raise ConfigError(
        f"model.block={kind.name}: {need} needs BlockKind.{hook} of it (docs/adding_a_block.md)"
    )


def olmo_core_swiglu(config: "TransformerConfig") -> bool:
    """Every layer of the built ``config`` is OLMo-core's own block with its SwiGLU FFN or its MoE
    of SwiGLU experts: what the hooks' defaults count."""
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.moe import MoEConfig
    from olmo_core.nn.transformer import TransformerBlockConfig

    return all(
        type(b) is TransformerBlockConfig
        and (type(b.feed_forward) is FeedForwardConfig or type(b.feed_forward_moe) is MoEConfig)
        for b in config.resolved_block_configs
    )


class BlockKind:
    """One transformer shape, told to the rest of the project in three groups of hooks, each with a
    default that fits OLMo-core's constant-width SwiGLU transformer (the baseline):

    - the model: its keys (``spec``; a key's ``axis`` metadata places it on a coordinate-check
      axis), checks, build, widths, size at load, name and description in reports, hidden units
      for the analyses and learning-rate groups;
    - its accounting: its papers' counts (the budget, the report's compute axis), the memory its
      layers keep, float8 and FSDP placement;
    - its export to Hugging Face.

    A default that depends on the FFN's or the block's form reads the built model and refuses
    (:func:`refuse`: one line naming the kind and the hook) a model that is not OLMo-core's
    blocks with their SwiGLU: no tool counts another FFN as a SwiGLU."""

    name: str = ""  # the value of model.block
    spec: type = ModelSpec  # its model keys: ModelSpec, or a subclass adding the kind's knobs

    @property
    def knobs(self) -> Tuple[str, ...]:
        """The model keys of this kind that ModelSpec does not have."""
        common = {f.name for f in fields(ModelSpec)}
        return tuple(f.name for f in fields(self.spec) if f.name not in common)

    # -- the model: keys, checks, build, widths and size ------------------------------------------

    def check(self, m, fail: Callable) -> None:
        """The checks of a model of this kind: each knob in its domain, then the shapes that must
        fit together; ``fail(key, value, why)`` for the first bad one."""

    def build(self, m, config: "TransformerConfig") -> "TransformerConfig":
        """OLMo-core's config of this shape, from the constant-width SwiGLU ``config`` with ``m``'s
        attention, norms, RoPE and vocabulary."""
        return config

    def widths(self, m) -> List[int]:
        """w_1..w_L: each layer's width inside the residual stream of width d_model."""
        return [m.d_model] * m.n_layers

    @property
    def constant_width(self) -> bool:
        """Every layer d_model wide, known at load (a kind with its own ``widths`` solves them)."""
        return type(self).widths is BlockKind.widths

    def layer_params_floor(self, m) -> int:
        """At most one layer's weights, known at load without torch (the size check's floor,
        config/spec.py; 0: only the embedding is counted)."""
        return 0

    def label(self, m) -> str:
        """The model's name in tables, figures and scaling fits (a constant-width variant of a kind
        is the baseline)."""
        return self.name

    def describe(self, m) -> str:
        """The shape beyond d_model, L and heads (count_params' title, the export's card, the config
        table's FFN column; empty: nothing more)."""
        return ""

    def record_hidden(self, m, block, record: Callable) -> List[Callable[[], None]]:
        """Hand the FFN hidden units of ``block`` (one built layer) to ``record`` as its forward
        runs (analyze.py's dead units and utilisation); returns the undo callables (none: an MoE
        layer, no units). Default: OLMo-core's SwiGLU, the input of its w2."""
        from olmo_core.nn.feed_forward import FeedForward
        from olmo_core.nn.transformer.block import TransformerBlock

        ffn = getattr(block, "feed_forward", None)
        if ffn is None and hasattr(block, "feed_forward_moe"):
            return []
        if type(block) is not TransformerBlock or type(ffn) is not FeedForward:
            refuse(self, "record_hidden", "analyze.py's FFN hidden units")
        return w2_input(ffn, record)

    def optim_groups(self, m) -> List[Tuple[List[str], float]]:
        """(parameter-name globs, learning-rate multiplier) pairs beyond AdamW's defaults."""
        return []

    # -- its accounting: papers' counts, memory, float8 and FSDP ----------------------------------

    def paper_counts(self, m, vocab: int, seq: int) -> Dict[str, Any]:
        """The model as its papers count it (count_params --json, the demo's comparison, the
        report's compute axis): ``matched_params``, the non-embedding weights a budget is matched
        on, and ``authors_flops_per_token``, training FLOPs per token as 3 x the forward's (2 per
        weight a token uses, 2 d_model V for the head, 4 s per unit of each layer's attention
        width: full s x s attention). Default: the built weights; a kind whose layers are not all
        d_model wide counts its own."""
        if not self.constant_width:
            refuse(self, "paper_counts", "its papers' parameter and FLOP counts")
        return built_counts(m, vocab, seq)

    def memory_layers(self, m, config: "TransformerConfig") -> List["LayerMemory"]:
        """Each layer's terms for the memory model (launch/memory.py), read off this kind's built
        ``config`` (blocks/memory.py). Default: OLMo-core's blocks, attention and one SwiGLU (or
        its MoE's top-k SwiGLU experts)."""
        from .memory import layer_memory

        if not olmo_core_swiglu(config):
            refuse(self, "memory_layers", "the memory model (what its layers save for backward)")
        return [layer_memory(block, config.d_model) for block in config.resolved_block_configs]

    def routed_experts(self, m) -> bool:
        """Whether its FFN is a mixture of OLMo-core's grouped experts (no float8, no whole-block
        activation checkpointing)."""
        return False

    def fsdp_splits(self, m) -> List[str]:
        """How FSDP2 splits this kind's weights where they are not one matrix per map (the dry run's
        FSDP row, report/plan.py); its block's ``apply_fsdp`` places them (OLMo-core's: one unit a
        block). Empty: every weight a matrix or vector, split on its rows (nn/shards.py)."""
        return []

    # -- its export: the Hugging Face model (export/hf.py) ----------------------------------------

    def hf_config(self, m, built: "TransformerConfig") -> Dict[str, Any]:
        """Its fields of the modeling file's ``HourglassOlmoConfig`` (export/
        modeling_hourglass_olmo.py), from ``m`` and OLMo-core's ``built`` config: the FFN form and
        sizes, the layers' widths, the ``wiring`` of a layer's attention, FFN and norms (default:
        attention then FFN, as ``model.norm_placement``); the attention, RoPE, norm eps and
        vocabulary are the export's. A model this kind cannot export: :func:`refuse`, or a
        ``ConfigError`` naming the key. Exactly the default's fields: transformers' own Olmo2 (a
        post-norm QK-norm model). The default: ``m.swiglu_config`` as it is, and refused if
        ``build`` changed a field of it (:func:`first_change`) that the export would not carry."""
        blocks = built.resolved_block_configs
        if not olmo_core_swiglu(built) or any(b.feed_forward is None for b in blocks):
            refuse(self, "hf_config", "the Hugging Face export (its FFN in the modeling file)")
        if (change := first_change(m.swiglu_config(built.vocab_size), built)) is not None:
            refuse(self, "hf_config", f"the Hugging Face export (its {change})")
        return dict(ffn="swiglu", ffn_hidden=m.resolved_d_ff)

    def hf_weights(self, m, state: Dict[str, Any]) -> Dict[str, Any]:
        """OLMo-core's ``state`` (names kept) with each tensor in the modeling file's shape."""
        return state


# Fields of OLMo-core's configs that do not change a trained model's forward: its initialization,
# frozen weights, dropout, and the kernels that compute the same attention.
_NOT_THE_FORWARD = frozenset(
    {"init_method", "init_seed", "init_std", "embedding_init_std", "freeze_params", "dropout"}
    | {"backend", "use_flash", "use_recompute_qkv_prep"}
)


def first_change(base: Any, built: Any, path: str = "") -> Optional[str]:
    """The first field of OLMo-core's config ``built`` that differs from ``base`` and changes the
    forward (``path``: its dotted name, then both values), or None."""
    if is_dataclass(base) and type(base) is type(built):
        for f in fields(base):
            if f.name not in _NOT_THE_FORWARD:
                where = f"{path}.{f.name}" if path else f.name
                if why := first_change(getattr(base, f.name), getattr(built, f.name), where):
                    return why
        return None
    if base == built:
        return None
    show = [str(v if not is_dataclass(v) else type(v).__name__)[:60] for v in (built, base)]
    return f"{path} is {show[0]}, not {show[1]}"


def w2_input(ffn, record: Callable) -> List[Callable[[], None]]:
    """:meth:`BlockKind.record_hidden` of an FFN whose hidden units are the input of its output
    matrix ``w2`` (OLMo-core's SwiGLU: SiLU(w1 x) * w3 x)."""
    return [ffn.w2.register_forward_pre_hook(lambda _m, args: record(args[0])).remove]


def attention_params_of(m) -> int:
    """One layer's attention weights at d_model (Q, K, V, O: shapes/counts.py) from ``m``'s keys."""
    from ..shapes.counts import attention_params

    head_dim, n_kv = m.resolved_head_dim, m.resolved_n_kv_heads
    return attention_params(m.d_model, m.n_heads * head_dim, n_kv * head_dim)


def built_counts(m, vocab: int, seq: int) -> Dict[str, Any]:
    """:meth:`BlockKind.paper_counts`' rule on the weights of ``m``'s built model:
    ``matched_params`` its attention and FFN matrices, ``authors_flops_per_token`` 3 x (2 x those a
    token uses, an MoE's k active experts; 2 d_model V; 4 s n_heads head_dim_l in each layer l)."""
    from ..nn.accounting import breakdown

    b = breakdown(m.build(vocab).build(init_device="meta"), seq)
    attention = sum(m.n_heads * d for d in m.head_dims)
    forward = 2 * (b.non_embedding - b.inactive) + 2 * m.d_model * vocab + 4 * seq * attention
    return {"matched_params": b.non_embedding, "authors_flops_per_token": 3.0 * forward}


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
        raise KeyError(
            f"model.block={name}: choose one of {', '.join(BLOCKS)}, or name the module of your own"
            " in HOURGLASS_BLOCKS"
        ) from None


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


def axes(m) -> List[str]:
    """The coordinate-check axes of a model spec ``m``: width, depth and its kind's own (its keys'
    ``axis`` metadata)."""
    return list(dict.fromkeys(axis for _, axis, _ in _on_axes(m, "model")))


def scaled(m, axis: str, k: int) -> List[str]:
    """The overrides scaling each key of ``m`` on ``axis`` by ``k`` (a key at null stays null)."""
    return [
        f"{key}=[{','.join(repr(v * k) for v in value)}]"
        if isinstance(value, list)
        else f"{key}={value * k!r}"
        for key, on, value in _on_axes(m, "model")
        if on == axis and value is not None
    ]


def _on_axes(node, prefix: str) -> Iterator[Tuple[str, str, Any]]:
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _on_axes(value, f"{prefix}.{f.name}")
        elif "axis" in f.metadata:
            yield f"{prefix}.{f.name}", f.metadata["axis"], value
