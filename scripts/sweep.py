"""Launch, track and report a sweep of configs (olmo_patches/launch/sweep.py,
olmo_patches/report/sweep.py).

    python scripts/sweep.py launch --local CONFIGS... [--set key=value ...]
    python scripts/sweep.py launch --slurm CONFIGS... [--nodes 2] [--gpus-per-node 8]
                                   [--sbatch-arg=--time=24:00:00]
    python scripts/sweep.py status CONFIGS... [--set key=value ...]
    python scripts/sweep.py report CONFIGS... --out DIR [--baseline NAME] [--best-lr]

Every command takes --seeds N (or --seed-list 0,3,7), --vary init|order|both and --lr-grid
0.5,1,2: each config then runs once per seed offset and LR scale (olmo_patches/launch/sweep.py),
and the report compares the configs over seeds (docs/statistics.md). --confirm N adds N fresh seeds
per config at its best LR of the finished grid: launch trains them, report compares on them. Give
the same options to launch, status and report: they name the same runs.

CONFIGS are config files, folders (every *.yaml below) or globs; the same CONFIGS and --set
overrides name the same runs (their save folders). --local trains the runs one after another in
this process's environment, skipping finished ones and resuming stopped or failed ones; --slurm
submits them as one job array of scripts/launch_slurm.sbatch. A run claimed by a live launch is
never started twice. Bad configs: one line, exit 2, nothing started.
"""

import argparse
import math
import sys
from pathlib import Path

from rich.table import Table

from olmo_patches.cli import ArgumentParser, at_least, console, out_arg
from olmo_patches.config import ConfigError


def seed_list(text: str) -> tuple:
    """--seed-list: distinct seed offsets >= 0, comma-separated."""
    try:
        seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"{text}: seed offsets must be >= 0")
    if len(set(seeds)) < len(seeds):
        raise argparse.ArgumentTypeError(f"{text}: a seed appears twice")
    return seeds


def lr_grid(text: str) -> tuple:
    """--lr-grid: distinct positive multiples of each config's train.lr, comma-separated."""
    try:
        scales = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from None
    if not all(0 < x < math.inf for x in scales):  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text}: LR scales must be positive and finite")
    if len(set(scales)) < len(scales):
        raise argparse.ArgumentTypeError(f"{text}: a scale appears twice")
    return scales


def main() -> None:
    args = _parser().parse_args()
    if args.command == "report":
        out_arg("--out", args.out)
    from olmo_patches.launch.sweep import Variants

    variants = Variants(
        seeds=args.seed_list or tuple(range(args.seeds or 1)),
        vary=("init", "order") if args.vary == "both" else (args.vary,),
        lr_scales=tuple(sorted({1.0, *(args.lr_grid or ())})),
    )
    try:
        members = _members(args, variants)  # the configs are good: what follows imports torch
        fresh = _confirmation(args, members, variants) if args.confirm else []
        if args.command == "launch":
            _launch(args, fresh or members)
        elif args.command == "status":
            _status(args, members + fresh, variants)
        else:
            _report(args, members, variants, fresh)
    except ConfigError as e:  # a bad config or --baseline, a grid not finished, a bad run folder
        from olmo_patches.launch.run_folder import RunFolderError

        kind = "error" if isinstance(e, RunFolderError) else "config error"
        print(f"{kind}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name) for name in ("launch", "status", "report")}
    for p in commands.values():
        _run_arguments(p)
    launch, report = commands["launch"], commands["report"]
    where = launch.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="train here, one run after another")
    where.add_argument(
        "--slurm", action="store_true", help="submit one SLURM job array, one element per run"
    )
    launch.add_argument("--nodes", type=at_least(1), default=1, help="nodes per run (--slurm)")
    launch.add_argument(
        "--gpus-per-node", type=at_least(1), default=8, help="GPUs per node (--slurm)"
    )
    launch.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        help="extra sbatch option, e.g. --sbatch-arg=--time=24:00:00",
    )
    report.add_argument("--out", type=Path, required=True, help="output folder")
    report.add_argument("--no-figures", action="store_true")
    report.add_argument(
        "--baseline",
        help="the config (its run.name) the others are compared with (default: the first)",
    )
    report.add_argument(
        "--best-lr",
        action="store_true",
        help="compare each config at its own best LR of --lr-grid (default: its train.lr)",
    )
    report.add_argument(
        "--target-loss",
        type=at_least(0, float),
        help="matched-loss FLOPs at this loss (default: the largest baseline run's)",
    )
    return parser


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """What names the sweep's runs, the same for launch, status and report."""
    p.add_argument("configs", nargs="+", help="config files, folders of configs, globs")
    p.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override for every run",
    )
    p.add_argument(
        "--slurm-logs",
        type=Path,
        default=Path("logs"),
        help="where the SLURM elements' output goes",
    )
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds", type=at_least(1), help="N seeds per config: offsets 0..N-1 (0: the config's own)"
    )
    seeds.add_argument("--seed-list", type=seed_list, help="seed offsets per config, e.g. 0,3,7")
    p.add_argument(
        "--vary", choices=("init", "order", "both"), default="both",
        help="what a seed offset changes: train.seed (init), data.order_seed (order) or both",
    )  # fmt: skip
    p.add_argument(
        "--lr-grid",
        type=lr_grid,
        help="LR scales per config, e.g. 0.5,1,2 (1, the config's LR, always runs)",
    )
    p.add_argument(
        "--confirm",
        type=at_least(1),
        metavar="N",
        help="N fresh seeds per config at its best LR of the finished grid (launched; compared)",
    )


def _members(args: argparse.Namespace, variants) -> list:
    """The sweep's runs; a bad config or --baseline: ConfigError."""
    from olmo_patches.launch.sweep import load_sweep

    members = load_sweep(args.configs, args.overrides, variants)
    groups = list(dict.fromkeys(m.group for m in members))
    if args.command == "report" and args.baseline and args.baseline not in groups:
        raise ConfigError(
            f"--baseline {args.baseline}: not a config of the sweep ({', '.join(groups)})"
        )
    return members


def _confirmation(args: argparse.Namespace, members: list, variants) -> list:
    """The fresh seeds at each config's best LR; a grid not finished: ConfigError."""
    from olmo_patches.report.compare import confirmation

    return confirmation(members, args.overrides, variants, args.confirm)


def _launch(args: argparse.Namespace, members: list) -> None:
    from olmo_patches.launch.sweep import launch_local, launch_slurm

    if args.local:
        raise SystemExit(1 if launch_local(members, args.overrides) else 0)
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


def _status(args: argparse.Namespace, members: list, variants) -> None:
    """A table of the runs' states; with several seeds or LRs, the runs per config too."""
    from olmo_patches.launch.sweep import sweep_status
    from olmo_patches.report.sweep import seed_counts, status_rows

    statuses = sweep_status(members, args.slurm_logs)
    rows = status_rows(statuses)
    _print_table(f"sweep: {len(rows)} run(s)", rows, overflow="fold")
    if len(variants.seeds) * len(variants.lr_scales) > 1:
        _print_table(f"seeds per config: {variants.describe()}", seed_counts(statuses))


def _print_table(title: str, rows: list, overflow: str = "ellipsis") -> None:
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, overflow=overflow)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row.values())
    console().print(table)


def _report(args: argparse.Namespace, members: list, variants, fresh: list) -> None:
    from olmo_patches.report.sweep import report

    written = report(
        members,
        args.out,
        args.slurm_logs,
        figures=not args.no_figures,
        target_loss=args.target_loss,
        variants=variants,
        baseline=args.baseline,
        use_best_lr=args.best_lr,
        confirm=fresh,
    )
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
