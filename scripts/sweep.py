"""Launch, track and report a sweep of configs (olmo_patches/launch/sweep.py, olmo_patches/report/sweep.py).

    python scripts/sweep.py launch --local CONFIGS... [--set key=value ...]
    python scripts/sweep.py launch --slurm CONFIGS... [--nodes 2] [--gpus-per-node 8] [--sbatch-arg=--time=24:00:00]
    python scripts/sweep.py status CONFIGS... [--set key=value ...]
    python scripts/sweep.py report CONFIGS... --out DIR

CONFIGS are config files, folders (every *.yaml below) or globs; the same CONFIGS and --set
overrides name the same runs (their save folders). --local trains the runs one after another in
this process's environment, skipping finished ones and resuming stopped or failed ones; --slurm
submits them as one job array of scripts/launch_slurm.sbatch. A run claimed by a live launch is
never started twice. Bad configs: one line, exit 2, nothing started.
"""

import argparse
import sys
from pathlib import Path

from rich.table import Table

from olmo_patches.cli import ArgumentParser, at_least, console, out_arg
from olmo_patches.config import ConfigError


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name) for name in ("launch", "status", "report")}
    for p in commands.values():
        p.add_argument("configs", nargs="+", help="config files, folders of configs, globs")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
        p.add_argument("--slurm-logs", type=Path, default=Path("logs"), help="where the SLURM elements' output goes")
    where = commands["launch"].add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="train here, one run after another")
    where.add_argument("--slurm", action="store_true", help="submit one SLURM job array, one element per run")
    commands["launch"].add_argument("--nodes", type=at_least(1), default=1, help="nodes per run (--slurm)")
    commands["launch"].add_argument("--gpus-per-node", type=at_least(1), default=8, help="GPUs per node (--slurm)")
    commands["launch"].add_argument(
        "--sbatch-arg", action="append", default=[], help="extra sbatch option, e.g. --sbatch-arg=--time=24:00:00"
    )
    commands["report"].add_argument("--out", type=Path, required=True, help="output folder")
    commands["report"].add_argument("--no-figures", action="store_true")
    commands["report"].add_argument(
        "--target-loss", type=at_least(0, float), help="matched-loss FLOPs at this loss (default: the largest baseline run's)"
    )
    args = parser.parse_args()
    if args.command == "report":
        out_arg("--out", args.out)

    from olmo_patches.launch.sweep import launch_local, launch_slurm, load_sweep, sweep_status
    from olmo_patches.report.sweep import report, status_rows

    try:
        members = load_sweep(args.configs, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

    if args.command == "launch" and args.local:
        raise SystemExit(1 if launch_local(members, args.overrides) else 0)
    if args.command == "launch":
        try:
            launch_slurm(
                members,
                args.overrides,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                log_dir=args.slurm_logs,
                sbatch_args=args.sbatch_arg,
            )
        except RuntimeError as e:
            print(f"sweep: {e}", file=sys.stderr)
            raise SystemExit(1) from None
    elif args.command == "status":
        rows = status_rows(sweep_status(members, args.slurm_logs))
        table = Table(title=f"sweep: {len(rows)} run(s)")
        for col in rows[0]:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row.values())
        console().print(table)
    else:
        for path in report(members, args.out, args.slurm_logs, figures=not args.no_figures, target_loss=args.target_loss):
            print(path)


if __name__ == "__main__":
    main()
