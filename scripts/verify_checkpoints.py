"""Check every checkpoint of a run folder by content, as a resume would, without moving anything.

    python scripts/verify_checkpoints.py RUN_FOLDER      # or one checkpoint, RUN/stepN

One line per checkpoint, newest first: ``ok`` (every file at its recorded size and CRC-32; a
checkpoint without CRCs, from an older version: its weights load and are finite) or why not.
Exit 0 when all are good, 1 when one is not (a resume would move it to RUN/rejected/).
"""

import argparse
from pathlib import Path

from olmo_patches.cli import ArgumentParser, refuse


def main() -> None:
    parser = ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run_folder",
        metavar="RUN_FOLDER",
        help="a run's save folder, or one checkpoint (RUN/stepN)",
    )
    args = parser.parse_args()

    from olmo_patches.train.checkpoints import checkpoints_at, verify

    folder = Path(args.run_folder)
    if not folder.is_dir():
        refuse(
            f"verify_checkpoints: RUN_FOLDER {folder}: "
            f"{'not a folder' if folder.exists() else 'no such folder'}"
        )
    found = checkpoints_at(folder)
    if not found:
        refuse(f"verify_checkpoints: RUN_FOLDER {folder}: no complete checkpoint there")
    bad = 0
    for _, path in found:
        why = verify(path)
        bad += why is not None
        print(f"{path}: {'ok' if why is None else why}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
