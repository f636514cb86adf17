"""Rewrite the papers' sweep folders: paper 1's from their scripts/search.py commands, paper 2's
r_l / r_d grid from olmo_patches/config/paper_sweeps.py's WIDTH_GRID.

    python scripts/make_sweeps.py [FOLDER ...] [--root DIR]

Each folder's YAML files are replaced by what scripts/search.py --write gives now. FOLDER: only
those (as listed in olmo_patches/config/paper_sweeps.py); --root DIR: a copy of the repository's
configs/ lies under DIR and is rewritten instead (a check that the shipped folders reproduce:
diff -r the two).
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from olmo_patches.cli import ArgumentParser, refuse
from olmo_patches.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="*", help="sweep folders to rewrite (default: all)")
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the folder holding configs/ (default: the repository)",
    )
    args = parser.parse_args()

    from olmo_patches.config.paper_sweeps import BASELINE_113M, SWEEPS, WIDTH_GRID, write_width_grid

    for f in args.folders:
        if f.rstrip("/") not in {**SWEEPS, **WIDTH_GRID}:
            refuse(
                f"make_sweeps: command line: FOLDER={f}: not a sweep "
                f"(olmo_patches/config/paper_sweeps.py lists {', '.join({**SWEEPS, **WIDTH_GRID})})"
            )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    for folder, argv in SWEEPS.items():
        if args.folders and folder not in [f.rstrip("/") for f in args.folders]:
            continue
        out = args.root / folder
        if not (args.root / BASELINE_113M).is_file():
            refuse(f"make_sweeps: command line: --root={args.root}: no {BASELINE_113M} there")
        for old in out.glob("*.yaml"):
            old.unlink()
        # Run from the root with relative paths: each config names the command as typed in the
        # repository.
        cmd = [
            sys.executable,
            str(ROOT / "scripts/search.py"),
            BASELINE_113M,
            *argv,
            "--top",
            "100",
            "--write",
            folder,
        ]
        r = subprocess.run(cmd, cwd=args.root, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.stderr.write(r.stderr)
            sys.exit(r.returncode)
        print(f"{folder}: {len(list(out.glob('*.yaml')))} configs")
    for folder in WIDTH_GRID:
        if not args.folders or folder in [f.rstrip("/") for f in args.folders]:
            try:
                print(f"{folder}: {len(write_width_grid(args.root, folder))} configs")
            except ConfigError as e:
                refuse(f"make_sweeps: {e}")


if __name__ == "__main__":
    main()
