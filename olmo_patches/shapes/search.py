"""Solving hourglass shapes to a parameter budget, and enumerating the paper's search space.

The budget is the paper's non-embedding count (attention + FFN weight matrices; norms, embeddings
and LM head excluded): ``N = L (4 d_model^2 + 3 K d_model d_h)`` for an hourglass model with MHA.

The authors' revised runs free the attention width a = n_heads x head_dim from d_model (their 906M
hourglass: 16 x 96 = 1536 on d_model 2496) and Megatron's query groups allow GQA. With
``attn_fraction`` f the solver fixes ``head_dim`` and takes n_heads = round(f d_model / head_dim)
(a multiple of ``kv_group``); with ``kv_group`` g, n_kv_heads = n_heads / g. Then
``N = L (2 d_model a (1 + 1/g) + 3 K d_model d_h)``, and d_h is solved exactly as before.

Matching within the paper's 0.001% is a number-theory problem, not a rounding one: one unit of d_h
moves N by ``3 K d_model L`` (about 0.09% of 113M at K=4, d_model 1374, L=6), a hundred times the
tolerance. So :func:`solve` searches d_model near the continuous solution
``d* = sqrt(N / (L (4 + 3 K r)))`` (r = the target d_h/d_model) and, for each d_model, takes the
d_h that meets the budget exactly, then rounds it. It walks an alignment ladder, most
hardware-friendly first (d_model and d_h multiples of 128, 64, ... 8 for d_model, ... 1 for d_h),
and keeps the first rung that meets the tolerance; :attr:`Shape.rounding` says which rung it was.
Heads always divide d_model with an even head dimension (RoPE rotates pairs of dimensions), a
multiple of 8 where one exists (flash-attention), nearest 64 below d_model 2048 and 128 from there
(GPT-2 small / OLMo-2 1B); rungs that allow a multiple of 8 come first.

Exact matching forces shapes GPU matmuls dislike (113M: d_h 621; 403M: head dim 218).
``aligned=True`` keeps only the rungs with d_model % 8 and d_h % 64 (so head dims are multiples
of 8) and trades the budget for them within :data:`ALIGNED_TOLERANCE`, the authors' own +-0.3%
(their revised configs match their baselines to 0.04-0.29%).

The paper reports attention/FFN splits, not shapes (113M: K=4, L=6 at about 45M/68M; the headline
K=2 run at 66M/47M). :func:`solve_split` takes the attention count as the target instead of
d_h/d_model: with MHA attention = 4 d_model^2 L fixes d_model, the budget fixes d_h, and the
shape nearest the split with a head dim that is a multiple of 8 (flash-attention) within
:data:`SPLIT_TOLERANCE` wins. ``nearest_ratio=True`` makes :func:`solve` take, of the shapes within
the tolerance (any even d_model, its heads as above), the one whose d_h/d_model is nearest the
target, for sweeps over d_h/d_model at that tolerance.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator, Optional

from .counts import attention_params, hourglass_ffn_params

__all__ = [
    "TOLERANCE",
    "ALIGNED_TOLERANCE",
    "ALIGNED_LADDER",
    "Shape",
    "SPLIT_TOLERANCE",
    "solve",
    "solve_split",
    "enumerate_shapes",
    "choose_heads",
    "attention_heads",
    "optimal_width_depth",
    "rank_key",
]

TOLERANCE = (
    1e-5  # the paper: every variant within 0.001% of its baseline's non-embedding parameters
)
# d_model rungs; below 8 the head dim cannot be a multiple of 8
D_MODEL_ALIGN = (128, 64, 32, 16, 8, 4, 2)
D_H_ALIGN = (128, 64, 32, 16, 8, 4, 2, 1)
# (d_model, d_h) rungs, most hardware-friendly first: d_model a multiple of 8 first (head dims that
# are multiples of 8, as flash-attention wants), then by the smaller of the two multiples, then
# d_model's.
LADDER = sorted(
    ((a, b) for a in D_MODEL_ALIGN for b in D_H_ALIGN),
    key=lambda ab: (-min(ab[0], 8), -min(ab), -ab[0], -ab[1]),
)
ALIGNED_TOLERANCE = 3e-3  # the authors' revised configs: within +-0.3% of their baselines
# d_model % 8, d_h % 64
ALIGNED_LADDER = tuple((a, b) for a, b in LADDER if a % 8 == 0 and b % 64 == 0)
SPLIT_TOLERANCE = 4e-4  # the tightest of the authors' revised configs (0.04%; they range to 0.29%)


@dataclass(frozen=True)
class Shape:
    """One hourglass shape (constant width; MHA at head_dim d_model / n_heads unless fixed_head_dim,
    n_kv_heads)."""

    K: int
    d_model: int
    n_layers: int
    d_h: int
    n_heads: int
    rounding: str = ""  # which alignment rung the solver used, e.g. "d_model % 64, d_h % 1"
    fixed_head_dim: Optional[int] = None  # head size apart from d_model (None: d_model / n_heads)
    n_kv_heads: Optional[int] = None  # GQA key/value heads (None: n_heads)

    @property
    def attention_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return (self.n_kv_heads or self.n_heads) * self.head_dim

    @property
    def attention(self) -> int:
        return attention_params(self.d_model, self.attention_width, self.kv_width) * self.n_layers

    @property
    def ffn(self) -> int:
        return hourglass_ffn_params(self.d_model, self.K, self.d_h) * self.n_layers

    @property
    def non_embedding(self) -> int:
        return self.attention + self.ffn

    @property
    def head_dim(self) -> int:
        return self.fixed_head_dim or self.d_model // self.n_heads

    @property
    def d_h_ratio(self) -> float:
        return self.d_h / self.d_model

    @property
    def width_depth(self) -> float:
        """d_model / L, the paper's width-to-depth ratio."""
        return self.d_model / self.n_layers

    def mismatch(self, budget: int) -> float:
        """Relative mismatch to the budget, signed."""
        return (self.non_embedding - budget) / budget

    def flops_per_token(self, seq_len: int, vocab_size: int) -> int:
        """OLMo-core's training FLOPs per token (6 per weight, causal attention, LM head), norms
        excluded."""
        return 6 * (
            self.non_embedding + vocab_size * self.d_model
        ) + 6 * self.n_layers * self.attention_width * (seq_len + 1)


@functools.lru_cache(maxsize=None)  # the solver asks about the same d_model values ~10^6 times
def choose_heads(d_model: int) -> Optional[int]:
    """Heads for d_model: head dim in [48, 256], even (RoPE rotates pairs), a multiple of 8 where
    d_model allows (flash-attention), nearest 64 (d_model < 2048) or 128 (GPT-2 small / OLMo-2
    1B)."""
    target = 64 if d_model < 2048 else 128
    step = 8 if d_model % 8 == 0 else 2
    dims = [h for h in range(48, 257, step) if d_model % h == 0]
    if not dims:
        return None
    return d_model // min(dims, key=lambda h: (abs(h - target), -h))


def solve(
    budget: int,
    *,
    K: int,
    n_layers: int,
    d_h_ratio: float,
    tolerance: float = TOLERANCE,
    windows: tuple[float, ...] = (0.04, 0.08),
    layer_slack: int = 0,
    ratio_slack: float = 0.2,
    attn_fraction: Optional[float] = None,
    head_dim: int = 64,
    kv_group: int = 1,
    aligned: bool = False,
    nearest_ratio: bool = False,
) -> Optional[Shape]:
    """The hourglass shape with K given, L = ``n_layers`` (or within ``layer_slack`` of it, nearest
    first), d_h/d_model within ``ratio_slack`` (relative) of ``d_h_ratio``, and the budget met
    within ``tolerance``. None when there is none. ``attn_fraction``: attention width near that
    fraction of d_model in heads of ``head_dim`` (None: MHA at d_model / n_heads); ``kv_group``:
    query heads per key/value head (GQA; 1: MHA); ``aligned``: only the :data:`ALIGNED_LADDER` rungs
    (pass ``tolerance=ALIGNED_TOLERANCE`` with it); ``nearest_ratio``: any even d_model, d_h any
    integer, the d_h/d_model nearest the target winning (pass ``tolerance=SPLIT_TOLERANCE`` with
    it).

    Search order: each L nearest ``n_layers`` first (another L only where this one has no shape in
    any window), each d_model window in turn (relative to the continuous solution d*), each
    alignment rung most aligned first; on a rung the d_model nearest d* wins.
    """
    layers = sorted(
        range(max(1, n_layers - layer_slack), n_layers + layer_slack + 1),
        key=lambda L: (abs(L - n_layers), L),
    )
    for L in layers:
        for window in windows:
            if nearest_ratio:
                attention = dict(attn_fraction=attn_fraction, head_dim=head_dim, kv_group=kv_group)
                shape = _solve_nearest_ratio(
                    budget, K, L, d_h_ratio, tolerance, window, ratio_slack, **attention
                )
                if shape is not None:
                    return shape
                continue
            shape = _solve_rungs(
                budget,
                K,
                L,
                d_h_ratio,
                tolerance,
                window,
                ratio_slack,
                attn_fraction,
                head_dim,
                kv_group,
                ALIGNED_LADDER if aligned else LADDER,
            )
            if shape is not None:
                return shape
    return None


def solve_split(
    budget: int,
    *,
    K: int,
    n_layers: int,
    attention: float,
    tolerance: float = SPLIT_TOLERANCE,
    window: float = 0.05,
) -> Optional[Shape]:
    """The MHA hourglass shape whose attention parameters are nearest ``attention`` (d_model nearest
    sqrt(attention / 4 L)), with d_model % 8 and a head dim that is a multiple of 8, and d_h the
    integer that meets the budget within ``tolerance``. None when no d_model within ``window``
    (relative) of the split's has one."""
    L = n_layers
    d_star = math.sqrt(attention / (4 * L))
    lo, hi = max(8, int(d_star * (1 - window))), int(math.ceil(d_star * (1 + window)))
    for d_model in sorted(range(lo + (-lo) % 8, hi + 1, 8), key=lambda d: (abs(d - d_star), d)):
        n_heads = choose_heads(d_model)
        if n_heads is None or (d_model // n_heads) % 8:
            continue
        d_h = round(_exact_d_h(budget, K, d_model, L))
        if d_h < 1:
            continue
        shape = Shape(K, d_model, L, d_h, n_heads, rounding="d_model % 8, d_h % 1 (split)")
        if abs(shape.mismatch(budget)) <= tolerance:
            return shape
    return None


def _exact_d_h(budget: int, K: int, d_model: int, L: int, attention: Optional[int] = None) -> float:
    """The d_h that meets the budget exactly: (N - attention) / (3 K d_model L), attention (default
    MHA's 4 d_model^2 L) and FFN from :mod:`.counts`."""
    if attention is None:
        attention = attention_params(d_model) * L
    return (budget - attention) / (hourglass_ffn_params(d_model, K, 1) * L)


def _per_layer(K: int, r: float, attn_fraction: Optional[float] = None, kv_group: int = 1) -> float:
    """N / (d_model^2 L) in the continuous limit, d_h = r d_model and attention width f d_model (f =
    ``attn_fraction``, 1 for MHA): 2 f (1 + 1/g) + 3 K r. Floats for the solvers' starting point d*;
    the exact integer counts are :mod:`.counts`'."""
    f = 1.0 if attn_fraction is None else attn_fraction
    return 2 * f * (1 + 1 / kv_group) + 3 * K * r


def attention_heads(
    d_model: int, attn_fraction: Optional[float] = None, head_dim: int = 64, kv_group: int = 1
) -> Optional[dict]:
    """Shape keywords of the attention for d_model (None: no valid head count)."""
    if attn_fraction is None:
        n_heads = choose_heads(d_model)
        if n_heads is None or n_heads % kv_group:
            return None
        return dict(n_heads=n_heads, n_kv_heads=n_heads // kv_group if kv_group > 1 else None)
    n_heads = max(1, round(attn_fraction * d_model / (head_dim * kv_group))) * kv_group
    return dict(
        n_heads=n_heads,
        fixed_head_dim=head_dim,
        n_kv_heads=n_heads // kv_group if kv_group > 1 else None,
    )


def _solve_rungs(
    budget: int,
    K: int,
    L: int,
    r: float,
    tolerance: float,
    window: float,
    ratio_slack: float,
    attn_fraction: Optional[float] = None,
    head_dim: int = 64,
    kv_group: int = 1,
    ladder: tuple = LADDER,
) -> Optional[Shape]:
    d_star = math.sqrt(budget / (L * _per_layer(K, r, attn_fraction, kv_group)))
    lo, hi = max(8, int(d_star * (1 - window))), int(math.ceil(d_star * (1 + window)))
    for a_d, a_h in ladder:
        best: Optional[Shape] = None
        for d_model in range(lo + (-lo) % a_d, hi + 1, a_d):
            if (attention := attention_heads(d_model, attn_fraction, head_dim, kv_group)) is None:
                continue
            exact = _exact_d_h(
                budget, K, d_model, L, Shape(K, d_model, L, 0, **attention).attention
            )
            d_h = int(round(exact / a_h)) * a_h
            if d_h < 1 or abs(d_h / d_model / r - 1) > ratio_slack:
                continue
            shape = Shape(K, d_model, L, d_h, rounding=f"d_model % {a_d}, d_h % {a_h}", **attention)
            if abs(shape.mismatch(budget)) > tolerance:
                continue
            if best is None or abs(d_model - d_star) < abs(best.d_model - d_star):
                best = shape
        if best is not None:
            return best
    return None


def _solve_nearest_ratio(
    budget: int,
    K: int,
    L: int,
    r: float,
    tolerance: float,
    window: float,
    ratio_slack: float,
    attn_fraction: Optional[float] = None,
    head_dim: int = 64,
    kv_group: int = 1,
) -> Optional[Shape]:
    """Any even d_model with its heads (MHA at d_model / n_heads, :func:`choose_heads`, or the
    attention of :func:`attention_heads` with ``attn_fraction``), d_h any integer: of the shapes
    within ``tolerance``, the one whose d_h/d_model is nearest ``r`` (a sweep over d_h/d_model gets
    its ratios)."""
    d_star = math.sqrt(budget / (L * _per_layer(K, r, attn_fraction, kv_group)))
    lo, hi = max(8, int(d_star * (1 - window))), int(math.ceil(d_star * (1 + window)))
    best: Optional[Shape] = None
    for d_model in range(lo + lo % 2, hi + 1, 2):
        if (attention := attention_heads(d_model, attn_fraction, head_dim, kv_group)) is None:
            continue
        d_h = round(
            _exact_d_h(budget, K, d_model, L, Shape(K, d_model, L, 0, **attention).attention)
        )
        if d_h < 1 or abs(d_h / d_model / r - 1) > ratio_slack:
            continue
        shape = Shape(K, d_model, L, d_h, rounding="d_model % 2, d_h % 1", **attention)
        if abs(shape.mismatch(budget)) <= tolerance and (
            best is None or abs(shape.d_h_ratio - r) < abs(best.d_h_ratio - r)
        ):
            best = shape
    return best


def optimal_width_depth(K: int) -> float:
    """The paper's U-curve optimum of d_model/L: about 180 at K=2, 110 at K=4 (linear between, flat
    outside)."""
    if K <= 2:
        return 180.0
    if K >= 4:
        return 110.0
    return 180.0 + (K - 2) * (110.0 - 180.0) / 2


def rank_key(shape: Shape) -> tuple:
    """The paper's findings as a sort key: d_h/d_model >= 0.4 first (below is clearly worse), then
    the distance of d_model/L from the K's U-curve optimum (log scale), then fewer FLOPs (smaller
    d_model)."""
    return (
        shape.d_h_ratio < 0.4 - 1e-9,
        abs(math.log(shape.width_depth / optimal_width_depth(shape.K))),
        shape.d_model,
    )


def enumerate_shapes(
    budget: int,
    *,
    Ks: range | list[int] = range(1, 11),
    d_h_ratios: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
    width_depth: tuple[float, float] = (50.0, 300.0),
    tolerance: float = TOLERANCE,
    attn_fractions: tuple[Optional[float], ...] = (None,),
    head_dim: int = 64,
    kv_group: int = 1,
    aligned: bool = False,
    nearest_ratio: bool = False,
) -> Iterator[Shape]:
    """Every solvable shape of the paper's search space: K, d_h/d_model, each attention width
    fraction (None: MHA at d_model), and each L whose solved d_model/L falls in ``width_depth``.
    Duplicates (same K, L, d_model, d_h, heads) are yielded once."""
    seen = set()
    for K in Ks:
        for r in d_h_ratios:
            for f in attn_fractions:
                per_layer = _per_layer(K, r, f, kv_group)  # N = per_layer d^2 L, d = rho L
                L_min = max(1, math.floor((budget / (per_layer * width_depth[1] ** 2)) ** (1 / 3)))
                L_max = math.ceil((budget / (per_layer * width_depth[0] ** 2)) ** (1 / 3))
                for L in range(L_min, L_max + 1):
                    shape = solve(
                        budget,
                        K=K,
                        n_layers=L,
                        d_h_ratio=r,
                        tolerance=tolerance,
                        attn_fraction=f,
                        head_dim=head_dim,
                        kv_group=kv_group,
                        aligned=aligned,
                        nearest_ratio=nearest_ratio,
                    )
                    if shape is None or not width_depth[0] <= shape.width_depth <= width_depth[1]:
                        continue
                    key = (
                        shape.K,
                        shape.n_layers,
                        shape.d_model,
                        shape.d_h,
                        shape.n_heads,
                        shape.head_dim,
                    )
                    if key not in seen:
                        seen.add(key)
                        yield shape
