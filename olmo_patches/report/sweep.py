"""A sweep's report: its status table, the papers' tables that have a run of the sweep, the scaling
fits and the figures (``scripts/sweep.py status`` and ``report``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from ..launch.run_folder import read_metrics
from ..launch.sweep import Member, RunStatus, sweep_status
from .figures import make_figures, scaling_figure
from .scaling import scaling_tables
from .tables import Run, _fmt, ablation_configs, build_tables, load_runs, paper_results, write_tables

__all__ = ["report", "status_rows"]


def _val_ppl(m: Member) -> str:
    ppl = Run(m.folder, {"run": {"name": m.name}, "model": {}}, read_metrics(m.folder)).val_ppl()
    return _fmt(ppl, 2) if ppl is not None else ""


def status_rows(statuses: Sequence[RunStatus]) -> List[dict]:
    return [
        {
            "run": s.member.name,
            "config": str(s.member.config),
            "state": s.state,
            "step": f"{s.step}/{s.member.total_steps}",
            "tokens": f"{s.tokens:,}",
            "val PPL": _val_ppl(s.member),
            "SLURM job": s.slurm_job,
            "error": s.error,
        }
        for s in statuses
    ]


def report(
    members: Sequence[Member],
    out: Path,
    slurm_log_dir: Path = Path("logs"),
    figures: bool = True,
    target_loss: Optional[float] = None,
) -> List[Path]:
    """The sweep's status table, the papers' tables that have a run of the sweep (ablation rows: the
    sweep's configs, paper beside run), the scaling fits where a family has runs at 2+ budgets
    (report/scaling.py), and the figures, for all runs and per ablation."""
    runs = load_runs([m.folder for m in members if (m.folder / "config.yaml").exists()])
    configs = [m.config for m in members]
    tables = build_tables(runs, sweep_configs=configs)
    tables = {k: rows for k, rows in tables.items() if any(r.get("run") in runs for r in rows)}
    tables.update({k: rows for k, rows in scaling_tables(runs, paper_results(), target_loss).items() if rows})
    tables = {"sweep": status_rows(sweep_status(members, slurm_log_dir)), **tables}
    written = write_tables(tables, out)
    if figures:
        written += make_figures(runs, out) + scaling_figure(runs, out, paper_results())
        by_config = {m.config: m.name for m in members}
        for group, paths in ablation_configs(configs).items():
            subset = {by_config[p]: runs[by_config[p]] for p in paths if by_config[p] in runs}
            if subset:
                written += make_figures(subset, out / group)
    return written
