"""Train a config through OLMo-core's Trainer.

    python scripts/train.py CONFIG [key=value ...] [--dry-run]
    torchrun --nproc-per-node N scripts/train.py CONFIG [key=value ...]

A run resumes from the newest good checkpoint in its save folder; --resume-from PATH resumes
from PATH instead (a checkpoint or a folder of them). SIGTERM saves a checkpoint and exits 0.
A folder holding another run's config or another process: one line, exit 2. A non-finite loss,
gradient norm or weight: one line naming the step and the last good checkpoint, exit 3.
"""

import argparse
import sys

from olmo_patches.report.console import console as rich_console
from olmo_patches.cli import load_or_exit
from olmo_patches.config import spec_to_yaml
from olmo_patches.report.plan import plan_table, preset_rows
from olmo_patches.report.counts import param_table
from olmo_patches.train import train
from olmo_patches.train.run_folder import RunFolderError
from olmo_patches.train.safety import NonFiniteError


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
        console.print(plan_table(spec, preset_rows(args.config, args.overrides)))
        return
    try:
        train(spec, resume_from=args.resume_from)
    except RunFolderError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except NonFiniteError as e:
        print(f"diverged: {e}", file=sys.stderr)
        raise SystemExit(3) from None


if __name__ == "__main__":
    main()
