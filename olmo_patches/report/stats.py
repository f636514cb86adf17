"""Is a gap between two shapes bigger than the seed-to-seed noise? Intervals and tests over seeds.

Each member of a sweep is trained once per seed s (``scripts/sweep.py --seeds``); its final
validation loss L_s is one draw. The tests, all at ``LEVEL`` (95%), assume:

- **Mean loss**: the L_s of one member are independent draws from a normal distribution (a
  Student-t interval, n - 1 degrees of freedom; n >= 2). Perplexity's interval is exp of the loss's
  (the geometric mean perplexity over seeds).
- **Paired difference**: member and baseline share seed s (the same init seed and data order), so
  d_s = L_member,s - L_baseline,s removes what the seed does to both alike; the d_s are independent
  and normal (the paired t-test). "distinguishable" when the interval of the mean d excludes 0
  (equivalently p < 1 - LEVEL); "not distinguishable" otherwise. Not distinguishable is not "equal":
  the interval says how large a gap the seeds can hide.
- **Noise floor**: every pair of the baseline's seeds, |L_i - L_j|: the gap two runs of the *same*
  config show. A single-seed comparison below it says nothing.
- **Matched-loss ratios** (bootstrap): the tokens (and FLOPs) a member's mean validation curve needs
  to reach the baseline's mean final loss, over the baseline's; its interval is the percentile
  bootstrap over seeds resampled with replacement, member and baseline together
  (``scipy.stats.bootstrap``, paired). With 5 seeds the bootstrap's interval is rough (it cannot be
  wider than what 5 seeds show): treat it as a range, not an exact 95%.
- **Scaling fits over seeds** (:func:`bootstrap_means`): a statistic of several configs' mean
  losses (a fit's a and b, a matched-loss ratio) with a percentile bootstrap whose unit is one
  seed's run: each config's seeds are resampled with replacement, independently of the other
  configs' (a numpy resample), and the statistic recomputed from the resampled means; a config
  of one seed stays fixed. Same caveat: with a few seeds per config, a range.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

__all__ = [
    "LEVEL",
    "Interval",
    "Paired",
    "NoiseFloor",
    "mean_interval",
    "paired_difference",
    "noise_floor",
    "tokens_to_reach",
    "matched_loss_ratio",
    "bootstrap_means",
]

LEVEL = 0.95  # confidence level of every interval and test
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

    def covers(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.lo):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


@dataclass(frozen=True)
class Paired:
    """Mean of member - baseline over the seeds both have, its t-interval and p-value."""

    diff: Interval
    p: float
    seeds: Tuple[int, ...]

    @property
    def verdict(self) -> str:
        if self.diff.n < 2:
            return "one seed: no test"
        return NOT_DISTINGUISHABLE if self.diff.covers(0.0) else DISTINGUISHABLE


@dataclass(frozen=True)
class NoiseFloor:
    """|L_i - L_j| over the baseline's seed pairs."""

    pairs: int
    rms: float  # root mean square gap (sqrt(2) x the seeds' standard deviation, on average)
    largest: float


def mean_interval(x: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean and its Student-t interval (normal, independent draws)."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n == 0:
        raise ValueError("no values")
    mean = float(a.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * a.std(ddof=1) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired_difference(
    member: Mapping[int, float], baseline: Mapping[int, float], level: float = LEVEL
) -> Paired:
    """member - baseline, paired by seed (the seeds both have)."""
    seeds = tuple(sorted(member.keys() & baseline.keys()))
    if not seeds:
        raise ValueError("no seed in common")
    d = np.array([member[s] - baseline[s] for s in seeds])
    interval = mean_interval(d, level)
    if len(seeds) < 2:
        p = math.nan
    elif d.std(ddof=1) == 0:
        p = 1.0 if d.mean() == 0 else 0.0
    else:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return Paired(interval, p, seeds)


def noise_floor(baseline: Mapping[int, float]) -> Optional[NoiseFloor]:
    """The baseline against itself: every pair of its seeds (None below 2 seeds)."""
    gaps = [abs(a - b) for a, b in itertools.combinations(baseline.values(), 2)]
    if not gaps:
        return None
    return NoiseFloor(len(gaps), float(np.sqrt(np.mean(np.square(gaps)))), float(max(gaps)))


def tokens_to_reach(tokens: Sequence[float], loss: Sequence[float], target: float) -> float:
    """The first point where the curve reaches ``target``, linearly interpolated between
    evaluations; NaN when it never does."""
    t, y = np.asarray(tokens, dtype=float), np.asarray(loss, dtype=float)
    below = np.nonzero(y <= target)[0]
    if below.size == 0:
        return math.nan
    i = int(below[0])
    if i == 0:
        return float(t[0])
    frac = (y[i - 1] - target) / (y[i - 1] - y[i])
    return float(t[i - 1] + frac * (t[i] - t[i - 1]))


def _ratio(member: np.ndarray, baseline: np.ndarray, tokens: np.ndarray) -> float:
    """Tokens the mean member curve needs for the mean baseline's final loss, over the
    baseline's."""
    m, b = member.mean(axis=0), baseline.mean(axis=0)
    base = tokens_to_reach(tokens, b, b[-1])
    # reached at 0 tokens: no ratio
    return tokens_to_reach(tokens, m, b[-1]) / base if base > 0 else math.nan


def matched_loss_ratio(
    member: Mapping[int, Sequence[float]],
    baseline: Mapping[int, Sequence[float]],
    tokens: Sequence[float],
    level: float = LEVEL,
    resamples: int = 2000,
    seed: int = 0,
    statistic: Callable[[np.ndarray, np.ndarray, np.ndarray], float] = _ratio,
) -> Interval:
    """Matched-loss token ratio over the seeds both have (validation curves at the same ``tokens``),
    with a paired percentile bootstrap over seeds (NaN bounds below 2 seeds or when a resample's
    member never reaches the target). Scale by FLOPs per token for the FLOPs ratio."""
    seeds = sorted(member.keys() & baseline.keys())
    if not seeds:
        raise ValueError("no seed in common")
    m = np.array([member[s] for s in seeds], dtype=float)
    b = np.array([baseline[s] for s in seeds], dtype=float)
    x = np.asarray(tokens, dtype=float)
    point = statistic(m, b, x)
    if len(seeds) < 2 or math.isnan(point):
        return Interval(point, math.nan, math.nan, len(seeds))
    idx = np.arange(len(seeds))

    def resampled(i: np.ndarray) -> float:
        i = i.astype(int)
        return statistic(m[i], b[i], x)

    res = stats.bootstrap(
        (idx,), resampled, vectorized=False, confidence_level=level, n_resamples=resamples,
        method="percentile", rng=np.random.default_rng(seed),
    )  # fmt: skip
    lo, hi = res.confidence_interval
    return Interval(point, float(lo), float(hi), len(seeds))


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
