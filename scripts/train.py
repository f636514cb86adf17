"""Train a config through OLMo-core's Trainer.

    python scripts/train.py CONFIG [key=value ...] [--dry-run]
    torchrun --nproc-per-node N scripts/train.py CONFIG [key=value ...]

A run resumes from the latest complete checkpoint in its save folder; --resume-from PATH resumes
from PATH instead (a checkpoint or a folder of them). SIGTERM saves a checkpoint and exits 0.
"""

import argparse
import sys

from olmo_core.exceptions import OLMoConfigurationError

from olmo_patches.report.console import console as rich_console
from olmo_patches.cli import load_or_exit
from olmo_patches.config import spec_to_yaml
from olmo_patches.report.plan import plan_table
from olmo_patches.report.counts import param_table
from olmo_patches.train import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="YAML config")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-3")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and parameters, then exit")
    parser.add_argument("--resume-from", metavar="PATH", help="checkpoint (or folder of checkpoints) to resume from")
    args = parser.parse_args()
    spec = load_or_exit(args.config, args.overrides)
    if args.dry_run:
        console = rich_console()
        console.print(spec_to_yaml(spec), highlight=False)
        console.print(param_table(spec))
        console.print(plan_table(spec))
        return
    try:
        train(spec, resume_from=args.resume_from)
    except OLMoConfigurationError as e:  # found while building the run (e.g. a downstream task that cannot fit)
        print(f"config error: {args.config}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
