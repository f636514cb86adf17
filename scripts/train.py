"""Train a config through OLMo-core's Trainer.

    python scripts/train.py CONFIG [key=value ...] [--dry-run [--nproc-per-node N [--nodes M]]]
    torchrun --nproc-per-node N scripts/train.py CONFIG [key=value ...]

The config and its data files are checked for the ranks the run has (torchrun's environment)
before anything is written; --dry-run --nproc-per-node N --nodes M checks and plans a launch on M
nodes of N GPUs.

A run resumes from the newest good checkpoint in its save folder; --resume-from PATH resumes
from PATH instead (a checkpoint or a folder of them). --init-from PATH (train.init_from) starts a
new run from the weights of another run's checkpoint or of a Hugging Face OLMo-2 folder, with a
fresh optimizer and schedule. SIGTERM or SIGUSR1 (the time limit under
scripts/launch_slurm.sbatch) saves a checkpoint at the next step and exits 0; another one does not
cut the save short.
A folder holding another run's config (with a checkpoint of it: a record left by a start that failed
before its first checkpoint is replaced) or another process, or one that not every node sees: one
line, exit 2. A non-finite loss, gradient norm or weight: one line naming the step and the last good
checkpoint, exit 3. Out of space during a save: one line naming the folder, the bytes needed and
left, the partial save removed and the good checkpoints kept, exit 4. A refusal or an error on any
rank ends every rank within a second or so, its line printed once on each node.
"""

import argparse
import os
import sys
from typing import Optional

from olmo_patches.cli import ArgumentParser, at_least, load_or_exit, refuse
from olmo_patches.launch.ranks import Layout
from olmo_patches.resources import find_config


def main() -> None:
    args, layout = _arguments()
    # A bad config or bad data is refused here, before torch is imported (the dry run too).
    spec = load_or_exit(args.config, args.overrides, layout, data=True)
    from olmo_patches.report.advice import advice

    if os.environ.get("RANK", "0") == "0":
        for line in advice(spec):  # what the config costs on GPUs, once, before the plan or the run
            print(line, file=sys.stderr)
    if args.dry_run:
        _dry_run(spec, args, layout)
    else:
        _train(spec, args.resume_from)


def _arguments() -> tuple[argparse.Namespace, Optional[Layout]]:
    """The command line, and the launch a dry run plans (None: torchrun's environment)."""
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", help="YAML config")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-3")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the resolved config and parameters, then exit"
    )
    parser.add_argument(
        "--resume-from", metavar="PATH", help="checkpoint (or folder of checkpoints) to resume from"
    )
    parser.add_argument(
        "--init-from",
        metavar="PATH",
        help="a new run's weights: a run checkpoint or a Hugging Face OLMo-2 folder",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=at_least(1),
        metavar="N",
        help="--dry-run: plan for N ranks per node (as torchrun's)",
    )
    parser.add_argument(
        "--nodes", type=at_least(1), metavar="M", help="--dry-run: plan for M nodes (default 1)"
    )
    args = parser.parse_intermixed_args()  # overrides before or after the flags
    planned = args.nproc_per_node is not None or args.nodes is not None
    if planned and not args.dry_run:
        parser.error(
            "--nproc-per-node/--nodes plan a launch with --dry-run; "
            "a real run takes its ranks from torchrun"
        )
    if args.init_from is not None:  # the same as train.init_from=PATH: the run folder records it
        if args.resume_from is not None:
            parser.error(
                "--init-from starts a new run from weights; --resume-from continues a run: give one"
            )
        args.overrides.append(f"train.init_from={args.init_from}")
    args.config = str(find_config(args.config))  # configs/... from any folder once installed
    return args, Layout.plan(args.nproc_per_node or 1, args.nodes or 1) if planned else None


def _dry_run(spec, args: argparse.Namespace, layout: Optional[Layout]) -> None:
    """What the real run would refuse before writing, refused alike (nothing written); then the
    resolved config, the parameters and the launch's plan."""
    from olmo_patches.config import ConfigError, spec_to_yaml
    from olmo_patches.launch.run_folder import Lock
    from olmo_patches.report.console import console as rich_console
    from olmo_patches.report.counts import param_table
    from olmo_patches.report.plan import mixture_table, plan_table, preset_rows
    from olmo_patches.train import exit_line
    from olmo_patches.train.run import check_before_writing

    try:
        *_, mixture = check_before_writing(spec, args.resume_from)  # the mixture's table below
        Lock(spec.save_folder).check()
    except ConfigError as e:
        refuse(exit_line(e)[0])
    console = rich_console()
    console.print(spec_to_yaml(spec), highlight=False)
    console.print(param_table(spec))
    presets = preset_rows(args.config, args.overrides, layout)
    console.print(plan_table(spec, layout or Layout.from_env(), presets))
    if mixture:
        console.print(mixture_table(mixture))


def _train(spec, resume_from: Optional[str]) -> None:
    """The run, its stop signals saving and exiting 0; an error ends in its one line and code."""
    from olmo_patches.launch.peers import announce
    from olmo_patches.train import exit_line, train
    from olmo_patches.train.callbacks.stop import ignore_stop_signals, install_stop_signals

    install_stop_signals()  # SIGTERM/SIGUSR1: the run saves at its next step and exits 0
    try:
        train(spec, resume_from=resume_from, data_checked=True)
        # Saved and done: a late signal does not end the exit (Python's own exit restores SIG_DFL).
        ignore_stop_signals()
    except Exception as e:  # train() announced it (peers.py); refuse() prints the first failure
        line, code = exit_line(e)
        if code == 1 and announce(line, code)[:2] == (line, code):
            raise  # this rank's own error, not the consequence of another's: its traceback
        refuse(line, code)


if __name__ == "__main__":
    main()
