"""scripts/train.py, with one rank alone refusing once the run has started (test helper).

    python tests/_fail_on_rank.py RANK CONFIG [key=value ...]

That rank raises a RunFolderError when the run is built, after the process group is up (the line
scripts/train.py prints: ``error: refused on rank RANK (test)``, exit 2); the other ranks are then
in a collective, waiting for it.
"""

import os
import runpy
import sys
from pathlib import Path

import olmo_patches.train.run as training
from olmo_patches.launch.run_folder import RunFolderError


def refuse_on(rank: int) -> None:
    """Patch olmo_patches.train's build_experiment to refuse on ``rank``."""
    original = training.build_experiment

    def build(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == rank:
            raise RunFolderError(f"refused on rank {rank} (test)")
        return original(*args, **kwargs)

    training.build_experiment = build


if __name__ == "__main__":
    rank, *argv = sys.argv[1:]
    refuse_on(int(rank))
    train = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    sys.argv = [str(train), *argv]
    runpy.run_path(str(train), run_name="__main__")
