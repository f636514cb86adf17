"""A sweep's members compared over seeds: is a gap real, how big a gap could the seeds see, and at
which learning rate (report/stats.py).

A member is one config of the sweep (its ``run.name``, the group of its runs); its runs are its seed
offsets at each LR scale (launch/sweep.py :class:`~olmo_patches.launch.sweep.Variants`). Only a run
that reached its planned step with every logged loss finite counts (:func:`left_out` says why
another does not); the tables name the others. Tables:

- ``seeds``: per member and seed offset, the final validation loss and its difference to the
  baseline's at that seed, or why the run is left out (steps reached of planned).
- ``comparison``: per member, at the config's LR or its own best (the table says which), the mean
  final validation loss and perplexity with 95% intervals over the seeds used, the paired
  difference to the baseline (interval, seeds' standard deviation, smallest difference detectable
  at 80% power, p, verdict; Holm-adjusted beside where several members are compared), and the
  matched-loss token and FLOPs ratios with their intervals, or why not estimable.
- ``downstream``: per member and task with each document's outcome in every seed (post-hoc
  evaluations), the accuracy with an interval over documents (clustered by passage) and seeds.
- ``lr_sweep``: per member and LR scale, the mean final loss over seeds; each member's best LR of
  the scales where every seed finished, and where the grid must grow or can be refined.

Figure ``val_curves.png``: each member's mean validation loss against tokens, with its 95% band.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import ConfigError
from ..eval.names import PAPER_VALIDATION_SETS
from ..launch.sweep import Member, RunStatus, Variants
from . import stats
from .tables import _LM, Run, SeedGroup

__all__ = [
    "left_out",
    "comparison",
    "compared_runs",
    "comparison_tables",
    "confirmation",
    "comparison_notes",
    "val_curves_figure",
]


def left_out(status: RunStatus, run: Optional[Run]) -> str:
    """Why a run does not count ("" when it does): not started, stopped or failed short of its
    planned step, a non-finite loss, or no validation loss."""
    planned = status.member.total_steps
    if status.state != "done":
        where = "" if status.state == "not started" else f" at step {status.step}/{planned}"
        return status.state + where + (f" ({status.error})" if status.error else "")
    if run is None:
        return "no config.yaml"
    bad = [s for s, rec in run.metrics.items() for k, v in rec.items() if "loss" in k and not
           math.isfinite(v)]  # fmt: skip
    if bad:
        return f"not finite from step {min(bad)}/{planned}"
    return "" if run.val_loss() is not None else "no validation loss"


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


@dataclass
class Cell:
    """One member at one LR scale: the runs that count by seed, and why the others do not."""

    runs: Dict[int, Run] = field(default_factory=dict)
    left: Dict[int, str] = field(default_factory=dict)

    @property
    def loss(self) -> Dict[int, float]:
        return {s: r.val_loss() for s, r in sorted(self.runs.items())}  # type: ignore[misc]

    def seeds_text(self) -> str:
        planned = len(self.runs) + len(self.left)
        return str(planned) if not self.left else f"{len(self.runs)} of {planned}"

    @cached_property
    def flops_per_token(self) -> float:
        """Training FLOPs per token of its config (counted once: the baseline's is every member's
        denominator)."""
        from .counts import count

        return float(count(self.runs[min(self.runs)].spec).flops_per_token)

    def curves(self) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
        """(tokens, {seed: validation curve}), every seed's on the first one's evaluations."""
        x = val_curve(self.runs[min(self.runs)])[0]
        return x, {s: np.interp(x, *val_curve(r)) for s, r in self.runs.items()}


Grouped = Dict[str, Dict[float, Cell]]


def _by_member(members: Sequence[Member], runs: Dict[str, Run], why: Dict[str, str]) -> Grouped:
    """{member: {LR scale: Cell}}: the runs that count, the others with why not."""
    out: Grouped = defaultdict(lambda: defaultdict(Cell))
    for m in members:
        cell = out[m.group or m.name][m.lr_scale]
        if why.get(m.name, "not started"):
            cell.left[m.seed] = why.get(m.name, "not started")
        else:
            cell.runs[m.seed] = runs[m.name]
    return out


def best_lr_scales(grouped: Grouped) -> Dict[str, float]:
    """{member: the LR scale with the lowest mean final loss among those where every seed counts}
    (a member with no such scale: none)."""
    best = {}
    for group, scales in grouped.items():
        full = {
            x: np.mean(list(c.loss.values())) for x, c in scales.items() if c.runs and not c.left
        }
        if full:
            best[group] = min(full, key=full.__getitem__)
    return best


@dataclass
class Comparison:
    """The sweep's runs by member and LR scale (``grouped``: the grid), the seeds compared (the
    sweep's, or the fresh ones confirming its best LRs) and the LR scale each is compared at."""

    grouped: Grouped
    compared: Grouped
    scale: Dict[str, float]
    config_lr: Dict[str, float]
    best_lr: bool


def comparison(
    members: Sequence[Member],
    runs: Dict[str, Run],
    why: Dict[str, str],
    use_best_lr: bool,
    confirm: Sequence[Member] = (),
) -> Comparison:
    """``why``: each run's reason to be left out (:func:`left_out`), "" for one that counts; with
    ``confirm`` (:func:`confirmation`), the comparison is of those fresh seeds at the best LRs."""
    grouped = _by_member(members, runs, why)
    compared = _by_member(confirm, runs, why) if confirm else grouped
    use_best_lr = use_best_lr or bool(confirm)
    best = best_lr_scales(compared)
    scale = {g: best.get(g, math.nan) if use_best_lr else 1.0 for g in compared}
    config_lr = {m.group or m.name: m.spec.train.lr / m.lr_scale for m in members}
    return Comparison(grouped, compared, scale, config_lr, use_best_lr)


def compared_runs(c: Comparison) -> Dict[str, Run]:
    """Each member's runs at the LR it is compared at, named by the member, as the papers' tables,
    the scaling fits and the figures read them: a lone run as it is, several seeds (or one at
    another LR than the config's) as a :class:`~olmo_patches.report.tables.SeedGroup`. The other
    scales of an LR grid are no points of their own."""
    out: Dict[str, Run] = {}
    for group, scales in c.compared.items():
        cell = scales.get(c.scale[group])
        if cell is None or not cell.runs:
            continue
        first = cell.runs[min(cell.runs)]
        alone = len(cell.runs) == 1 and first.name == group
        seeds = SeedGroup(
            first.path, first.config, record=first.record, group=group, seeds=dict(cell.runs)
        )
        out[group] = first if alone else seeds
    return out


def _grid_advice(scales: Sequence[float], best: float) -> str:
    """Where the best of a grid lies: at an edge, the grid extended one step beyond it; inside, a
    finer grid of the geometric midpoints to its neighbours."""
    grid = sorted(scales)
    i = grid.index(best)
    if i in (0, len(grid) - 1):
        step = grid[1] / grid[0] if i == 0 else grid[-1] / grid[-2]
        new = best / step if i == 0 else best * step
        extended = ",".join(f"{x:g}" for x in sorted({*grid, new} - {1.0}))
        return f"at the grid's edge: the best may lie beyond; extend with --lr-grid {extended}"
    finer = [math.sqrt(best * grid[i - 1]), math.sqrt(best * grid[i + 1])]
    return "inside the grid; finer: --lr-grid " + ",".join(
        f"{x:.3g}" for x in sorted({*grid, *finer} - {1.0})
    )


def lr_sweep_rows(c: Comparison, variants: Variants) -> List[dict]:
    if len(variants.lr_scales) < 2:
        return []
    best, config_lr, rows = best_lr_scales(c.grouped), c.config_lr, []
    for group, scales in c.grouped.items():
        row = {"member": group, "config LR": f"{config_lr[group]:.3g}"}
        for x in variants.lr_scales:
            cell = scales.get(x, Cell())
            row[f"x{x:g}"] = (
                f"{np.mean(list(cell.loss.values())):.4f} ({cell.seeds_text()})"
                if cell.runs
                else "none"
            )
        b = best.get(group)
        row.update(
            {
                "best LR": f"{config_lr[group] * b:.3g}" if b else "none: no scale with every seed",
                "best / config": f"x{b:g}" if b else "",
                "log2 distance": f"{math.log2(b):+.2f}" if b else "",
                "note": _grid_advice(variants.lr_scales, b) if b else "",
            }
        )
        rows.append(row)
    return rows


def _paired_columns(cell: Cell, base: Cell) -> dict:
    """A member's paired difference to the baseline over the seeds both have."""
    paired = stats.paired_difference(cell.loss, base.loss)
    one = paired.diff.n < 2
    return {
        "diff to baseline [95%]": f"{paired.diff.text(4)}"
        + (" (one seed: no interval)" if one else ""),
        "sd of diffs": "" if one else f"{paired.sd:.4f}",
        "detectable (80%)": "" if one else f"{paired.detectable:.4f}",
        "p": "" if one else f"{paired.p:.3g}",
        "verdict": paired.verdict,
        "_p": paired.p,
        "_n": paired.diff.n,
    }


def _ratio_columns(cell: Cell, base: Cell) -> dict:
    """The matched-loss tokens and FLOPs ratios, or why not estimable."""
    x, curves = cell.curves()
    bx, base_curves = base.curves()
    seeds = cell.runs.keys() & base.runs.keys()
    ratio, why = stats.matched_ratio(
        {s: curves[s] for s in seeds}, x, {s: base_curves[s] for s in seeds}, bx
    )
    if ratio is None:
        return {"tokens ratio [95%]": f"not estimable: {why}", "FLOPs ratio [95%]": ""}
    k = cell.flops_per_token / base.flops_per_token
    scaled = stats.Interval(ratio.mean * k, ratio.lo * k, ratio.hi * k, ratio.n)
    one = " (one seed: no interval)" if ratio.n < 2 else ""
    return {"tokens ratio [95%]": ratio.text(3) + one, "FLOPs ratio [95%]": scaled.text(3) + one}


def comparison_rows(c: Comparison, baseline: str) -> List[dict]:
    """Each member against the baseline, at each one's LR (config's or best), Holm beside raw."""
    scale = c.scale
    base = c.compared.get(baseline, {}).get(scale.get(baseline, math.nan))
    if base is None or not base.runs:
        return []
    rows = []
    for group, scales in c.compared.items():
        cell = scales.get(scale[group])
        if cell is None or not cell.runs:
            rows.append({"member": group, "seeds": "0", "diff to baseline [95%]": "no run counts"})
            continue
        mean = stats.mean_interval(list(cell.loss.values()))
        how = f"own best, x{scale[group]:g}" if c.best_lr else "config"
        row = {
            "member": group,
            "LR": f"{c.config_lr[group] * scale[group]:.3g} ({how})",
            "seeds": cell.seeds_text(),
            "val loss [95%]": mean.text(4),
            "val PPL [95%]": mean.exp().text(2),
        }
        if group != baseline and cell.runs.keys() & base.runs.keys():
            row.update({**_paired_columns(cell, base), **_ratio_columns(cell, base)})
        else:
            row["diff to baseline [95%]"] = "baseline" if group == baseline else "no seed in common"
        rows.append(row)
    return _with_holm(rows)


def _with_holm(rows: List[dict]) -> List[dict]:
    """Holm's adjusted p and verdict beside the raw ones where 2+ members have a test."""
    tested = [r for r in rows if r.get("_n", 0) >= 2]
    if len(tested) > 1:
        for r, p in zip(tested, stats.holm([r["_p"] for r in tested])):
            r.update({"p (Holm)": f"{p:.3g}", "verdict (Holm)": stats.verdict(float(p), r["_n"])})
    columns = list(dict.fromkeys(k for r in rows for k in r if not k.startswith("_")))
    return [{k: r.get(k, "") for k in columns} for r in rows]


def seed_rows(c: Comparison, baseline: str) -> List[dict]:
    """Per member, LR scale and seed offset: the final loss (at the compared LR, with its
    difference to the baseline's at that seed), or why the run is left out."""
    scale = c.scale
    base = c.compared.get(baseline, {}).get(scale.get(baseline, math.nan), Cell()).loss
    rows = []
    for group, scales in c.compared.items():
        for x, cell in sorted(scales.items()):
            row = {"member": group, "LR x": f"{x:g}"}
            for s in sorted({*cell.runs, *cell.left}):
                loss = cell.loss.get(s)
                paired = s in base and group != baseline and x == scale[group]
                diff = f" ({loss - base[s]:+.4f})" if loss is not None and paired else ""
                row[f"seed {s}"] = (
                    f"{loss:.4f}{diff}" if loss is not None else f"left out: {cell.left[s]}"
                )
            rows.append(row)
    return rows


def _items(run: Run) -> Dict[str, dict]:
    """{task: each document's outcome} of the run's latest post-hoc evaluation (scripts/evaluate.py
    writes them beside its metrics), {} where none."""
    found = {int(p.stem.rpartition("step")[2]): p for p in run.path.glob("items-step*.json")}
    return json.loads(found[max(found)].read_text()) if found else {}


def downstream_rows(c: Comparison) -> List[dict]:
    """Per member and task evaluated with its items in every seed: the accuracy over the
    documents all seeds scored, its interval over items (clustered by passage) and seeds."""
    rows = []
    for group, scales in c.compared.items():
        cell = scales.get(c.scale[group])
        per_seed = [_items(r) for r in cell.runs.values()] if cell else []
        for task in sorted(set.intersection(*map(set, per_seed)) if per_seed else ()):
            docs = sorted(set.intersection(*(set(i[task]["doc"]) for i in per_seed)))
            outcome = [dict(zip(i[task]["doc"], i[task]["correct"])) for i in per_seed]
            cluster = dict(zip(per_seed[0][task]["doc"], per_seed[0][task]["cluster"]))
            acc = stats.accuracy_interval(
                [[o[d] for d in docs] for o in outcome], [cluster[d] for d in docs]
            )
            n = {
                "seeds": len(per_seed),
                "documents": len(docs),
                "passages": len({cluster[d] for d in docs}),
            }
            rows.append({"member": group, "task": task, **{k: str(v) for k, v in n.items()},
                         "accuracy [95%]": acc.text(4)})  # fmt: skip
    return rows


def comparison_tables(c: Comparison, variants: Variants, baseline: str) -> Dict[str, List[dict]]:
    """``seeds``, ``comparison``, ``downstream`` and ``lr_sweep`` (empty where the sweep has
    none)."""
    return {
        "seeds": seed_rows(c, baseline),
        "comparison": comparison_rows(c, baseline),
        "downstream": downstream_rows(c),
        "lr_sweep": lr_sweep_rows(c, variants),
    }


def confirmation(
    members: Sequence[Member], overrides: Sequence[str], variants: Variants, n: int
) -> List[Member]:
    """The runs confirming a best-LR comparison: ``n`` fresh seed offsets after the sweep's, each
    config at its best LR scale of the grid, chosen on the sweep's seeds (ConfigError naming a
    config whose grid has no scale with every seed finished)."""
    from ..launch.sweep import load_sweep, sweep_status
    from .tables import load_runs

    loaded = load_runs([m.folder for m in members if (m.folder / "config.yaml").exists()])
    why = {s.member.name: left_out(s, loaded.get(s.member.name)) for s in sweep_status(members)}
    best = best_lr_scales(_by_member(members, loaded, why))
    start = max(variants.seeds) + 1
    fresh: List[Member] = []
    for config, group in dict.fromkeys((m.config, m.group) for m in members):
        if group not in best:
            raise ConfigError(
                f"--confirm: {group} has no LR scale of the grid with every seed finished; "
                "finish the grid first (sweep.py status)"
            )
        seeds = tuple(range(start, start + n))
        fresh += load_sweep(
            [str(config)], overrides, replace(variants, seeds=seeds, lr_scales=(best[group],))
        )
    return fresh


def comparison_notes(
    variants: Variants, baseline: str, use_best_lr: bool, confirm: Sequence[Member] = ()
) -> str:
    """What the comparison tables assume, for the report beside them."""
    fresh = sorted({m.seed for m in confirm})
    lr = (
        f"each member at its own best LR of the grid, chosen on seeds "
        f"{', '.join(map(str, variants.seeds))} and compared on fresh seeds "
        f"{', '.join(map(str, fresh))}"
        if confirm
        else "each member at its own best LR of the grid (chosen on these seeds: confirm on "
        "fresh ones, --confirm N)"
        if use_best_lr
        else "each config its own train.lr"
    )
    return (
        f"# Comparison over seeds\n\n"
        f"- Planned: {variants.describe()}. Only runs that reached their planned step with finite "
        "losses count; `seeds` names the others and why, and every count is of the runs used.\n"
        f"- Baseline: {baseline}. LR: {lr}.\n"
        f"- val loss: final validation loss, mean over seeds with a Student-t {stats.LEVEL:.0%} "
        "interval (normal, independent seeds); PPL: exp of the loss's interval.\n"
        f"- diff to baseline: member - baseline paired by seed offset (same init and data order), "
        f"paired t-interval; 'distinguishable' when p < {1 - stats.LEVEL:.2f}. 'not "
        "distinguishable' is not 'equal'. sd of diffs: the seeds' standard deviation of the "
        "paired differences, the spread of a one-seed comparison of the two; detectable (80%): "
        f"the smallest true gap the test finds {stats.POWER:.0%} of the time with these seeds.\n"
        "- p (Holm), verdict (Holm): with several members against one baseline, Holm's adjustment "
        "keeps the chance of any false 'distinguishable' at 5%.\n"
        "- tokens / FLOPs ratio: per seed, the tokens the member's fitted curve (L = E + A t^-a) "
        "needs to reach the baseline's fitted final loss, over the baseline's (FLOPs: x FLOPs "
        "per token); geometric mean over seeds, t-interval on the log ratios.\n"
        f"- See docs/statistics.md.\n"
    )


def val_curves_figure(c: Comparison, out: Path) -> List[Path]:
    """Mean validation loss per member against tokens (the runs compared), with the 95% t-band
    over seeds."""
    from .figures import plt, save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = False
    for group, scales in c.compared.items():
        cell = scales.get(c.scale[group])
        if cell is None or not cell.runs:
            continue
        x, curves = cell.curves()
        bands = [stats.mean_interval(col) for col in np.array(list(curves.values())).T]
        ax.plot(x, [b.mean for b in bands], label=f"{group} ({len(curves)} seeds)")
        if len(curves) > 1:
            ax.fill_between(x, [b.lo for b in bands], [b.hi for b in bands], alpha=0.25)
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
