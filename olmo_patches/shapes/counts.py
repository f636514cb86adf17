"""The papers' closed-form parameter counts of a constant-width layer: pure arithmetic, no torch.

One formula per concept, used by the shape solvers (shapes/search.py) and by the modules' own counts
(nn/): attention 2 d_model (a + a_kv), with Q and O d_model x a (a = n_heads head_dim) and K and V
d_model x a_kv (a_kv = n_kv_heads head_dim), 4 d_model^2 for MHA at head_dim d_model / n_heads;
SwiGLU FFN 3 d_model d_ff; hourglass FFN 3 K d_model d_h (K sub-MLPs of W_d1, W_d2: d_h x d_model
and W_u: d_model x d_h). Norms, biases, embeddings and the LM head are not counted. Tests hold these
against the built models (nn/accounting.py's ``breakdown``).
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "attention_params",
    "swiglu_ffn_params",
    "hourglass_ffn_params",
    "analytic_non_embedding",
]


def attention_params(
    d_model: int, attention_width: Optional[int] = None, kv_width: Optional[int] = None
) -> int:
    """2 d_model (a + a_kv): a = ``attention_width`` and a_kv = ``kv_width`` default to d_model
    (MHA)."""
    a = attention_width if attention_width is not None else d_model
    return 2 * d_model * (a + (kv_width if kv_width is not None else a))


def swiglu_ffn_params(d_model: int, d_ff: int) -> int:
    """3 d_model d_ff: W1, W3 (d_ff x d_model) and W2 (d_model x d_ff)."""
    return 3 * d_model * d_ff


def hourglass_ffn_params(d_model: int, K: int, d_h: int) -> int:
    """3 K d_model d_h: K sub-MLPs, each W_d1, W_d2 (d_h x d_model) and W_u (d_model x d_h)."""
    return 3 * K * d_model * d_h


def analytic_non_embedding(
    d_model: int,
    n_layers: int,
    *,
    d_ff: Optional[int] = None,
    K: int = 1,
    d_h: Optional[int] = None,
    attention_width: Optional[int] = None,
    kv_width: Optional[int] = None,
) -> dict:
    """{'attention', 'ffn', 'non_embedding'} of a constant-width model of ``n_layers`` layers.

    Give ``d_ff`` for a SwiGLU FFN of that hidden size (default 4 d_model), or ``K`` and ``d_h`` for
    an hourglass FFN; ``attention_width`` and ``kv_width`` as in :func:`attention_params`.
    """
    attention = attention_params(d_model, attention_width, kv_width) * n_layers
    if d_h is not None:
        ffn = hourglass_ffn_params(d_model, K, d_h) * n_layers
    else:
        ffn = swiglu_ffn_params(d_model, d_ff if d_ff is not None else 4 * d_model) * n_layers
    return {"attention": attention, "ffn": ffn, "non_embedding": attention + ffn}
