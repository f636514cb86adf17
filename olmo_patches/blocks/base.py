"""What a block kind is, and the registry that lists them.

A block kind owns what one transformer shape means: which of ``model``'s keys it reads, its checks,
its layers' widths w_1..w_L, its OLMo-core build, its label in reports, the learning-rate groups it
needs. Everything else asks :func:`block_of` (or :func:`get_block` for a recorded config) and never
names a kind: a new shape is one module that subclasses :class:`BlockKind` and calls
:func:`register` (docs/adding_a_block.md). Loading a config imports no torch: a kind imports
OLMo-core inside :meth:`BlockKind.build` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

if TYPE_CHECKING:
    from olmo_core.nn.transformer import TransformerConfig

    from .memory import LayerMemory, ModelMemory

__all__ = ["BLOCKS", "BlockKind", "block_of", "get_block", "register"]


class BlockKind:
    """One transformer shape. Override what differs from a constant-width SwiGLU transformer."""

    name: str = ""  # the value of model.block
    label: str = ""  # its name in tables and figures
    knobs: Tuple[
        str, ...
    ] = ()  # model keys only this kind reads (set under another kind: warned as ignored)

    def reads(self, m) -> Tuple[str, ...]:
        """The knobs this model ``m`` of the kind reads (some depend on another knob's value)."""
        return self.knobs

    def check_domain(self, m, fail: Callable) -> None:
        """Each of its knobs in its domain, whatever the kind in use (a sweep's override applies to
        every run): ``fail(key, value, why)`` for the first bad one."""

    def check(self, m, fail: Callable) -> None:
        """The checks of a model of this kind (shapes that must fit together)."""

    def ffn_hidden(self, m) -> Tuple[str, int]:
        """The key that sets one FFN matrix's hidden size, and that size (the matrix-size check)."""
        return ("model.d_ff" if m.d_ff is not None else "model.ffn_ratio"), m.resolved_d_ff

    olmo2_layers: bool = (
        False  # its layers are transformers' Olmo2 layers (export as Olmo2ForCausalLM)
    )

    def export_ffn(self, m) -> str:
        """The FFN form of its Hugging Face export (export/modeling_hourglass_olmo.py's ``block``):
        ``baseline`` (one SwiGLU of ffn_hidden) or ``hourglass`` (K sub-MLPs of d_h)."""
        return "baseline"

    def widths(self, m) -> List[int]:
        """w_1..w_L: each layer's width inside the residual stream of width d_model."""
        return [m.d_model] * m.n_layers

    constant_width: bool = True  # every layer d_model wide (else w_l is known only once solved)

    def layer_params_floor(self, m) -> int:
        """At most one layer's attention and FFN weights, known without building per-layer lists
        (the size check at load, config/validate.py; 0 where unknown)."""
        from ..shapes.counts import attention_params, swiglu_ffn_params

        head_dim, n_kv = m.resolved_head_dim, m.resolved_n_kv_heads
        attention = attention_params(m.d_model, m.n_heads * head_dim, n_kv * head_dim)
        return attention + swiglu_ffn_params(m.d_model, m.resolved_d_ff)

    def build(self, m, config: "TransformerConfig") -> "TransformerConfig":
        """OLMo-core's config of this shape, from the constant-width SwiGLU ``config`` with ``m``'s
        attention, norms, RoPE and vocabulary."""
        return config

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
