"""Train a config through OLMo-core's Trainer.

    python scripts/train.py CONFIG [key=value ...] [--dry-run]
    torchrun --nproc-per-node N scripts/train.py CONFIG [key=value ...]
"""

import argparse

from rich.console import Console

from olmo_patches.cli import load_or_exit
from olmo_patches.config import spec_to_yaml
from olmo_patches.report import param_table
from olmo_patches.train import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="YAML config")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-3")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and parameters, then exit")
    args = parser.parse_args()
    spec = load_or_exit(args.config, args.overrides)
    if args.dry_run:
        console = Console()
        console.print(spec_to_yaml(spec), highlight=False)
        console.print(param_table(spec))
        return
    train(spec)


if __name__ == "__main__":
    main()
