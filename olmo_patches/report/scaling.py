"""Scaling fits and matched-loss compute: L = a C^b per family of runs, and the FLOPs each family
needs to reach a given loss (paper 2's "22% fewer FLOPs under fitted loss-matched scaling curves").

A run's point: C = training FLOPs = OLMo-core's FLOPs per token of its model (6 per weight plus causal
attention; an MoE's active experts) x the tokens it trained (last step x global batch x sequence
length), in units of 1e20 FLOPs; L = its final validation loss (``Run.val_loss``). Runs fall into
families by shape (:func:`family`), and each family with runs at 2 or more compute budgets gets

    ln L = ln a + b ln C        (ordinary least squares in log space)

with the covariance of (ln a, b) from the residual variance, s^2 (X^T X)^-1, s^2 = RSS / (n - 2): the
standard errors of a (a x se(ln a)) and b need 3 or more runs. The compute a family needs for a loss
L* is C(L*) = (L* / a)^(1/b), with the standard error of ln C(L*) by the delta method; the matched-loss
ratio is C_family(L*) / C_baseline(L*). L* defaults to the loss of the baseline family's run with the
most compute (the paper: the 2B baseline's loss, reached by x with 77.8% of its FLOPs).

The same fit and solve against a run's mean layer width W (the mean of its layers' widths; d_model at
constant width), L = a W^b, gives the mean width each family needs for the target loss: the KV cache
per token is 2 W L, so at matched loss the ratio of mean widths is the paper's KV-cache saving (85.1%
of the baseline's at the 2B baseline's loss, the abstract's 15%), not the 10-11% of the equal-size
rows. :func:`paper_matched_loss` repeats both solves on the paper's own four dense rows
(docs/variable_width.md): 77.6% of the FLOPs (the paper: 77.8%) and 85.1% of the mean width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from ..blocks import get_block
from .tables import Run

__all__ = [
    "fit_power_law",
    "family",
    "scaling_points",
    "scaling_tables",
    "paper_matched_loss",
    "paper_matched_loss_rows",
    "fits",
    "Point",
]

C_UNIT = 1e20  # FLOPs; the paper's fit L = 3.16 C^-0.0498 has C in about these units (docs/variable_width.md)


@dataclass(frozen=True)
class PowerLaw:
    """L = a C^b (C in C_UNIT FLOPs), fitted to n points; cov: the covariance of (ln a, b)."""

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
        """C(L) = (L / a)^(1/b), in C_UNIT FLOPs."""
        return math.exp((math.log(L) - math.log(self.a)) / self.b)

    def compute_log_err(self, L: float) -> float:
        """Standard error of ln C(L): ln C = (ln L - ln a) / b, gradient (-1/b, -ln C / b) on (ln a, b)."""
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


def family(run: Run) -> str:
    """baseline (constant width: OLMo-core's block or a constant variable-width schedule), hourglass,
    or a variable-width shape (x, v, ^, 3) with its resizing when not carry-forward; "MoE" appended."""
    m = run.model
    return get_block(m.get("block", "baseline")).family(m) + (" MoE" if m.get("moe") else "")


def run_compute_and_width(run: Run) -> tuple[float, float]:
    """A run's training FLOPs so far in C_UNIT (FLOPs per token x last step x batch x sequence length),
    and the mean of its layer widths (variable width: its schedule's w_l; otherwise d_model)."""
    from ..config import load_spec
    from .counts import count

    spec = load_spec(run.path / "config.yaml")
    m = spec.model
    tokens = run.last_step * spec.train.global_batch_size * spec.data.sequence_length
    widths = m.layer_widths
    return count(spec).flops_per_token * tokens / C_UNIT, sum(widths) / len(widths)


class Point(NamedTuple):
    C: float  # training FLOPs so far, in C_UNIT
    L: float  # validation loss
    run: str
    W: float  # mean layer width


def scaling_points(runs: Dict[str, Run]) -> Dict[str, List[Point]]:
    """{family: [Point, ...] by C} for the runs with a validation loss."""
    points: Dict[str, List[Point]] = {}
    for name, run in sorted(runs.items()):
        if (loss := run.val_loss()) is not None and run.last_step > 0:
            C, width = run_compute_and_width(run)
            points.setdefault(family(run), []).append(Point(C, loss, name, width))
    return {f: sorted(p) for f, p in points.items()}


def fits(points: Dict[str, List[Point]], x: str = "C") -> Dict[str, PowerLaw]:
    """L = a X^b per family with runs at 2 or more values of X: compute ``C`` or mean width ``W``."""
    return {
        f: fit_power_law([getattr(p, x) for p in pts], [p.L for p in pts])
        for f, pts in points.items()
        if len({getattr(p, x) for p in pts}) >= 2
    }


def _err(x: float, digits: int) -> str:
    return "n/a (2 runs)" if math.isnan(x) else f"{x:.{digits}f}"


def scaling_tables(runs: Dict[str, Run], paper: dict, target_loss: Optional[float] = None) -> Dict[str, List[dict]]:
    """``scaling_fit`` (a, b and their standard errors per family, the paper's baseline fit beside) and
    ``matched_loss`` (each family's C at the target loss and its ratio to the baseline's, the paper's
    x ratio beside); both empty without two runs of a family."""
    points = scaling_points(runs)
    fitted = fits(points)
    ref = paper["variable_width"]["scaling"]
    fit_rows = []
    for f, law in fitted.items():
        paper_fit = f"a {ref['baseline_a']}, b {ref['baseline_b']}" if f == "baseline" else ""
        fit_rows.append(
            {
                "family": f,
                "runs": ", ".join(p[2] for p in points[f]),
                "C range (1e20 FLOPs)": f"{points[f][0][0]:.3g}-{points[f][-1][0]:.3g}",
                "a": f"{law.a:.4g}",
                "a std err": _err(law.a_err, 4),
                "b": f"{law.b:.5f}",
                "b std err": _err(law.b_err, 5),
                "paper": paper_fit,
            }
        )
    if target_loss is None and "baseline" in points:
        target_loss = points["baseline"][-1][1]
    rows = []
    if target_loss is not None and fitted:
        base = fitted.get("baseline")
        widths = fits(points, x="W")
        base_w = widths.get("baseline")
        for f, law in fitted.items():
            C = law.compute_at(target_loss)
            err = law.compute_log_err(target_loss) if law.n > 2 else math.nan
            ratio = C / base.compute_at(target_loss) if base is not None else None
            w = widths[f].compute_at(target_loss) if f in widths else None
            w_ratio = w / base_w.compute_at(target_loss) if w is not None and base_w is not None else None
            rows.append(
                {
                    "family": f,
                    "target loss": f"{target_loss:.4f}",
                    "C at target (1e20 FLOPs)": f"{C:.4g}",
                    "ln C std err": _err(err, 3),
                    "C / baseline's": f"{ratio:.1%}" if ratio is not None else "no baseline fit",
                    "mean width at target": f"{w:.1f}" if w is not None else "one width",
                    "mean width (KV cache) / baseline's": f"{w_ratio:.1%}" if w_ratio is not None else "n/a",
                    "paper": (
                        f"{ref['x_flops_fraction']:.1%} FLOPs, {ref['x_mean_width_fraction']:.1%} mean width "
                        "(x, at the 2B baseline's loss)"
                    )
                    if f == "x"
                    else "",
                }
            )
    return {"scaling_fit": fit_rows, "matched_loss": rows}


def paper_matched_loss(rows: Sequence[dict], vocab_size: int, seq_len: int, target_loss: Optional[float] = None) -> dict:
    """Paper 2's matched-loss figures from its own table. ``rows``: the dense sizes, each with h, n_layers,
    batch (sequences), steps, baseline and x (final losses), flops and mean_width (x's change vs the
    baseline at that size, e.g. -0.025). C = 3 x the authors' forward FLOPs per sequence
    (``paper_flops``) x sequences, in C_UNIT; x's C and mean width are the baseline's times (1 + change).
    Returns the four fits and x's fraction of the baseline's FLOPs and mean width at ``target_loss``
    (default: the largest baseline's loss, the paper's 2B 2.751)."""
    from ..shapes.widths import paper_flops

    C = [3 * paper_flops([r["h"]] * r["n_layers"], r["h"], vocab_size, seq_len) * r["batch"] * r["steps"] / C_UNIT for r in rows]
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
        "equal_size": {"size": largest.get("size", ""), "flops": 1 + largest["flops"], "mean_width": 1 + largest["mean_width"]},
    }


def _fraction(text) -> float:
    """-2.5% or -0.025 -> -0.025."""
    return float(str(text).rstrip("%")) / 100 if str(text).endswith("%") else float(text)


def paper_matched_loss_rows(paper: dict) -> List[dict]:
    """The matched-loss table from paper 2's own dense rows (paper_results.yaml), beside the paper's
    stated figures and the equal-size change at its largest dense size."""
    vw = paper["variable_width"]
    dense = [dict(r, flops=_fraction(r["flops"]), mean_width=_fraction(r["mean_width"])) for r in vw["sizes"] if "h" in r]
    got = paper_matched_loss(dense, vw["vocab_size"], vw["sequence_length"])
    ref, eq = vw["scaling"], got["equal_size"]
    out = []
    for key, label, stated, fit in (
        ("flops", "training FLOPs", ref["x_flops_fraction"], "L = a C^b (C in 1e20 FLOPs)"),
        ("mean_width", "mean width (KV cache per token)", ref["x_mean_width_fraction"], "L = a W^b (W: mean layer width)"),
    ):
        base, x = got[key]
        out.append(
            {
                "quantity": label,
                "fit": fit,
                "baseline a, b": f"{base.a:.5g}, {base.b:.5f}",
                "x a, b": f"{x.a:.5g}, {x.b:.5f}",
                "target loss": f"{got['target_loss']:.3f}",
                "x / baseline at the target": f"{got[key + '_fraction']:.1%}",
                "paper": f"{stated:.1%}",
                f"equal size ({eq['size']})": f"{eq[key]:.1%}",
            }
        )
    return out
