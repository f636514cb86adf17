"""The checks of the model keys every kind shares (``ModelSpec``: sizes, heads, the FFN size, the
vocabulary, RoPE and its scaling, the init and norm scales), the kind's own (``BlockKind.check``)
among them. A failure is one line naming the key and the value, through ``fail`` (config/spec.py's:
it names the file or "command line" that set the key)."""

from __future__ import annotations

import math

from .base import block_of

MAX_MATRIX = 2**40  # elements in one weight matrix: far beyond any GPU's memory, far below int64


def check_model(m, fail) -> None:
    """The model (a ModelSpec): sizes, head and FFN shapes, RoPE scaling, its kind's knobs, then the
    init and norm scales."""
    for key, value in (
        ("model.d_model", m.d_model),
        ("model.n_layers", m.n_layers),
        ("model.n_heads", m.n_heads),
    ):
        if value < 1:
            fail(key, value, "must be >= 1")
    _check_knobs(m, fail)
    where = fail.where
    if (
        m.head_dim is None
        and m.d_model % m.n_heads
        and where("model.d_model") == "command line" != where("model.n_heads")
    ):
        # the key changed last
        fail(
            "model.d_model",
            m.d_model,
            f"not a multiple of model.n_heads={m.n_heads} (or set model.head_dim)",
        )
    _check_attention(m, fail)
    if m.ffn_ratio < 1:
        fail("model.ffn_ratio", m.ffn_ratio, "must be >= 1")
    block_of(m).check(m, fail)  # its own knobs
    for key, value, why in (
        ("model.init_std", m.init_std, "must be finite and > 0"),
        ("model.norm_eps", m.norm_eps, "must be finite and > 0"),
        ("model.rope_theta", m.rope_theta, "must be > 0"),
    ):
        if not (value > 0 and math.isfinite(value)):
            fail(key, value, why)


def _check_knobs(m, fail) -> None:
    """The domain of the vocabulary and the RoPE scaling (a kind checks its own knobs)."""
    if m.vocab_size is not None and m.vocab_size < 1:
        fail("model.vocab_size", m.vocab_size, "must be >= 1")
    if (r := m.rope_scaling) is not None and r.original_max_position_embeddings < 1:
        fail(
            "model.rope_scaling.original_max_position_embeddings",
            r.original_max_position_embeddings,
            "must be >= 1",
        )


def _check_attention(m, fail) -> None:
    """Head size, GQA groups, FFN size and RoPE scaling."""
    if m.head_dim is None:
        if m.d_model % m.n_heads:
            fail(
                "model.n_heads",
                m.n_heads,
                f"does not divide model.d_model={m.d_model} (or set model.head_dim)",
            )
        if (m.d_model // m.n_heads) % 2:
            fail(
                "model.n_heads",
                m.n_heads,
                f"head_dim {m.d_model // m.n_heads} = model.d_model / model.n_heads is odd; RoPE "
                "needs it even",
            )
    elif m.head_dim < 2 or m.head_dim % 2:
        fail(
            "model.head_dim", m.head_dim, "must be even and >= 2 (RoPE rotates pairs of dimensions)"
        )
    if m.n_kv_heads is not None and (m.n_kv_heads < 1 or m.n_heads % m.n_kv_heads):
        fail(
            "model.n_kv_heads", m.n_kv_heads, f"must divide model.n_heads={m.n_heads} (GQA groups)"
        )
    if m.d_ff is not None and m.d_ff < 1:
        fail("model.d_ff", m.d_ff, "must be >= 1")
    if (r := m.rope_scaling) is not None:
        if r.factor < 1:
            fail("model.rope_scaling.factor", r.factor, "must be >= 1")
        if not 1 <= r.low_freq_factor:
            fail("model.rope_scaling.low_freq_factor", r.low_freq_factor, "must be >= 1")
        # blamed on the one moved from its default (4, 1)
        if not r.low_freq_factor < r.high_freq_factor:
            if r.high_freq_factor != 4.0 and r.low_freq_factor == 1.0:
                fail(
                    "model.rope_scaling.high_freq_factor",
                    r.high_freq_factor,
                    f"must be > model.rope_scaling.low_freq_factor={r.low_freq_factor}",
                )
            fail(
                "model.rope_scaling.low_freq_factor",
                r.low_freq_factor,
                f"must be >= 1 and < model.rope_scaling.high_freq_factor={r.high_freq_factor}",
            )
