"""scripts/train.py, with one rank alone refusing once the run has started (test helper).

    python tests/_fail_on_rank.py [--own-store] RANK CONFIG [key=value ...]

That rank raises a RunFolderError when the run is built, after the process group is up (the line
scripts/train.py prints: ``error: refused on rank RANK (test)``, exit 2); the other ranks are then
in a collective, waiting for it. ``--own-store`` (under torchrun): the process group gets a store of
its own on rank 0 (env:// on a fresh MASTER_PORT), as under a launcher other than torchrun.
"""

import os
import runpy
import socket
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

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


def own_store() -> None:
    """The process group's store on rank 0, at a port rank 0 picks (told through torchrun's)."""
    env = os.environ
    torchrun = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout=timedelta(minutes=5))
    if env["RANK"] == "0":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            torchrun.set("_fail_on_rank/port", str(s.getsockname()[1]))
    port = torchrun.get("_fail_on_rank/port").decode()
    env.update(MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="False")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--own-store":
        own_store()
        args = args[1:]
    rank, *argv = args
    refuse_on(int(rank))
    train = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    sys.argv = [str(train), *argv]
    runpy.run_path(str(train), run_name="__main__")
