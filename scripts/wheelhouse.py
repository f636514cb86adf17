"""Download every dependency except torch's CUDA stack as wheels, for an offline node (olmo_patches/wheelhouse.py).

    python scripts/wheelhouse.py FOLDER [--python-version 3.12] [--platform TAG ...] [--extras wandb,hf] [--add WHEEL ...]
    # then, on the node (its Python has a CUDA torch >= 2.10, < 2.14):
    pip install --no-index --find-links FOLDER 'hourglass-olmo[wandb,hf]'
"""

import argparse
import sys
from pathlib import Path

from olmo_patches.cli import ArgumentParser
from olmo_patches.wheelhouse import PLATFORMS, build, gpu_check_missing


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where the wheels go")
    parser.add_argument("--python-version", default="3.12", help="the node's Python, e.g. 3.11 or 3.12")
    parser.add_argument("--platform", action="append", help=f"pip platform tags (default: {' '.join(PLATFORMS)})")
    parser.add_argument("--extras", default="wandb,hf", help="comma-separated extras of pyproject.toml to include")
    parser.add_argument("--add", type=Path, action="append", default=[],
                        help="a wheel to put in the folder as it is: flash-attn built for the node (pip wheel flash-attn==2.8.3 --no-build-isolation)")
    args = parser.parse_args()
    extras = [e for e in args.extras.split(",") if e]
    missing = build(args.folder, extras, args.python_version, args.platform, args.add)
    wheels = list(args.folder.glob("*.whl"))
    print(f"{args.folder}: {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.0f} MiB for Python {args.python_version}")
    if missing:
        print("missing: " + "; ".join(missing), file=sys.stderr)
        sys.exit(1)
    print(f"install on the node: pip install --no-index --find-links {args.folder} 'hourglass-olmo[{','.join(extras)}]'")
    if lacking := gpu_check_missing(args.folder):
        print(f"for scripts/gpu_check.py on CUDA also add: {', '.join(lacking)} (--add WHEEL), or run it with --no-flash")


if __name__ == "__main__":
    main()
