"""Is a gap between two shapes bigger than the seed-to-seed noise, and how big a gap could the seeds
have seen? Intervals and tests over seeds, each at ``LEVEL`` (95%); what each assumes and how it was
checked: docs/statistics.md. The core functions take the seeds on the last axis of an array (the
simulation checks of tests/test_statistics.py run thousands at once):

- :func:`t_test`, :func:`mean_interval`: the Student-t interval of independent normal draws;
- :func:`paired_difference`: member - baseline paired by seed (the paired t-test), the seeds' sd of
  the differences and :func:`detectable`, the smallest true difference found at ``POWER`` (80%);
- :func:`holm`: Holm's step-down adjustment for several members against one baseline;
- :func:`matched_ratio`: the tokens ratio at matched loss on fitted curves (:func:`fit_curves`),
  seed by seed, with the t-interval of the mean log ratio;
- :func:`accuracy_interval`: a downstream accuracy over documents (clustered by passage) and seeds;
- :func:`bootstrap_means`: a percentile bootstrap over seeds for statistics of several configs'
  mean losses (the scaling fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize, stats

__all__ = [
    "LEVEL",
    "POWER",
    "Interval",
    "Paired",
    "t_test",
    "mean_interval",
    "paired_difference",
    "detectable",
    "holm",
    "fit_curves",
    "log_ratios",
    "matched_ratio",
    "accuracy_interval",
    "ratio_of_estimates",
    "bootstrap_means",
]

LEVEL = 0.95  # confidence level of every interval and test
POWER = 0.80  # the power at which the smallest detectable difference is stated
DISTINGUISHABLE, NOT_DISTINGUISHABLE = "distinguishable", "not distinguishable"


@dataclass(frozen=True)
class Interval:
    """A mean over n seeds and its interval (lo, hi; NaN below 2 seeds)."""

    mean: float
    lo: float
    hi: float
    n: int

    def exp(self) -> "Interval":
        return Interval(math.exp(self.mean), math.exp(self.lo), math.exp(self.hi), self.n)

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.lo):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def t_test(x, level: float = LEVEL):
    """(mean, half-width of the t-interval, two-sided p against 0, sd) over the last axis (n >= 2):
    the Student-t interval and one-sample t-test of independent normal draws."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    mean, sd = x.mean(axis=-1), x.std(axis=-1, ddof=1)
    se = sd / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / se, np.where(mean == 0, 0.0, np.inf))
    p = 2 * stats.t.sf(np.abs(t), n - 1)
    return mean, stats.t.ppf(0.5 + level / 2, n - 1) * se, p, sd


def mean_interval(x: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean and its Student-t interval (normal, independent draws)."""
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        raise ValueError("no values")
    if a.size < 2:
        return Interval(float(a.mean()), math.nan, math.nan, a.size)
    mean, half = (float(v) for v in t_test(a, level)[:2])
    return Interval(mean, mean - half, mean + half, a.size)


def detectable(sd, n: int, level: float = LEVEL, power: float = POWER):
    """The smallest true mean difference the two-sided paired t-test at ``level`` finds with
    probability ``power`` from n pairs whose differences have standard deviation ``sd``: the
    noncentrality delta of the noncentral t (n - 1 df) with that power, times sd / sqrt(n)."""
    if n < 2:
        return math.nan * np.asarray(sd)
    crit = stats.t.ppf(0.5 + level / 2, n - 1)

    def shortfall(delta):
        lower = np.nan_to_num(stats.nct.cdf(-crit, n - 1, delta))  # NaN far out at 1 df: 0
        return stats.nct.sf(crit, n - 1, delta) + lower - power

    return optimize.brentq(shortfall, 0.0, 100.0) * np.asarray(sd) / math.sqrt(n)


@dataclass(frozen=True)
class Paired:
    """member - baseline over the seeds both have: its t-interval, p-value, the seeds' standard
    deviation of the differences and the smallest difference detectable at ``POWER``."""

    diff: Interval
    p: float
    seeds: Tuple[int, ...]
    sd: float
    detectable: float

    @property
    def verdict(self) -> str:
        return verdict(self.p, self.diff.n)


def verdict(p: float, n: int) -> str:
    """The test's word for p over n seeds."""
    if n < 2:
        return "one seed: no test"
    return DISTINGUISHABLE if p < 1 - LEVEL else NOT_DISTINGUISHABLE


def paired_difference(
    member: Mapping[int, float], baseline: Mapping[int, float], level: float = LEVEL
) -> Paired:
    """member - baseline, paired by seed (the seeds both have)."""
    seeds = tuple(sorted(member.keys() & baseline.keys()))
    if not seeds:
        raise ValueError("no seed in common")
    d = np.array([member[s] - baseline[s] for s in seeds])
    if len(seeds) < 2:
        return Paired(
            Interval(float(d[0]), math.nan, math.nan, 1), math.nan, seeds, *[math.nan] * 2
        )
    mean, half, p, sd = (float(v) for v in t_test(d, level))
    interval = Interval(mean, mean - half, mean + half, len(seeds))
    return Paired(interval, p, seeds, sd, float(detectable(sd, len(seeds), level)))


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values over the last axis: the i-th smallest times (k - i + 1),
    made non-decreasing, capped at 1. A member whose adjusted p is below 1 - LEVEL is
    distinguishable with the family-wise error rate of all k kept at 1 - LEVEL."""
    p = np.asarray(p, dtype=float)
    k = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * (k - np.arange(k))
    adjusted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out


ALPHAS = np.geomspace(0.02, 4.0, 160)  # the exponents the curve fit searches
REACH = 2.0  # a member's fitted curve is followed up to this multiple of its last evaluation


def fit_curves(tokens, loss) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E, A, alpha) of L(t) = E + A t^-alpha, least squares over the evaluations at t > 0 (the
    last axis; at least 3), for every curve of ``loss`` (..., evaluations) at once: E and A
    solved exactly at each alpha of a fine grid, the best alpha kept. A curve that does not fall
    (best A <= 0) gets NaN."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(loss, dtype=float)[..., t > 0]
    x = t[t > 0][None, :] ** -ALPHAS[:, None]  # (alphas, m)
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    a = (yc @ xc.T) / (xc * xc).sum(axis=1)  # (..., alphas)
    sse = (yc * yc).sum(axis=-1, keepdims=True) - a * a * (xc * xc).sum(axis=1)
    best = np.argmin(np.where(a > 0, sse, np.inf), axis=-1)
    A = np.take_along_axis(a, best[..., None], axis=-1)[..., 0]
    E = y.mean(axis=-1) - A * x.mean(axis=1)[best]
    ok = A > 0
    return np.where(ok, E, np.nan), np.where(ok, A, np.nan), np.where(ok, ALPHAS[best], np.nan)


def log_ratios(member, member_tokens, baseline, baseline_tokens) -> np.ndarray:
    """ln(tokens the member's fitted curve needs to reach the baseline's fitted final loss / the
    baseline's final tokens), curve by curve (paired: seed s against seed s, the seeds on the
    second-to-last axis); NaN where the member does not reach it within ``REACH`` x its own last
    evaluation or a curve does not fall."""
    t_base, t_member = float(np.max(baseline_tokens)), float(np.max(member_tokens))
    E, A, alpha = fit_curves(baseline_tokens, baseline)
    target = E + A * t_base**-alpha
    E, A, alpha = fit_curves(member_tokens, member)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.log(A / (target - E)) / alpha
    return np.where((target > E) & (t <= math.log(REACH * t_member)), t - math.log(t_base), np.nan)


def matched_ratio(
    member: Mapping[int, Sequence[float]],
    member_tokens: Sequence[float],
    baseline: Mapping[int, Sequence[float]],
    baseline_tokens: Sequence[float],
    level: float = LEVEL,
) -> Tuple[Optional[Interval], str]:
    """(the geometric mean over seeds of the matched-loss tokens ratio with its t-interval, "") or
    (None, why it is not estimable): each side's curves at its ``tokens``, the seeds both have."""
    seeds = sorted(member.keys() & baseline.keys())
    if min(sum(np.asarray(t) > 0) for t in (member_tokens, baseline_tokens)) < 3:
        return None, "fewer than 3 evaluations after step 0: no curve to fit"
    m, b = (np.array([c[s] for s in seeds], dtype=float) for c in (member, baseline))
    r = log_ratios(m, member_tokens, b, baseline_tokens)
    if missed := [s for s, v in zip(seeds, r) if np.isnan(v)]:
        return None, (
            f"seed(s) {','.join(map(str, missed))} do not reach the baseline's final loss within "
            f"{REACH:g}x their tokens"
        )
    return mean_interval(r, level).exp(), ""


def accuracy_interval(
    correct, clusters: Optional[Sequence] = None, level: float = LEVEL
) -> Interval:
    """Mean accuracy over seeds and items, ``correct`` (seeds, items) in [0, 1], with an interval
    for the accuracy of the task's item population and the config's seed distribution: the
    clustered standard error over items (their mean over seeds; ``clusters``: each item's passage,
    items of one passage a cluster; default each item its own) and the seeds' own spread,
    combined, with Satterthwaite's degrees of freedom."""
    x = np.atleast_2d(np.asarray(correct, dtype=float))
    seeds, items = x.shape
    mean = float(x.mean())
    ids = np.unique(np.arange(items) if clusters is None else np.asarray(clusters),
                    return_inverse=True)[1]  # fmt: skip
    sums = np.bincount(ids, weights=x.mean(axis=0) - mean)
    c = sums.size
    v_items = c / max(c - 1, 1) * float((sums * sums).sum()) / items**2
    v_seeds = float(x.mean(axis=1).var(ddof=1)) / seeds if seeds > 1 else 0.0
    v = v_items + v_seeds
    df = v * v / (v_items**2 / max(c - 1, 1) + (v_seeds**2 / (seeds - 1) if seeds > 1 else 0.0))
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(v) if v > 0 else 0.0
    return Interval(mean, mean - half, mean + half, seeds)


def ratio_of_estimates(
    log_a: float,
    err_a: float,
    df_a: int,
    log_b: float,
    err_b: float,
    df_b: int,
    level: float = LEVEL,
) -> Interval:
    """exp(log_a - log_b) with its t-interval, for two independent estimates of logs with standard
    errors ``err_*`` on ``df_*`` residual degrees of freedom (two fits' ln C at one loss):
    Welch-Satterthwaite's degrees of freedom for the difference."""
    va, vb = err_a * err_a, err_b * err_b
    df = (va + vb) ** 2 / (va * va / df_a + vb * vb / df_b) if va + vb > 0 else min(df_a, df_b)
    d, half = log_a - log_b, float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(va + vb)
    return Interval(d, d - half, d + half, 0).exp()


def bootstrap_means(
    samples: Sequence[Sequence[float]],
    statistic: Callable[[np.ndarray], np.ndarray],
    level: float = LEVEL,
    resamples: int = 2000,
    seed: int = 0,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point, lo, hi) of ``statistic`` (a vector) of the samples' means: the percentile
    bootstrap, each sample (one config's seeds) resampled with replacement on its own, a sample of
    one value fixed. ``statistic`` maps means (..., samples) to (..., k), vectorized over the
    leading axes. NaN bounds where no sample has 2 values or a resample's statistic is NaN."""
    arrays = [np.asarray(x, dtype=float) for x in samples]
    point = np.asarray(statistic(np.array([a.mean() for a in arrays])), dtype=float)
    if all(a.size < 2 for a in arrays):
        return point, np.full_like(point, math.nan), np.full_like(point, math.nan)
    rng = np.random.default_rng(seed)
    means = np.stack(  # (resamples, samples): each sample's mean in each resample
        [a[rng.integers(0, a.size, (resamples, a.size))].mean(axis=1) for a in arrays], axis=1
    )
    lo, hi = np.percentile(statistic(means), [50 * (1 - level), 50 * (1 + level)], axis=0)
    return point, lo, hi
