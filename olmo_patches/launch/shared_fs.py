"""Whether the run's local folders are shared by every node: found out, not declared.

OLMo-core writes a local save folder from one rank when ``OLMO_SHARED_FS=1``, and on more than one
node refuses it otherwise ("Checkpointing to a local directory requires a shared filesystem", raised
on the ranks of the other nodes only). :func:`require_shared` finds out instead: rank 0 writes a
marker with a fresh name in each folder, every rank looks for it, the answers are gathered. Seen on
every rank: ``OLMO_SHARED_FS=1`` for OLMo-core. A node that does not see it: the same one-line
:class:`ConfigError` on every rank, naming the folder and the node, and nothing left behind.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Dict, List

import torch.distributed as dist
from olmo_core.distributed.utils import OLMO_SHARED_FS_ENV_VAR, barrier, broadcast_object, get_rank, get_world_size

from ..config import ConfigError

__all__ = ["require_shared", "LOOK_S"]

LOOK_S = 5.0  # how long a rank looks for the marker (a network filesystem may show a new file late)


def _created(folder: Path) -> List[Path]:
    """``folder`` and its missing parents, created; the ones made here, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _look(marker: Path) -> bool:
    deadline = time.monotonic() + LOOK_S
    while not marker.is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def require_shared(folders: Dict[str, Path]) -> None:
    """Check that every node sees the same ``folders`` (config key -> local folder); collective.
    One node (``LOCAL_WORLD_SIZE`` = world size): nothing to check."""
    world = get_world_size()
    if world == 1 or int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return
    name = f".shared-fs-{broadcast_object(uuid.uuid4().hex if get_rank() == 0 else None)}"
    made: List[Path] = []
    if get_rank() == 0:
        for folder in folders.values():
            made += _created(folder)
            (folder / name).touch()
    barrier()
    seen = [_look(folder / name) for folder in folders.values()]
    answers: list = [None] * world
    dist.all_gather_object(answers, (seen, os.environ.get("GROUP_RANK", "?"), socket.gethostname(), [str(f) for f in folders.values()]))
    if get_rank() == 0:  # every rank has looked
        for folder in folders.values():
            (folder / name).unlink(missing_ok=True)
    for i, key in enumerate(folders):
        blind = sorted({(node, host) for s, node, host, _ in answers if not s[i]})
        if blind:
            if get_rank() == 0:
                for path in sorted(made, key=lambda p: len(p.parts), reverse=True):  # what was made here, if empty
                    try:
                        path.rmdir()
                    except OSError:
                        pass
            nodes = ", ".join(f"node {node} ({host})" for node, host in blind)
            raise ConfigError(
                f"{key}={answers[0][3][i]}: not shared by every node: {nodes} does not see what rank 0 writes there; "
                f"use a folder on a filesystem every node mounts"
            )
    os.environ[OLMO_SHARED_FS_ENV_VAR] = "1"
