"""Whether the run's local folders are shared by every node: found out, not declared.

OLMo-core writes a local save folder from one rank when ``OLMO_SHARED_FS=1``, and on more than one
node refuses it otherwise ("Checkpointing to a local directory requires a shared filesystem", raised
on the ranks of the other nodes only). :func:`require_shared` finds out instead: rank 0 writes a
marker with a fresh name in each folder, every rank looks for it, the answers are gathered. Seen on
every rank: ``OLMO_SHARED_FS=1`` for OLMo-core. A node that does not see it: the same one-line
:class:`ConfigError` on every rank, naming the folder and the node, and nothing left behind.

:func:`require_data` does the same for the token files: every rank opens each local one and the
answers (the paths as spelled there, their sizes, what could not be read) are compared, so a file
missing or unreadable on some node, a file of another size, or the data given under another spelling
on one node (OLMo-core names its per-node index caches by a hash of the paths: one node would look
for caches the others never write) stops every rank with one line naming the file and the rank.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist
from olmo_core.distributed.utils import (
    OLMO_SHARED_FS_ENV_VAR,
    barrier,
    broadcast_object,
    get_rank,
    get_world_size,
)

from ..config import ConfigError

__all__ = ["require_shared", "require_data"]

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
    dist.all_gather_object(
        answers,
        (
            seen,
            os.environ.get("GROUP_RANK", "?"),
            socket.gethostname(),
            [str(f) for f in folders.values()],
        ),
    )
    if get_rank() == 0:  # every rank has looked
        for folder in folders.values():
            (folder / name).unlink(missing_ok=True)
    for i, key in enumerate(folders):
        blind = sorted({(node, host) for s, node, host, _ in answers if not s[i]})
        if blind:
            if get_rank() == 0:
                # what was made here, if empty
                for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
                    try:
                        path.rmdir()
                    except OSError:
                        pass
            nodes = ", ".join(f"node {node} ({host})" for node, host in blind)
            raise ConfigError(
                f"{key}={answers[0][3][i]}: not shared by every node: {nodes} does not see what "
                "rank 0 writes there; use a folder on a filesystem every node mounts"
            )
    os.environ[OLMO_SHARED_FS_ENV_VAR] = "1"


def _read(path: str) -> Tuple[Optional[int], Optional[str]]:
    """(size, None) for a local file this process can open, else (None, why)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return None, "missing" if isinstance(
            e, FileNotFoundError
        ) else f"unreadable ({type(e).__name__}: {e.strerror})"
    try:
        return os.fstat(fd).st_size, None
    finally:
        os.close(fd)


def require_data(paths: Sequence[str]) -> None:
    """Check that every rank reads the same local token files (URLs are left to their reader);
    collective. Raises one :class:`ConfigError` on every rank otherwise."""
    local = [p for p in paths if "://" not in p]
    read = [_read(p) for p in local]
    rank, node, host = get_rank(), os.environ.get("GROUP_RANK", "0"), socket.gethostname()
    problem = next(
        (
            f"data file {p}: {why} on rank {rank} (node {node}, {host})"
            for p, (_, why) in zip(local, read)
            if why
        ),
        None,
    )
    digest = hashlib.sha256(repr((local, [size for size, _ in read])).encode()).hexdigest()
    answers: list = [(problem, digest)]
    if get_world_size() > 1:
        answers = [None] * get_world_size()
        dist.all_gather_object(answers, (problem, digest))
    if (first := next((p for p, _ in answers if p), None)) is not None:
        raise ConfigError(first)
    if len({d for _, d in answers}) == 1:
        return
    everything: list = [None] * get_world_size()  # what differs, named
    dist.all_gather_object(everything, (local, [size for size, _ in read], node, host))
    paths0, sizes0 = everything[0][:2]
    for r, (paths_r, sizes_r, node_r, host_r) in enumerate(everything):
        where = f"rank {r} (node {node_r}, {host_r})"
        if paths_r != paths0:
            i = next(
                (i for i, (a, b) in enumerate(zip(paths0, paths_r)) if a != b),
                min(len(paths0), len(paths_r)),
            )
            mine = paths_r[i] if i < len(paths_r) else "nothing"
            theirs = paths0[i] if i < len(paths0) else "nothing"
            raise ConfigError(
                f"data paths differ between ranks: {where} reads {mine} where rank 0 reads "
                f"{theirs}; give every node the same data paths, spelled the same"
            )
        if sizes_r != sizes0:
            i = next(i for i, (a, b) in enumerate(zip(sizes0, sizes_r)) if a != b)
            raise ConfigError(
                f"data file {paths0[i]}: {sizes_r[i]:,} bytes on {where}, {sizes0[i]:,} on rank 0; "
                "every node must read the same files"
            )
