"""A sweep's report: its status table, the papers' tables that have a run of the sweep, the scaling
fits, the comparison over seeds and LRs (report/compare.py) and the figures (``scripts/sweep.py
status`` and ``report``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from ..launch.run_folder import read_metrics
from ..launch.sweep import Member, RunStatus, Variants, sweep_status
from .compare import (
    compared_runs,
    comparison,
    comparison_notes,
    comparison_tables,
    left_out,
    val_curves_figure,
)
from .figures import ablation_figures, make_figures, scaling_figure
from .scaling import scaling_points, scaling_tables
from .tables import (
    Run,
    _fmt,
    ablation_configs,
    build_tables,
    load_runs,
    paper_results,
    write_tables,
)

__all__ = ["report", "status_rows", "seed_counts"]


def _val_ppl(m: Member) -> str:
    ppl = Run(m.folder, {"run": {"name": m.name}, "model": {}}, read_metrics(m.folder)).val_ppl()
    return _fmt(ppl, 2) if ppl is not None else ""


def status_rows(statuses: Sequence[RunStatus]) -> List[dict]:
    variants = len({(s.member.seed, s.member.lr_scale) for s in statuses}) > 1
    return [
        {
            "run": s.member.name,
            **({"seed": str(s.member.seed), "LR x": f"{s.member.lr_scale:g}"} if variants else {}),
            "config": ", ".join(map(str, (s.member.config, *s.member.copies))),
            "state": s.state,
            "step": f"{s.step}/{s.member.total_steps}",
            "tokens": f"{s.tokens:,}",
            "val PPL": _val_ppl(s.member),
            "SLURM job": s.slurm_job,
            "error": s.error,
        }
        for s in statuses
    ]


def seed_counts(statuses: Sequence[RunStatus]) -> List[dict]:
    """Per config and LR scale: how many of its seeds are in each state."""
    counts: dict = {}
    for s in statuses:
        row = counts.setdefault(
            (s.member.group or s.member.name, s.member.lr_scale),
            dict.fromkeys(("seeds", "done", "running", "stopped", "failed", "not started"), 0),
        )
        row["seeds"] += 1
        row[s.state] += 1
    return [
        {"config": g, "LR x": f"{x:g}", **{k: str(v) for k, v in row.items()}}
        for (g, x), row in counts.items()
    ]


def report(
    members: Sequence[Member],
    out: Path,
    slurm_log_dir: Path = Path("logs"),
    figures: bool = True,
    target_loss: Optional[float] = None,
    variants: Variants = Variants(),
    baseline: Optional[str] = None,
    use_best_lr: bool = False,
    confirm: Sequence[Member] = (),
) -> List[Path]:
    """The sweep's status table, the papers' tables that have a run of the sweep (ablation rows: the
    sweep's configs, paper beside run; a member's seeds at the LR it is compared at as one row,
    compare.compared_runs: the other scales of an LR grid are no rows or points of their own), the
    scaling fits where a family has runs at 2+ budgets (report/scaling.py), the comparison over
    seeds against ``baseline`` (default: the first config) at each config's LR or each member's
    best (``use_best_lr``; ``confirm``: compare.confirmation's fresh seeds there), and the
    figures, for all runs and per ablation (figures.ablation_figures). Only the runs that reached
    their planned step with finite losses are read (compare.left_out); the status and ``seeds``
    tables name the others. (A run folder of another config is refused when the sweep loads.)"""
    baseline = baseline or (members[0].group or members[0].name)
    statuses = sweep_status([*members, *confirm], slurm_log_dir)
    folders = [m.folder for m in [*members, *confirm] if (m.folder / "config.yaml").exists()]
    loaded = load_runs(folders)
    why = {s.member.name: left_out(s, loaded.get(s.member.name)) for s in statuses}
    runs = {name: run for name, run in loaded.items() if not why.get(name, "")}
    compared = comparison(members, runs, why, use_best_lr, confirm)
    grouped = compared_runs(compared)  # a member's seeds at its compared LR: one row, one point
    configs = list(dict.fromkeys(c for m in members for c in (m.config, *m.copies)))  # each once
    tables = build_tables(grouped, sweep_configs=configs)
    tables = {k: rows for k, rows in tables.items() if any(r.get("run") in grouped for r in rows)}
    points = scaling_points(grouped)
    scaling = scaling_tables(points, paper_results(), target_loss)
    tables.update({k: rows for k, rows in scaling.items() if rows})
    tables = {
        "sweep": status_rows(statuses),
        **{k: rows for k, rows in comparison_tables(compared, variants, baseline).items() if rows},
        **tables,
    }
    written = write_tables(tables, out)
    notes = comparison_notes(variants, baseline, use_best_lr, confirm)
    (out / "comparison_notes.md").write_text(notes)
    written.append(out / "comparison_notes.md")
    if figures:
        written += make_figures(grouped, out) + scaling_figure(points, out, paper_results())
        written += val_curves_figure(compared, out)
        by_config = {c: m.group or m.name for m in members for c in (m.config, *m.copies)}
        for kind, paths in ablation_configs(configs).items():
            subset = {by_config[p]: grouped[by_config[p]] for p in paths if by_config[p] in grouped}
            if subset:
                written += ablation_figures(kind, subset, out / kind)
    return written
