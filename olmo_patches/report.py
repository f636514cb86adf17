"""Parameter counts of a config's model and their rich table."""

from __future__ import annotations

from rich.table import Table

from .config import ExperimentSpec
from .shapes import ParamBreakdown, breakdown

__all__ = ["vocab_size", "count", "param_table"]


def vocab_size(spec: ExperimentSpec) -> int:
    """The model's vocabulary without building data: explicit, dolma2's padded, or the demo's."""
    if spec.model.vocab_size:
        return spec.model.vocab_size
    if spec.data.tokenizer == "dolma2":
        from olmo_core.data import TokenizerConfig

        return TokenizerConfig.dolma2().padded_vocab_size()
    pad = 128
    return pad * ((spec.data.demo_vocab_size + pad - 1) // pad)


def count(spec: ExperimentSpec) -> ParamBreakdown:
    model = spec.model.build(vocab_size(spec)).build(init_device="meta")
    return breakdown(model, spec.data.sequence_length)


def param_table(spec: ExperimentSpec) -> Table:
    b = count(spec)
    m = spec.model
    shape = f"{m.block}: d_model {m.d_model}, L {m.n_layers}, heads {m.n_heads}"
    if m.block == "hourglass":
        shape += f", K {m.K}, d_h {m.resolved_d_h}"
    table = Table(title=f"{spec.run.name} ({shape})")
    table.add_column("parameters")
    table.add_column("count", justify="right")
    table.add_column("share of non-embedding", justify="right")
    for name, value in (("embedding (input + untied head)", b.embedding), ("attention", b.attention), ("FFN", b.ffn)):
        share = f"{value / b.non_embedding:.1%}" if name in ("attention", "FFN") else ""
        table.add_row(name, f"{value:,}", share)
    table.add_row("norms", f"{b.norm:,}", "")
    table.add_row("non-embedding (attention + FFN)", f"{b.non_embedding:,}", "")
    table.add_row("total", f"{b.total:,}", "")
    table.add_row(f"FLOPs per token (train, seq {spec.data.sequence_length})", f"{b.flops_per_token:,}", "")
    return table
