"""The papers' tables (markdown + CSV) and figures (PNG) from runs, beside the reported numbers.

    python scripts/make_tables.py RUN_DIR... --out DIR

RUN_DIR is a run folder (config.yaml + metrics.jsonl) or a folder of them (e.g. runs/). Missing
runs appear as "not run"; partial runs use their last evaluation.
"""

import argparse
import sys
from pathlib import Path

from olmo_patches.cli import ArgumentParser
from olmo_patches.report.figures import make_figures
from olmo_patches.report.tables import build_tables, load_runs, write_tables


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders, or folders of run folders")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-figures", action="store_true")
    args = parser.parse_args()
    missing = [p for p in args.runs if not Path(p).is_dir()]
    if missing:
        print(f"make_tables: no such folder: {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    runs = load_runs(args.runs)
    out = Path(args.out)
    written = write_tables(build_tables(runs), out)
    if not args.no_figures:
        written += make_figures(runs, out)
    print(f"{len(runs)} run(s): {', '.join(sorted(runs)) or '-'}")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
