"""The papers' figures (PNG, matplotlib) from runs loaded by :mod:`olmo_patches.report.tables`.

- ``u_curve.png``: validation loss against d_model/L, one line per K (hourglass runs).
- ``ppl_vs_K.png``, ``ppl_vs_dh_ratio.png``: validation PPL against K and against d_h/d_model.
- ``loss_curves.png``: training loss against tokens, one line per run; the seeds of one config
  (tables.py ``group_seeds``): their mean, with a band from the lowest seed to the highest.
- ``param_split.png``: attention / FFN non-embedding parameters per run (stacked bars).
- ``scaling.png`` (:func:`scaling_figure`): validation loss against training FLOPs per family
  (PF-days, the authors' count: report/scaling.py), the fitted L = a C^b of each, and the paper's
  two fits; a seed group's point is its mean loss, with a bar from its lowest seed to its highest.
The other figures plot a seed group at its mean. An ablation's folder of a sweep report
(:func:`ablation_figures`) has the figure of what it varies (K: ``ppl_vs_K``, d_h_ratio:
``ppl_vs_dh_ratio``, width_depth: ``u_curve``), its loss curves and its parameter split.
A figure with no points to plot is not written.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .scaling import C_LABEL, PF_DAY, Point, fits  # noqa: E402
from .tables import Run, SeedGroup  # noqa: E402

__all__ = ["make_figures", "ablation_figures", "scaling_figure", "save_figure"]


def _hourglass(runs: Dict[str, Run]) -> List[Run]:
    return [r for r in runs.values() if r.stacks_ffn and r.val_loss() is not None]


def save_figure(fig, path: Path, dpi: int = 120) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def u_curve(runs: Dict[str, Run], out: Path) -> List[Path]:
    by_k: Dict[int, list] = defaultdict(list)
    for r in _hourglass(runs):
        by_k[int(r.model.get("K", 1))].append(
            (r.model["d_model"] / r.model["n_layers"], r.val_loss())
        )
    if not by_k:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, pts in sorted(by_k.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"K={k}")
    ax.axvspan(100, 250, color="0.9", label="paper: best d_model/L")
    ax.set(
        xlabel="d_model / L",
        ylabel="validation loss",
        title="Width/depth: validation loss vs d_model/L",
    )
    ax.legend()
    return [save_figure(fig, out / "u_curve.png")]


def _scatter(runs: Dict[str, Run], out: Path, x_of, xlabel: str, name: str) -> List[Path]:
    pts = sorted((x_of(r), r.val_ppl(), r.name) for r in _hourglass(runs))
    if not pts:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o")
    ax.set(xlabel=xlabel, ylabel="validation PPL", title=f"Validation PPL vs {xlabel}")
    return [save_figure(fig, out / name)]


def _train_curve(run: Run, steps: List[int]) -> Tuple[List[float], List[float]]:
    """(tokens, training CE loss) of a run at ``steps``."""
    return (
        [run.metrics[s].get("throughput/total tokens", s) for s in steps],
        [run.metrics[s]["train/CE loss"] for s in steps],
    )


def _logged(run: Run) -> List[int]:
    return sorted(s for s, m in run.metrics.items() if "train/CE loss" in m)


def _seed_curves(ax, name: str, group: SeedGroup) -> bool:
    """A seed group's mean training loss over its seeds, at the steps every seed logged, with a
    band from the lowest seed's to the highest's (min-max)."""
    steps = sorted(set.intersection(*(set(_logged(r)) for r in group.seeds.values())))
    if not steps:
        return False
    x = _train_curve(next(iter(group.seeds.values())), steps)[0]
    y = np.array([_train_curve(r, steps)[1] for r in group.seeds.values()])
    label = f"{name} (mean of {len(y)} seeds, band min-max)"
    (line,) = ax.plot(x, y.mean(axis=0), label=label)
    ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=line.get_color(), alpha=0.25)
    return True


def loss_curves(runs: Dict[str, Run], out: Path) -> List[Path]:
    """Training loss against tokens, one line per run; a seed group's: the mean over its seeds
    with a min-max band (:func:`_seed_curves`)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = False
    for name, r in sorted(runs.items()):
        if isinstance(r, SeedGroup):
            plotted = _seed_curves(ax, name, r) or plotted
        elif steps := _logged(r):
            ax.plot(*_train_curve(r, steps), label=name)
            plotted = True
    if not plotted:
        plt.close(fig)
        return []
    ax.set(xlabel="tokens", ylabel="train CE loss", title="Training loss")
    ax.legend(fontsize="small")
    return [save_figure(fig, out / "loss_curves.png")]


def param_split_figure(runs: Dict[str, Run], out: Path) -> List[Path]:
    """(attention, FFN) non-embedding parameters of each run's model (built on the meta device)."""
    from .counts import count

    names, attn, ffn = [], [], []
    for name, r in sorted(runs.items()):
        b = count(r.spec)
        names.append(name), attn.append(b.attention / 1e6), ffn.append(b.ffn / 1e6)
    if not names:
        return []
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(names)), 4))
    ax.bar(names, attn, label="attention")
    ax.bar(names, ffn, bottom=attn, label="FFN")
    ax.set(ylabel="non-embedding parameters (M)", title="Attention / FFN parameter split")
    ax.tick_params(axis="x", rotation=45)
    plt.setp(ax.get_xticklabels(), ha="right")
    ax.legend()
    return [save_figure(fig, out / "param_split.png")]


def scaling_figure(points: Dict[str, List[Point]], out: Path, paper: dict) -> List[Path]:
    """``points``: report/scaling.py's ``scaling_points`` of the runs."""
    fitted = fits(points)
    if not fitted:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    lo, hi = (
        min(p[0] for pts in points.values() for p in pts),
        max(p[0] for pts in points.values() for p in pts),
    )
    grid = np.geomspace(lo / 2, hi * 2, 50)
    for f, pts in points.items():
        (dots,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=f"{f} runs")
        for p in pts:  # a seed group: its lowest to its highest seed
            if len(p.seeds) > 1:
                ax.plot([p.C, p.C], [min(p.seeds), max(p.seeds)], "-", color=dots.get_color())
        if f in fitted:
            law = fitted[f]
            ax.plot(
                grid,
                law.loss(grid),
                "-",
                color=dots.get_color(),
                label=f"{f}: L = {law.a:.3g} C^{law.b:.4f}",
            )
    ref = paper["variable_width"]["scaling"]
    for f, style in (("baseline", "k--"), ("x", "k:")):  # the paper's fits, C in PF-days
        a, b = ref[f + "_a"], ref[f + "_b"]
        ax.plot(grid, a * grid**b, style, label=f"paper {f}: L = {a} C^{b}")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=f"training FLOPs C ({C_LABEL}; 1 PF-day = {PF_DAY:.3g} FLOPs)",
        ylabel="validation loss",
        title="Scaling: L = a C^b per family",
    )
    ax.legend(fontsize="small")
    return [save_figure(fig, out / "scaling.png")]


def ppl_vs_K(runs: Dict[str, Run], out: Path) -> List[Path]:
    return _scatter(runs, out, lambda r: int(r.model.get("K", 1)), "K", "ppl_vs_K.png")


def ppl_vs_dh_ratio(runs: Dict[str, Run], out: Path) -> List[Path]:
    return _scatter(
        runs, out, lambda r: r.d_h / r.model["d_model"], "d_h / d_model", "ppl_vs_dh_ratio.png"
    )


ABLATION_FIGURES = {"K": ppl_vs_K, "d_h_ratio": ppl_vs_dh_ratio, "width_depth": u_curve}


def make_figures(runs: Dict[str, Run], out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        *u_curve(runs, out),
        *ppl_vs_K(runs, out),
        *ppl_vs_dh_ratio(runs, out),
        *loss_curves(runs, out),
        *param_split_figure(runs, out),
    ]


def ablation_figures(kind: str, runs: Dict[str, Run], out: Path) -> List[Path]:
    """An ablation's own figure (PPL or loss against what it varies), its runs' loss curves and
    their parameter split."""
    out.mkdir(parents=True, exist_ok=True)
    own = ABLATION_FIGURES[kind](runs, out)
    return [*own, *loss_curves(runs, out), *param_split_figure(runs, out)]
