"""Scaling fits and matched-loss compute: L = a C^b per family of runs, and the FLOPs each family
needs to reach a given loss (paper 2's "22% fewer FLOPs under fitted loss-matched scaling curves").

A run's point: C = training FLOPs = its FLOPs per token x the tokens it trained (last step x global
batch x sequence length), in PF-days (:data:`PF_DAY`, 8.64e19 FLOPs: paper 2's unit, the one in
which refitting its own table gives its printed a and b); L = its final validation loss
(``Run.val_loss``). Two FLOP counts, one for the papers and one for the hardware:

- the authors' (:func:`authors_flops_per_token`, paper 2's ``compute_metrics``): 3 x the forward
  FLOPs, 2 per weight a token uses, full s x s attention, the idle first/last-layer slices of a
  variable-width model left out. Every fit and ratio compared with the paper's numbers uses it;
- OLMo-core's (``num_flops_per_token`` of the built model: causal attention, every computed matmul),
  kept as separately labelled columns. On it the x shape costs about what the baseline does (+0.11,
  -0.54, +0.24, -0.06% at 200M-2B, where the authors' count gives -3.2, -3.6, -2.6, -2.6%), so a
  matched-loss ratio on it is not the paper's quantity (docs/variable_width.md).

Runs fall into families by shape (:func:`family`: the block kind's label), and each family with
runs at 2 or more compute budgets gets

    ln L = ln a + b ln C        (ordinary least squares in log space)

with the covariance of (ln a, b) from the residual variance, s^2 (X^T X)^-1, s^2 = RSS / (n - 2):
the standard errors of a (a x se(ln a)) and b need 3 or more runs. The compute a family needs for a
loss L* is C(L*) = (L* / a)^(1/b), with the standard error of ln C(L*) by the delta method; the
matched-loss ratio is C_family(L*) / C_baseline(L*) (independent of the unit). L* defaults to the
loss of the baseline family's run with the most compute (the paper: the 2B baseline's loss, reached
by x with 77.8% of its FLOPs).

The same fit and solve against a run's mean layer width W (the mean of its layers' widths; d_model
at constant width), L = a W^b, gives the mean width each family needs for the target loss: the KV
cache per token is 2 W L, so at matched loss the ratio of mean widths is the paper's KV-cache saving
(85.1% of the baseline's at the 2B baseline's loss, the abstract's 15%), not the 10-11% of the
equal-size rows. :func:`paper_matched_loss` repeats both solves on the paper's own four dense rows
(docs/variable_width.md): a 3.160, b -0.04979 (baseline) and a 3.125, b -0.05033 (x) in PF-days (the
paper: 3.16, -0.0498 and 3.12, -0.0503), 77.6% of the FLOPs (the paper: 77.8%; its rounded constants
give 75.5%) and 85.1% of the mean width.

Seeds: the seeds of one config (tables.py ``group_seeds``) are one point at their mean loss.
Where a family's points have several seeds, a, b and the matched-loss FLOPs and width ratios get
a 95% percentile bootstrap over seeds (stats.py ``bootstrap_means``, a numpy resample, 2000
draws): the unit is one seed's run, resampled with replacement within its config, every config on
its own; the fits are redone on the resampled mean
losses, each point's C and the target loss held. Where every point has one seed, a and b keep the
standard errors above, and the matched-loss ratios get a t-interval from both fits' standard errors
of ln C at the target (stats.py ``ratio_of_estimates``: independent fits, Welch-Satterthwaite's
degrees of freedom; 95% +- 2% coverage in tests/test_scaling.py's simulation); with 2 points a
fit has no residual and the ratio is "not estimable".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..blocks import block_of
from . import stats
from .tables import Run, SeedGroup

__all__ = [
    "fit_power_law",
    "family",
    "scaling_points",
    "scaling_tables",
    "paper_matched_loss",
    "paper_matched_loss_rows",
    "fits",
    "Point",
    "PF_DAY",
    "authors_flops_per_token",
]

# FLOPs in a petaFLOP/s-day: C's unit in every fit (paper 2's: its table refits to its a, b)
PF_DAY = 8.64e19
C_LABEL = "PF-days, authors' count"  # the unit and FLOP count of C in the tables' column names


@dataclass(frozen=True)
class PowerLaw:
    """L = a C^b (C in PF-days), fitted to n points; cov: the covariance of (ln a, b)."""

    a: float
    b: float
    cov: np.ndarray
    n: int

    @property
    def a_err(self) -> float:
        return self.a * math.sqrt(self.cov[0, 0])

    @property
    def b_err(self) -> float:
        return math.sqrt(self.cov[1, 1])

    def loss(self, C: np.ndarray | float) -> np.ndarray | float:
        return self.a * np.power(C, self.b)

    def compute_at(self, L: float) -> float:
        """C(L) = (L / a)^(1/b), in the unit of the fitted C."""
        return math.exp((math.log(L) - math.log(self.a)) / self.b)

    def compute_log_err(self, L: float) -> float:
        """Standard error of ln C(L): ln C = (ln L - ln a) / b, gradient (-1/b, -ln C / b) on
        (ln a, b)."""
        g = np.array([-1.0 / self.b, -math.log(self.compute_at(L)) / self.b])
        return float(math.sqrt(g @ self.cov @ g))


def fit_power_law(C: Sequence[float], L: Sequence[float]) -> PowerLaw:
    """Least squares of ln L on ln C (2 or more distinct C; with 2 the covariance is NaN)."""
    x, y = np.log(np.asarray(C, dtype=float)), np.log(np.asarray(L, dtype=float))
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("a power law needs runs at 2 or more compute budgets")
    X = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    n = len(x)
    s2 = float(np.sum((y - X @ coef) ** 2) / (n - 2)) if n > 2 else math.nan
    return PowerLaw(a=math.exp(coef[0]), b=float(coef[1]), cov=s2 * np.linalg.inv(X.T @ X), n=n)


def family(spec) -> str:
    """A run's model as its kind labels it: baseline (a constant-width variable-width schedule
    too), hourglass, or a variable-width shape (x, v, ^, 3) with its resizing when not
    carry-forward; "MoE" appended."""
    m = spec.model
    return block_of(m).label(m)


def authors_flops_per_token(spec) -> float:
    """Training FLOPs per token as the papers' authors count them (paper 2's ``compute_metrics``): 3
    x forward FLOPs per sequence / s, as the model's kind counts it (``BlockKind.paper_counts``:
    paper 2's own rule for its layers, the built weights' for OLMo-core's and the hourglass's)."""
    from .counts import paper_report

    return paper_report(spec)["authors_flops_per_token"]


def run_compute_and_width(run: Run, spec) -> tuple[float, float, float]:
    """A run's training FLOPs so far in PF-days on the authors' count and on OLMo-core's (FLOPs per
    token x last step x batch x sequence length), and the mean of its layer widths (variable width:
    its schedule's w_l; otherwise d_model); ``spec``: its recorded config, loaded."""
    from .counts import count

    m = spec.model
    tokens = run.last_step * spec.train.global_batch_size * spec.data.sequence_length
    widths = m.layer_widths
    authors, olmo = authors_flops_per_token(spec), count(spec).flops_per_token
    return authors * tokens / PF_DAY, olmo * tokens / PF_DAY, sum(widths) / len(widths)


class Point(NamedTuple):
    C: float  # training FLOPs so far, PF-days, the authors' count (a seed group: the seeds' mean)
    L: float  # validation loss (a seed group: the mean over its seeds)
    run: str
    W: float  # mean layer width
    C_olmo: float  # training FLOPs so far, PF-days, OLMo-core's count
    seeds: Tuple[float, ...] = ()  # a seed group's final validation loss of each seed


def _point(run: Run) -> Optional[Tuple[str, Point]]:
    """A run's family and point, or a seed group's: the mean loss and compute over its seeds with
    a loss (C of each in proportion to its steps), None without one."""
    seeds = run.seeds if isinstance(run, SeedGroup) else {0: run}
    done = [r for r in seeds.values() if r.val_loss() is not None and r.last_step > 0]
    if not done:
        return None
    spec = done[0].spec  # the seeds' model and data are the same
    C, C_olmo, width = run_compute_and_width(done[0], spec)
    steps = np.array([r.last_step for r in done], dtype=float) / done[0].last_step
    losses = tuple(float(r.val_loss()) for r in done)  # type: ignore[arg-type]
    return family(spec), Point(
        C * steps.mean(),
        float(np.mean(losses)),
        run.name,
        width,
        C_olmo * steps.mean(),
        losses if isinstance(run, SeedGroup) else (),
    )


def scaling_points(runs: Dict[str, Run]) -> Dict[str, List[Point]]:
    """{family: [Point, ...] by C} for the runs (and seed groups) with a validation loss."""
    points: Dict[str, List[Point]] = {}
    for _, run in sorted(runs.items()):
        if (found := _point(run)) is not None:
            points.setdefault(found[0], []).append(found[1])
    return {f: sorted(p) for f, p in points.items()}


def fits(points: Dict[str, List[Point]], x: str = "C") -> Dict[str, PowerLaw]:
    """L = a X^b per family with runs at 2 or more values of X: compute ``C`` (the authors' count),
    ``C_olmo`` (OLMo-core's) or mean width ``W``."""
    return {
        f: fit_power_law([getattr(p, x) for p in pts], [p.L for p in pts])
        for f, pts in points.items()
        if len({getattr(p, x) for p in pts}) >= 2
    }


def _err(x: float, digits: int) -> str:
    return "n/a (2 runs)" if math.isnan(x) else f"{x:.{digits}f}"


def _paper_fit(ref: dict, f: str) -> str:
    """The paper's fit for a family (C in PF-days, the authors' count), or "" where none."""
    return f"a {ref[f + '_a']}, b {ref[f + '_b']}" if f in ("baseline", "x") else ""


ONE_SEED = "one seed per point: std errors only"  # a family's bootstrap cell without seeds
BOOT = "95%, bootstrap over seeds"  # the bootstrap columns' label
FIT = "95%, the fits' errors"  # the ratios' interval with one seed per point


def _seeded(pts: Sequence[Point]) -> bool:
    return any(len(p.seeds) > 1 for p in pts)


def _samples(pts: Sequence[Point]) -> List[Sequence[float]]:
    """Each point's seeds' losses (one loss for a single run): the bootstrap's samples."""
    return [p.seeds or (p.L,) for p in pts]


def _bracket(x: float, lo: float, hi: float, fmt: str) -> str:
    return f"{x:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def fit_rows(points: Dict[str, List[Point]], ref: dict) -> List[dict]:
    """``scaling_fit``: a, b and their standard errors per family; where a family's points have
    several seeds, their bootstrap intervals over seeds (stats.bootstrap_means)."""
    fitted, fitted_olmo = fits(points), fits(points, x="C_olmo")
    seeded = any(_seeded(p) for p in points.values())
    rows = []
    for f, law in fitted.items():
        olmo, pts = fitted_olmo.get(f), points[f]
        row = {
            "family": f,
            "runs": ", ".join(p.run for p in pts),
            f"C range ({C_LABEL})": f"{pts[0].C:.3g}-{pts[-1].C:.3g}",
            "a": f"{law.a:.4g}",
            "a std err": _err(law.a_err, 4),
            "b": f"{law.b:.5f}",
            "b std err": _err(law.b_err, 5),
            "paper": _paper_fit(ref, f),
            "a, b (OLMo-core's count)": f"{olmo.a:.4g}, {olmo.b:.5f}" if olmo is not None else "",
        }
        if seeded:
            row["seeds per point"] = ", ".join(str(len(p.seeds) or 1) for p in pts)
            row[f"a [{BOOT}]"] = row[f"b [{BOOT}]"] = ONE_SEED
            if _seeded(pts):
                C = [p.C for p in pts]
                (a, b), lo, hi = stats.bootstrap_means(
                    _samples(pts), lambda m: np.stack(_fit_many(C, m), axis=-1)
                )
                row[f"a [{BOOT}]"] = _bracket(a, lo[0], hi[0], ".5g")
                row[f"b [{BOOT}]"] = _bracket(b, lo[1], hi[1], ".5f")
        rows.append(row)
    return rows


def _fit_many(x: Sequence[float], losses: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(a, b) of L = a x^b for each row of ``losses`` (..., points): :func:`fit_power_law`'s
    least squares in log space, in closed form."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(losses)
    dx = lx - lx.mean()
    b = (ly - ly.mean(axis=-1, keepdims=True)) @ dx / (dx @ dx)
    return np.exp(ly.mean(axis=-1) - b * lx.mean()), b


def _ratios(points: Dict[str, List[Point]], f: str, target: float):
    """(point, lo, hi) of family f's C and mean width at ``target`` over the baseline's: both
    families' fits redone on each resample of their points' seeds; the target held."""
    base, pts = points["baseline"], points[f]
    widths = all(len({p.W for p in q}) >= 2 for q in (base, pts))

    def ratios(means: np.ndarray) -> np.ndarray:
        lb, lf = means[..., : len(base)], means[..., len(base) :]
        c = _at(pts, lf, "C", target) / _at(base, lb, "C", target)
        w = _at(pts, lf, "W", target) / _at(base, lb, "W", target) if widths else c * math.nan
        return np.stack([c, w], axis=-1)

    return stats.bootstrap_means(_samples(base) + _samples(pts), ratios)


def _at(pts: Sequence[Point], losses: np.ndarray, x: str, target: float) -> np.ndarray:
    """X(target) = (target / a)^(1/b) of each row's fit (PowerLaw.compute_at)."""
    a, b = _fit_many([getattr(p, x) for p in pts], losses)
    return np.exp((math.log(target) - np.log(a)) / b)


def matched_rows(
    points: Dict[str, List[Point]], ref: dict, target_loss: Optional[float]
) -> List[dict]:
    """``matched_loss``: each family's C at the target loss and its ratio to the baseline's on both
    counts, and the mean width's; where seeds exist, the ratios' bootstrap intervals over seeds."""
    fitted = fits(points)
    if target_loss is None and "baseline" in points:
        target_loss = points["baseline"][-1].L
    if target_loss is None or not fitted:
        return []
    laws = {"C": fitted, "C_olmo": fits(points, x="C_olmo"), "W": fits(points, x="W")}

    def ratio(x: str, f: str) -> str:
        if f not in laws[x] or "baseline" not in laws[x]:
            return "no baseline fit" if f in laws[x] else "n/a"
        at = {g: laws[x][g].compute_at(target_loss) for g in (f, "baseline")}
        return f"{at[f] / at['baseline']:.1%}"

    rows = []
    for f, law in fitted.items():
        err = law.compute_log_err(target_loss) if law.n > 2 else math.nan
        w = laws["W"][f].compute_at(target_loss) if f in laws["W"] else None
        rows.append(
            {
                "family": f,
                "target loss": f"{target_loss:.4f}",
                f"C at target ({C_LABEL})": f"{law.compute_at(target_loss):.4g}",
                "ln C std err": _err(err, 3),
                "C / baseline's": ratio("C", f),
                "mean width at target": f"{w:.1f}" if w is not None else "one width",
                "mean width (KV cache) / baseline's": ratio("W", f),
                "paper": _paper_ratio(ref) if f == "x" else "",
                "C / baseline's (OLMo-core's count)": ratio("C_olmo", f),
            }
        )
    for row in rows:
        row.update(_ratio_cells(points, row["family"], target_loss, laws))
    return rows


def _paper_ratio(ref: dict) -> str:
    return (
        f"{ref['x_flops_fraction']:.1%} FLOPs, {ref['x_mean_width_fraction']:.1%} mean width "
        "(x, at the 2B baseline's loss)"
    )


def _ratio_cells(points, f: str, target: float, laws) -> Dict[str, str]:
    """The matched-loss ratios' interval cells of family f's row: the bootstrap over seeds where
    either family has several seeds, else the fits' errors (BOOT or FIT columns, as the table)."""
    seeded = any(_seeded(p) for p in points.values())
    keys = tuple(f"{x} / baseline's [{BOOT if seeded else FIT}]" for x in ("C", "mean width"))
    if f == "baseline" or "baseline" not in laws["C"]:
        return dict.fromkeys(keys, "")
    if not (_seeded(points[f]) or _seeded(points["baseline"])):
        cells = (_fit_ratio(laws[x], f, target) for x in ("C", "W"))
        return {k: v + (" (the fits' errors: one seed per point)" if seeded and "[" in v else "")
                for k, v in zip(keys, cells)}  # fmt: skip
    (c, w), lo, hi = _ratios(points, f, target)
    width = _bracket(w, lo[1], hi[1], ".1%") if not math.isnan(w) else "n/a"
    return {keys[0]: _bracket(c, lo[0], hi[0], ".1%"), keys[1]: width}


def _fit_ratio(laws: Dict[str, PowerLaw], f: str, target: float) -> str:
    """Family f's X at ``target`` over the baseline's, with the two fits' t-interval."""
    if f not in laws or "baseline" not in laws:
        return "n/a"
    lf, lb = laws[f], laws["baseline"]
    if min(lf.n, lb.n) <= 2:
        return "not estimable: a fit of 2 points has no residual"
    r = stats.ratio_of_estimates(
        math.log(lf.compute_at(target)), lf.compute_log_err(target), lf.n - 2,
        math.log(lb.compute_at(target)), lb.compute_log_err(target), lb.n - 2,
    )  # fmt: skip
    return _bracket(r.mean, r.lo, r.hi, ".1%")


def scaling_tables(
    points: Dict[str, List[Point]], paper: dict, target_loss: Optional[float] = None
) -> Dict[str, List[dict]]:
    """``scaling_fit`` (a, b and their standard errors per family on the authors' count, the paper's
    fit beside, and a, b on OLMo-core's count) and ``matched_loss`` (each family's C at the target
    loss and its ratio to the baseline's on both counts, the paper's x ratio beside); both empty
    without two runs of a family. C in PF-days. A seed group (tables.group_seeds) is one point, its
    mean loss; where a family's points have several seeds both tables add percentile bootstrap
    intervals over seeds (:func:`~olmo_patches.report.stats.bootstrap_means`: each point's seeds
    resampled with replacement, the fits redone; the target loss held). ``points``:
    :func:`scaling_points` of the runs."""
    ref = paper["variable_width"]["scaling"]
    return {
        "scaling_fit": fit_rows(points, ref),
        "matched_loss": matched_rows(points, ref, target_loss),
    }


def paper_matched_loss(
    rows: Sequence[dict], vocab_size: int, seq_len: int, target_loss: Optional[float] = None
) -> dict:
    """Paper 2's matched-loss figures from its own table. ``rows``: the dense sizes, each with h,
    n_layers, batch (sequences), steps, baseline and x (final losses), flops and mean_width (x's
    change vs the baseline at that size, e.g. -0.025). C = 3 x the authors' forward FLOPs per
    sequence (``paper_flops``) x sequences, in PF-days; x's C and mean width are the baseline's
    times (1 + change). Returns the four fits and x's fraction of the baseline's FLOPs and mean
    width at ``target_loss`` (default: the largest baseline's loss, the paper's 2B 2.751)."""
    from ..shapes.widths import paper_flops

    C = [
        3
        * paper_flops([r["h"]] * r["n_layers"], r["h"], vocab_size, seq_len)
        * r["batch"]
        * r["steps"]
        / PF_DAY
        for r in rows
    ]
    base_c = fit_power_law(C, [r["baseline"] for r in rows])
    x_c = fit_power_law([c * (1 + r["flops"]) for c, r in zip(C, rows)], [r["x"] for r in rows])
    base_w = fit_power_law([r["h"] for r in rows], [r["baseline"] for r in rows])
    x_w = fit_power_law([r["h"] * (1 + r["mean_width"]) for r in rows], [r["x"] for r in rows])
    if target_loss is None:
        target_loss = max(zip(C, rows), key=lambda cr: cr[0])[1]["baseline"]
    largest = max(rows, key=lambda r: r["h"])
    return {
        "target_loss": target_loss,
        "flops": (base_c, x_c),
        "mean_width": (base_w, x_w),
        "flops_fraction": x_c.compute_at(target_loss) / base_c.compute_at(target_loss),
        "mean_width_fraction": x_w.compute_at(target_loss) / base_w.compute_at(target_loss),
        "equal_size": {
            "size": largest.get("size", ""),
            "flops": 1 + largest["flops"],
            "mean_width": 1 + largest["mean_width"],
        },
    }


def _fraction(text) -> float:
    """-2.5% or -0.025 -> -0.025."""
    return float(str(text).rstrip("%")) / 100 if str(text).endswith("%") else float(text)


def paper_matched_loss_rows(paper: dict) -> List[dict]:
    """The matched-loss table from paper 2's own dense rows (paper_results.yaml), C in PF-days on
    the authors' count: the refitted a, b beside the paper's printed ones, x's fraction beside the
    paper's stated one and beside what the printed (rounded) a, b give, and the equal-size change at
    its largest dense size."""
    vw = paper["variable_width"]
    dense = [
        dict(r, flops=_fraction(r["flops"]), mean_width=_fraction(r["mean_width"]))
        for r in vw["sizes"]
        if "h" in r
    ]
    got = paper_matched_loss(dense, vw["vocab_size"], vw["sequence_length"])
    ref, eq, L = vw["scaling"], got["equal_size"], got["target_loss"]
    printed = {
        "baseline": PowerLaw(ref["baseline_a"], ref["baseline_b"], np.full((2, 2), math.nan), 0),
        "x": PowerLaw(ref["x_a"], ref["x_b"], np.full((2, 2), math.nan), 0),
    }
    out = []
    for key, label, stated, fit in (
        ("flops", "training FLOPs", ref["x_flops_fraction"], f"L = a C^b (C in {C_LABEL})"),
        (
            "mean_width",
            "mean width (KV cache per token)",
            ref["x_mean_width_fraction"],
            "L = a W^b (W: mean layer width)",
        ),
    ):
        base, x = got[key]
        flops = key == "flops"  # the paper prints the FLOPs fits only
        out.append(
            {
                "quantity": label,
                "fit": fit,
                "baseline a, b": f"{base.a:.4f}, {base.b:.5f}",
                "paper baseline a, b": _paper_fit(ref, "baseline")
                .replace("a ", "")
                .replace("b ", "")
                if flops
                else "not given",
                "x a, b": f"{x.a:.4f}, {x.b:.5f}",
                "paper x a, b": _paper_fit(ref, "x").replace("a ", "").replace("b ", "")
                if flops
                else "not given",
                "target loss": f"{L:.3f}",
                "x / baseline at the target": f"{got[key + '_fraction']:.1%}",
                "paper": f"{stated:.1%}",
                "paper's printed a, b at the target": (
                    f"{printed['x'].compute_at(L) / printed['baseline'].compute_at(L):.1%}"
                    if flops
                    else ""
                ),
                f"equal size ({eq['size']})": f"{eq[key]:.1%}",
            }
        )
    return out
