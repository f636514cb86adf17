"""Disk space: a run folder checked for one checkpoint's room before the run starts, and a save that
runs out of space (ENOSPC, or EDQUOT for a quota: errno(3)) turned into one line naming the folder,
the bytes the save needed and what is left, its partial folder removed, every good checkpoint kept."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Iterator, Optional

from ..config import ConfigError, ExperimentSpec

__all__ = [
    "DiskFullError",
    "check_room",
    "checkpoint_bytes",
    "full_error",
    "CHECKPOINT_BYTES_PER_PARAM",
    "disk_full_error",
]

FULL = (errno.ENOSPC, errno.EDQUOT)  # "No space left on device", "Disk quota exceeded"


class DiskFullError(OSError):
    """A save that ran out of space: the message is one line (folder, bytes needed, bytes left)."""


CHECKPOINT_BYTES_PER_PARAM = (
    12  # fp32 weights + AdamW's two fp32 moments (the trainer state is a few KB)
)


def checkpoint_bytes(spec: ExperimentSpec) -> int:
    """One checkpoint's size: every parameter of the model (a meta build) in fp32, with AdamW's two moments."""
    model = spec.model_config().build(init_device="meta")
    return sum(p.numel() for p in model.parameters()) * CHECKPOINT_BYTES_PER_PARAM


def free_bytes(folder: Path) -> int:
    """Bytes free to this user on the disk that holds ``folder`` (or its nearest existing parent)."""
    for path in (folder, *folder.parents):
        if path.exists():
            return shutil.disk_usage(path).free
    return shutil.disk_usage(".").free


def check_room(spec: ExperimentSpec) -> None:
    """Before the run writes anything: a local run folder whose disk cannot hold one checkpoint is
    refused (ConfigError, one line)."""
    folder = Path(spec.save_folder)
    if "://" in spec.save_folder:
        return
    need, free = checkpoint_bytes(spec), free_bytes(folder)
    if free < need:
        raise ConfigError(
            f"run.save_folder={folder}: {_size(free)} free on its disk, one checkpoint needs about {_size(need)}"
        )


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and every exception behind it: causes, contexts, and the per-rank failures that
    torch.distributed.checkpoint's CheckpointException holds (rank -> (exception, traceback))."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [c for c in (x.__cause__, x.__context__) if c is not None]
        for failure in (getattr(x, "failures", None) or {}).values():
            first = failure[0] if isinstance(failure, tuple) and failure else failure
            if isinstance(first, BaseException):
                todo.append(first)
        todo += [a for a in getattr(x, "args", ()) if isinstance(a, BaseException)]


def full_error(e: BaseException) -> Optional[OSError]:
    """The out-of-space OSError behind ``e``, if that is what it is (an exception object, or the text
    of one that OLMo-core's writer threads pass on as "Original error: <traceback>")."""
    chain = list(_chain(e))
    if found := next((x for x in chain if isinstance(x, OSError) and x.errno in FULL), None):
        return found
    for code in FULL:
        if any(f"[Errno {code}]" in str(x) for x in chain):
            return OSError(code, os.strerror(code))
    return None


def disk_full_error(folder: Path, path: str, need: int, cause: OSError) -> DiskFullError:
    free = free_bytes(folder)
    return DiskFullError(
        cause.errno,
        f"{cause.strerror} saving {Path(path).name} to {folder}: the save needs about "
        f"{_size(need)}, {_size(free)} left; the partial save was removed, earlier checkpoints kept",
    )


def _size(n: int) -> str:
    return (
        f"{n / 2**30:,.2f} GiB"
        if n >= 2**30
        else f"{n / 2**20:,.1f} MiB"
        if n >= 2**20
        else f"{n:,} bytes"
    )
