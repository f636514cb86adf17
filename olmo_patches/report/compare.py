"""A sweep's members compared over seeds: is a gap real (report/stats.py), and at which learning
rate.

A member is one config of the sweep (its ``run.name``, the group of its runs); its runs are its seed
offsets at each LR scale (launch/sweep.py :class:`~olmo_patches.launch.sweep.Variants`). Tables:

- ``lr_sweep``: per member and LR scale, the mean final validation loss over seeds; each member's
  best LR and its distance from the config's (a best LR at the grid's edge may lie beyond it).
- ``comparison``: per member, at the config's LR or at its own best (the table says which), the
  mean final validation loss and perplexity with their 95% intervals, the difference to the
  baseline paired by seed with its interval, p-value and verdict, and the matched-loss token and
  FLOPs ratios with bootstrap intervals.
- ``noise_floor``: the baseline against itself, every pair of its seeds.

Figure ``val_curves.png``: each member's mean validation loss against tokens, with its 95% band.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import ConfigError
from ..eval.names import PAPER_VALIDATION_SETS
from ..launch.run_folder import changed_keys
from ..launch.sweep import Member, Variants
from . import stats
from .tables import Run, _LM

__all__ = ["check_seed_folders", "comparison_tables", "comparison_notes", "val_curves_figure"]


def check_seed_folders(members: Sequence[Member]) -> None:
    """Every run folder of a member holds that member's config at that seed (ConfigError otherwise):
    a report never pools the seeds of different shapes."""
    for m in members:
        recorded = m.folder / "config.yaml"
        if recorded.is_file() and (changes := changed_keys(recorded.read_text(), m.spec)):
            raise ConfigError(
                f"{recorded}: seed {m.seed} of {m.group or m.name} was trained with another config "
                f"({'; '.join(changes)}); the seeds of one member must share its config"
            )


def val_curve(run: Run) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, validation loss) at each evaluation: the mean over the paper's validation sets, or
    over the sets evaluated where none of them were (as ``Run.val_loss``)."""
    per_token = run.config["train"]["global_batch_size"] * run.config["data"]["sequence_length"]
    tokens, losses = [], []
    for step in sorted(run.metrics):
        sets = {
            m.group(1).removesuffix("-validation"): v
            for k, v in run.metrics[step].items()
            if (m := _LM.match(k))
        }
        chosen = [v for k, v in sets.items() if k in PAPER_VALIDATION_SETS] or list(sets.values())
        if chosen:
            tokens.append(step * per_token)
            losses.append(sum(chosen) / len(chosen))
    return np.array(tokens, dtype=float), np.array(losses, dtype=float)


def _by_member(
    members: Sequence[Member], runs: Dict[str, Run]
) -> Dict[str, Dict[float, Dict[int, Run]]]:
    """{member: {LR scale: {seed: run}}} for the runs with a validation loss."""
    out: Dict[str, Dict[float, Dict[int, Run]]] = defaultdict(lambda: defaultdict(dict))
    for m in members:
        run = runs.get(m.name)
        if run is not None and run.val_loss() is not None:
            out[m.group or m.name][m.lr_scale][m.seed] = run
    return out


def _lr(members: Sequence[Member]) -> Dict[str, float]:
    """{member: the config's train.lr}."""
    return {m.group or m.name: m.spec.train.lr / m.lr_scale for m in members}


def best_lr_scales(grouped: Dict[str, Dict[float, Dict[int, Run]]]) -> Dict[str, float]:
    """{member: the LR scale with the lowest mean final validation loss over seeds}."""
    best = {}
    for group, scales in grouped.items():
        means = {
            x: float(np.mean([r.val_loss() for r in seeds.values()])) for x, seeds in scales.items()
        }
        best[group] = min(means, key=means.__getitem__)
    return best


def lr_sweep_rows(members: Sequence[Member], grouped, variants: Variants) -> List[dict]:
    if len(variants.lr_scales) < 2:
        return []
    best, config_lr, rows = best_lr_scales(grouped), _lr(members), []
    edges = (min(variants.lr_scales), max(variants.lr_scales))
    for group, scales in grouped.items():
        row = {"member": group, "config LR": f"{config_lr[group]:.3g}"}
        for x in variants.lr_scales:
            seeds = scales.get(x, {})
            row[f"x{x:g}"] = (
                f"{np.mean([r.val_loss() for r in seeds.values()]):.4f} ({len(seeds)})"
                if seeds
                else "not run"
            )
        b = best[group]
        row.update(
            {
                "best LR": f"{config_lr[group] * b:.3g}",
                "best / config": f"x{b:g}",
                "log2 distance": f"{math.log2(b):+.2f}",
                "note": "at the grid's edge: the best may lie beyond"
                if b in edges and len(scales) > 1
                else "",
            }
        )
        rows.append(row)
    return rows


def _curves(seeds: Dict[int, Run], x: np.ndarray) -> Dict[int, np.ndarray]:
    """Each seed's validation curve on the tokens ``x`` (NaN past its last evaluation)."""
    out = {}
    for s, run in seeds.items():
        t, y = val_curve(run)
        out[s] = np.where(x <= t[-1] + 1e-9, np.interp(x, t, y), np.nan)
    return out


def _flops_per_token(run: Run) -> float:
    from ..config import load_spec
    from .counts import count

    return float(count(load_spec(run.path / "config.yaml")).flops_per_token)


def comparison_rows(
    members: Sequence[Member], grouped, baseline: str, use_best_lr: bool
) -> Tuple[List[dict], Optional[stats.NoiseFloor]]:
    best, config_lr = best_lr_scales(grouped), _lr(members)
    scale = {g: best[g] if use_best_lr else 1.0 for g in grouped}
    if baseline not in grouped or scale[baseline] not in grouped[baseline]:
        return [], None
    base = _Baseline(grouped[baseline][scale[baseline]])
    rows = []
    for group, scales in grouped.items():
        seeds = scales.get(scale[group])
        if not seeds:
            continue
        loss = {s: r.val_loss() for s, r in seeds.items()}
        mean = stats.mean_interval(list(loss.values()))
        lr = config_lr[group] * scale[group]
        how = f"own best, x{scale[group]:g}" if use_best_lr else "config"
        row = {
            "member": group,
            "LR": f"{lr:.3g} ({how})",
            "seeds": str(len(loss)),
            "val loss [95%]": mean.text(4),
            "val PPL [95%]": mean.exp().text(2),
        }
        if group == baseline:
            row.update(_no_comparison("baseline"))
        elif not loss.keys() & base.loss.keys():
            row.update(_no_comparison("no seed in common"))
        else:
            row.update(base.compared(seeds, loss))
        rows.append(row)
    return rows, stats.noise_floor(base.loss)


class _Baseline:
    """The baseline's seeds at its learning rate: what every other member is compared with."""

    def __init__(self, seeds: dict):
        self.loss = {s: r.val_loss() for s, r in seeds.items()}
        self.x = val_curve(seeds[min(seeds)])[0]
        self.curves = _curves(seeds, self.x)
        self.flops_per_token = _flops_per_token(seeds[min(seeds)])

    def compared(self, seeds: dict, loss: dict) -> dict:
        """A member's columns against the baseline: the paired difference over the seeds in
        common, and the tokens (FLOPs) it needs to reach the baseline's final loss."""
        paired = stats.paired_difference(loss, self.loss)
        ratio = stats.matched_loss_ratio(_curves(seeds, self.x), self.curves, self.x)
        fpt = _flops_per_token(seeds[min(seeds)]) / self.flops_per_token
        reached = not math.isnan(ratio.mean)
        return {
            "diff to baseline [95%]": (
                f"{paired.diff.text(4)} (seeds {','.join(map(str, paired.seeds))})"
            ),
            "p": "" if math.isnan(paired.p) else f"{paired.p:.3g}",
            "verdict": paired.verdict,
            "tokens ratio": ratio.text(3)
            if reached
            else "none: baseline's final loss not reached (or reached at 0 tokens)",
            "FLOPs ratio": _scaled(ratio, fpt).text(3) if reached else "",
        }


def _no_comparison(why: str) -> dict:
    return {
        "diff to baseline [95%]": why,
        "p": "",
        "verdict": "",
        "tokens ratio": "",
        "FLOPs ratio": "",
    }


def _scaled(i: stats.Interval, k: float) -> stats.Interval:
    return stats.Interval(i.mean * k, i.lo * k, i.hi * k, i.n)


def comparison_tables(
    members: Sequence[Member],
    runs: Dict[str, Run],
    variants: Variants,
    baseline: str,
    use_best_lr: bool,
) -> Dict[str, List[dict]]:
    """``comparison``, ``noise_floor`` and ``lr_sweep`` (empty where the sweep has none)."""
    grouped = _by_member(members, runs)
    rows, floor = comparison_rows(members, grouped, baseline, use_best_lr)
    noise = []
    if floor is not None:
        noise = [
            {
                "member": baseline,
                "seed pairs": str(floor.pairs),
                "RMS gap": f"{floor.rms:.4f}",
                "largest gap": f"{floor.largest:.4f}",
            }
        ]
    return {
        "comparison": rows,
        "noise_floor": noise,
        "lr_sweep": lr_sweep_rows(members, grouped, variants),
    }


def comparison_notes(variants: Variants, baseline: str, use_best_lr: bool) -> str:
    """What the comparison tables assume, for the report beside them."""
    lr = (
        "each member at its own best LR of the grid"
        if use_best_lr
        else "each config its own train.lr"
    )
    return (
        f"# Comparison over seeds\n\n"
        f"- Runs: {variants.describe()}.\n"
        f"- Baseline: {baseline}. LR: {lr}.\n"
        f"- val loss: final validation loss, mean over seeds with a Student-t {stats.LEVEL:.0%} "
        "interval (normal, independent seeds); PPL: exp of the loss's interval.\n"
        f"- diff to baseline: member - baseline paired by seed offset (same init and data order), "
        f"paired t-interval; 'distinguishable' when it excludes 0 (p < {1 - stats.LEVEL:.2f}). "
        f"'not distinguishable' is not 'equal': the interval bounds the gap the seeds can hide.\n"
        f"- noise floor: |gap| between the baseline's own seeds, every pair.\n"
        "- tokens / FLOPs ratio: tokens (FLOPs) a member's mean validation curve needs to reach "
        "the baseline's mean final loss, over the baseline's; paired percentile bootstrap over "
        "seeds (rough with few seeds).\n"
        f"- See docs/statistics.md.\n"
    )


def val_curves_figure(
    members: Sequence[Member], runs: Dict[str, Run], out: Path, use_best_lr: bool
) -> List[Path]:
    """Mean validation loss per member against tokens, with the 95% t-band over seeds."""
    from .figures import plt, save_figure

    grouped = _by_member(members, runs)
    best = best_lr_scales(grouped)
    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = False
    for group, scales in grouped.items():
        seeds = scales.get(best[group] if use_best_lr else 1.0)
        if not seeds:
            continue
        x = val_curve(seeds[min(seeds)])[0]
        curves = np.array(list(_curves(seeds, x).values()))
        bands = [
            stats.mean_interval(c[~np.isnan(c)]) if np.any(~np.isnan(c)) else None for c in curves.T
        ]
        keep = [i for i, b in enumerate(bands) if b is not None]
        xs, mid = x[keep], np.array([bands[i].mean for i in keep])
        ax.plot(xs, mid, label=f"{group} ({len(seeds)} seeds)")
        if len(seeds) > 1:
            ax.fill_between(
                xs, [bands[i].lo for i in keep], [bands[i].hi for i in keep], alpha=0.25
            )
        plotted = True
    if not plotted:
        plt.close(fig)
        return []
    ax.set(
        xlabel="tokens",
        ylabel="validation loss",
        title=f"Validation loss, mean and {stats.LEVEL:.0%} band over seeds",
    )
    ax.legend(fontsize="small")
    out.mkdir(parents=True, exist_ok=True)
    return [save_figure(fig, out / "val_curves.png")]
