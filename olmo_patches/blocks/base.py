"""What a block kind is, and the registry that lists them.

A block kind owns what one transformer shape means: its own ``model`` keys (the fields of its
``ModelSpec`` subclass; a config of another kind cannot set them), its checks,
its layers' widths w_1..w_L, its OLMo-core build, its label in reports, the learning-rate groups it
needs. Everything else asks :func:`block_of` (or :func:`get_block` for a recorded config) and never
names a kind: a new shape is one module that subclasses :class:`BlockKind` and calls
:func:`register` (docs/adding_a_block.md). Loading a config imports no torch: a kind imports
OLMo-core inside :meth:`BlockKind.build` only.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

from .model import ModelSpec

if TYPE_CHECKING:
    from olmo_core.nn.transformer import TransformerConfig

__all__ = ["BLOCKS", "BlockKind", "block_of", "get_block", "model_spec", "register"]


class BlockKind:
    """One transformer shape. Override what differs from a constant-width SwiGLU transformer."""

    name: str = ""  # the value of model.block
    label: str = ""  # its name in tables and figures
    spec: type = ModelSpec  # its model keys: ModelSpec, or a subclass adding the kind's knobs

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

    def export_ffn(self, m) -> str:
        """The FFN form of its Hugging Face export (export/modeling_hourglass_olmo.py's ``block``):
        ``baseline`` (one SwiGLU of ffn_hidden) or ``hourglass`` (K sub-MLPs of d_h)."""
        return "baseline"

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


def model_spec(block: str, **keys: Any) -> ModelSpec:
    """The model of kind ``block`` with these keys, as a config's ``model`` section loads."""
    return get_block(block).spec(block=block, **keys)


def block_of(m) -> BlockKind:
    """The kind of a model spec (``m.block``)."""
    return get_block(str(m.block))
