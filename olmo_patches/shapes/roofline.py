"""Roofline estimates of a training step's FFN and of float8's gain per matmul: pure arithmetic.

A card is its dense bf16 peak P (FLOP/s; float8 runs at 2 P) and its memory bandwidth B (bytes/s).
A GEMM of (M, N, K) takes max(2 M N K / P, 2 (M K + N K + M N) / B) in bf16; a linear layer's
training step is three of them (forward, input and weight gradients: the same FLOPs and operands).
An elementwise kernel takes its bytes / B. These are bounds (every kernel at its roof), not
predictions: a measured ratio below :func:`ffn_roofline_ratio` is what is left to win.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Roof", "ffn_roofline_ratio", "ffn_seconds", "float8_gain"]

BYTES = 2  # bf16 activations and weights (FSDP's param dtype)
# Each element float8 casts, per step: its amax (read, 2 bytes), the cast (read 2, write 1) and the
# transposed float8 copy the other GEMM of the backward needs (read 1, write 1).
CAST_BYTES = 7


@dataclass(frozen=True)
class Roof:
    flops: float  # dense bf16 FLOP/s (float8: twice)
    bandwidth: float  # memory bytes/s


def _linear(M: int, N: int, K: int, roof: Roof) -> float:
    """Seconds of one linear layer's three GEMMs (forward, input and weight gradients)."""
    return 3 * max(2 * M * N * K / roof.flops, BYTES * (M * K + N * K + M * N) / roof.bandwidth)


def ffn_seconds(tokens: int, d_model: int, hidden: int, K: int, roof: Roof) -> float:
    """One FFN's training step (forward and backward, compiled) at ``tokens``: K = 0 for the
    pre-norm SwiGLU of ``hidden`` with its norm and residual (OLMo-core's block), else the hourglass
    of K sub-MLPs of d_h = ``hidden`` with their norms folded (nn/hourglass.py).

    Elementwise bytes per token beside the GEMMs (each group one fused kernel), SwiGLU: forward the
    norm (read h, write n: 2 d), SiLU x mul (3 H), residual add (3 d); backward SiLU x mul (read 3,
    write 2: 5 H), the norm's backward with the two input gradients' sum and the residual's (5 d):
    10 d + 8 H. Each folded hourglass sub-MLP: 1 / rms(h) (read h: d), SiLU(a r) x b r (3 d_h), the
    residual add (3 d); backward 5 d_h and 5 d: 9 d + 8 d_h, so K sub-MLPs add (9 K - 10) d to an
    equal SwiGLU's. The fold's W_d diag g: per step 7 weight-sized passes over 2 K d_h d_model
    (forward: read W, write W diag g; backward: the same again, recomputed, then read its gradient
    and W, write W's), per token divided by tokens.
    """
    d, M = d_model, tokens
    if K == 0:
        gemms = 2 * _linear(M, hidden, d, roof) + _linear(M, d, hidden, roof)
        elementwise = (10 * d + 8 * hidden) * M * BYTES
    else:
        gemms = K * (2 * _linear(M, hidden, d, roof) + _linear(M, d, hidden, roof))
        elementwise = (9 * d + 8 * hidden) * K * M * BYTES + 7 * 2 * K * hidden * d * BYTES
    return gemms + elementwise / roof.bandwidth


def ffn_roofline_ratio(tokens: int, d_model: int, K: int, d_h: int, roof: Roof) -> float:
    """Hourglass / SwiGLU achieved FLOP/s at equal FLOPs (the SwiGLU's hidden K d_h), every kernel
    at its roof: the best the measured ratio can reach."""
    swiglu = ffn_seconds(tokens, d_model, K * d_h, 0, roof)
    return swiglu / ffn_seconds(tokens, d_model, d_h, K, roof)


def float8_gain(M: int, N: int, K: int, roof: Roof) -> float:
    """Seconds one (M, N, K) linear layer's step saves in float8 (3 GEMMs of 2 M N K at 2 P: 3 M N K
    / P) less what its casts add (CAST_BYTES for each element of the input, the output gradient
    and the weight); > 0: float8 wins."""
    return 3 * M * N * K / roof.flops - CAST_BYTES * (M * K + M * N + N * K) / roof.bandwidth
