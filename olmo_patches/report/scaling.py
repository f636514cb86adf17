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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .tables import Run

__all__ = ["C_UNIT", "PowerLaw", "fit_power_law", "family", "run_compute", "scaling_points", "scaling_tables"]

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
    if m.get("block") == "hourglass":
        name = "hourglass"
    elif m.get("block") == "variable_width" and (w := m.get("widths") or {}).get("schedule") != "constant":
        resize = w.get("resize", "carry_forward")
        name = str(w.get("shape", "x")) + ("" if resize == "carry_forward" else f" ({resize})")
    else:
        name = "baseline"
    return name + (" MoE" if m.get("moe") else "")


def run_compute(run: Run) -> float:
    """Training FLOPs of a run so far, in C_UNIT: FLOPs per token x last step x batch x sequence length."""
    from ..config import load_spec
    from .counts import count

    spec = load_spec(run.path / "config.yaml")
    tokens = run.last_step * spec.train.global_batch_size * spec.data.sequence_length
    return count(spec).flops_per_token * tokens / C_UNIT


def scaling_points(runs: Dict[str, Run]) -> Dict[str, List[tuple]]:
    """{family: [(C, L, run name), ...] by C} for the runs with a validation loss."""
    points: Dict[str, List[tuple]] = {}
    for name, run in sorted(runs.items()):
        if (loss := run.val_loss()) is not None and run.last_step > 0:
            points.setdefault(family(run), []).append((run_compute(run), loss, name))
    return {f: sorted(p) for f, p in points.items()}


def fits(points: Dict[str, List[tuple]]) -> Dict[str, PowerLaw]:
    """The families with runs at 2 or more compute budgets, fitted."""
    return {f: fit_power_law([p[0] for p in pts], [p[1] for p in pts]) for f, pts in points.items()
            if len({p[0] for p in pts}) >= 2}


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
        fit_rows.append({"family": f, "runs": ", ".join(p[2] for p in points[f]), "C range (1e20 FLOPs)":
                         f"{points[f][0][0]:.3g}-{points[f][-1][0]:.3g}", "a": f"{law.a:.4g}", "a std err": _err(law.a_err, 4),
                         "b": f"{law.b:.5f}", "b std err": _err(law.b_err, 5), "paper": paper_fit})
    if target_loss is None and "baseline" in points:
        target_loss = points["baseline"][-1][1]
    rows = []
    if target_loss is not None and fitted:
        base = fitted.get("baseline")
        for f, law in fitted.items():
            C = law.compute_at(target_loss)
            err = law.compute_log_err(target_loss) if law.n > 2 else math.nan
            ratio = C / base.compute_at(target_loss) if base is not None else None
            rows.append({"family": f, "target loss": f"{target_loss:.4f}", "C at target (1e20 FLOPs)": f"{C:.4g}",
                         "ln C std err": _err(err, 3), "C / baseline's": f"{ratio:.1%}" if ratio is not None else "no baseline fit",
                         "paper": f"{ref['x_flops_fraction']:.1%} (x, at the 2B baseline's loss)" if f == "x" else ""})
    return {"scaling_fit": fit_rows, "matched_loss": rows}
