"""scripts/train.py run several times in the same ranks, one run after another (test helper): one
torchrun launch, and one set of imports, for several runs.

    torchrun --standalone --nproc-per-node N tests/_train_each.py ARGS [--- ARGS ...]

ARGS are scripts/train.py's (CONFIG key=value ...); a run that fails ends the launch with its exit
code. Each run rendezvouses on a store of its own: rank 0 hosts a new TCPStore on a free port and
publishes the port on torchrun's store (a process group created again on torchrun's store would
read the keys of the one before: torch names the default group "0" every time); OLMo-core's world
mesh, one per process, is dropped after each run.
"""

import os
import runpy
import socket
import sys
from datetime import timedelta
from pathlib import Path

import olmo_core.distributed.parallel as parallel
from torch.distributed import TCPStore

from olmo_patches.launch import peers

TRAIN = Path(__file__).resolve().parents[1] / "scripts" / "train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    runs: list[list[str]] = [[]]
    for arg in sys.argv[1:]:
        if arg == "---":
            runs.append([])
        else:
            runs[-1].append(arg)
    torchrun = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(minutes=5),
    )
    for i, argv in enumerate(runs):
        key = f"_train_each/{i}/port"
        if os.environ["RANK"] == "0":
            torchrun.set(key, str(_free_port()))
        os.environ.update(
            MASTER_PORT=torchrun.get(key).decode(), TORCHELASTIC_USE_AGENT_STORE="False"
        )
        sys.argv = [str(TRAIN), *argv]
        runpy.run_path(str(TRAIN), run_name="__main__")
        parallel._WORLD_MESH = (
            None  # OLMo-core builds its world mesh once a process: this run's is gone
        )
        peers.stop_watching()  # and the next run starts with no store or failure of this one's
        peers._forget()


if __name__ == "__main__":
    main()
