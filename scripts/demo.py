"""The embedded default: train the demo variants on the Python standard library and compare them.

    python scripts/demo.py [CONFIG ...] [--out runs/demo] [--set key=value ...]

With no CONFIG it trains every config in configs/demo/ (baseline first). Nothing is downloaded.
"""

import argparse
import shutil
from pathlib import Path

from olmo_patches.cli import ArgumentParser, console, load_or_exit, out_arg

DEMO_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "demo"


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="demo configs (default: configs/demo/*.yaml)")
    parser.add_argument("--out", default="runs/demo", help="where summary.json and loss_curves.png go")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override for every variant"
    )
    args = parser.parse_args()

    out_arg("--out", args.out)
    paths = args.configs or sorted(DEMO_CONFIGS.glob("*.yaml"), key=lambda p: (p.stem != "baseline", p.stem))
    specs = [load_or_exit(str(p), args.overrides) for p in paths]  # every config checked before any training

    from olmo_patches.report.demo import compare
    from olmo_patches.train import train

    for i, spec in enumerate(specs, 1):
        shutil.rmtree(spec.save_folder, ignore_errors=True)  # a demo is a fresh comparison, never a resume
        console().rule(f"[bold]{i}/{len(specs)}: {spec.run.name}")
        train(spec)
    compare(specs, Path(args.out))


if __name__ == "__main__":
    main()
