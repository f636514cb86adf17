"""The embedded default: train the demo variants on the Python standard library and compare them.

    python scripts/demo.py [CONFIG ...] [--out runs/demo] [--set key=value ...] [--fresh]

With no CONFIG it trains every config in configs/demo/ (baseline first). Nothing is downloaded.

A rerun continues: a finished variant (a checkpoint at its last step) is not trained again, an
unfinished one resumes from its newest checkpoint. Ctrl-C or SIGTERM saves the step reached and ends
the demo (rerun the same command to resume); --fresh moves the variants' run folders aside first
(FOLDER.before-TIME: nothing is deleted) and starts the comparison over.
"""

import argparse
import sys
import time
from pathlib import Path

from olmo_patches.cli import ArgumentParser, console, load_or_exit, out_arg, refuse

DEMO_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "demo"


def main() -> None:
    args = _arguments()
    out_arg("--out", args.out)
    paths = args.configs or sorted(
        DEMO_CONFIGS.glob("*.yaml"), key=lambda p: (p.stem != "baseline", p.stem)
    )
    # Every config and its data checked before any training.
    specs = [load_or_exit(str(p), args.overrides, data=True) for p in paths]

    from olmo_patches.report.demo import compare
    from olmo_patches.train.callbacks.stop import ignore_stop_signals, install_stop_signals

    if args.fresh:
        _move_aside([Path(spec.save_folder) for spec in specs])
    # SIGTERM/SIGUSR1 between steps: save and stop (Ctrl-C too, inside OLMo-core's fit()).
    install_stop_signals()
    for i, spec in enumerate(specs, 1):
        _train_variant(spec, f"{i}/{len(specs)}")
    ignore_stop_signals()  # trained: a late signal does not cut the comparison's table short
    compare(specs, Path(args.out))


def _arguments() -> argparse.Namespace:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*", help="demo configs (default: configs/demo/*.yaml)")
    parser.add_argument(
        "--out", default="runs/demo", help="where summary.json and loss_curves.png go"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override for every variant",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="move the variants' run folders aside first (FOLDER.before-TIME): a new comparison",
    )
    return parser.parse_args()


def _train_variant(spec, which: str) -> None:
    """One variant (``which``: "i/n") trained to its end, or kept if it got there before; a stop
    signal saves it and ends the demo (exit 0), an error ends it with train.py's line and code."""
    from olmo_patches.launch.run_folder import latest_step
    from olmo_patches.train import exit_line, train
    from olmo_patches.train.callbacks.stop import ignore_stop_signals, stop_requested

    name, planned = spec.run.name, spec.steps
    if (done := latest_step(spec.save_folder)) >= planned:
        console().print(f"{which}: {name} finished (step {done}, {spec.save_folder}): kept")
        return
    console().rule(f"[bold]{which}: {name}")
    try:
        train(spec, data_checked=True)
    except KeyboardInterrupt:  # outside the steps (a build, an evaluation): nothing saved
        refuse(
            f"interrupted in {name}: rerun the same command to resume (--fresh: start over)", 130
        )
    except Exception as e:  # a folder of another config, a divergence: train.py's line and code
        line, code = exit_line(e)
        refuse(f"{name}: {line} (--fresh moves the demo's runs aside and starts over)", code)
    if (reached := latest_step(spec.save_folder)) < planned or stop_requested():
        print(
            f"stopped in {name} at step {max(reached, 0)}/{planned} (saved): "
            "rerun the same command to resume (--fresh: start over)",
            file=sys.stderr,
        )
        ignore_stop_signals()
        raise SystemExit(0)


def _move_aside(folders: list) -> None:
    """--fresh: each existing run folder renamed FOLDER.before-TIME (a run's checkpoints are never
    deleted); a folder another process holds: one line, exit 2, nothing moved."""
    from olmo_patches.config import ConfigError
    from olmo_patches.launch.run_folder import Lock

    there = [f for f in folders if f.exists()]
    for folder in there:
        try:
            Lock(folder).check()
        except ConfigError as e:
            refuse(f"--fresh: {e}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in there:
        aside = folder.with_name(f"{folder.name}.before-{stamp}")
        folder.rename(aside)
        console().print(f"--fresh: {folder} moved to {aside}")


if __name__ == "__main__":
    main()
