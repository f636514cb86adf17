"""scripts/train.py, with one rank failing once the run has started (test helper).

    python tests/_fail_on_rank.py RANK KIND CONFIG [key=value ...]

KIND ``refuse``: that rank alone raises a RunFolderError (the one line scripts/train.py prints,
exit 2) when the run is built, after the process group is up; ``raise``: a FileNotFoundError, as a
data file missing on one node would. The other ranks are then in a collective, waiting for it.
"""

import os
import runpy
import sys
from pathlib import Path

import olmo_patches.train.experiment as training
from olmo_patches.train.run_folder import RunFolderError

ERRORS = {"refuse": RunFolderError, "raise": FileNotFoundError}


def fail_on(rank: int, kind: str) -> None:
    """Patch olmo_patches.train's build_experiment to raise on ``rank``."""
    original = training.build_experiment

    def build(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == rank:
            raise ERRORS[kind](f"{kind} on rank {rank} (test)")
        return original(*args, **kwargs)

    training.build_experiment = build


if __name__ == "__main__":
    rank, kind, *argv = sys.argv[1:]
    fail_on(int(rank), kind)
    train = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    sys.argv = [str(train), *argv]
    runpy.run_path(str(train), run_name="__main__")
