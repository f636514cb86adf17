"""Parameter counts of a config's model and their rich table."""

from __future__ import annotations

from rich.table import Table

from ..blocks import block_of
from ..config import ExperimentSpec, vocab_size
from ..nn.accounting import ParamBreakdown, breakdown
from ..nn.float8 import float8_matmuls

__all__ = [
    "count",
    "float8_report",
    "float8_row",
    "param_table",
    "paper_report",
    "attention_report",
    "gpu_report",
    "aligned_sibling",
    "exact_gap",
]


def count(spec: ExperimentSpec) -> ParamBreakdown:
    model = spec.model_config().build(init_device="meta")
    return breakdown(model, spec.data.sequence_length)


def float8_report(spec: ExperimentSpec, emulated: bool = False) -> dict:
    """train.float8's matmuls (nn/float8.py) as a float8 GPU would run them (``emulated``: as
    torchao's emulation does, every aligned one): ``float8_params``, the weights of the matmuls that
    run in float8; those kept in high precision, ``unaligned`` (a dim not a multiple of 16) or
    ``small`` (float8 would lose: torchao's size floor, or the casts at a micro-batch's tokens on
    train.hardware's card, an H100 when none is named)."""
    from ..launch.cards import CARDS

    model = spec.model_config().build(init_device="meta")
    modules = dict(model.named_modules())
    mb, card = spec.train.micro_batch_size, CARDS.get(spec.train.hardware, CARDS["h100"])
    tokens = mb * spec.data.sequence_length if mb else None
    recipe = spec.train.float8 if spec.train.float8 != "off" else "tensorwise"
    m = float8_matmuls(model, tokens, recipe, None if emulated else card.roof)
    params = {k: sum(modules[n].weight.numel() for n in names) for k, names in m.items()}
    return {
        "float8": spec.train.float8,
        "float8_params": params["float8"],
        "float8_modules": len(m["float8"]),
        "float8_unaligned": m["unaligned"],
        "float8_small": m["small"],
        "float8_kept_params": params["unaligned"] + params["small"],
        "float8_filter": f"{card.name}, {tokens or 'any'} tokens a micro-batch",
    }


def gpu_report(spec: ExperimentSpec) -> dict:
    """Whether the shape suits GPU kernels, whatever train.float8 says: ``float8_able`` per matmul
    group (every FFN / attention matmul has both dims multiples of 16, nn/float8.py), and per
    flash-attention kernel whether every head dim is one it runs without padding
    (``head_dim_native``)."""
    from ..nn.attention import FLASH_KERNEL_HEAD_DIMS, head_dims, kernel_head_dim

    model = spec.model_config().build(init_device="meta")
    skipped = set(float8_matmuls(model)["unaligned"])
    groups: dict[str, list[str]] = {"ffn": [], "attention": []}
    for name in (*float8_matmuls(model)["float8"], *skipped):
        group = (
            "ffn" if ".feed_forward." in name else "attention" if ".attention." in name else None
        )
        if group:
            groups[group].append(name)
    dims = head_dims(spec.model_config())
    return {
        "float8_able": {g: bool(names) and not skipped & set(names) for g, names in groups.items()},
        "float8_unable": sorted(skipped),
        "head_dim_native": {
            k: all(kernel_head_dim(k, d) == d for d in dims) for k in FLASH_KERNEL_HEAD_DIMS
        },
    }


def aligned_sibling(name: str) -> str | None:
    """The aligned sibling (configs/SIZE/STEM-aligned.yaml) of the shipped config whose run.name is
    ``name`` (SIZE-STEM, an ``-exact`` suffix dropped), relative to the data root; else None."""
    from ..resources import data_root

    size, _, stem = name.partition("-")
    path = f"configs/{size}/{stem.removesuffix('-exact')}-aligned.yaml"
    return (
        path if stem and not stem.endswith("-aligned") and (data_root() / path).is_file() else None
    )


def exact_gap(config) -> dict:
    """For an aligned sibling (configs/SIZE/STEM-aligned.yaml): its exact config (STEM-exact.yaml,
    else STEM.yaml) and the non-embedding parameter gap, this config's minus the exact one's;
    otherwise {}."""
    from pathlib import Path

    from ..config import load_spec

    path = Path(config)
    if not path.stem.endswith("-aligned"):
        return {}
    stem = path.stem.removesuffix("-aligned")
    exact = next(
        (
            p
            for p in (path.with_name(f"{stem}-exact.yaml"), path.with_name(f"{stem}.yaml"))
            if p.is_file()
        ),
        None,
    )
    if exact is None:
        return {}
    this, other = count(load_spec(path)).non_embedding, count(load_spec(exact)).non_embedding
    return {
        "exact_config": exact.name,
        "exact_gap": this - other,
        "exact_gap_relative": (this - other) / other,
    }


def attention_report(spec: ExperimentSpec) -> dict:
    """Heads, head size, key/value heads and the attention width (n_heads x head_dim; per layer for
    a variable-width model whose head size follows w_l)."""
    m = spec.model
    report = {
        "n_heads": m.n_heads,
        "head_dim": m.resolved_head_dim,
        "n_kv_heads": m.resolved_n_kv_heads,
    }
    widths = m.layer_widths
    if m.head_dim is None and widths != [m.d_model] * m.n_layers:
        return {
            **report,
            "head_dim": [w // m.n_heads for w in widths],
            "attention_width": widths,
            "kv_width": [w // m.n_heads * m.resolved_n_kv_heads for w in widths],
        }
    return {
        **report,
        "attention_width": m.n_heads * m.resolved_head_dim,
        "kv_width": m.resolved_n_kv_heads * m.resolved_head_dim,
    }


def paper_report(spec: ExperimentSpec) -> dict:
    """The model as its papers count it: its kind's ``paper_counts`` (the budget's
    ``matched_params``, the report's ``authors_flops_per_token``; a variable-width model's widths
    and FLOP ratios to its constant-width twin, ...)."""
    m = spec.model
    return block_of(m).paper_counts(m, vocab_size(spec), spec.data.sequence_length)


def param_table(spec: ExperimentSpec) -> Table:
    b = count(spec)
    m = spec.model
    a = attention_report(spec)
    shape = f"{m.block}: d_model {m.d_model}, L {m.n_layers}, heads {m.n_heads}"
    if m.head_dim is not None or m.n_kv_heads is not None:
        shape += (
            f" x {a['head_dim']} (attention width {a['attention_width']}), "
            f"kv heads {a['n_kv_heads']}"
        )
    if more := block_of(m).describe(m):
        shape += f", {more}"
    table = Table(title=f"{spec.run.name} ({shape})")
    table.add_column("parameters")
    table.add_column("count", justify="right")
    table.add_column("share of non-embedding", justify="right")
    embedding = (
        "embedding (tied with the head)" if m.tie_embeddings else "embedding (input + untied head)"
    )
    for name, value in ((embedding, b.embedding), ("attention", b.attention), ("FFN", b.ffn)):
        share = f"{value / b.non_embedding:.1%}" if name in ("attention", "FFN") else ""
        table.add_row(name, f"{value:,}", share)
    table.add_row("norms", f"{b.norm:,}", "")
    if b.resize:
        table.add_row("learned resize projections", f"{b.resize:,}", "")
    table.add_row("non-embedding (attention + FFN)", f"{b.non_embedding:,}", "")
    table.add_row("total", f"{b.total:,}", "")
    if b.inactive:
        table.add_row("active (the experts a token is routed to)", f"{b.active:,}", "")
    table.add_row(
        f"FLOPs per token (train, seq {spec.data.sequence_length})", f"{b.flops_per_token:,}", ""
    )
    if spec.train.float8 != "off":
        table.add_row(*float8_row(spec), "")
    return table


def float8_row(spec: ExperimentSpec) -> tuple[str, str]:
    """The parameters whose matmuls run in float8, for the count and the dry run."""
    f = float8_report(spec)
    kept = [
        f"{len(f['float8_unaligned'])} a dim not a multiple of 16" if f["float8_unaligned"] else "",
        f"{len(f['float8_small'])} where float8 loses ({f['float8_filter']})"
        if f["float8_small"]
        else "",
    ]
    why = "; ".join(k for k in kept if k)
    kept_text = f" ({f['float8_kept_params']:,} params kept high precision: {why})" if why else ""
    return (
        f"float8 ({f['float8']}) matmul parameters",
        f"{f['float8_params']:,} in {f['float8_modules']} modules{kept_text}",
    )
